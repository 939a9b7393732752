"""Masked discrete diffusion (lesson 15): the forward process, the ELBO loss and its bound, the unmasking sampler."""
import itertools
import math

import numpy as np
import pytest
import torch

from minwiola import diffusion
from minwiola.diffusion import (add_noise, denoiser_log_probs, diffusion_loss, exact_elbo, mask_id, nll_bound,
                                reveal_counts, sample, sample_times, unmask_step)
from minwiola.model import LanguageModel, preset


def tiny_denoiser(seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(preset("tiny-diffusion")).eval()


class Recorder(torch.nn.Module):
    """Wraps a model and keeps every input it was called with (to see the order in which masks were filled)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.inputs = model, []

    def forward(self, x):
        self.inputs.append(x.clone())
        return self.model(x)


def test_the_mask_is_the_last_id_and_the_presets_have_room_for_it():
    assert mask_id(preset("tiny-diffusion")) == 64 and mask_id(preset("diffusion-llama-style")) == 4096
    assert not preset("diffusion-llama-style").causal
    assert LanguageModel(preset("diffusion-llama-style")).n_params() == 463_424 + 64   # llama-style + one row


@pytest.mark.parametrize("t", [0.05, 0.3, 0.5, 0.9])
def test_each_token_is_masked_with_probability_t(t):
    g = torch.Generator().manual_seed(1)
    x0 = torch.randint(0, 64, (100, 200), generator=g)
    xt, masked = add_noise(x0, torch.full((100,), t), 64, g)
    n = masked.numel()
    assert abs(masked.float().mean().item() - t) < 4 * math.sqrt(t * (1 - t) / n)    # binomial, 4 sigma
    assert torch.equal(xt, torch.where(masked, torch.tensor(64), x0))                 # masks exactly there
    per_row = masked.float().mean(1)                                                 # independent across rows
    assert per_row.std().item() < 3 * math.sqrt(t * (1 - t) / 200)


def test_one_level_per_sequence_and_the_ends_of_the_schedule():
    x0 = torch.randint(0, 64, (3, 4000), generator=torch.Generator().manual_seed(2))
    xt, masked = add_noise(x0, torch.tensor([1.0, 0.0, 0.25]), 64, torch.Generator().manual_seed(3))
    assert masked[0].all() and (xt[0] == 64).all()                          # t = 1: everything masked
    assert not masked[1].any() and torch.equal(xt[1], x0[1])                # t = 0: nothing
    assert abs(masked[2].float().mean().item() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / 4000)
    with pytest.raises(ValueError, match="already holds the mask id"):
        add_noise(torch.full((1, 3), 64), torch.ones(1), 64)
    with pytest.raises(ValueError, match="must lie in"):
        add_noise(x0, torch.tensor([1.5, 0.0, 0.1]), 64)


def test_noise_levels_are_stratified_one_per_stripe():
    eps = 1e-3
    for n in (1, 7, 64):
        t = sample_times(n, torch.Generator().manual_seed(n), eps)
        assert t.shape == (n,) and (t >= eps).all() and (t <= 1).all()
        u = (t - eps) / (1 - eps)
        assert torch.equal((u * n).floor().long(), torch.arange(n))       # draw b lies in stripe [b/n, (b+1)/n)
    many = torch.stack([sample_times(4, torch.Generator().manual_seed(s)) for s in range(4000)])
    assert abs(many.mean().item() - (1 + eps) / 2) < 0.01                 # uniform on [eps, 1] overall
    with pytest.raises(ValueError, match="eps must be in"):
        sample_times(4, eps=1.0)


def test_the_loss_equals_its_definition_on_a_hand_case():
    # B = 2 sequences of T = 3 tokens, V = 4 ids of which id 3 is [MASK]
    logits = torch.tensor([[[2.0, 0.0, 0.0, 9.0], [0.0, 1.0, 0.0, 9.0], [1.0, 1.0, 1.0, 9.0]],
                           [[0.0, 0.0, 3.0, 9.0], [1.0, 2.0, 3.0, 9.0], [0.0, 0.0, 0.0, 9.0]]])
    x0 = torch.tensor([[0, 2, 1], [2, 0, 1]])
    masked = torch.tensor([[True, True, False], [False, True, True]])
    t = torch.tensor([0.5, 0.25])
    # the [MASK] column (9.0) is left out of every softmax
    row0 = -(2 - math.log(math.exp(2) + 2)) - (0 - math.log(2 + math.e))           # positions 0 and 1
    row1 = -(1 - math.log(math.e + math.e ** 2 + math.e ** 3)) - (0 - math.log(3))  # positions 1 and 2
    expected = (row0 / 3 / 0.5 + row1 / 3 / 0.25) / 2
    assert abs(diffusion_loss(logits, x0, masked, t, 3).item() - expected) < 1e-6


def mask_sets(T):
    return [M for k in range(1, T + 1) for M in itertools.combinations(range(T), k)]


def losses_by_set(log_probs_fn, x0, mask):
    """L(M) = sum_{i in M} -log p(x0_i | x0 with M masked), for every non-empty set M."""
    out = {}
    for M in mask_sets(len(x0)):
        xt = x0.clone()
        xt[list(M)] = mask
        logp = log_probs_fn(xt[None])[0]
        out[M] = -sum(logp[i, x0[i]].item() for i in M)
    return out


def test_exact_elbo_is_the_continuous_integral_and_the_any_order_form():
    model = tiny_denoiser()
    fn = lambda xt: denoiser_log_probs(model(xt), 64)
    x0 = torch.tensor([5, 17, 3, 40, 11])
    T = len(x0)
    L = losses_by_set(fn, x0, 64)
    # the any-order form: E_{k ~ U{1..T}} E_{|M| = k} [(T/k) L(M)]
    any_order = sum((1 / T) * sum((T / k) * L[M] for M in L if len(M) == k) / math.comb(T, k)
                    for k in range(1, T + 1))
    # the continuous-time ELBO: integral_0^1 (1/t) sum_M t^|M| (1 - t)^(T - |M|) L(M) dt, by Gauss-Legendre
    # quadrature (the integrand is a polynomial of degree T - 1: 8 nodes integrate it exactly)
    nodes, weights = np.polynomial.legendre.leggauss(8)
    ts, ws = (nodes + 1) / 2, weights / 2
    integral = sum(w * sum(t ** (len(M) - 1) * (1 - t) ** (T - len(M)) * L[M] for M in L) for t, w in zip(ts, ws))
    got = exact_elbo(fn, x0, 64)
    assert abs(got - any_order) < 1e-9 * abs(got) and abs(got - integral) < 1e-9 * abs(got)
    with pytest.raises(ValueError, match="one short sequence"):
        exact_elbo(fn, x0[None], 64)


def test_the_monte_carlo_bound_is_unbiased_for_the_exact_elbo():
    # A denoiser whose losses depend strongly on how many tokens are masked and where: a wrong weighting of k (or a
    # k that is not uniform) shows at once.
    g = torch.Generator().manual_seed(0)
    table = torch.randn(6, 9, generator=g)
    mask = 8

    def model(xt):
        k = (xt == mask).sum(1, keepdim=True)[..., None].float()                    # (B, 1, 1)
        return table[None] * (1 + k) + torch.arange(9.0) * (xt[..., None] % 3)

    x0 = torch.tensor([1, 4, 0, 7, 2, 5])
    exact = exact_elbo(lambda xt: denoiser_log_probs(model(xt), mask), x0, mask) / 6
    estimates = nll_bound(model, x0.repeat(4000, 1), mask, draws=3, generator=torch.Generator().manual_seed(1))
    mean, stderr = estimates.mean().item(), estimates.std().item() / math.sqrt(len(estimates))
    assert abs(mean - exact) < 4 * stderr, (mean, exact, stderr)
    assert stderr < 0.02 * exact                                         # a test that could tell a 10% bias


def tiny_distribution(V=3, T=3, seed=0):
    """q over all V^T sequences: random positive weights (full support, and not a product of marginals)."""
    seqs = list(itertools.product(range(V), repeat=T))
    w = torch.rand(len(seqs), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.05
    return seqs, (w / w.sum()).tolist()


def exact_denoiser(seqs, q, V, mask):
    """log q(x_i = v | the visible tokens of x_t), by enumeration: the true conditionals (masked columns summed out)."""
    def log_probs(xt):
        xt = xt[0].tolist()
        consistent = [(s, p) for s, p in zip(seqs, q) if all(a == mask or a == b for a, b in zip(xt, s))]
        total = sum(p for _, p in consistent)
        out = torch.full((1, len(xt), V + 1), -math.inf, dtype=torch.float64)
        for i in range(len(xt)):
            for v in range(V):
                mass = sum(p for s, p in consistent if s[i] == v)
                if mass > 0:                                        # a visible position: its own token only
                    out[0, i, v] = math.log(mass / total)
        return out
    return log_probs


def test_the_elbo_is_tight_for_the_exact_denoiser_and_loose_for_a_wrong_one():
    V, T, mask = 3, 3, 3
    seqs, q = tiny_distribution(V, T)
    entropy = -sum(p * math.log(p) for p in q)
    exact = exact_denoiser(seqs, q, V, mask)
    for s, p in zip(seqs, q):                    # (a) any-order autoregression with exact conditionals: -log q(x)
        assert abs(exact_elbo(exact, torch.tensor(s), mask) - -math.log(p)) < 1e-9
    # (b) independent marginals: the bound's mean is sum_i H(q_i), above H(q) (q is not a product)
    marginals = torch.tensor([[sum(p for s, p in zip(seqs, q) if s[i] == v) for v in range(V)] for i in range(T)],
                             dtype=torch.float64)
    independent = lambda xt: torch.cat([marginals.log(), torch.full((T, 1), -math.inf, dtype=torch.float64)], 1)[None]
    mean_bound = sum(p * exact_elbo(independent, torch.tensor(s), mask) for s, p in zip(seqs, q))
    sum_of_marginal_entropies = -(marginals * marginals.log()).sum().item()
    assert abs(mean_bound - sum_of_marginal_entropies) < 1e-9 and mean_bound > entropy + 0.01
    # (c) a trained-looking but wrong denoiser (random logits that depend on x_t) pays more than H(q) too
    table = torch.randn(4 ** T, T, V + 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    wrong = lambda xt: denoiser_log_probs(table[int(sum(a * 4 ** j for j, a in enumerate(xt[0].tolist())))][None],
                                          mask)
    assert sum(p * exact_elbo(wrong, torch.tensor(s), mask) for s, p in zip(seqs, q)) > entropy + 0.01


def test_reveal_counts_are_even_and_sum_to_n():
    assert reveal_counts(10, 4) == [3, 3, 2, 2] and reveal_counts(8, 8) == [1] * 8
    assert reveal_counts(2, 5) == [1, 1, 0, 0, 0] and reveal_counts(0, 3) == [0, 0, 0]
    for n in range(30):
        for steps in range(1, 12):
            c = reveal_counts(n, steps)
            assert sum(c) == n and len(c) == steps and max(c) - min(c) <= 1
    with pytest.raises(ValueError, match="steps >= 1"):
        reveal_counts(3, 0)


def test_confidence_reveals_the_most_confident_predictions_first():
    V, mask = 5, 4
    logits = torch.full((1, 5, V), 0.0)
    logits[0, 0, 1] = 3.0                # confident: token 1
    logits[0, 1, 2] = 1.0                # unsure
    logits[0, 2, 3] = 6.0                # the most confident: token 3
    logits[0, 3, 0] = 2.0
    logits[0, 4, 2] = 50.0               # the most confident of all, but already visible: never touched
    logits[:, :, mask] = 100.0           # the mask itself is never predicted
    x = torch.tensor([[mask, mask, mask, mask, 0]])
    out = unmask_step(x, logits, 2, mask, "confidence")
    assert out.tolist() == [[1, mask, 3, mask, 0]]
    assert unmask_step(out, logits, 1, mask).tolist() == [[1, mask, 3, 0, 0]]
    out = unmask_step(x, logits, 2, mask, "random", generator=torch.Generator().manual_seed(0))
    assert (out == mask).sum() == 2 and out[0, 4] == 0 and set(out[0, :4].tolist()) <= {1, 2, 3, 0, mask}


@pytest.mark.parametrize("rule,temperature", [("confidence", 0.0), ("random", 0.0), ("confidence", 1.0)])
def test_one_step_changes_only_k_masked_positions_inside_allowed(rule, temperature):
    g = torch.Generator().manual_seed(3)
    mask = 9
    x = torch.randint(0, 9, (6, 20), generator=g)
    x[torch.rand(6, 20, generator=g) < 0.6] = mask
    allowed = torch.zeros(6, 20, dtype=torch.bool)
    allowed[:, 5:15] = True
    k = torch.minimum(((x == mask) & allowed).sum(1), torch.tensor(3))
    logits = torch.randn(6, 20, 10, generator=g)
    out = unmask_step(x, logits, k, mask, rule, temperature, torch.Generator().manual_seed(4), allowed)
    changed = out != x
    assert torch.equal(changed.sum(1), k)                       # exactly k per row
    assert (x[changed] == mask).all() and allowed[changed].all()  # only masks, only inside the block
    assert (out[changed] != mask).all()
    with pytest.raises(ValueError, match="more positions than"):
        unmask_step(x, logits, 11, mask, rule, allowed=allowed)
    with pytest.raises(ValueError, match="rule must be one of"):
        unmask_step(x, logits, 1, mask, "lowest")
    with pytest.raises(ValueError, match="non-negative int"):
        unmask_step(x, logits, -1, mask)


@pytest.mark.parametrize("rule", ["confidence", "random"])
def test_sampling_fills_every_mask_in_block_order_with_the_steps_asked(rule):
    model = Recorder(tiny_denoiser())
    x = torch.full((3, 32), 64)
    ids, passes = sample(model, x, steps=16, mask=64, rule=rule, block=8, temperature=0.7,
                         generator=torch.Generator().manual_seed(0))
    assert passes == 16 == len(model.inputs) and not (ids == 64).any()
    # the step at which each position was revealed: the first call whose input no longer has a mask there
    states = torch.stack(model.inputs + [ids])                                  # (steps + 1, B, T)
    revealed = (states == 64).sum(0)                                            # calls that still saw the mask
    for b in range(4 - 1):                                                      # blocks strictly left to right
        assert revealed[:, 8 * b:8 * b + 8].max() < revealed[:, 8 * (b + 1):8 * (b + 2)].min()
    assert revealed.max() == 16 and revealed.min() == 1
    ids, passes = sample(tiny_denoiser(), x, steps=32, mask=64, rule=rule)   # one block: one token a step
    assert passes == 32 and not (ids == 64).any()


class FixedLogits(torch.nn.Module):
    """A "denoiser" whose logits ignore the input (a tied-head model at initialisation tends to predict its input
    token back, which would hide a sampler that overwrites the given tokens)."""

    def __init__(self, T, V, seed=0):
        super().__init__()
        self.table = torch.randn(T, V, generator=torch.Generator().manual_seed(seed))

    def forward(self, x):
        return self.table[None].expand(x.shape[0], -1, -1)


def test_sampling_keeps_the_given_tokens_and_fills_a_blank_in_the_middle():
    model = Recorder(FixedLogits(30, 65))
    g = torch.Generator().manual_seed(2)
    story = torch.randint(0, 64, (2, 30), generator=g)
    x = story.clone()
    x[:, 10:20] = 64                                                          # a blank in the middle
    ids, passes = sample(model, x, steps=5, mask=64, block=4, generator=g)
    assert torch.equal(ids[:, :10], story[:, :10]) and torch.equal(ids[:, 20:], story[:, 20:])
    assert not (ids == 64).any() and passes == 5 == len(model.inputs)
    # blocks start at the first mask: 10-13, 14-17, 18-19 with two, two and one steps (2 rows x 2 a step)
    assert [(s[:, 10:20] == 64).sum().item() for s in model.inputs] == [20, 16, 12, 8, 4]
    with pytest.raises(ValueError, match="fewer than the 3 blocks"):
        sample(model, x, steps=2, mask=64, block=4)
    same, none = sample(model, story, steps=3, mask=64)
    assert torch.equal(same, story) and none == 0                              # nothing to fill: no pass


def test_the_held_out_bound_is_reproducible_and_counts_every_token():
    model = tiny_denoiser()
    tokens = np.random.default_rng(0).integers(0, 64, 300).astype(np.uint16)
    nbytes = torch.full((65,), 3)
    a = diffusion.evaluate(model, tokens, block_size=32, nbytes=nbytes, batch=4, draws=2)
    b = diffusion.evaluate(model, tokens, block_size=32, nbytes=nbytes, batch=4, draws=2)
    assert a == b and a["bound"] is True and a["tokens"] == 300 and a["bytes"] == 900
    assert all(type(a[k]) is float for k in ("nats_per_token", "perplexity", "bits_per_byte", "stderr_nats"))
    assert abs(a["bits_per_byte"] - a["nats_per_token"] * 300 / math.log(2) / 900) < 1e-9
    assert 0 < a["stderr_nats"] < 0.1 * a["nats_per_token"]
    assert abs(a["nats_per_token"] - math.log(64)) < 0.5                      # an untrained model: about ln V
    other = diffusion.evaluate(model, tokens, block_size=32, nbytes=nbytes, batch=4, draws=2, seed=1)
    assert other["nats_per_token"] != a["nats_per_token"]
    assert abs(other["nats_per_token"] - a["nats_per_token"]) < 4 * math.hypot(a["stderr_nats"], other["stderr_nats"])


def test_the_training_loss_is_the_elbo_estimate_of_the_models_output():
    model = tiny_denoiser()
    x0 = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    loss = diffusion.training_loss(model, x0, 64, torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    t = sample_times(4, g)
    xt, masked = add_noise(x0, t, 64, g)
    assert torch.allclose(loss, diffusion_loss(model(xt), x0, masked, t, 64))
    assert math.log(64) / 4 < loss.item() < 4 * math.log(64)     # 1/t weights the masked tokens back to ~ln V


def test_a_bidirectional_model_refuses_a_cache():
    model = tiny_denoiser()
    with pytest.raises(ValueError, match="no incremental"):
        model(torch.zeros(1, 3, dtype=torch.long), model.new_cache())


def test_the_elbo_bounds_the_random_order_samplers_own_nll_on_every_sequence():
    """For any denoiser, the sampler that reveals positions in a uniformly random order defines
    p(x) = mean over orderings sigma of p_sigma(x); the ELBO is the mean of -log p_sigma(x), so Jensen gives
    -log p(x) <= ELBO(x) for each x, not only on average. The denoiser is a near miss (q's exact conditionals with
    noise on the logits), so the gaps are small (0.5% of the bound at the smallest) and a bound that was a few
    percent too low would break the inequality."""
    V, T, mask = 3, 3, 3
    seqs, q = tiny_distribution(V, T)
    exact = exact_denoiser(seqs, q, V, mask)
    noise = 0.3 * torch.randn(4 ** T, T, V, generator=torch.Generator().manual_seed(7), dtype=torch.float64)

    def denoiser(xt):                          # float64 throughout, no mass on [MASK]
        pattern = int(sum(a * 4 ** j for j, a in enumerate(xt[0].tolist())))
        row = (exact(xt)[0, :, :V] + noise[pattern]).log_softmax(-1)
        return torch.cat([row, torch.full((T, 1), -math.inf, dtype=torch.float64)], 1)[None]

    p_model, elbo = [], []
    for s in seqs:
        orders = list(itertools.permutations(range(T)))
        p = 0.0
        for sigma in orders:
            xt, logp = torch.full((1, T), mask), 0.0
            for i in sigma:
                logp += denoiser(xt)[0, i, s[i]].item()
                xt[0, i] = s[i]
            p += math.exp(logp) / len(orders)
        p_model.append(p)
        elbo.append(exact_elbo(denoiser, torch.tensor(s), mask))
    assert abs(sum(p_model) - 1) < 1e-12                                   # a distribution over all V^T sequences
    gaps = [e + math.log(p) for e, p in zip(elbo, p_model)]
    assert min(gaps) >= -1e-12                                             # the bound, sequence by sequence
    assert max(gaps) > 0.01                                                # and not an equality in disguise
