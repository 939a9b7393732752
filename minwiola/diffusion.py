"""Masked (absorbing-state) discrete diffusion: noising, the ELBO loss, its bound on the NLL, the sampler (lesson 15).

A diffusion language model writes a whole sequence at once. Training corrupts a clean sequence x_0 (B, T) by
replacing tokens with a special [MASK] id m, and a *bidirectional* network (ModelConfig(causal=False): every
position sees every other) learns to put the tokens back. Generation starts from a sequence of masks only and
unmasks it over a chosen number of steps.

Notation: t in (0, 1] is the noise level, alpha_t = 1 - t the probability that a token is still clean at time t
(the "linear" schedule of MDLM, Sahoo et al. 2024, and of Shi et al. 2024), and m = vocab_size - 1 the mask id:
the model's vocabulary is the tokenizer's plus one id that the tokenizer never produces.

* Forward process q(x_t | x_0): each token independently becomes m with probability t, else stays (`add_noise`).
  A masked token stays masked as t grows: m is "absorbing".
* Reverse model p_theta(x_0 | x_t): the network's logits at each position, with the [MASK] column removed
  (`denoiser_log_probs`): a denoiser that predicts the mask would put mass where x_0 never is.
* Loss: the continuous-time ELBO (`diffusion_loss`), derived there; its estimate is a cross-entropy on the masked
  positions weighted by 1/t. BERT's masked-LM loss is one fixed t (0.15) of the same family, without the weight.
* Bound: the ELBO is an upper bound on -log p(x_0) under the model's generative process, so a diffusion model's
  bits per byte are reported *as a bound* (`exact_elbo`, `nll_bound`, `evaluate`) next to the exact figure of an
  autoregressive model.
* Sampling (`unmask_step`, `sample`): predict every mask, commit k of them (the most confident, or k at random),
  repeat; optionally block by block from left to right (semi-autoregressive, as LLaDA, Nie et al. 2025).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F

from .model import evaluating

RULES = ("confidence", "random")


def mask_id(config) -> int:
    """The absorbing state's id m: the last id of the model's vocabulary (its tokenizer has one id fewer, or less)."""
    return config.vocab_size - 1


def uniform(shape: tuple, generator: torch.Generator | None, device) -> torch.Tensor:
    """U[0, 1) numbers drawn on the generator's own device (a CPU generator for a CUDA run is the trainer's usual
    case), then moved to `device`: the same generator state gives the same numbers on every device."""
    where = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=where).to(device)


def add_noise(x0: torch.Tensor, t: torch.Tensor, mask: int, generator: torch.Generator | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward process q(x_t | x_0): each token of x0 (B, T) is replaced by `mask` with probability t[b] (t is
    (B,), one level per sequence), independently of the others. Returns (x_t, masked), masked a bool (B, T)."""
    if x0.dim() != 2 or t.shape != (x0.shape[0],):
        raise ValueError(f"x0 must be (B, T) and t (B,), got {tuple(x0.shape)} and {tuple(t.shape)}")
    if not bool(((t >= 0) & (t <= 1)).all()):
        raise ValueError(f"noise levels t must lie in [0, 1], got values in [{float(t.min())}, {float(t.max())}]")
    if bool((x0 == mask).any()):
        raise ValueError(f"x0 already holds the mask id {mask}: clean text never does (is vocab_size one more "
                         "than the tokenizer's?)")
    masked = uniform(tuple(x0.shape), generator, x0.device) < t.to(x0.device)[:, None]
    return x0.masked_fill(masked, mask), masked


def sample_times(n: int, generator: torch.Generator | None = None, eps: float = 1e-3) -> torch.Tensor:
    """Noise levels t (n,) for a batch of n sequences, stratified: u_b = (b + U_b) / n, one uniform draw in each
    stripe [b/n, (b+1)/n), so the batch covers (0, 1) evenly. Each u_b on its own is not uniform, but a row drawn
    at random is, so the expectation of the loss is unchanged; its variance is lower (no batch of all-low t).

    Then t = eps + (1 - eps) u, in [eps, 1). Why eps: the ELBO weights a sequence by 1/t, and at t -> 0 almost
    nothing is masked, so single draws there have a huge weight for one or two tokens. Honestly said, this is not
    the ELBO any more: t is uniform on [eps, 1], so the loss estimates (1/(1 - eps)) times the integral from eps to
    1, and the piece from 0 to eps is left out. That piece is about eps times the loss of a single masked token
    (per token), so with eps = 1e-3 the training loss differs from the ELBO by about 0.1%. Evaluation (`nll_bound`)
    uses the discrete form of the bound, which has no eps at all."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not 0 <= eps < 1:
        raise ValueError(f"eps must be in [0, 1), got {eps}")
    u = (torch.arange(n) + uniform((n,), generator, "cpu")) / n
    return eps + (1 - eps) * u


def denoiser_log_probs(logits: torch.Tensor, mask: int) -> torch.Tensor:
    """log p_theta(x_0 = v | x_t) (B, T, V): a log-softmax in float32 with the [MASK] column set to -inf. The
    absorbing-state parameterisation gives the mask zero probability under the denoiser (x_0 never holds one)."""
    logits = logits.float().index_fill(-1, torch.tensor([mask], device=logits.device), float("-inf"))
    return F.log_softmax(logits, -1)


def diffusion_loss(logits: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor, t: torch.Tensor, mask: int
                   ) -> torch.Tensor:
    """The continuous-time ELBO estimate, in nats per token: mean over b of (1/t_b) sum_{i masked} -log p(x0_i|x_t) / T.

    Derivation (MDLM; Shi et al. 2024). For the absorbing process with schedule alpha_t (the chance a token is still
    clean), the negative ELBO in continuous time is

        -log p(x_0) <= integral_0^1 alpha_t' / (1 - alpha_t) E_q(x_t|x_0)[ sum_{i: x_t^i = m} log p(x_0^i | x_t) ] dt

    (the reverse step from t to s < t reveals a masked token with probability (alpha_s - alpha_t) / (1 - alpha_t);
    its KL term is that probability times the cross-entropy on the masked tokens; letting s -> t gives the rate
    -alpha_t' / (1 - alpha_t)). For alpha_t = 1 - t, alpha_t' = -1 and 1 - alpha_t = t, so the weight is -1/t:

        -log p(x_0) <= E_{t ~ U(0, 1)} E_q [ (1/t) sum_{i masked} -log p(x_0^i | x_t) ].

    One draw of t per sequence gives this estimate; dividing by T gives nats per token. Positions not masked add
    nothing: the model could not get them wrong (the reverse process copies them)."""
    if logits.shape[:2] != x0.shape or masked.shape != x0.shape or t.shape != (x0.shape[0],):
        raise ValueError(f"logits (B, T, V), x0 and masked (B, T), t (B,) must agree, got {tuple(logits.shape)}, "
                         f"{tuple(x0.shape)}, {tuple(masked.shape)}, {tuple(t.shape)}")
    nll = -denoiser_log_probs(logits, mask).gather(-1, x0[..., None]).squeeze(-1)        # (B, T)
    per_sequence = (nll * masked).sum(1) / x0.shape[1] / t.to(nll.device)
    return per_sequence.mean()


def training_loss(model, x0: torch.Tensor, mask: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """One Monte-Carlo estimate of the ELBO for a batch of clean windows x0 (B, T): draw t (`sample_times`), mask
    (`add_noise`), run the model on x_t, score (`diffusion_loss`). The trainer's objective="diffusion"."""
    t = sample_times(x0.shape[0], generator).to(x0.device)
    xt, masked = add_noise(x0, t, mask, generator)
    return diffusion_loss(model(xt), x0, masked, t, mask)


def exact_elbo(log_probs_fn, x0: torch.Tensor, mask: int) -> float:
    """The ELBO for one short sequence x0 (T,), computed exactly by enumerating all 2^T mask sets M: nats for the
    whole sequence, an upper bound on -log p(x_0) under the model's generative process.

    Under q(x_t | x_0) a given set M (of size k = |M|) is exactly the masked set with probability t^k (1 - t)^(T-k),
    and then the loss is L(M) = sum_{i in M} -log p(x0_i | x0 with M masked). The ELBO (see `diffusion_loss`) is

        integral_0^1 (1/t) sum_M t^k (1 - t)^(T-k) L(M) dt = sum_M L(M) integral_0^1 t^(k-1) (1 - t)^(T-k) dt
                                                             = sum_M L(M) B(k, T-k+1) = sum_M L(M) / (k C(T, k))

    since B(k, T-k+1) = (k-1)! (T-k)! / T! = 1 / (k C(T, k)); the empty set adds nothing. Grouping the sets by size,
    there are C(T, k) of each size k, so with k uniform on {1..T} (probability 1/T) and M uniform among the sets
    of size k (probability 1/C(T, k)):

        sum_M L(M) / (k C(T, k)) = sum_k (1/T) sum_{|M|=k} (1/C(T, k)) (T/k) L(M)
                                 = E_{k ~ U{1..T}} E_{|M|=k} [(T/k) L(M)]

    the "any-order" form: (1/k) L(M) is the mean loss of a masked token, and T of them make a sequence. With the
    exact conditionals of a distribution q the bound is tight (each ordering of the positions is a chain rule of
    q); any other denoiser pays more on average.

    log_probs_fn maps x_t (1, T) to log-probabilities (1, T, V) (for a model: `denoiser_log_probs(model(x), m)`).
    2^T calls: keep T small (about 12 at most)."""
    if x0.dim() != 1 or x0.numel() > 16:
        raise ValueError(f"exact_elbo enumerates 2^T mask sets: x0 must be one short sequence (T,), T <= 16, "
                         f"got shape {tuple(x0.shape)}")
    T = x0.numel()
    total = 0.0
    for k in range(1, T + 1):
        weight = 1.0 / (k * math.comb(T, k))
        for positions in itertools.combinations(range(T), k):
            xt = x0.clone()
            xt[list(positions)] = mask
            logp = log_probs_fn(xt[None])[0]                                       # (T, V)
            total += weight * -sum(logp[i, x0[i]].item() for i in positions)
    return total


def nll_bound(model, x0: torch.Tensor, mask: int, draws: int = 8, generator: torch.Generator | None = None
              ) -> torch.Tensor:
    """A Monte-Carlo estimate of `exact_elbo` / T for each sequence of x0 (B, T): nats per token, (B,).

    From the any-order form: per draw, k ~ U{1..T}, k positions masked uniformly at random, the mean -log p over
    those k positions. Its expectation is E_k E_{|M|=k} [(1/k) L(M)] = exact_elbo / T: unbiased, with no eps and
    no 1/t weight (which makes the continuous form's estimate noisy at small t). The draws are stratified in k:
    draw j takes u in [j/draws, (j+1)/draws) and k = floor(u T) + 1, so eight draws cover small and large k alike;
    over a random draw index u is uniform, so k is uniform on {1..T} and the average stays unbiased."""
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive int, got {draws!r}")
    B, T = x0.shape
    total = torch.zeros(B, device=x0.device)
    for j in range(draws):
        u = (j + uniform((B,), generator, x0.device)) / draws
        k = (u * T).long().clamp(max=T - 1) + 1                                     # (B,) in 1..T
        rank = uniform((B, T), generator, x0.device).argsort(-1).argsort(-1)        # a random order of positions
        masked = rank < k[:, None]                                                  # its first k: a uniform k-set
        logp = denoiser_log_probs(model(x0.masked_fill(masked, mask)), mask)
        nll = -logp.gather(-1, x0[..., None]).squeeze(-1)
        total += (nll * masked).sum(1) / k
    return total / draws


@torch.no_grad()
def evaluate(model, tokens: np.ndarray, block_size: int, nbytes: torch.Tensor, batch: int = 32,
             device: torch.device | str = "cpu", max_windows: int | None = None, draws: int = 8, seed: int = 0
             ) -> dict:
    """The ELBO bound on the held-out stream, comparable (as a bound) with `train.evaluate`'s exact figures.

    The same consecutive windows of `block_size` tokens (`data.stream_windows`); here every token of a window is
    predicted (a denoiser has no "first token without a past"). Returns nats_per_token, perplexity and bits_per_byte
    of the bound (bytes counted with the trainer's `token_bytes` table, `nbytes`), tokens, bytes, "bound": True, and
    "stderr_nats": the standard error of nats_per_token over windows (each window's estimate varies with its text and
    with the Monte-Carlo draws: the ratio estimator's standard error, NaN with a single window). The random draws
    come from `seed`, so two evaluations of the same model agree exactly."""
    from .data import stream_windows
    generator = torch.Generator().manual_seed(seed)
    m = mask_id(model.config)
    nats, lengths, text_bytes = [], [], 0
    with evaluating(model):
        for window in stream_windows(tokens, block_size, batch, max_windows, overlap=0):
            x0 = window.to(device)
            nats += (nll_bound(model, x0, m, draws, generator) * x0.shape[1]).tolist()   # nats per window
            lengths += [x0.shape[1]] * x0.shape[0]
            text_bytes += int(nbytes[window].sum())
    nats, lengths = np.array(nats), np.array(lengths, dtype=float)
    per_token = float(nats.sum() / lengths.sum())                # Python floats: they go into JSON and checkpoints
    n = len(nats)
    stderr = math.sqrt(((nats - per_token * lengths) ** 2).sum() / (n * (n - 1))) / float(lengths.mean()) if n > 1 \
        else math.nan
    return {"nats_per_token": per_token, "perplexity": math.exp(per_token),
            "bits_per_byte": float(nats.sum()) / math.log(2) / max(text_bytes, 1), "tokens": int(lengths.sum()),
            "bytes": text_bytes, "stderr_nats": stderr, "bound": True}


def reveal_counts(n: int, steps: int) -> list[int]:
    """How many of n masked positions to reveal at each of `steps` steps: as even as possible, the larger counts
    first, summing to n. With more steps than masks the last steps reveal nothing (zeros; `sample` skips them
    without a forward pass)."""
    if not isinstance(n, int) or not isinstance(steps, int) or n < 0 or steps < 1:
        raise ValueError(f"need n >= 0 masks and steps >= 1, got n={n!r}, steps={steps!r}")
    return [n // steps + (1 if s < n % steps else 0) for s in range(steps)]


def unmask_step(x: torch.Tensor, logits: torch.Tensor, k, mask: int, rule: str = "confidence",
                temperature: float = 0.0, generator: torch.Generator | None = None,
                allowed: torch.Tensor | None = None) -> torch.Tensor:
    """One reverse step: fill k masked positions of each row of x (B, T) from the logits (B, T, V).

    Every masked position gets a prediction: the argmax at temperature 0, else a draw from softmax(logits / temp);
    never the mask itself. Then k of them per row are committed (k an int, or a (B,) tensor), the rest stay masked:
    * rule "confidence": the k predictions with the highest probability (of the predicted token, under the
      temperature-1 softmax): LLaDA's "low-confidence remasking", the unsure ones wait for more context;
    * rule "random": k of the masked positions uniformly at random (the reverse process of the ELBO, where each
      masked token is equally likely to be revealed next).
    `allowed` (bool (B, T)) limits which positions may be revealed (the current block). Unmasked positions never
    change. Returns the new x."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    B, T = x.shape
    candidate = x == mask
    if allowed is not None:
        candidate &= allowed
    k = torch.as_tensor(k, device=x.device).expand(B) if not isinstance(k, torch.Tensor) else k.to(x.device)
    if k.shape != (B,) or k.dtype.is_floating_point or bool((k < 0).any()):
        raise ValueError(f"k must be a non-negative int or a (B,) tensor of them, got {k.tolist()}")
    available = candidate.sum(1)
    if bool((k > available).any()):
        raise ValueError(f"k={k.tolist()} asks for more positions than the masked (and allowed) ones, "
                         f"{available.tolist()}")
    logp = denoiser_log_probs(logits, mask)                                     # (B, T, V)
    if temperature == 0:
        predicted = logp.argmax(-1)
    else:
        probs = F.softmax(logp / temperature, -1).reshape(B * T, -1)
        draws = torch.multinomial(probs.to(generator.device) if generator is not None else probs, 1,
                                  generator=generator)
        predicted = draws.to(x.device).reshape(B, T)
    if rule == "confidence":
        score = logp.gather(-1, predicted[..., None]).squeeze(-1)               # log-probability of the pick
    else:
        score = uniform((B, T), generator, x.device)
    score = score.masked_fill(~candidate, float("-inf"))                        # candidates rank first
    rank = score.argsort(-1, descending=True).argsort(-1)
    reveal = (rank < k[:, None]) & candidate
    return torch.where(reveal, predicted, x)


@torch.no_grad()
def sample(model, x: torch.Tensor, steps: int, mask: int, rule: str = "confidence", block: int | None = None,
           temperature: float = 0.0, generator: torch.Generator | None = None) -> tuple[torch.Tensor, int]:
    """Fill every mask of x (B, T) by iterative unmasking; returns (ids, forward passes used).

    Start from all masks to write from scratch, or from a prompt followed by masks, or a story with a blank in the
    middle: the given tokens are kept and only the masks are filled (infilling, which a left-to-right model cannot
    do directly). Each step runs the model once on the whole sequence and commits some masks (`unmask_step`); the
    masks of a row are spread over the steps by `reveal_counts`.

    With `block` (an int): semi-autoregressive. The positions from the first mask on are cut into blocks of `block`
    positions, left to right; the steps are split evenly over the blocks that hold masks, and a block's masks are
    all revealed before the next block starts (positions to its right stay masked, and the model sees them as
    masks). Without `block` the whole sequence is one block.

    A step at which no row has anything to reveal (more steps than masks in a block) is skipped without a forward
    pass, so the count returned is at most `steps`, and exactly `steps` when every block holds at least its share."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if block is not None and (not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be a positive int or None, got {block!r}")
    B, T = x.shape
    masked_any = (x == mask).any(0)
    if not bool(masked_any.any()):
        return x.clone(), 0
    first = int(masked_any.nonzero()[0])
    size = block or T
    edges = [(s, min(s + size, T)) for s in range(first, T, size)]
    edges = [(a, b) for a, b in edges if bool(masked_any[a:b].any())]         # blocks with nothing to fill: none
    if steps < len(edges):
        raise ValueError(f"steps={steps} is fewer than the {len(edges)} blocks to fill (block={block}): each block "
                         "needs at least one step")
    x, passes = x.clone(), 0
    with evaluating(model):                             # a plain function (a wrapped model) is left as it is
        for (a, b), block_steps in zip(edges, reveal_counts(steps, len(edges))):
            allowed = torch.zeros_like(x, dtype=torch.bool)
            allowed[:, a:b] = True
            per_row = [reveal_counts(int(n), block_steps) for n in (x[:, a:b] == mask).sum(1).tolist()]
            for s in range(block_steps):
                k = torch.tensor([counts[s] for counts in per_row], device=x.device)
                if not bool(k.any()):
                    continue
                x = unmask_step(x, model(x), k, mask, rule, temperature, generator, allowed)
                passes += 1
    assert not bool((x == mask).any()), "a mask was left after the last step"
    return x, passes
