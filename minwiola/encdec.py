"""The encoder-decoder layout (lesson 15): an encoder reads a source, a decoder writes a target while reading it.

    source ids (B, S) -> embedding -> L encoder blocks (no causal mask) -> norm -> memory (B, S, d)
    target ids (B, T) -> embedding -> L decoder blocks (causal, + cross-attention over memory) -> norm -> tied head

This is the original Transformer's layout (Vaswani et al., 2017) as T5 (Raffel et al., 2020) trains it, with the
course's parts: pre-norm, RoPE in the self-attention only, one embedding table shared by the source, the target and
the head. A decoder block has three residual branches (the decoder-only block has two):

    x = x + SelfAttention(Norm(x))             causal: target token t sees targets 0..t
    x = x + CrossAttention(Norm(x), memory)    every source token (attention.CrossAttention: K = W_K X')
    x = x + FFN(Norm(x))

The encoder is the decoder-only model's `model.Block`, built from the same config with causal=False: every source
token sees every other, as in BERT. So an encoder-decoder of L + L layers holds about twice the layers of an
L-layer decoder-only model, plus the cross-attention (budget.encdec_params counts it).

The task it is trained on here is T5's span corruption: hide a few spans of a text, each behind one sentinel id,
and have the decoder write each sentinel followed by the tokens it hid (`span_corruption`, `restore`).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .attention import CrossAttention
from .model import (ENCDEC_RULES, Block, ModelConfig, check_ids, check_rules, init_weights, make_ffn, make_mixer,
                    make_norm, next_token_loss)


def check_config(cfg: ModelConfig) -> None:
    """Raise ValueError unless the encoder-decoder can be built from `cfg` (the decoder's config, causal=True): the
    layout's requirements are `model.ENCDEC_RULES`, beside every other rule of which features exclude which."""
    check_rules(cfg, ENCDEC_RULES)


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: causal self-attention, cross-attention over the encoder's memory, feed-forward,
    each in its own residual branch with its own norm (T5's decoder block; the original Transformer's with the
    norms moved inside the branches)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = make_mixer(cfg)                       # causal self-attention, with the config's positions
        self.norm2 = make_norm(cfg)
        self.cross = CrossAttention(cfg.d, cfg.n_heads, cfg.attn_bias, cfg.attention)
        self.norm3 = make_norm(cfg)
        self.ffn = make_ffn(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """x (B, T, d) the target stream, memory (B, S, d) the encoder's output -> (B, T, d)."""
        x = x + self.drop(self.attn(self.norm1(x), context=None))
        x = x + self.drop(self.cross(self.norm2(x), context=memory))
        return x + self.drop(self.ffn(self.norm3(x)))


class EncoderDecoder(nn.Module):
    """An encoder of config.n_layers non-causal `model.Block`s and a decoder of config.n_layers `DecoderBlock`s,
    sharing one embedding, which is also the head (logits = h E^T, as in the decoder-only model).

    `encode(src)` -> memory (B, S, d); `decode(tgt, memory)` -> logits (B, T, V); `model(src, tgt)` does both;
    `loss(src, tgt_in, tgt_out)` is the mean cross-entropy in nats per target token."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        check_config(config)
        self.config = cfg = config
        self.encoder_config = dataclasses.replace(cfg, causal=False)    # the same parts, without the causal mask
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(Block(self.encoder_config) for _ in range(cfg.n_layers))
        self.encoder_norm = make_norm(cfg)                  # the memory is normed once, as in T5
        self.decoder = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.n_layers))
        self.decoder_norm = make_norm(cfg)
        self.head = None if cfg.tie_head else nn.Linear(cfg.d, cfg.vocab_size, bias=False)
        init_weights(self, cfg.init_std)                    # the decoder-only model's initialisation

    def check_ids(self, idx: torch.Tensor, name: str) -> None:
        """The decoder-only model's checks on ids (B, N): integers in [0, V), at most `context` of them."""
        try:
            check_ids(idx, self.config)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """Source ids (B, S) -> memory (B, S, d): every source token has seen every other."""
        self.check_ids(src, "src")
        x = self.drop(self.embed(src))
        for block in self.encoder:
            x = block(x)
        return self.encoder_norm(x)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Target ids (B, T) and memory (B, S, d) -> next-token logits (B, T, V); logit t sees targets 0..t and
        the whole memory."""
        self.check_ids(tgt, "tgt")
        if memory.dim() != 3 or memory.shape[0] != tgt.shape[0] or memory.shape[-1] != self.config.d:
            raise ValueError(f"memory must be ({tgt.shape[0]}, S, {self.config.d}) for {tgt.shape[0]} targets, got "
                             f"{tuple(memory.shape)}")
        x = self.drop(self.embed(tgt))
        for block in self.decoder:
            x = block(x, memory)
        h = self.decoder_norm(x)
        return h @ self.embed.weight.T if self.head is None else self.head(h)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt, self.encode(src))

    def loss(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of tgt_out given src and tgt_in (teacher forcing), in nats per target token."""
        if tgt_in.shape != tgt_out.shape:
            raise ValueError(f"tgt_in and tgt_out must have one shape, got {tuple(tgt_in.shape)} and "
                             f"{tuple(tgt_out.shape)}")
        return next_token_loss(self(src, tgt_in), tgt_out)

    def n_params(self) -> int:
        """Parameters, counting the shared embedding/head once."""
        return sum(p.numel() for p in self.parameters())


def shift_right(target: torch.Tensor, start: int) -> torch.Tensor:
    """The decoder's input for teacher forcing: `start` then the target without its last token, so position t
    predicts target t having seen targets 0..t-1."""
    first = torch.full_like(target[..., :1], start)
    return torch.cat([first, target[..., :-1]], -1)


@torch.no_grad()
def greedy(model: EncoderDecoder, src: torch.Tensor, length: int, start: int) -> torch.Tensor:
    """Greedy decoding of `length` target tokens for sources (B, S) -> (B, length).

    The source is encoded once; the decoder is then run on the whole target so far at every step (no KV cache),
    which costs O(length^2) decoder positions: a few hundred at the lengths used here, so caching is not worth its
    code."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    memory = model.encode(src)
    tgt = torch.full((src.shape[0], 1), start, dtype=src.dtype, device=src.device)
    for _ in range(length):
        nxt = model.decode(tgt, memory)[:, -1].argmax(-1, keepdim=True)
        tgt = torch.cat([tgt, nxt], 1)
    return tgt[:, 1:]


# ----------------------------------------------------------------------------------------------------
# T5's span corruption: the task the encoder-decoder learns here
# ----------------------------------------------------------------------------------------------------

def span_lengths(T: int, noise_density: float = 0.15, mean_span: float = 3.0) -> tuple[int, int]:
    """(noise tokens, spans) for a text of T tokens: round(T * density) hidden tokens in round(noise / mean_span)
    spans (at least one). Raise ValueError when T cannot hold them (each span and each gap needs a token)."""
    if not 0 < noise_density < 1 or not mean_span >= 1:
        raise ValueError(f"need 0 < noise_density < 1 and mean_span >= 1, got {noise_density} and {mean_span}")
    noise = round(T * noise_density)
    spans = max(1, round(noise / mean_span))
    if noise < spans or T - noise < spans:
        raise ValueError(f"{T} tokens cannot hold {spans} span(s) of {noise} hidden token(s) with a kept token "
                         f"before each: use longer texts or another noise_density")
    return noise, spans


def random_parts(total: int, parts: int, generator: torch.Generator | None) -> list[int]:
    """`total` split into `parts` positive integers at random: parts - 1 distinct cut points among 1..total-1."""
    cuts = sorted((torch.randperm(total - 1, generator=generator)[:parts - 1] + 1).tolist())
    edges = [0, *cuts, total]
    return [b - a for a, b in zip(edges, edges[1:])]


def span_corruption(ids: torch.Tensor, noise_density: float = 0.15, mean_span: float = 3.0, *,
                    first_sentinel: int, generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's span corruption of token ids (T,) or (B, T) -> (source, target), each row corrupted independently.

    As T5's random_spans_noise_mask: exactly n = round(T * density) tokens are hidden, in exactly
    k = round(n / mean_span) spans; the n hidden tokens are split into k spans of random positive lengths, the
    T - n kept ones into k gaps of random positive lengths, and the text is gap, span, gap, span, ... (it starts
    with kept text). In the source each span becomes one sentinel id, first_sentinel + i for span i; the target
    is each sentinel followed by the tokens it hid:

        ids     the  cat  sat  on   the  mat  and  slept        (spans: "cat sat", "and")
        source  the  <0>  on   the  mat  <1>  slept
        target  <0>  cat  sat  <1>  and

    So every source has T - n + k tokens and every target n + k, whatever the draw: a batch needs no padding.
    Sentinels must lie above every real id (vocab_size = the tokenizer's + the number of sentinels)."""
    if ids.dim() == 2:
        pairs = [span_corruption(row, noise_density, mean_span, first_sentinel=first_sentinel, generator=generator)
                 for row in ids]
        return torch.stack([s for s, _ in pairs]), torch.stack([t for _, t in pairs])
    if ids.dim() != 1:
        raise ValueError(f"ids must be (T,) or (B, T), got shape {tuple(ids.shape)}")
    if ids.numel() and ids.max() >= first_sentinel:
        raise ValueError(f"ids reach {int(ids.max())}, but sentinels start at first_sentinel={first_sentinel}: "
                         "sentinels must lie above every real token id")
    noise, spans = span_lengths(len(ids), noise_density, mean_span)
    hidden, kept = random_parts(noise, spans, generator), random_parts(len(ids) - noise, spans, generator)
    source, target, at = [], [], 0
    for i, (gap, span) in enumerate(zip(kept, hidden)):
        sentinel = ids.new_tensor([first_sentinel + i])
        source += [ids[at:at + gap], sentinel]
        target += [sentinel, ids[at + gap:at + gap + span]]
        at += gap + span
    return torch.cat(source), torch.cat(target)


def restore(source: torch.Tensor, target: torch.Tensor, first_sentinel: int) -> torch.Tensor:
    """Invert `span_corruption`: put back, in place of each sentinel of the source, the tokens that follow the
    same sentinel in the target. (T,) or (B, T). Raise ValueError if the sentinels do not match in order."""
    if source.dim() == 2:
        return torch.stack([restore(s, t, first_sentinel) for s, t in zip(source, target)])
    fills = target_spans(target, first_sentinel)
    out, used = [], 0
    for token in source.tolist():
        if token < first_sentinel:
            out.append(token)
            continue
        if token != first_sentinel + used or used >= len(fills):
            raise ValueError(f"source sentinel {token - first_sentinel} does not match the target's spans "
                             f"(expected sentinel {used} of {len(fills)})")
        out += fills[used]
        used += 1
    if used != len(fills):
        raise ValueError(f"the target has {len(fills)} spans, the source {used} sentinels")
    return source.new_tensor(out)


def target_spans(target: torch.Tensor, first_sentinel: int) -> list[list[int]]:
    """The hidden tokens of each span of a target (T,): what follows sentinel i up to the next sentinel. Raise
    ValueError unless the target starts with sentinel 0 and its sentinels count up by one."""
    spans: list[list[int]] = []
    for token in target.tolist():
        if token >= first_sentinel:
            if token != first_sentinel + len(spans):
                raise ValueError(f"target sentinel {token - first_sentinel} where sentinel {len(spans)} belongs")
            spans.append([])
        elif not spans:
            raise ValueError("a target must start with sentinel 0 (first_sentinel)")
        else:
            spans[-1].append(token)
    return spans


def spans_restored(predicted: torch.Tensor, target: torch.Tensor, first_sentinel: int) -> torch.Tensor:
    """Per span of each target row (B, U): True where the predicted row holds exactly that span (its sentinel
    and every hidden token) at the target's positions. A span of the wrong length shifts every later one, so
    they count as wrong too: strict, by design. Returns a flat boolean tensor over all spans of all rows."""
    if predicted.shape != target.shape:
        raise ValueError(f"predicted {tuple(predicted.shape)} and target {tuple(target.shape)} must have one shape")
    hits = []
    for p, t in zip(predicted, target):
        starts = (t >= first_sentinel).nonzero().flatten().tolist() + [len(t)]
        hits += [torch.equal(p[a:b], t[a:b]) for a, b in zip(starts, starts[1:])]
    return torch.tensor(hits)
