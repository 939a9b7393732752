"""Mixture of experts: a sparse feed-forward layer (lesson 14; the slides' "MoE").

A dense feed-forward layer runs every token through the same FFN. A mixture of experts keeps E FFNs, the
*experts*, and a small *router* that sends each token to k of them (k < E): the layer holds E FFNs' parameters
but each token pays for only k. Notation, used throughout:

    E               experts (`n_experts`), each a SwiGLU of hidden width h (`ffn.SwiGLU`)
    k               experts active per token (`k`), 1 <= k <= E
    N               tokens in the batch (B x T), x_i (1 x d) the i-th
    W_r             the router, a d x E matrix without bias
    C               capacity: the most assignments one expert takes in a batch

**Router.** The router scores every expert and a softmax turns the scores into gate probabilities:

    logits_i = x_i W_r                    (1 x E)
    p_i      = softmax(logits_i)          p_ie = exp(logits_ie) / sum_e' exp(logits_ie')

**Top-k, renormalised.** Token i goes to the k experts with the largest p_ie, the set S_i; their probabilities are
renormalised to sum to 1 over the chosen k, and the output is the weighted sum of those experts only:

    w_ie  = p_ie / sum_{e' in S_i} p_ie'      (e in S_i)
    y_i   = sum_{e in S_i} w_ie Expert_e(x_i)

The choice of S_i is a step function (no gradient); the router learns through the weights w_ie. With k = E every
expert is chosen and w = p (a dense, soft mixture); with k = 1 the renormalised weight is always 1, so the router
gets no gradient from the language-model loss at all, only from the balancing loss below (Switch, which routes
top-1, weights by p_ie itself for that reason). With E = k = 1 the layer is exactly one dense SwiGLU.

**Capacity and dropping.** Hardware-friendly implementations give each expert a fixed buffer of

    C = ceil(capacity_factor * k * N / E)

assignments (k N assignments spread evenly would be k N / E per expert; the factor leaves slack). Assignments
beyond an expert's C are *dropped*: that expert does not process the token and contributes 0 to y_i, and the
residual connection around the FFN carries the token on unchanged (with k > 1 its other experts may still take
it). Who is served first must be stated, because it decides who is dropped. Here: first come first served, the
tokens lined up *position by position* (all rows of the batch at position 0, then at position 1, ...; within a
token, its k choices together). So an assignment competes only with tokens at earlier positions and at the same
position in earlier rows: **a token's output never depends on later positions of its own sequence**, and a model
with capacity limits stays causal (tested). It does depend on the other rows of the batch at positions <= its own:
rows are coupled, and a sequence's output depends on its batch companions (and, when rows are consecutive windows
of one text as in `train.evaluate`, on tokens of the next window at earlier positions: a channel through which
assignments are dropped, not through their content). GShard instead serves every token's first choice before any
token's second choice; then a later token's first choice can take the slot of an earlier token's second choice,
and the future leaks into the past. `capacity_factor` None or <= 0 means no limit: nothing is dropped, rows are
independent. Decoding one token at a time (one sequence) never drops, since each expert gets at most one
assignment and C >= 1; so with a limit, a full forward that drops differs from decoding.

**Load-balancing loss (Switch Transformer).** Trained alone, a router tends to collapse: the experts it favours
early get the gradient, improve, and are favoured more. Switch adds, for each layer,

    f_e = (assignments routed to e) / (k N)       the fraction of assignments e receives (counted before dropping)
    P_e = (1/N) sum_i p_ie                         the mean router probability of e
    L_bal = E * sum_e f_e P_e

Its range: a token gives an expert at most one of its k slots, so f_e <= 1/k and L_bal <= (E/k) sum_e P_e = E/k
(k experts taking every token and holding all the probability; with k = 1 that is E). A uniform router
(P_e = 1/E) gives L_bal = sum_e f_e = 1 whatever it chooses. Its minimum is at uniform load only under an
idealisation: if the choices followed the probabilities (f = P, a router that drew its experts from p), then
L_bal = E sum_e P_e^2, and by Cauchy-Schwarz (sum_e P_e * 1)^2 <= (sum_e P_e^2)(sum_e 1^2), i.e.
1 <= E sum_e P_e^2, with equality exactly when every P_e = 1/E. Top-k choices need not follow the probabilities,
and then L_bal can be below 1 at a lopsided load: nine tokens with p = (0.34, 0.33, 0.33) and one with
p = (0, 0, 1), each routed to its top-1, give f = (0.9, 0, 0.1) and L_bal = 0.945 (tested). What balances is the
gradient: f_e counts discrete choices and has no gradient, P_e does (d L_bal / d P_e = E f_e), and through the
softmax d L_bal / d logit_ie = (E/N) p_ie (f_e - sum_e' p_ie' f_e'): every token's probability moves away from the
experts loaded above its own average, and the push is zero at uniform load (f_e = 1/E).

**Router z-loss (ST-MoE, Zoph et al. 2022).** L_z = (1/N) sum_i (log sum_e exp(logits_ie))^2 keeps the router's
logits small, where a softmax in low precision stays accurate; optional (weight 0 by default in the config).

After each forward the layer keeps `aux_loss` (L_bal), `z_loss` (L_z), `load` (f, E numbers) and `dropped` (the
fraction of the k N assignments dropped). It reports them the way any layer with a loss or a statistic does:
`added_loss(cfg)` is moe_aux L_bal + moe_z L_z, which the model sums over its layers into the training loss
(`model.LanguageModel.aux_loss`), and `stats()` gives load and dropped, which the trainer logs. An expert that gets
no token in a step has no gradient, so the layer says it `leaves_parameters_unused` (a data-parallel trainer must
expect it). `moe_layers(model)` and `moe_stats(model)` find a model's MoE layers and stack what they measured.

**Dispatch and its cost.** The layer loops over the experts: each gathers its tokens (`index_select`), runs on
them, and adds its weighted output back in place (`index_add_`). The arithmetic is k N SwiGLUs plus the router's
2 d E FLOPs a token, as `budget` counts it; the loop adds E small kernel calls and a gather and scatter of k N d
numbers per layer, and the sizes of the gathered batches depend on the data (a host sync on a GPU). Production
kernels pad each expert to C and run all experts in one batched product instead; the math is the same. One more
consequence of data-dependent batches: a matrix product's rounding depends on how many rows it has, so when one
token's routing changes, the other tokens of its experts can move in the last bits (about 1e-15 in float64);
causality and decoding hold to that rounding, not bit for bit.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .ffn import SwiGLU


def capacity(capacity_factor: float | None, k: int, n_tokens: int, n_experts: int) -> int | None:
    """C = ceil(capacity_factor * k * N / E) assignments per expert; None (no limit) when the factor is None or
    <= 0."""
    if capacity_factor is None or capacity_factor <= 0:
        return None
    return math.ceil(capacity_factor * k * n_tokens / n_experts)


def balancing_loss(probs: torch.Tensor, chosen: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Switch's L_bal = E sum_e f_e P_e and the load f, for router probabilities `probs` (N, E) and the chosen
    experts `chosen` (N, k). f (counted from the choices) carries no gradient; P = mean of probs does."""
    counts = torch.bincount(chosen.reshape(-1), minlength=n_experts)
    load = counts.to(probs.dtype) / max(chosen.numel(), 1)       # f_e: fraction of the k N assignments
    return n_experts * (load * probs.mean(0)).sum(), load


class MoE(nn.Module):
    """Mixture of E SwiGLU experts of hidden width `hidden`, k active per token; (B, T, d) -> (B, T, d).

    The second-to-last dimension of the input is the position (it sets the order tokens are served in when
    capacity is limited); leading ones are the batch. `capacity_factor` None or <= 0: no capacity limit."""

    leaves_parameters_unused = True      # an expert no token chose in a step gets no gradient

    def __init__(self, d: int, hidden: int, n_experts: int = 8, k: int = 2, capacity_factor: float | None = None,
                 bias: bool = False):
        super().__init__()
        if not 1 <= k <= n_experts:
            raise ValueError(f"need 1 <= k <= n_experts, got k={k} with n_experts={n_experts}")
        self.n_experts, self.k, self.capacity_factor = n_experts, k, capacity_factor
        self.router = nn.Linear(d, n_experts, bias=False)            # W_r
        self.experts = nn.ModuleList(SwiGLU(d, hidden, bias) for _ in range(n_experts))
        # what the latest forward measured (for the trainer and the lessons)
        self.aux_loss: torch.Tensor | None = None         # L_bal, with its graph (the trainer adds it to the loss)
        self.z_loss: torch.Tensor | None = None           # L_z, with its graph
        self.load: torch.Tensor | None = None             # f, (E,), detached
        self.dropped: torch.Tensor | None = None          # fraction of the k N assignments dropped, detached

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, d = x.shape, x.shape[-1]
        if x.numel() == 0:                                   # no tokens: nothing routed, nothing to balance
            self.aux_loss = self.z_loss = self.dropped = x.new_zeros(())
            self.load = x.new_zeros(self.n_experts)
            return torch.zeros_like(x)
        # line the tokens up position by position: (B, T, d) -> (T, B, d) -> (N, d), the order they are served in
        tokens = x.reshape(-1, *shape[-2:]).transpose(0, 1).reshape(-1, d)
        logits = self.router(tokens)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))   # the softmax in float32 or wider
        probs = logits.softmax(-1)                                              # p, (N, E)
        top, chosen = probs.topk(self.k, dim=-1)                                # S_i, (N, k)
        weights = top / top.sum(-1, keepdim=True)                               # w, renormalised over the k
        limit = capacity(self.capacity_factor, self.k, len(tokens), self.n_experts)
        out = torch.zeros_like(tokens)
        dropped = 0
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)   # its assignments, in token (= serving) order
            if limit is not None and len(token) > limit:
                dropped += len(token) - limit
                token, slot = token[:limit], slot[:limit]           # first come, first served; the rest dropped
            if len(token):
                y = expert(tokens.index_select(0, token)) * weights[token, slot, None]
                out.index_add_(0, token, y.to(out.dtype))
        self.aux_loss, load = balancing_loss(probs, chosen, self.n_experts)
        self.z_loss = torch.logsumexp(logits, -1).pow(2).mean()
        self.load = load.detach()
        self.dropped = torch.tensor(dropped / max(chosen.numel(), 1))
        batch = shape[:-2] if x.dim() > 2 else ()
        return out.reshape(shape[-2], -1, d).transpose(0, 1).reshape(*batch, *shape[-2:])

    def added_loss(self, cfg) -> torch.Tensor | None:
        """What this layer adds to the training loss: cfg.moe_aux * L_bal + cfg.moe_z * L_z of the latest forward,
        with their graph (None before any forward)."""
        if self.aux_loss is None:
            return None
        return cfg.moe_aux * self.aux_loss + cfg.moe_z * self.z_loss

    def stats(self) -> dict:
        """The latest forward's {"moe_load": f (E numbers), "moe_dropped": the fraction of assignments dropped}, to
        4 decimals (the trainer logs E numbers a layer at every step); {} before any forward."""
        if self.load is None:
            return {}
        return {"moe_load": [round(f, 4) for f in self.load.float().tolist()],
                "moe_dropped": round(self.dropped.float().item(), 4)}


def moe_layers(model: nn.Module) -> list[MoE]:
    """The mixture-of-experts feed-forward layers of `model`, in layer order (empty unless ffn="moe")."""
    return [layer for layer in model.modules() if isinstance(layer, MoE)]


def moe_stats(model: nn.Module) -> dict[str, torch.Tensor]:
    """The MoE layers' latest forward as tensors (for analysis; the trainer logs `stats()`): {"moe_load":
    (layers, E) fraction of assignments per expert, "moe_dropped": (layers,) fraction dropped}; {} without MoE."""
    layers = [layer for layer in moe_layers(model) if layer.load is not None]
    if not layers:
        return {}
    return {"moe_load": torch.stack([layer.load.float().cpu() for layer in layers]),
            "moe_dropped": torch.stack([layer.dropped.float().cpu() for layer in layers])}
