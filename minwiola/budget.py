"""Accounting: parameters, FLOPs per token and KV-cache / SSM-state memory, by component (lessons 08-10 and 13;
Wiola eqs. 33, 38-41, section X).

Parameters are counted from the config alone (no model is built) and a test checks the count against an
instantiated model for every preset (the large ones on the meta device, where no memory is allocated).

FLOP conventions. A multiply-add is 2 FLOPs, so a (1 x m) @ (m x n) product costs 2mn. Counts are per token of a
sequence of T tokens, forward pass only (training is about 3x: the backward costs twice the forward). The
attention core is counted the way Wiola's eq. 39 counts it, every query against all T keys (4 T H d_h per token:
q k^T and the weighted sum of values); a kernel that skips the masked half does about half of that. Norms,
softmax, activations and rotations are left out (O(d) per token, next to the O(d^2) products).

A state-space mixer (mixer="ssm", `ssm.py`) is counted the way it runs in training: kind="s4d" by its kernel and an
FFT convolution (O(d (N + log T)) per token: no term grows with T like attention's core), kind="selective" by the
scan (O(d N) per token). Its decoding memory is `state_bytes`, constant in T, next to `kv_cache_bytes`.

A mixture of experts (ffn="moe", `moe.py`, lesson 14) holds E experts but runs k of them per token: `count_params`
counts every parameter (what memory holds), `active_params` those one token uses (the k experts, not the other
E - k), and the FLOPs per token count the router and the k active experts. Dropped assignments (a capacity limit)
would save some of that work; the count is the cost without dropping.
"""
from __future__ import annotations

import dataclasses
import math

from .atm import KINDS as ATM_KINDS, atm_layers
from .attention import QKV
from .ffn import ACTIVATIONS, FFNS
from .gcla import LAMBDA, SUMMARIES
from .model import ENCDEC_RULES, MIXERS, ModelConfig, check_rules, pre_norm, unknown_kind
from .norm import NORMS
from .positions import POSITIONS
from .ssm import KINDS as SSM_KINDS


def norm_params(cfg: ModelConfig) -> int:
    """One norm: LayerNorm has a weight and a bias, RMSNorm a weight, WiolaRMSNorm gamma and delta (eq. 9)."""
    per_unit = {"layernorm": 2, "rmsnorm": 1, "wiola": 2}
    if cfg.norm not in per_unit:
        raise unknown_kind("norm", cfg.norm, NORMS)
    return per_unit[cfg.norm] * cfg.d


def ssm_params(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of one SSM mixer (`ssm.SSM`), by part: W_in (d -> 2d) and W_out (d -> d), with biases if
    attn_bias; then for "s4d" per channel N/2 complex a_n (two numbers each), N/2 complex c_n (two each), log Delta
    and D: 2N + 2; for "selective" W_Delta, W_B, W_C (d -> d + 2N) and per channel N real a_n, a Delta bias and D."""
    d, N, ab = cfg.d, cfg.ssm_state, int(cfg.attn_bias)
    out = {"SSM projections W_in, W_out": 3 * d * d + ab * 3 * d}
    if cfg.ssm_kind == "s4d":
        out["SSM system (A, C, Delta, D)"] = d * (2 * N + 2)
    elif cfg.ssm_kind == "selective":
        out["SSM selection W_Delta, W_B, W_C"] = d * (d + 2 * N)
        out["SSM system (A, Delta bias, D)"] = d * (N + 2)
    else:
        raise unknown_kind("ssm_kind", cfg.ssm_kind, SSM_KINDS)
    return out


def layer_params(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of one decoder layer, by component."""
    if cfg.mixer == "ssm":
        return {**ssm_params(cfg), **ffn_and_norms(cfg)}
    if cfg.mixer != "attention":
        raise unknown_kind("mixer", cfg.mixer, MIXERS)
    d, H = cfg.d, cfg.n_heads
    H_kv, d_h = cfg.H_kv, cfg.d_h
    ab = int(cfg.attn_bias)
    if cfg.qkv == "unified":
        attention = d * d + ab * d + H * d_h * d + ab * d               # one d -> d projection, W_O: d/3 -> d
    elif cfg.qkv == "separate":
        attention = (d * H * d_h + ab * H * d_h) + 2 * (d * H_kv * d_h + ab * H_kv * d_h) + (H * d_h * d + ab * d)
    else:
        raise unknown_kind("qkv", cfg.qkv, QKV)
    out = {"attention (W_Q, W_K, W_V, W_O)": attention}
    if gcla_on(cfg):
        out["GCLA gate W_gate"] = d * H * d_h + ab * H * d_h
        out["GCLA context W_K^ctx, W_V^ctx"] = 2 * (d * H_kv * d_h + ab * H_kv * d_h)
        out["GCLA blend phi"] = 1
    return {**out, **ffn_and_norms(cfg)}


def ffn_and_norms(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of one layer's feed-forward and its two norms."""
    d, h, fb = cfg.d, cfg.hidden, int(cfg.ffn_bias)
    out = {}
    if cfg.ffn == "moe":
        out["MoE router W_r"] = d * cfg.moe_experts
        out["MoE experts"] = cfg.moe_experts * swiglu_params(cfg)
    elif cfg.ffn == "dsff":
        d_A = cfg.d_ff_a or d
        out["DSFF streams"] = 3 * d * d_A + fb * (2 * d_A + d) + 2 * d * h + fb * (h + d)
        out["DSFF fusion gate W_f"] = 2 * d * d + fb * d
    elif cfg.ffn == "swiglu":
        out["feed-forward"] = swiglu_params(cfg)
    elif cfg.ffn in ACTIVATIONS:
        out["feed-forward"] = 2 * d * h + fb * (h + d)
    else:
        raise unknown_kind("ffn", cfg.ffn, FFNS)
    out["two norms"] = 2 * norm_params(cfg)
    return out


def gcla_on(cfg: ModelConfig) -> bool:
    """Whether the layers carry GCLA (either summary kind: the same parameters)."""
    if cfg.gcla != "off" and cfg.gcla not in SUMMARIES:
        raise unknown_kind("gcla", cfg.gcla, ("off", *SUMMARIES))
    return cfg.gcla != "off"


def swiglu_params(cfg: ModelConfig) -> int:
    """One SwiGLU of the config's hidden width h (the FFN, or one expert of an MoE): gate, up (d -> h) and down
    (h -> d), 3 d h, with biases 2h + d more."""
    return 3 * cfg.d * cfg.hidden + int(cfg.ffn_bias) * (2 * cfg.hidden + cfg.d)


def param_breakdown(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of the whole model, by component; the tied head is counted once, with the embedding."""
    out = {"embedding (tied head)" if cfg.tie_head else "embedding": cfg.vocab_size * cfg.d}
    if not cfg.tie_head:
        out["head"] = cfg.vocab_size * cfg.d
    if cfg.positions == "learned":
        out["learned positions"] = cfg.context * cfg.d
    elif cfg.positions not in POSITIONS:
        raise unknown_kind("positions", cfg.positions, POSITIONS)
    for name, n in layer_params(cfg).items():
        out[name] = cfg.n_layers * n
    if pre_norm(cfg):
        out["final norm"] = norm_params(cfg)
    return out


def count_params(cfg: ModelConfig) -> int:
    """Total parameters, from the config alone; equals `LanguageModel(cfg).n_params()` (tested for every preset)."""
    return sum(param_breakdown(cfg).values())


def active_params(cfg: ModelConfig) -> int:
    """Parameters one token uses: all of them for a dense model; with ffn="moe" the E - k experts a token is not
    sent to are left out of every layer (the router counts: every token uses it). The tied embedding counts once,
    as in `count_params`."""
    idle = cfg.moe_experts - cfg.moe_k if cfg.ffn == "moe" else 0
    return count_params(cfg) - cfg.n_layers * idle * swiglu_params(cfg)


def dsff_widths(cfg: ModelConfig, target: int, ratio: int = 3, multiple: int = 64) -> tuple[int, int]:
    """DSFF widths (d_A, d_B = ratio * d_A) that bring `cfg` closest to `target` parameters (lesson 10).

    Without biases the streams hold L d (3 d_A + 2 d_B) = L d (3 + 2 ratio) d_A parameters; everything else is
    fixed by the other fields. So d_A = (target - fixed) / (L d (3 + 2 ratio)), rounded to a multiple of `multiple`.
    """
    if cfg.ffn != "dsff" or cfg.ffn_bias:
        raise ValueError("dsff_widths needs ffn='dsff' without biases")
    if multiple < 1 or ratio < 1:
        raise ValueError(f"multiple and ratio must be >= 1, got {multiple} and {ratio}")
    per_unit = cfg.n_layers * cfg.d * (3 + 2 * ratio)            # parameters per unit of d_A
    streams = cfg.n_layers * cfg.d * (3 * (cfg.d_ff_a or cfg.d) + 2 * cfg.hidden)   # the config's own streams
    fixed = count_params(cfg) - streams
    if target < fixed + per_unit * multiple:
        raise ValueError(f"target {target:,} leaves no room for the DSFF streams: the rest of the model already has "
                         f"{fixed:,} parameters")
    d_A = round((target - fixed) / per_unit / multiple) * multiple
    return d_A, ratio * d_A


def check_memory_args(T: int, bytes_per_number: int, batch: int) -> None:
    if T < 0 or batch < 1 or bytes_per_number < 1:
        raise ValueError(f"need T >= 0, batch >= 1 and bytes_per_number >= 1, got {T}, {batch}, {bytes_per_number}")


def kv_cache_bytes(cfg: ModelConfig, T: int, bytes_per_number: int = 2, batch: int = 1) -> int:
    """KV-cache memory for T positions (Wiola eq. 38 done right): keys and values, L layers, H_kv heads of d_h
    numbers each, per position: 2 L H_kv d_h T b. Causal GCLA adds a running sum of d numbers per layer."""
    check_memory_args(T, bytes_per_number, batch)
    if cfg.mixer != "attention":
        raise ValueError(f"mixer={cfg.mixer!r} keeps no KV cache: its decoding memory is state_bytes(cfg)")
    keys_values = 2 * cfg.n_layers * cfg.H_kv * cfg.d_h * T
    summaries = cfg.n_layers * cfg.d if gcla_on(cfg) and cfg.gcla == "causal" else 0
    return batch * (keys_values + summaries) * bytes_per_number


def state_bytes(cfg: ModelConfig, bytes_per_number: int = 4, batch: int = 1) -> int:
    """The decoding state of an SSM model (mixer="ssm"): per layer and sequence, d channels of N real numbers (for
    "s4d" N/2 complex ones, two numbers each): L d N b, whatever the length T. The layer keeps it in float32 or
    wider (`ssm.SSM.forward`), hence the default of 4 bytes a number."""
    check_memory_args(0, bytes_per_number, batch)
    if cfg.mixer != "ssm":
        raise ValueError(f"state_bytes counts an SSM's state; mixer={cfg.mixer!r} keeps a KV cache: kv_cache_bytes")
    return batch * cfg.n_layers * cfg.d * cfg.ssm_state * bytes_per_number


def ssm_flops(cfg: ModelConfig, T: int) -> dict[str, float]:
    """Forward FLOPs per token of one SSM mixer for sequences of T tokens.

    Projections: W_in 2 d (2d), W_out 2 d d. kind="s4d", the convolutional view: the kernel's T entries per channel
    are each a sum of N/2 complex products c_n b_n a_n^k (8 FLOPs a term: a complex multiply and add), made once per
    sequence: 4 d N per token; the convolution takes three real FFTs of n = 2T points (u, K, and back; a real FFT
    costs about 2.5 n log2 n) and n/2 + 1 complex products (6 each): d (15 log2(2T) + 6) per token. kind="selective":
    W_Delta, W_B, W_C, 2 d (d + 2N), and per state number about 10 (ZOH's exp and expm1 counted as one each, the
    update A_bar x + B_bar u, the read-out C x). The gate, D u and SiLU are O(d), left out."""
    d, N = cfg.d, cfg.ssm_state
    out = {"SSM projections W_in, W_out": 2 * d * 3 * d}
    if cfg.ssm_kind == "s4d":
        out["SSM kernel K (once per sequence)"] = 4 * d * N
        out["SSM FFT convolution"] = d * (15 * math.log2(2 * T) + 6) if T else 0.0
    elif cfg.ssm_kind == "selective":
        out["SSM selection W_Delta, W_B, W_C"] = 2 * d * (d + 2 * N)
        out["SSM scan (ZOH per token, update, read-out)"] = 10 * d * N
    else:
        raise unknown_kind("ssm_kind", cfg.ssm_kind, SSM_KINDS)
    return out


def layer_flops(cfg: ModelConfig, T: int, mu: float = 0.0) -> dict[str, float]:
    """Forward FLOPs per token of one layer, by component, for sequences of T tokens.

    `mu` is ATM's merge ratio (eq. 33): the attention sub-layer then runs on T' = (1 - mu) T tokens, so every
    per-token cost in it shrinks by (1 - mu), and the core, whose per-token cost also grows with the number of
    keys, by (1 - mu)^2. The feed-forward runs at full length after unmerging.
    """
    if cfg.mixer == "ssm":
        return {**ssm_flops(cfg, T), **ffn_flops(cfg)}
    if cfg.mixer != "attention":
        raise unknown_kind("mixer", cfg.mixer, MIXERS)
    d, H = cfg.d, cfg.n_heads
    H_kv, d_h = cfg.H_kv, cfg.d_h
    keep = 1.0 - mu
    if cfg.qkv == "separate":
        projections = keep * 2 * d * d_h * (2 * H + 2 * H_kv)
    elif cfg.qkv == "unified":
        projections = keep * 2 * (d * d + d_h * H * d)
    else:
        raise unknown_kind("qkv", cfg.qkv, QKV)
    out = {"q, k, v, o projections": projections, "attention core (eq. 39)": keep * keep * 4 * T * H * d_h}
    if gcla_on(cfg):
        out["GCLA output gate (eq. 28)"] = keep * 2 * d * H * d_h
        out["GCLA context scores + sum (eq. 26)"] = keep * 4 * LAMBDA * H * d_h
        # W_K^ctx and W_V^ctx on Lambda summaries: every position has its own in the causal form (and ATM keeps
        # one per slot); the literal form projects Lambda summaries once per sequence
        per_token = keep if cfg.gcla == "causal" else 1.0 / T
        out["GCLA context projections (eqs. 24-25)"] = per_token * 2 * LAMBDA * 2 * d * H_kv * d_h
    return {**out, **ffn_flops(cfg)}


def ffn_flops(cfg: ModelConfig) -> dict[str, float]:
    """Forward FLOPs per token of one layer's feed-forward (its products). A mixture of experts: the router
    (2 d E) and the k experts the token is sent to (k SwiGLUs), not the E - k others."""
    d, out = cfg.d, {}
    if cfg.ffn == "moe":
        out["MoE router W_r"] = 2 * d * cfg.moe_experts
        out["feed-forward (k active experts)"] = cfg.moe_k * 2 * 3 * d * cfg.hidden
    elif cfg.ffn == "dsff":
        d_A = cfg.d_ff_a or d
        out["feed-forward"] = 2 * (3 * d * d_A + 2 * d * cfg.hidden)
        out["DSFF fusion gate W_f"] = 2 * 2 * d * d
    elif cfg.ffn == "swiglu":
        out["feed-forward"] = 2 * 3 * d * cfg.hidden            # gate, up and down
    elif cfg.ffn in ACTIVATIONS:
        out["feed-forward"] = 2 * 2 * d * cfg.hidden            # up and down
    else:
        raise unknown_kind("ffn", cfg.ffn, FFNS)
    return out


def forward_flops(cfg: ModelConfig, T: int, mu: float = 0.0) -> float:
    """Forward FLOPs per token of the whole model: the layers (ATM's mu applied to the middle third when
    cfg.atm is on) and the tied head (2 d V). The embedding lookup is free."""
    if not 0 <= mu < 1:
        raise ValueError(f"the merge ratio mu must be in [0, 1), got {mu}")
    if mu and cfg.atm == "off":
        raise ValueError("mu > 0 needs a config with atm on")
    if cfg.atm not in ("off", *ATM_KINDS):
        raise unknown_kind("atm", cfg.atm, ("off", *ATM_KINDS))
    merging = set(atm_layers(cfg.n_layers)) if cfg.atm != "off" else set()
    layers = sum(sum(layer_flops(cfg, T, mu if i in merging else 0.0).values()) for i in range(cfg.n_layers))
    return layers + 2 * cfg.d * cfg.vocab_size


def training_flops(cfg: ModelConfig, T: int, mu: float = 0.0) -> float:
    """Training FLOPs per token: forward plus backward, about 3x the forward (the backward computes gradients with
    respect to both the inputs and the weights of every product: twice the forward's work)."""
    return 3 * forward_flops(cfg, T, mu)


# ----------------------------------------------------------------------------------------------------
# The three layouts (lesson 15): encoder-only, decoder-only, encoder-decoder
# ----------------------------------------------------------------------------------------------------

def cross_attention_params(cfg: ModelConfig) -> int:
    """One `attention.CrossAttention`: W_Q, W_K, W_V (d -> H d_h) and W_O (H d_h -> d), with biases if attn_bias."""
    d = cfg.d                                   # H d_h = d: full multi-head, whatever the self-attention's qkv
    return 4 * d * d + int(cfg.attn_bias) * 4 * d


def encdec_breakdown(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of `encdec.EncoderDecoder(cfg)` by component: the shared embedding (and head), L encoder layers
    (each a decoder-only layer: the mask holds no parameters), L decoder layers (the same, plus a cross-attention
    and its norm), and the two final norms (encoder and decoder)."""
    check_rules(cfg, ENCDEC_RULES)                        # the same refusals as the model's
    layer = sum(layer_params(cfg).values())
    out = {"embedding (tied head)" if cfg.tie_head else "embedding": cfg.vocab_size * cfg.d}
    if not cfg.tie_head:
        out["head"] = cfg.vocab_size * cfg.d
    out["encoder layers"] = cfg.n_layers * layer
    out["decoder layers without cross-attention"] = cfg.n_layers * layer
    out["cross-attention and its norm"] = cfg.n_layers * (cross_attention_params(cfg) + norm_params(cfg))
    out["final norms (encoder, decoder)"] = 2 * norm_params(cfg)
    return out


def encdec_params(cfg: ModelConfig) -> int:
    """Total parameters of `encdec.EncoderDecoder(cfg)`; equals its n_params() (tested)."""
    return sum(encdec_breakdown(cfg).values())


def cross_flops(cfg: ModelConfig, S: int, T: int) -> float:
    """Forward FLOPs of one cross-attention layer for a source of S and a target of T tokens (a whole sequence,
    not per token): W_Q and W_O on the T target tokens, W_K and W_V on the S source tokens (once: the memory does
    not change while the target is read), and the core, every target query against all S keys (4 S H d_h each)."""
    d = cfg.d                                              # H d_h = d
    return T * 2 * 2 * d * d + S * 2 * 2 * d * d + T * 4 * S * d


def layout_costs(cfg: ModelConfig, source_len: int, target_len: int) -> dict[str, dict]:
    """The three layouts at the width and depth of `cfg`, on one example of a source of S = source_len tokens and
    a target of U = target_len tokens (a span-corruption pair, say). For each: its layers, its parameters, its
    forward FLOPs for the example (`flops`, of which `head_flops` the head's) and per token of it (over S + U),
    the (query, key) pairs its attention scores after masking, summed over layers, and in words what a token
    attends to.

      encoder-only (BERT): one sequence of S + U tokens (the source and U masked slots to fill), no mask;
      decoder-only (GPT): one sequence of S + U tokens (the source, then the target), causal;
      encoder-decoder (T5): L encoder layers over S, L decoder layers over U with cross-attention to S.

    FLOPs follow this file's conventions (`layer_flops`: products only, the attention core counted against every
    key, eq. 39, so the masked half a causal kernel may skip is still counted; `attended_pairs` tells the
    difference). The head (2 d V a token) runs where logits are made: every position of the one-sequence layouts
    (as `LanguageModel` computes them), the U target positions of the encoder-decoder (the encoder has none)."""
    if source_len < 1 or target_len < 1:
        raise ValueError(f"need source_len >= 1 and target_len >= 1, got {source_len} and {target_len}")
    S, U, L = source_len, target_len, cfg.n_layers
    N = S + U
    encoder_cfg = dataclasses.replace(cfg, causal=False)
    head = 2 * cfg.d * cfg.vocab_size
    one_sequence = N * forward_flops(cfg, N)        # encoder-only and decoder-only alike (eq. 39 counts every key)
    encdec = (S * L * sum(layer_flops(encoder_cfg, S).values())            # the encoder, per source token
              + U * L * sum(layer_flops(cfg, U).values())                  # the decoder's self-attention and FFN
              + L * cross_flops(cfg, S, U) + U * head)
    out = {
        "encoder-only": dict(layers=L, params=count_params(encoder_cfg), flops=one_sequence, attended_pairs=L * N * N,
                             attends_to="every token of its one sequence, before and after it (no mask)"),
        "decoder-only": dict(layers=L, params=count_params(cfg), flops=one_sequence,
                             attended_pairs=L * N * (N + 1) // 2,
                             attends_to="itself and the tokens before it (source, then the target so far)"),
        "encoder-decoder": dict(layers=2 * L, params=encdec_params(cfg), flops=encdec,
                                attended_pairs=L * (S * S + U * (U + 1) // 2 + U * S),
                                attends_to="a source token: every source token; a target token: itself and the "
                                           "targets before it (self), and every source token (cross)"),
    }
    out["encoder-decoder"]["head_flops"] = U * head
    out["encoder-only"]["head_flops"] = out["decoder-only"]["head_flops"] = N * head
    for layout in out.values():
        layout["flops_per_token"] = layout["flops"] / N
    return out
