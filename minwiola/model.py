"""The decoder-only language model: one config, the block, the model, and named presets (lessons 02-04).

    ids (B, T) -> token embedding (+ absolute positions) -> L blocks -> final norm -> tied head -> logits (B, T, V)

A pre-norm block (GPT-2, LLaMA, Wiola eqs. 1-6 with plain parts) is

    x = x + Attention(Norm(x));   x = x + FFN(Norm(x))

and a post-norm block (the original Transformer) is x = Norm(x + Attention(x)); x = Norm(x + FFN(x)). The head
is tied to the embedding: logits = h E^T (Wiola eq. 7), so the V x d table is stored once. The token mixer is
attention (or GCLA), or with mixer="ssm" a state-space layer (`ssm.SSM`, lesson 13) in the same place. The FFN is
dense, or with ffn="moe" a mixture of experts (`moe.MoE`, lesson 14) whose balancing losses the model sums for the
trainer (`LanguageModel.aux_loss`).

Every choice is a field of `ModelConfig`; an ablation is a different config, never a different model class.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.checkpoint
import torch.nn.functional as F
from torch import nn

from . import atm, evaluating     # evaluating: also imported from here (generate, train, diffusion)
from .attention import ATTENTION_POSITIONS, IMPLS, QKV, DecodingState, MultiHeadAttention, head_shape
from .ffn import ACTIVATIONS, DSFF, FFNS, MLP, SwiGLU, swiglu_hidden
from .gcla import GCLA, QUERIES, SUMMARIES, cross_layer_context
from .moe import MoE, moe_layers, moe_stats
from .norm import NORMS, LayerNorm, RMSNorm, WiolaRMSNorm
from .positions import POSITIONS, ROPE_SCALINGS, check_srpe, sinusoidal
from .ssm import KINDS as SSM_KINDS, SSM
from .tools import load_json


@functools.cache
def field_types(cls) -> dict[str, tuple[type, bool]]:
    """Each field of the dataclass `cls` as (type, optional): `int | None` gives (int, True), `float` (float,
    False). Read from the annotations themselves, so a new field of any type is described too."""
    hints = typing.get_type_hints(cls)
    described = {}
    for f in dataclasses.fields(cls):
        args = typing.get_args(hints[f.name])
        optional = type(None) in args and isinstance(hints[f.name], types.UnionType)
        others = [a for a in args if a is not type(None)] if optional else []
        described[f.name] = (others[0] if len(others) == 1 else hints[f.name], optional)
    return described


def check_field_types(config, may_be_infinite: set[str] = frozenset()) -> None:
    """Raise ValueError unless every field of the dataclass `config` holds a value of its declared type.

    Why: a config often comes from text (`--set attn_bias=False`, a config.json), and Python would happily keep the
    string "False" (which is true) or a float where an int is meant. A bool is not accepted as a number, an int is
    accepted as a float, and a float must be finite unless its field is in `may_be_infinite` (inf in srpe_f would
    give NaN position tables). Fields of other types (tuples, dicts) are left to the config's own checks."""
    for name, (kind, optional) in field_types(type(config)).items():
        value = getattr(config, name)
        if value is None and optional:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = {bool: isinstance(value, bool), int: number and isinstance(value, int), float: number,
              str: isinstance(value, str)}.get(kind, True)
        if not ok:
            raise ValueError(f"{name} must be {'an' if kind is int else 'a'} {kind.__name__}"
                             f"{' or None' if optional else ''}, got {value!r}")
        if kind is float and not math.isfinite(value) and not (name in may_be_infinite and value == math.inf):
            raise ValueError(f"{name} must be a finite number{' or inf' if name in may_be_infinite else ''}, "
                             f"got {value!r}")


# A field of `ModelConfig` declares its rules beside it, in its metadata (read back from `dataclasses.fields`), so a
# new field is one line.

def declared(default, *, choices: tuple = (), positive: bool = False, later: bool = False) -> dataclasses.Field:
    """A config field with its rules: `choices`, the values it may take; `positive`, a positive int (or None where
    its type allows None); `later`, added after models were shipped and runs saved, so a config.json without it
    means its default, which is what those models were built with (`ADDED_LATER`)."""
    return dataclasses.field(default=default, metadata={"choices": choices, "positive": positive, "later": later})


def choice(default, options: tuple, later: bool = False) -> dataclasses.Field:
    """A config field that takes one of `options`."""
    return declared(default, choices=options, later=later)


def positive(default, later: bool = False) -> dataclasses.Field:
    """A config field that holds a positive int (or None, where its type says `int | None`)."""
    return declared(default, positive=True, later=later)


MIXERS = ("attention", "ssm")
NORM_POSITIONS = ("pre", "post")


def unknown_kind(field: str, value, kinds: tuple) -> ValueError:
    """The error every dispatch on a kind raises when the kind is none it knows: a new kind must be taught to each
    place that builds or counts it, never be taken silently for another."""
    return ValueError(f"{field} must be one of {kinds}, got {value!r}")


# Which features exclude which, written once. A rule (when, needs, message): a config for which when(c) holds must
# have needs(c), else ValueError(message), with the config's values filled in (message.format(c=config)). Each
# component checks only its own arguments; what one feature asks of another is here.
RULES = [
    # a mixer other than attention (a state-space layer) has no attention scores, heads or context keys: what acts
    # on them does not apply
    (lambda c: c.mixer != "attention", lambda c: c.positions not in ("rope", "srpe", "alibi"),
     "mixer={c.mixer!r} has no attention scores to rotate or bias: positions={c.positions!r} does not apply; use "
     "positions='none' (the scan knows the order of the tokens)"),
    (lambda c: c.mixer != "attention", lambda c: c.gcla == "off",
     "mixer={c.mixer!r} needs gcla='off' (gcla is a part of attention), got {c.gcla!r}"),
    (lambda c: c.mixer != "attention", lambda c: c.atm == "off",
     "mixer={c.mixer!r} needs atm='off' (atm is a part of attention), got {c.atm!r}"),
    (lambda c: c.mixer != "attention", lambda c: c.qkv == "separate",
     "mixer={c.mixer!r} needs qkv='separate' (qkv is a part of attention), got {c.qkv!r}"),
    (lambda c: c.mixer == "ssm" and c.ssm_kind == "s4d", lambda c: c.ssm_state % 2 == 0,
     "ssm_state={c.ssm_state} must be even for ssm_kind='s4d' (N/2 complex modes)"),
    (lambda c: c.gcla != "off", lambda c: c.qkv == "separate",
     "gcla needs qkv='separate' (its context keys are grouped like the self-attention's)"),
    (lambda c: c.atm != "off", lambda c: c.norm_position == "pre",
     "atm needs norm_position='pre' (it merges the normed input of the attention branch)"),
    (lambda c: c.rope_scaling != "none", lambda c: c.positions == "rope",
     "rope_scaling={c.rope_scaling!r} rescales RoPE's angles: it needs positions='rope', got {c.positions!r}"),
    (lambda c: c.positions == "sinusoidal", lambda c: c.d % 2 == 0,
     "positions='sinusoidal' needs an even d, got {c.d}"),
    # causal=False: what is built on the causal order (GCLA's prefix means, ATM's copy-forward, a left-to-right
    # scan) has no bidirectional form, and ALiBi's bias -m (i - j) is defined for keys j <= i only (for j > i it
    # would reward distance)
    (lambda c: not c.causal, lambda c: c.gcla == "off",
     "causal=False needs gcla='off' (its {c.gcla!r} form is built on the causal order)"),
    (lambda c: not c.causal, lambda c: c.atm == "off",
     "causal=False needs atm='off' (its {c.atm!r} form is built on the causal order)"),
    (lambda c: not c.causal, lambda c: c.mixer == "attention",
     "causal=False needs mixer='attention' (its {c.mixer!r} form is built on the causal order)"),
    (lambda c: not c.causal, lambda c: c.positions != "alibi",
     "causal=False cannot use positions='alibi' (its bias is defined for past keys only); use 'rope', 'learned', "
     "'sinusoidal' or 'none'"),
    (lambda c: True, lambda c: c.moe_k <= c.moe_experts,
     "moe_k={c.moe_k} must be at most moe_experts={c.moe_experts} (k of E experts)"),
]

# What the encoder-decoder layout (`encdec.EncoderDecoder`, lesson 15) asks of the decoder's config on top of RULES.
# Refused: what is built on one causal stream or needs a per-token decoding state (GCLA, ATM, a state-space mixer),
# ALiBi (a bias for past keys only, which the encoder has not), positions added to the embedding (learned,
# sinusoidal: source and target would need tables of their own; here positions live in the self-attention),
# post-norm, and a mixture of experts (its balancing loss is not wired into `EncoderDecoder.loss`).
ENCDEC_RULES = [
    (lambda c: True, lambda c: c.gcla == "off", "EncoderDecoder cannot use gcla={c.gcla!r} (needs 'off')"),
    (lambda c: True, lambda c: c.atm == "off", "EncoderDecoder cannot use atm={c.atm!r} (needs 'off')"),
    (lambda c: True, lambda c: c.mixer == "attention",
     "EncoderDecoder cannot use mixer={c.mixer!r} (needs 'attention')"),
    (lambda c: True, lambda c: c.positions in ("rope", "srpe", "none"),
     "EncoderDecoder cannot use positions={c.positions!r} (needs 'rope', 'srpe' or 'none': positions inside "
     "self-attention)"),
    (lambda c: True, lambda c: c.norm_position == "pre",
     "EncoderDecoder cannot use norm_position={c.norm_position!r} (needs 'pre')"),
    (lambda c: True, lambda c: c.ffn != "moe",
     "EncoderDecoder cannot use ffn='moe' (its balancing loss is not part of EncoderDecoder.loss)"),
    (lambda c: True, lambda c: c.causal,
     "EncoderDecoder cannot use causal=False (pass the decoder's config; the encoder drops the mask itself)"),
]


def check_rules(config, rules: list) -> None:
    """Raise ValueError with the message of the first rule in `rules` (RULES, ENCDEC_RULES) that `config` breaks."""
    for when, needs, message in rules:
        if when(config) and not needs(config):
            raise ValueError(message.format(c=config))


@dataclass
class ModelConfig:
    """Every architectural choice of the model. Names follow the paper: d, L (n_layers), H, H_kv, V, T."""

    vocab_size: int = positive(4096)                      # V
    context: int = positive(512)                          # the longest sequence the model accepts (T_max)
    d: int = positive(64)                                 # model width
    n_layers: int = positive(4)                           # L
    n_heads: int = positive(4)                            # H, query heads
    n_kv_heads: int | None = positive(None)               # H_kv, key/value heads; None means H (multi-head attention)
    d_ff: int | None = positive(None)                     # the FFN's hidden width, read by ffn: an MLP's (None: 4d); a
                                                          # SwiGLU's (None: 8d/3 rounded up to 8); DSFF's wide GELU
                                                          # stream d_B (None: 4d; the narrow one is d_ff_a); each MoE
                                                          # expert's, a SwiGLU (None: 8d/3 as for SwiGLU)
    d_ff_a: int | None = positive(None)                   # DSFF's narrow SwiGLU stream width d_A (None: d)
    ffn: str = choice("swiglu", FFNS)                     # "gelu", "relu", "silu" (an MLP), "swiglu", "dsff" or "moe"
                                                          # (mixture of experts, lesson 14: moe_experts SwiGLUs, moe_k
                                                          # of them active per token)
    norm: str = choice("rmsnorm", NORMS)                  # "layernorm", "rmsnorm" or "wiola" (WiolaRMSNorm)
    norm_position: str = choice("pre", NORM_POSITIONS)    # "pre" (norm inside the residual branch) or "post" (after the
                                                          # residual add)
    norm_eps: float | None = declared(None, later=True)   # eps inside every norm's root; None: 1e-5 for LayerNorm, 1e-6
                                                          # for the RMS norms
    positions: str = choice("rope", POSITIONS)            # "rope", "srpe", "learned", "sinusoidal", "alibi" (a bias on
                                                          # the scores, no embedding and no rotation; lesson 12) or
                                                          # "none"
    srpe_k: float = 8.0                                   # SRPE k_s (eq. 12); math.inf switches the secondary winding
                                                          # off
    srpe_a: float = 0.05                                  # SRPE a_s (eq. 14), in [0, 1)
    srpe_f: float = 1 / 16                                # SRPE f_s (eq. 14)
    srpe_radius: str = declared("paper", later=True)      # SRPE radius: "paper" (eq. 14, depends on absolute position)
                                                          # or "offset" (a log spiral, rho^(p - p') in the score:
                                                          # relative; lesson 06)
    qkv: str = choice("separate", QKV)                    # "separate" Q, K, V projections, or Yocto's "unified" one
    attn_bias: bool = False                               # biases in the token mixer's projections (attention's, or the
                                                          # SSM's)
    ffn_bias: bool = False                                # biases in the feed-forward layers
    rope_theta: float = 10000.0                           # theta_0 of Wiola eq. 11
    rope_scaling: str = choice("none", ROPE_SCALINGS, later=True)   # RoPE read past its trained length with no
                                                          # training (lesson 12): "none", "interpolation", "ntk" or
                                                          # "yarn" (positions.rope_scaled), trained at context /
                                                          # rope_factor and read out to context
    rope_factor: float = declared(1.0, later=True)        # s = context / the length trained at; 1: plain RoPE
    dropout: float = 0.0                                  # on embeddings and on each residual branch, during training
                                                          # only
    attention: str = choice("fused", IMPLS)               # "explicit", "fused" or "tiled": the same math, different
                                                          # kernels
    init_std: float = 0.02                                # std of the normal initialisation of weights
    gcla: str = choice("off", ("off", *SUMMARIES))        # Gated Cross-Layer Attention: "off", "causal" (prefix-mean
                                                          # summaries) or "literal" (eq. 20's mean over the whole
                                                          # sequence: leaks the future)
    gcla_query: str = choice("plain", QUERIES)            # GCLA context query before rotation ("plain") or after it
                                                          # ("rotated", eq. 26)
    gcla_phi: float = -3.0                                # initial blend logit phi, beta = sigmoid(phi) (eq. 27)
    atm: str = choice("off", ("off", *atm.KINDS))         # Adaptive Token Merging in the middle third of the layers,
                                                          # during training: "off", "copy-forward" (causal) or "literal"
                                                          # (Algorithm 1: leaks the future)
    atm_tau: float = 0.92                                 # ATM's cosine threshold tau
    tie_head: bool = True                                 # the head reuses the embedding (Wiola eq. 7); False gives it
                                                          # its own V x d matrix (LLaMA-2, Mistral)
    mixer: str = choice("attention", MIXERS, later=True)  # the token mixer: "attention" or "ssm" (a state-space layer,
                                                          # lesson 13: no heads, no positions inside, a fixed-size
                                                          # decoding state; attn_bias gives its projections biases)
    ssm_state: int = positive(16, later=True)             # N, the state size of each channel of the SSM (even for
                                                          # "s4d": N/2 complex modes)
    ssm_kind: str = choice("s4d", SSM_KINDS, later=True)  # "s4d" (fixed diagonal system, trained by FFT convolution) or
                                                          # "selective" (Mamba-style: step, B and C depend on the token;
                                                          # trained by the scan)
    moe_experts: int = positive(8, later=True)            # E, the experts of each MoE layer
    moe_k: int = positive(2, later=True)                  # k, experts active per token (1 <= k <= E)
    moe_capacity: float = declared(0.0, later=True)       # capacity factor: each expert takes at most ceil(factor k N /
                                                          # E) of a batch's N tokens, the rest are dropped (position by
                                                          # position, first come first served); 0: no limit
    moe_aux: float = declared(0.01, later=True)           # weight of the Switch load-balancing loss in the training
                                                          # loss
    moe_z: float = declared(0.0, later=True)              # weight of the router z-loss (ST-MoE; 0: off)
    causal: bool = declared(True, later=True)             # the causal mask: True for a decoder (each token sees only
                                                          # its past); False for an encoder or a diffusion denoiser
                                                          # (every token sees every other: lesson 15). Without it there
                                                          # is no next-token prediction and no KV-cache decoding

    def __post_init__(self):
        fields = dataclasses.fields(self)
        for f in fields:                             # each field's own rules (`declared`): its choices first...
            allowed, value = f.metadata.get("choices"), getattr(self, f.name)
            if allowed and value not in allowed:
                raise ValueError(f"{f.name} must be one of {allowed}, got {value!r}")
        for f in fields:                             # ...then the positive ints
            value = getattr(self, f.name)
            if not f.metadata.get("positive") or (value is None and field_types(type(self))[f.name][1]):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{f.name} must be a positive int, got {value!r}")
        check_field_types(self, may_be_infinite={"srpe_k"})     # srpe_k = inf switches the second winding off
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not self.rope_factor >= 1:
            raise ValueError(f"rope_factor must be >= 1 (the length read over the length trained), got {self.rope_factor}")
        if not self.init_std > 0:
            raise ValueError(f"init_std must be > 0, got {self.init_std}")
        if self.norm_eps is not None and not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0 (or None for each norm's default), got {self.norm_eps}")
        check_srpe(self.srpe_k, self.srpe_a, self.srpe_f, self.srpe_radius,
                   self.context if self.positions == "srpe" else None)   # "offset": radii bounded over the context
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.mixer == "attention":
            head_shape(self.d, self.n_heads, self.n_kv_heads, self.qkv)     # the heads' divisibility rules
        if not -1.0 <= self.atm_tau <= 1.0:
            raise ValueError(f"atm_tau is a cosine threshold in [-1, 1], got {self.atm_tau}")
        for name in ("moe_capacity", "moe_aux", "moe_z"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0{' (0: no capacity limit)' if name == 'moe_capacity' else ''}"
                                 f", got {getattr(self, name)}")
        check_rules(self, RULES)                     # which features exclude which

    @property
    def H_kv(self) -> int:
        """Key/value heads: n_kv_heads, or H when None (multi-head attention)."""
        return head_shape(self.d, self.n_heads, self.n_kv_heads, self.qkv)[0]

    @property
    def d_h(self) -> int:
        """Head width: d / H, or d / (3H) for Yocto's unified projection."""
        return head_shape(self.d, self.n_heads, self.n_kv_heads, self.qkv)[1]

    @property
    def hidden(self) -> int:
        """The FFN hidden width actually used: d_ff, or the default of the ffn kind (for DSFF: d_B)."""
        if self.ffn in ("swiglu", "moe"):
            return swiglu_hidden(self.d) if self.d_ff is None else self.d_ff
        if self.ffn in (*ACTIVATIONS, "dsff"):
            return 4 * self.d if self.d_ff is None else self.d_ff
        raise unknown_kind("ffn", self.ffn, FFNS)


# The fields added after models were shipped (`declared(..., later=True)`): a saved config.json without one means
# its default.
ADDED_LATER = frozenset(f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("later"))

WIOLA = dict(norm="wiola", positions="srpe", gcla="causal", atm="copy-forward")   # the five parts, causal forms

PRESETS: dict[str, dict] = {
    # Yocto's published shape (its README): 484,272 parameters with V = 4,000.
    "yocto": dict(vocab_size=4000, context=512, d=72, n_layers=4, n_heads=3, d_ff=288, ffn="gelu", ffn_bias=True,
                  norm="layernorm", positions="rope", qkv="unified", attn_bias=False),
    # GPT-2's recipe at Yocto's scale: learned positions, LayerNorm, GELU MLP of 4d, biases everywhere.
    "gpt2-style": dict(vocab_size=4096, context=512, d=64, n_layers=4, n_heads=4, ffn="gelu", ffn_bias=True,
                       norm="layernorm", positions="learned", qkv="separate", attn_bias=True),
    # LLaMA's recipe at Yocto's scale: RMSNorm, SwiGLU of 8d/3, RoPE, no biases.
    "llama-style": dict(vocab_size=4096, context=512, d=64, n_layers=4, n_heads=4, ffn="swiglu",
                        norm="rmsnorm", positions="rope", qkv="separate"),
    # The same recipe with an S4D state-space mixer (N = 16) in place of attention, and no positions. The mixer
    # holds 3d^2 + 2d + 2dN = 14,464 parameters a layer, attention 4d^2 = 16,384; a SwiGLU of d_ff = 186 (not 176)
    # gives the 4 x 1,920 back, so both hold exactly 463,424 parameters (lesson 13's like-for-like comparison).
    "ssm-llama-style": dict(vocab_size=4096, context=512, d=64, n_layers=4, ffn="swiglu", d_ff=186, norm="rmsnorm",
                            positions="none", mixer="ssm", ssm_state=16),
    # The same recipe with a mixture of experts in every layer (lesson 14): E = 6 SwiGLU experts of d_ff = 87, top-2.
    # Active per token, per layer: the router d E = 384 and two experts 2 x 3 d 87 = 33,408, 33,792 in all, as
    # llama-style's SwiGLU 3 d 176: so both have 463,424 active parameters (budget.active_params); the MoE holds
    # 730,688 in total (6 experts), as many as llama-style with d_ff = 524 (the dense model of equal total size).
    # Top-2, not top-1: with k = 1 the renormalised weight is 1 and the router would learn from the balancing loss only.
    "moe-llama-style": dict(vocab_size=4096, context=512, d=64, n_layers=4, n_heads=4, ffn="moe", moe_experts=6,
                            moe_k=2, d_ff=87, norm="rmsnorm", positions="rope", qkv="separate"),
    # llama-style as a masked-diffusion denoiser (lesson 15): no causal mask, and one id more than the tokenizer's
    # 4,096 for the absorbing [MASK] state (id 4,096, `diffusion.mask_id`). 463,424 + 64 (its embedding row, tied
    # to the head) = 463,488 parameters: the same network as llama-style otherwise.
    "diffusion-llama-style": dict(vocab_size=4097, context=512, d=64, n_layers=4, n_heads=4, ffn="swiglu",
                                  norm="rmsnorm", positions="rope", qkv="separate", causal=False),
    # The Wiola family (lesson 10). The paper states only wiola-360m's d, L, V, H, H_kv; its size tables are lost.
    # The other shapes are ours in the same spirit (d_h = 64, H_kv = H/4, L growing with d), and every DSFF pair
    # (d_A, d_B = 3 d_A) is what `budget.dsff_widths` derives for the nominal size (tested).
    "wiola-120m": dict(vocab_size=32000, context=2048, d=768, n_layers=12, n_heads=12, n_kv_heads=3, ffn="dsff",
                       d_ff_a=640, d_ff=1920, **WIOLA),
    "wiola-360m": dict(vocab_size=32000, context=2048, d=1024, n_layers=16, n_heads=16, n_kv_heads=4, ffn="dsff",
                       d_ff_a=1536, d_ff=4608, **WIOLA),
    "wiola-700m": dict(vocab_size=32000, context=2048, d=1536, n_layers=20, n_heads=24, n_kv_heads=6, ffn="dsff",
                       d_ff_a=1344, d_ff=4032, **WIOLA),
    "wiola-1.5b": dict(vocab_size=32000, context=2048, d=2048, n_layers=24, n_heads=32, n_kv_heads=8, ffn="dsff",
                       d_ff_a=1856, d_ff=5568, **WIOLA),
    # Small Wiolas for training here: one at Yocto's size (like for like, V = 4,096), one at the CS336 TinyStories
    # shape (d = 512, 4 layers, 16 heads, context 256).
    "wiola-yocto": dict(vocab_size=4096, context=512, d=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn="dsff",
                        d_ff_a=48, d_ff=144, **WIOLA),
    "wiola-cs336": dict(vocab_size=4096, context=256, d=512, n_layers=4, n_heads=16, n_kv_heads=4, ffn="dsff",
                        d_ff_a=480, d_ff=1440, **WIOLA),
    # The shipped story model (minwiola/assets/story-model, chosen in lesson 11 section 7): llama-style's shape (full
    # multi-head attention) with the five parts, DSFF widths 44 / 134 so that it holds as many parameters as
    # llama-style widened to d_ff = 200 (513,156 against 512,576), dropout 0.1, and ATM's threshold calibrated on a
    # run never reported (benchmarks/convergence.py). Its recipe (minwiola/recipes.py): lr 0.03, batches 32 x 256.
    "wiola-story": dict(vocab_size=4096, context=512, d=64, n_layers=4, n_heads=4, qkv="separate", ffn="dsff",
                        d_ff_a=44, d_ff=134, dropout=0.1, atm_tau=0.4951, **WIOLA),
    # Its LLaMA-style baseline for the throughput comparison: the same shape, full multi-head attention, and a SwiGLU
    # of d_ff = 1,792 (not 8d/3 = 1,368) so that both hold the same number of parameters (17.3M, within 0.4%).
    "llama-cs336": dict(vocab_size=4096, context=256, d=512, n_layers=4, n_heads=16, d_ff=1792, ffn="swiglu",
                        norm="rmsnorm", positions="rope", qkv="separate"),
    # Published shapes of three comparison models (counted on the meta device; never trained here).
    "gpt2-124m": dict(vocab_size=50257, context=1024, d=768, n_layers=12, n_heads=12, d_ff=3072, ffn="gelu",
                      ffn_bias=True, norm="layernorm", positions="learned", attn_bias=True),
    "llama2-7b": dict(vocab_size=32000, context=4096, d=4096, n_layers=32, n_heads=32, d_ff=11008, ffn="swiglu",
                      norm="rmsnorm", positions="rope", tie_head=False),
    "mistral-7b": dict(vocab_size=32000, context=8192, d=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
                       ffn="swiglu", norm="rmsnorm", positions="rope", rope_theta=1e6, tie_head=False),
    # Tiny versions for tests and quick lessons.
    "tiny-gpt2": dict(vocab_size=64, context=32, d=24, n_layers=2, n_heads=2, ffn="gelu", ffn_bias=True,
                      norm="layernorm", positions="learned", attn_bias=True),
    "tiny-llama": dict(vocab_size=64, context=32, d=24, n_layers=2, n_heads=4, n_kv_heads=2, ffn="swiglu",
                       norm="rmsnorm", positions="rope"),
    "wiola-tiny": dict(vocab_size=64, context=32, d=24, n_layers=3, n_heads=4, n_kv_heads=2, ffn="dsff",
                       d_ff_a=24, d_ff=48, **WIOLA),
    "tiny-ssm": dict(vocab_size=64, context=32, d=24, n_layers=2, ffn="swiglu", norm="rmsnorm", positions="none",
                     mixer="ssm", ssm_state=8),
    "tiny-moe": dict(vocab_size=64, context=32, d=24, n_layers=2, n_heads=4, n_kv_heads=2, ffn="moe", moe_experts=4,
                     moe_k=2, d_ff=32, norm="rmsnorm", positions="rope"),
    "tiny-diffusion": dict(vocab_size=65, context=32, d=24, n_layers=2, n_heads=4, n_kv_heads=2, ffn="swiglu",
                           norm="rmsnorm", positions="rope", causal=False),     # tiny-llama + [MASK] = id 64
    "tiny-yocto": dict(vocab_size=64, context=32, d=24, n_layers=2, n_heads=2, d_ff=96, ffn="gelu",
                       ffn_bias=True, norm="layernorm", positions="rope", qkv="unified"),
}


def preset(name: str, **overrides) -> ModelConfig:
    """The named configuration, with any field overridden: `preset("yocto", vocab_size=4096)`."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets are {sorted(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown config field(s) {sorted(unknown)}; fields are {sorted(fields)}")
    return ModelConfig(**{**PRESETS[name], **overrides})


# The factories: each builds one part of a block from the whole config, and is the one place that part is chosen.

def make_mixer(cfg: ModelConfig) -> nn.Module:
    """The token mixer the config asks for. Every mixer takes `(x, *, context, cache, positions)` and makes its own
    decoding state with `new_cache(max_len)`."""
    if cfg.mixer == "ssm":
        return SSM(cfg.d, cfg.ssm_state, cfg.ssm_kind, bias=cfg.attn_bias)
    if cfg.mixer != "attention":
        raise unknown_kind("mixer", cfg.mixer, MIXERS)
    if cfg.positions in ATTENTION_POSITIONS:
        inside = cfg.positions
    elif cfg.positions in POSITIONS:
        inside = "none"                                      # absolute ones are added to the embedding, outside
    else:
        raise unknown_kind("positions", cfg.positions, POSITIONS)
    options = dict(positions=inside, bias=cfg.attn_bias, max_len=cfg.context, rope_theta=cfg.rope_theta,
                   impl=cfg.attention, srpe=(cfg.srpe_k, cfg.srpe_a, cfg.srpe_f), srpe_radius=cfg.srpe_radius,
                   rope_scaling=(cfg.rope_scaling, cfg.rope_factor))
    if not cfg.causal:                                       # GCLA refuses causal=False (RULES)
        options["causal"] = False
    if cfg.gcla != "off":
        return GCLA(cfg.d, cfg.n_heads, cfg.H_kv, cfg.gcla_query, cfg.gcla_phi, **options)
    return MultiHeadAttention(cfg.d, cfg.n_heads, cfg.H_kv, cfg.qkv, **options)


def make_ffn(cfg: ModelConfig) -> nn.Module:
    """The feed-forward layer the config asks for (ffn.py, moe.py): "gelu", "relu" or "silu" (an MLP), "swiglu",
    "dsff" (cfg.hidden is the wide stream's d_B, d_ff_a the narrow stream's d_A, None: d) or "moe" (moe_experts
    SwiGLUs of width cfg.hidden, moe_k active per token, moe_capacity 0 for no capacity limit)."""
    d, hidden, bias = cfg.d, cfg.hidden, cfg.ffn_bias
    if cfg.ffn == "swiglu":
        return SwiGLU(d, hidden, bias)
    if cfg.ffn == "dsff":
        return DSFF(d, cfg.d_ff_a if cfg.d_ff_a is not None else d, hidden, bias)
    if cfg.ffn == "moe":
        return MoE(d, hidden, cfg.moe_experts, cfg.moe_k, cfg.moe_capacity, bias)
    if cfg.ffn in ACTIVATIONS:
        return MLP(d, hidden, cfg.ffn, bias)
    raise unknown_kind("ffn", cfg.ffn, FFNS)


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The norm the config asks for ("layernorm", "rmsnorm" or "wiola", norm.py) for width d. norm_eps=None keeps
    each class's default (1e-5 for LayerNorm, as torch; 1e-6 for the RMS norms, as the Wiola and LLaMA code); CS336
    and many references use 1e-5 for RMSNorm too."""
    d = cfg.d
    options = {} if cfg.norm_eps is None else {"eps": cfg.norm_eps}
    if cfg.norm == "layernorm":
        return LayerNorm(d, **options)
    if cfg.norm == "rmsnorm":
        return RMSNorm(d, **options)
    if cfg.norm == "wiola":
        return WiolaRMSNorm(d, **options)
    raise unknown_kind("norm", cfg.norm, NORMS)


def pre_norm(cfg: ModelConfig) -> bool:
    """True for pre-norm blocks (the norm inside each residual branch), False for post-norm ones."""
    if cfg.norm_position not in NORM_POSITIONS:
        raise unknown_kind("norm_position", cfg.norm_position, NORM_POSITIONS)
    return cfg.norm_position == "pre"


def init_module(module: nn.Module, std: float) -> None:
    """One module's initialisation: a Linear's or Embedding's weight ~ N(0, std^2), a Linear's bias 0. Norms keep
    their own (gamma = 1, delta = 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def init_weights(model: nn.Module, std: float) -> None:
    """Initialise every module of `model` (`init_module`), then put DSFF's gate back to W_f = 0 (alpha = 1/2,
    Wiola's initialisation), which the normal draw overwrote."""
    model.apply(lambda module: init_module(module, std))
    for module in model.modules():
        if isinstance(module, DSFF):
            module.reset_gate()


def check_ids(idx: torch.Tensor, cfg: ModelConfig, start: int = 0, values: bool = True) -> None:
    """Raise ValueError unless idx is a (B, T) integer tensor of valid ids that fits the context after `start`
    tokens already seen. values=False checks the shape, dtype and length only: the scan of the values is the one
    step that must read a number back from the device (a host synchronisation), so a caller that has checked its ids
    where they came from (the trainer its token files, `generate_ids` its prompt) skips it in its loop."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"idx must be a (B, T) int64 (or int32) tensor of token ids, got "
                         f"{getattr(idx, 'dtype', type(idx).__name__)} of shape {tuple(getattr(idx, 'shape', ()))}")
    if start + idx.shape[1] > cfg.context:
        raise ValueError(f"sequence of {start + idx.shape[1]} tokens is longer than context={cfg.context}")
    if values and idx.numel():
        low, high = idx.aminmax()                          # one pass over the ids for both ends
        if low < 0 or high >= cfg.vocab_size:
            raise ValueError(f"token ids must be in [0, vocab_size={cfg.vocab_size}), got values in "
                             f"[{int(low)}, {int(high)}]")


class Block(nn.Module):
    """One decoder block: the token mixer (attention, GCLA or an SSM) then feed-forward, each in a residual branch
    with its norm.

    With GCLA the mixer also reads the cross-layer `context`; with ATM (`merges=True`, in training only) the
    attention runs on merged tokens and its output is unmerged before the residual add (Wiola: between eqs. 1-2).
    A merging block's `stats()` reports ATM's "atm_mu", which it declares an evaluation mean (`evaluation_means`).
    """

    def __init__(self, cfg: ModelConfig, merges: bool = False):
        super().__init__()
        self.pre = pre_norm(cfg)
        self.norm1 = make_norm(cfg)
        self.attn = make_mixer(cfg)         # the mixer (`.mixer`); saved models name it blocks.N.attn.*
        self.norm2 = make_norm(cfg)
        self.ffn = make_ffn(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        if merges and cfg.atm not in atm.KINDS:
            raise unknown_kind("atm", cfg.atm, ("off", *atm.KINDS))
        self.merge_kind = cfg.atm if merges else None
        self.tau = cfg.atm_tau
        self.last_slot: torch.Tensor | None = None      # the last merge plan (B, T), for lessons
        self.last_mu: float | None = None               # and its mu, read with the merged length: no extra read
        self.evaluation_means = ("atm_mu",) if merges else ()   # statistics an evaluation record holds as means

    @property
    def mixer(self) -> nn.Module:
        """The token mixer (attention, GCLA or an SSM: `make_mixer`). It is registered under the name `attn`, which
        saved models' tensor names (blocks.N.attn.*) and parameter names keep."""
        return self.attn

    def mix(self, h: torch.Tensor, cache: DecodingState | None, context: torch.Tensor | None) -> torch.Tensor:
        """The token-mixing branch on the normed input h, with token merging when this layer merges and trains."""
        if self.merge_kind is None or not self.training:
            return self.mixer(h, context=context, cache=cache)
        if cache is not None:
            raise ValueError("token merging runs in training only; decode with model.eval()")
        out, self.last_slot, self.last_mu = atm.merged_attention(self.mixer, h, self.tau, self.merge_kind, context)
        return out

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        """A residual branch's dropout, skipped outside training: there it does nothing, yet its module call would
        cost a decoding step microseconds (benchmarks/generation_bench.py's history)."""
        return self.drop(x) if self.training else x

    def stats(self) -> dict[str, float]:
        """{"atm_mu": mu = 1 - T'/T (eq. 33)} of this layer's latest training forward when it merges tokens (the
        trainer logs it: mu is measured, never assumed); {} otherwise."""
        if self.merge_kind is None or self.last_mu is None:
            return {}
        return {"atm_mu": self.last_mu}

    def forward(self, x: torch.Tensor, cache: DecodingState | None = None, context: torch.Tensor | None = None
                ) -> torch.Tensor:
        if self.pre:
            x = x + self.dropout(self.mix(self.norm1(x), cache, context))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.mix(x, cache, context)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class LanguageModel(nn.Module):
    """`model(idx)` maps token ids (B, T) to next-token logits (B, T, V). With `cache` (from `new_cache`) the ids
    continue the cached sequence: positions start where the cache ends, and only the new tokens are computed."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d)
        if cfg.positions == "learned":
            self.pos = nn.Embedding(cfg.context, cfg.d)
        elif cfg.positions == "sinusoidal":
            # The formula's rows have norm sqrt(d/2) (5.7 at d = 64), the token embeddings' about init_std sqrt(d)
            # (0.16): added as it is, the table would drown the tokens 35 to 1, and the model must first learn
            # embeddings 35 times larger (it trained worst of all encodings in lesson 12, and broke worst past its
            # length). The original Transformer avoids it by multiplying the embeddings by sqrt(d); that would
            # change the token path of this one encoding. We scale the table instead, to entries of RMS init_std,
            # like the learned table's rows at initialisation: a table of the embeddings' size, so the sinusoidal
            # and learned arms differ only in formula against trained rows (lesson 12).
            scale = cfg.init_std * math.sqrt(2)              # sin^2 + cos^2 = 1: entries of RMS 1/sqrt(2)
            self.register_buffer("pos_table", scale * sinusoidal(cfg.context, cfg.d), persistent=False)
        elif cfg.positions not in ATTENTION_POSITIONS:
            raise unknown_kind("positions", cfg.positions, POSITIONS)
        self.drop = nn.Dropout(cfg.dropout)
        merging = atm.atm_layers(cfg.n_layers) if cfg.atm != "off" else range(0)
        self.blocks = nn.ModuleList(Block(cfg, merges=i in merging) for i in range(cfg.n_layers))
        # post-norm blocks end in a norm already; pre-norm ones need a final norm before the head
        self.norm = make_norm(cfg) if pre_norm(cfg) else nn.Identity()
        self.head = None if cfg.tie_head else nn.Linear(cfg.d, cfg.vocab_size, bias=False)
        self.activation_checkpointing = False   # recompute each block's activations in backward (saves memory)
        init_weights(self, cfg.init_std)      # N(0, init_std^2) weights, zero biases, DSFF's gate at alpha = 1/2

    def _init(self, module: nn.Module) -> None:
        """One module's initialisation with this model's init_std (`init_module`)."""
        init_module(module, self.config.init_std)

    def new_cache(self) -> list[DecodingState]:
        """An empty decoding state, one per layer (each mixer makes its own `DecodingState`: a KV cache, GCLA's adds
        a running sum, an SSM's is its fixed-size state `ssm.SSMState`), for incremental decoding."""
        return [block.mixer.new_cache(self.config.context) for block in self.blocks]

    def aux_loss(self) -> torch.Tensor:
        """The sum of what the layers add to the training loss over their latest forward (each layer's
        `added_loss(config)`: MoE's weighted balancing and z-losses, `moe.MoE`). The trainer adds it to the loss it
        trains on, never to the reported loss. 0 when no layer adds one, or before a forward."""
        added = [layer.added_loss(self.config) for layer in self.blocks.modules() if hasattr(layer, "added_loss")]
        return sum((loss for loss in added if loss is not None), self.embed.weight.new_zeros(()))

    def stats(self) -> dict[str, list]:
        """What the layers measured in their latest forward, each statistic listed in layer order: every layer that
        has a `stats()` reports its own (ATM's merging blocks "atm_mu"; MoE layers "moe_load", "moe_dropped").
        The trainer logs this dict as it is; {} when no layer reports anything."""
        out: dict[str, list] = {}
        for layer in self.blocks.modules():
            for name, value in (layer.stats() if hasattr(layer, "stats") else {}).items():
                out.setdefault(name, []).append(value)
        return out

    def leaves_parameters_unused(self) -> bool:
        """True when a step may leave some parameters without a gradient: a layer says so itself (its
        `leaves_parameters_unused`; MoE's experts can get no token). DDP must be told (`find_unused_parameters`)."""
        return any(getattr(layer, "leaves_parameters_unused", False) for layer in self.blocks.modules())

    def evaluation_means(self) -> frozenset[str]:
        """The statistics of `stats()` that layers declare evaluation means (their `evaluation_means`: ATM's merging
        blocks "atm_mu"): an evaluation record holds each as its mean over the steps since the last one."""
        return frozenset(name for layer in self.blocks.modules() for name in getattr(layer, "evaluation_means", ()))

    # Earlier methods named for one feature, kept for lessons and benchmarks: the functions live in moe.py and atm.py.
    moe_layers = moe_layers
    moe_stats = moe_stats
    atm_similarities = atm.atm_similarities

    def check_ids(self, idx: torch.Tensor, start: int = 0, values: bool = True) -> None:
        """Raise ValueError unless idx is a (B, T) integer tensor of valid ids that fits the context."""
        check_ids(idx, self.config, start, values)

    def forward(self, idx: torch.Tensor, cache: list[DecodingState] | None = None, *,
                ids_checked: bool = False) -> torch.Tensor:
        """Logits (B, T, V) for ids idx (B, T). ids_checked=True: the caller has already checked that every id is
        in [0, vocab_size) (a loop over ids it made or checked itself); the shape and length are checked still."""
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers, the model {len(self.blocks)}: use model.new_cache()")
        if cache is not None and not self.config.causal:
            raise ValueError("a model with causal=False sees the whole sequence at once: it has no incremental "
                             "decoding (no cache); diffusion samplers call it on the full sequence (minwiola.diffusion)")
        start = cache[0].length if cache else 0
        self.check_ids(idx, start, values=not ids_checked)
        x = self.embed(idx)
        if self.config.positions == "learned":
            x = x + self.pos(torch.arange(start, start + idx.shape[1], device=idx.device))
        elif self.config.positions == "sinusoidal":
            x = x + self.pos_table[start:start + idx.shape[1]].to(x.dtype)
        x = self.drop(x) if self.training else x           # dropout does nothing outside training: skip the call
        previous = None                                     # GCLA: the summary of the previous layer's input
        for i, block in enumerate(self.blocks):
            layer_cache = cache[i] if cache else None
            context, previous = cross_layer_context(x, previous, self.config.gcla, layer_cache)  # GCLA: eqs. 20-21
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, layer_cache, context, use_reentrant=False)
            else:
                x = block(x, layer_cache, context)
        h = self.norm(x)
        return F.linear(h, self.embed.weight) if self.head is None else self.head(h)   # tied head h E^T: Wiola eq. 7

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in nats per token (eq. 42)."""
        return next_token_loss(self(idx), targets)

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> Path:
        """Write `config.json` (every config field), `model.safetensors` (the weights; the tied head is stored once,
        as the embedding) and, if given, the tokenizer as `tokenizer.bpe`, so the model and its ids travel together."""
        from safetensors.torch import save_file
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2) + "\n")
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(directory / "model.safetensors"))
        (directory / "tokenizer.bpe").unlink(missing_ok=True)          # never leave another model's tokenizer
        if tokenizer is not None:
            if tokenizer.vocab_size > self.config.vocab_size:
                raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids, the model only "
                                 f"vocab_size={self.config.vocab_size}")
            tokenizer.save(directory / "tokenizer.bpe")
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> "LanguageModel":
        """The model `save_pretrained` wrote, in eval mode (its tokenizer, if saved, is loaded by
        `minwiola.generate.load_model`: the model knows ids, not text). A config.json missing a field, or tensors
        that do not match the config (missing, unexpected, or of another shape), raise ValueError naming them."""
        directory = Path(directory)
        for name in ("config.json", "model.safetensors"):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"{directory / name} not found: is {directory} a save_pretrained folder?")
        fields = load_json(directory / "config.json")       # a ValueError naming the file if it holds no JSON
        if not isinstance(fields, dict):
            raise ValueError(f"{directory / 'config.json'} holds a {type(fields).__name__}, not a model config")
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        if set(fields) != known and not set(fields) <= known <= set(fields) | ADDED_LATER:
            raise ValueError(f"{directory / 'config.json'} has unknown field(s) {sorted(set(fields) - known)} and "
                             f"lacks {sorted(known - set(fields))}: was it written by another version?")
        try:
            config = ModelConfig(**fields)                   # the same checks as any config: types, ranges
        except ValueError as e:
            raise ValueError(f"{directory / 'config.json'}: {e}") from None
        model = cls(config)
        load_weights(model, directory / "model.safetensors")
        return model.to(device).eval()

    def n_params(self) -> int:
        """Parameters, counting the tied embedding/head once."""
        return sum(p.numel() for p in self.parameters())


def load_weights(model: nn.Module, path: Path, prefix: str = "") -> None:
    """Load the safetensors file `path` into `model`, its tensors named as in `model.state_dict()` after `prefix`
    (a Hugging Face folder stores them under "model.": `minwiola.hf`). Tensors missing, unexpected or of another
    shape than the config needs raise one ValueError naming them all, before anything is loaded."""
    from safetensors.torch import load_file
    try:
        saved = load_file(str(path))
    except Exception as e:                               # safetensors raises its own error type (truncated,
        raise ValueError(f"{path} cannot be read ({e}): the file is damaged or incomplete") from None  # empty, ...)
    expected = model.state_dict()
    problems = [f"unexpected tensor {k!r}" for k in saved
                if not k.startswith(prefix) or k[len(prefix):] not in expected]
    saved = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
    problems += [f"missing tensor {prefix + k!r}" for k in expected if k not in saved]
    problems += [f"tensor {prefix + k!r} has shape {tuple(saved[k].shape)}, the config needs {tuple(v.shape)}"
                 for k, v in expected.items() if k in saved and saved[k].shape != v.shape]
    if problems:
        raise ValueError(f"checkpoint {path.parent} does not match its config: " + "; ".join(problems))
    model.load_state_dict(saved)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Eq. 42: the cross-entropy of logits (B, T, V) against the next tokens (B, T), in nats ("mean" per token, or
    "sum"). bf16 or fp16 logits (mixed precision) are taken to float32 first: the softmax over V needs the range."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


def initial_loss(vocab_size: int) -> float:
    """ln V: the loss of a model that spreads probability evenly over V tokens, where training starts."""
    return math.log(vocab_size)
