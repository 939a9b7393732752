"""Self-checks for lesson 15's exercises: the forward (masking) process of masked diffusion, checked by its
statistics (each token masked independently with its own sequence's probability t), and one unmasking step,
checked against `minwiola.diffusion.unmask_step` (rule "confidence", temperature 0). A function that still returns
None is "not attempted yet". Solutions: `solutions/lesson15.py` (look after trying)."""
import math

import torch

from exercises import attempted, correct
from minwiola.diffusion import unmask_step

MASK = 50                                  # the [MASK] id of the checks' small vocabulary (ids 0..49 are tokens)


def _x0(B: int, T: int, seed: int) -> torch.Tensor:
    return torch.randint(0, MASK, (B, T), generator=torch.Generator().manual_seed(seed))


def _raised(error: Exception, what: str) -> AssertionError:
    """A message, not a traceback, for an error raised inside the learner's function."""
    hint = ""
    if "must match the size" in str(error) or "broadcast" in str(error):
        hint = (": shapes that do not line up. t is (B,), one level per row; to compare it with a (B, T) tensor of "
                "uniforms, give it a column axis, t[:, None], so each row is compared with its own t")
    return AssertionError(f"{what} raised {type(error).__name__}: {error}{hint}")


def _call_noise(my_add_noise, x0, t, seed):
    try:
        got = my_add_noise(x0, t, MASK, torch.Generator().manual_seed(seed))
    except Exception as error:                                    # noqa: BLE001 (any mistake becomes a message)
        raise _raised(error, f"my_add_noise(x0 of shape {tuple(x0.shape)}, t of shape {tuple(t.shape)}, ...)") \
            from None
    assert isinstance(got, tuple) and len(got) == 2, f"return (xt, masked), got {type(got).__name__}"
    xt, masked = (torch.as_tensor(v) for v in got)
    assert tuple(xt.shape) == tuple(x0.shape) and tuple(masked.shape) == tuple(x0.shape), (
        f"xt and masked must have x0's shape {tuple(x0.shape)}, got {tuple(xt.shape)} and {tuple(masked.shape)}")
    assert masked.dtype == torch.bool, f"masked must be a bool tensor (True where a mask was put), got {masked.dtype}"
    return xt, masked


def check_1(my_add_noise) -> None:
    """my_add_noise(x0 (B, T), t (B,), mask, generator) -> (xt, masked): each token of row b independently replaced
    by `mask` with probability t[b]; masked (bool) says where. Randomness from `generator`."""
    x0 = _x0(2, 8, 0)
    try:
        first = my_add_noise(x0, torch.tensor([0.5, 0.5]), MASK, torch.Generator().manual_seed(0))
    except Exception as error:                                    # noqa: BLE001
        raise _raised(error, "my_add_noise(x0 of shape (2, 8), t of shape (2,), ...)") from None
    if not attempted(first, 1):
        return
    xt, masked = _call_noise(my_add_noise, x0, torch.tensor([0.5, 0.5]), 0)
    wrong = ((xt == MASK) != masked).nonzero()
    assert len(wrong) == 0, f"at {tuple(wrong[0].tolist())}: xt and masked disagree about whether it is masked"
    changed = (~masked & (xt != x0)).nonzero()
    assert len(changed) == 0, f"at {tuple(changed[0].tolist())}: a token that is not masked must stay as it was"
    again = _call_noise(my_add_noise, x0, torch.tensor([0.5, 0.5]), 0)[1]
    assert torch.equal(masked, again), "two calls with equally seeded generators differ: draw with `generator`"
    # per-row fractions: one noise level per sequence, masked with probability t (not 1 - t)
    T = 4000
    t = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    masked = _call_noise(my_add_noise, _x0(3, T, 1), t, 1)[1]
    for b, level in enumerate(t.tolist()):
        frac = masked[b].float().mean().item()
        bound = 5 * math.sqrt(level * (1 - level) / T)             # five binomial standard deviations
        if abs(frac - level) <= bound:
            continue
        if abs(frac - (1 - level)) <= bound:
            raise AssertionError(f"row {b} has t = {level:g} but {frac:.3f} of it is masked: t is the probability "
                                 "that a token IS masked (t = 1: all masks)")
        if all(abs(masked[i].float().mean().item() - frac) <= 5 * math.sqrt(0.25 / T) for i in range(3)):
            raise AssertionError(f"every row is masked at about {frac:.3f}, whatever its t {[round(v, 2) for v in t.tolist()]}: each "
                                 "sequence has its own noise level t[b]")
        raise AssertionError(f"row {b} has t = {level:g} but {frac:.3f} of it is masked (expected within "
                             f"{bound:.3f} of {level})")
    # independent tokens: the number of masks in a row varies as a binomial, it is not fixed by t
    B, T, level = 400, 50, 0.3
    rows = _call_noise(my_add_noise, _x0(B, T, 2), torch.full((B,), level), 2)[1]
    same = (rows == rows[0]).all(1).float().mean().item()          # independent rows: two agree ~0.58^50 of the time
    assert same < 0.5, (
        f"{B} rows at the same t = {level}: {same:.0%} of them have exactly row 0's mask. Rows with equal t got "
        "identical masks, so the uniforms are shared between rows (one per column): draw one uniform per token, "
        "shape (B, T), not (T,)")
    counts = rows.sum(1).float()
    variance, expected = counts.var().item(), T * level * (1 - level)
    assert variance > expected / 2, (
        f"{B} rows of {T} tokens at t = {level}: the number of masks per row has variance {variance:.2f}, a "
        f"binomial's is {expected:.2f}: mask each token independently (a coin per token), not a fixed count")
    full = _call_noise(my_add_noise, _x0(2, 30, 3), torch.ones(2), 3)[1]
    assert full.all(), "t = 1 must mask every token"
    correct("Exercise 1: correct (each token masked independently with its own sequence's probability t)", my_add_noise)


def _step_case(seed: int, B: int = 3, T: int = 12, V: int = MASK + 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, MASK, (B, T), generator=g)
    x[torch.rand(B, T, generator=g) < 0.6] = MASK                        # about 60% masked
    x[:, 0] = MASK                                                       # at least one mask per row
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    # at some masked positions the [MASK] column is the largest logit: a denoiser must never predict it
    tempt = (x == MASK) & (torch.rand(B, T, generator=g) < 0.4)
    logits[..., MASK] = torch.where(tempt, logits.amax(-1) + 5, logits[..., MASK])
    return x, logits


def _call_step(my_unmask_step, x, logits, k):
    try:
        return my_unmask_step(x.clone(), logits, k, MASK)
    except Exception as error:                                    # noqa: BLE001 (any mistake becomes a message)
        raise _raised(error, f"my_unmask_step(x of shape {tuple(x.shape)}, logits of shape {tuple(logits.shape)}, "
                             f"k={k}, mask={MASK})") from None


def _ranked(x, score, k):
    """The k masked positions of each row with the highest `score` (B, T): a bool (B, T)."""
    score = score.masked_fill(x != MASK, float("-inf"))
    return torch.zeros_like(x, dtype=torch.bool).scatter(-1, score.topk(k, dim=-1).indices, True) & (x == MASK)


def _confidence(logits):
    """Each position's confidence (B, T): the log-probability of its predicted token, [MASK] column removed."""
    return logits.index_fill(-1, torch.tensor([MASK]), float("-inf")).log_softmax(-1).amax(-1)


def _commit(x, score, predicted, k):
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, score.masked_fill(x != MASK, float("-inf"))
                                                          .topk(k, dim=-1).indices, True) & (x == MASK)
    return torch.where(reveal, predicted, x)


def _over_positions(x, logits, k):
    """The mistake of a softmax over the positions (dim 1), not the vocabulary, gathered at the argmax."""
    no_mask = logits.index_fill(-1, torch.tensor([MASK]), float("-inf"))
    predicted = no_mask.argmax(-1)
    return _commit(x, no_mask.softmax(1).gather(-1, predicted[..., None]).squeeze(-1), predicted, k)


def _by_raw_logit(x, logits, k):
    """The mistake of ranking by the predicted token's raw logit, not its probability."""
    no_mask = logits.index_fill(-1, torch.tensor([MASK]), float("-inf"))
    return _commit(x, no_mask.amax(-1), no_mask.argmax(-1), k)


def _ranking_mistake(my_unmask_step) -> str:
    """Which of two ranking mistakes the learner made, told apart on a case where they give different answers (on
    some cases a raw-logit ranking and a softmax over the positions commit the same positions)."""
    x, logits = _step_case(1)
    got = torch.as_tensor(_call_step(my_unmask_step, x, logits, 2))
    raw, positions = _by_raw_logit(x, logits, 2), _over_positions(x, logits, 2)
    assert not torch.equal(raw, positions), "the check's own case must tell the two mistakes apart"
    if torch.equal(got, raw):
        return ("you ranked by the predicted token's raw logit. Confidence is its PROBABILITY, the softmax over the "
                "real tokens of that position: each position has its own normaliser (log-sum-exp), so the largest "
                "logit is not the surest prediction; rank by softmax(logits without [MASK], dim=-1).max(-1)")
    if torch.equal(got, positions):
        return ("you took the softmax over the positions (dim 1), not over the vocabulary (the last dim): each "
                "position's distribution is over the tokens: softmax(..., dim=-1), taken after the [MASK] column is "
                "set to -inf")
    return ""


def check_2(my_unmask_step) -> None:
    """my_unmask_step(x (B, T), logits (B, T, V), k, mask) -> new x: at every masked position predict the most
    likely token that is not the mask; keep the k most confident predictions of each row (highest probability of
    the predicted token under the denoiser's distribution: the [MASK] column removed, the softmax taken over the
    real tokens), leave the other masks masked, and never change a visible token."""
    x, logits = _step_case(0)
    if not attempted(_call_step(my_unmask_step, x, logits, 1), 2):
        return
    for seed, k in ((0, 1), (1, 2), (2, 3), (3, 1), (4, 2)):
        x, logits = _step_case(seed)
        got = torch.as_tensor(_call_step(my_unmask_step, x, logits, k))
        want = unmask_step(x, logits, k, MASK, rule="confidence", temperature=0.0)
        case = f"case {seed}, k = {k}"
        assert tuple(got.shape) == tuple(x.shape), f"{case}: shape {tuple(got.shape)}, expected {tuple(x.shape)}"
        if torch.equal(got, want):
            continue
        visible = (x != MASK) & (got != x)
        if visible.any():
            i = tuple(visible.nonzero()[0].tolist())
            raise AssertionError(f"{case}: position {i} was visible ({x[i].item()}) and you changed it to "
                                 f"{got[i].item()}: only masked positions may be filled")
        axis = ("each position's distribution is over the tokens: softmax(..., dim=-1), taken after the [MASK] "
                "column is set to -inf")
        if torch.equal(got, _over_positions(x, logits, k)) or torch.equal(got, _by_raw_logit(x, logits, k)):
            mistake = _ranking_mistake(my_unmask_step)
            if mistake:
                raise AssertionError(f"{case}: {mistake}")
        if torch.equal(got, x):
            calm = logits.clone()
            calm[..., MASK] = logits.amin(-1) - 5                       # no [MASK] logit tempts anywhere
            if torch.equal(torch.as_tensor(_call_step(my_unmask_step, x, calm, k)), x):
                raise AssertionError(
                    f"{case}: you revealed nothing in any row, even when the [MASK] logit is the smallest at every "
                    "position. One mistake that does this: a softmax over the positions (dim 1), not the "
                    "vocabulary: the [MASK] column, -inf at every position, becomes NaN and wins the max, so [MASK] "
                    f"is committed everywhere; {axis}")
        revealed = (x == MASK) & (got != MASK)
        counts = revealed.sum(1)
        wrong_count = (counts != k).nonzero().flatten().tolist()
        if wrong_count and int(counts.sum()) == k and len(x) > 1:
            raise AssertionError(f"{case}: you revealed {k} masks in the whole batch ({counts.tolist()} per row): k is "
                                 f"per row, each of the {len(x)} rows commits its own k = {k}")
        if wrong_count:
            b = wrong_count[0]
            masks, n = int((x[b] == MASK).sum()), int(counts[b])
            if n > k:
                raise AssertionError(f"{case}: row {b} had {masks} masks and you revealed {n}, expected k = {k}: "
                                     "commit only the k most confident predictions and leave the other masks as masks")
            top = _confidence(logits)[b].topk(k).indices                  # the k surest positions, visible ones too
            if n < k and bool((x[b, top] != MASK).any()) and n == int((x[b, top] == MASK).sum()):
                raise AssertionError(
                    f"{case}: row {b}: you revealed {n}, expected k = {k}: your top k was taken over every position, "
                    f"and {int((x[b, top] != MASK).sum())} of the {k} picks fell on visible tokens, which reveal "
                    "nothing. Rank only the masked positions: set the confidence of visible ones to -inf before topk")
            tempted = bool(((x[b] == MASK) & (logits[b].argmax(-1) == MASK)).any())
            hint = (": at some masked positions the largest logit is the [MASK] column; take the argmax with that "
                    "column removed (a committed [MASK] is no prediction: the denoiser never predicts the mask)"
                    ) if tempted else ": commit exactly k predictions in every row"
            raise AssertionError(f"{case}: row {b} had {masks} masks and you revealed {n}, expected k = {k}{hint}")
        target = (x == MASK) & (want != MASK)
        if (revealed != target).any():
            b = int((revealed != target).any(1).nonzero()[0])
            hint = ("confidence is the probability the denoiser gives its predicted token; the highest are committed "
                    "first")
            pick = logits.index_fill(-1, torch.tensor([MASK]), float("-inf")).argmax(-1, keepdim=True)
            with_mask = _ranked(x, logits.log_softmax(-1).gather(-1, pick).squeeze(-1), k)   # [MASK] in the sum
            if torch.equal(revealed[b], with_mask[b]) and not torch.equal(with_mask[b], target[b]):
                hint = ("you ranked by a softmax over all columns, [MASK] included. The denoiser's distribution "
                        "drops the [MASK] column and renormalises over the real tokens (diffusion.denoiser_log_probs)"
                        ": set that logit to -inf before the softmax, then rank by the predicted token's probability")
            raise AssertionError(f"{case}: row {b}: you revealed positions {revealed[b].nonzero().flatten().tolist()}, "
                                 f"the {k} most confident predictions are at {target[b].nonzero().flatten().tolist()}: "
                                 + hint)
        i = tuple(((got != want) & revealed).nonzero()[0].tolist())
        raise AssertionError(f"{case}: at {i} you committed {got[i].item()}, the most likely token there (never the "
                             f"mask) is {want[i].item()}")
    correct("Exercise 2: correct (the k most confident predictions committed, the mask never predicted, visible "
          "tokens kept)", my_unmask_step)


EXERCISES = {1: "my_add_noise", 2: "my_unmask_step"}
