"""Self-checks for lesson 11's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which input, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson11.py` (look after trying)."""
import math

import torch

from exercises import attempted, close, same_tensor
from minwiola import atm
from minwiola.generate import story_statistics
from minwiola.train import learning_rate


def check_1(bits_per_byte) -> None:
    """bits_per_byte(nats_per_token, bytes_per_token)."""
    if not attempted(bits_per_byte(1.0, 1.0), 1):
        return
    close(bits_per_byte(math.log(2), 1.0), 1.0, "ln 2 nats per token, 1 byte per token (one bit per byte)")
    close(bits_per_byte(math.log(2), 4.0), 0.25, "ln 2 nats per token, 4 bytes per token (divide by the bytes)")
    close(bits_per_byte(3.0, 4.2), 3.0 / (math.log(2) * 4.2), "3 nats per token, 4.2 bytes per token")
    print("Exercise 1: correct")


def check_2(rate_at) -> None:
    """rate_at(step): eq. 43 for 2,000 steps, peak 3e-3, 5% warm-up."""
    if not attempted(rate_at(0), 2):
        return
    for step in (0, 1, 37, 99, 100, 101, 1000, 1999, 2000):
        close(rate_at(step), learning_rate(step / 2000, 3e-3, 0.05),
              f"step {step} (progress {step / 2000:g}; warm-up ends at step 100)", 1e-9)
    print("Exercise 2: correct (the peak is reached at step 100)")


def check_3(dsff_widths) -> None:
    """dsff_widths(d, hidden): (d_A, d_B) with DSFF's parameters equal to a SwiGLU of that hidden width."""
    if not attempted(dsff_widths(64, 176), 3):
        return
    for d, hidden in ((64, 176), (512, 1368), (32, 88), (96, 256)):
        got = dsff_widths(d, hidden)
        assert isinstance(got, (tuple, list)) and len(got) == 2, (f"d={d}, hidden={hidden}: expected a pair "
                                                                  f"(d_A, d_B), got {got!r}")
        a, b = got
        budget = 3 * d * hidden
        used = 3 * d * a + 2 * d * b + 2 * d * d
        assert used == budget, (f"d={d}, hidden={hidden}: ({a}, {b}) gives DSFF 3*d*d_A + 2*d*d_B + 2*d^2 = "
                                f"{used:,} parameters, SwiGLU has 3*d*hidden = {budget:,} (is the gate W_f in?)")
        best = min((abs((3 * hidden - 2 * d - 3 * x) // 2 - 3 * x), x) for x in range(1, hidden)
                   if (3 * hidden - 2 * d - 3 * x) % 2 == 0 and 3 * hidden - 2 * d - 3 * x > 0)
        assert abs(b - 3 * a) == best[0], (f"d={d}, hidden={hidden}: ({a}, {b}) is exact but d_B - 3 d_A = "
                                           f"{b - 3 * a}; another exact pair has |d_B - 3 d_A| = {best[0]}")
    print(f"Exercise 3: correct (the ablation's DSFF: {dsff_widths(64, 176)})")


def check_4(distinct) -> None:
    """distinct(words, n): the share of distinct n-grams among a list of words' n-grams."""
    story = "the cat sat on the mat and the cat ran to the mat".split()
    if not attempted(distinct(story, 1), 4):
        return
    from minwiola.generate import words
    again = "the cat sat on the mat the cat sat on a hat the cat sat".split()    # repeated 2-, 3- and 4-grams
    for text in (story, again):
        for n in (1, 2, 3, 4):
            grams = list(zip(*(text[i:] for i in range(n))))
            close(distinct(text, n), len(set(grams)) / len(grams), f"n = {n} on {' '.join(text)!r} "
                  f"({len(grams)} {n}-grams, {len(set(grams))} distinct)")
    text = "Once upon a time, a dog and a cat played. The dog ran and the cat ran. The dog and the cat slept."
    w = words(text)
    stats = story_statistics([text], n_words=len(w))
    close(distinct(w, 1), stats["distinct_1"], "distinct-1 against minwiola.generate.story_statistics")
    close(distinct(w, 2), stats["distinct_2"], "distinct-2 against minwiola.generate.story_statistics")
    print(f"Exercise 4: correct (2-gram repetition of that text: {1 - distinct(w, 2):.3f})")


def check_5(tau_for_ratio) -> None:
    """tau_for_ratio(rho, target): a tau that merges at least `target` while tau + 0.001 merges less."""
    torch.manual_seed(0)
    rho = torch.rand(4, 255) * 2 - 1
    if not attempted(tau_for_ratio(rho, 0.11), 5):
        return
    for target in (0.02, 0.11, 0.3):
        tau = float(tau_for_ratio(rho, target))
        mu = atm.merge_ratio(atm.merge_plan(rho, tau))
        assert mu >= target, f"target {target}: at your tau = {tau:.4f} only mu = {mu:.4f} of the tokens merge"
        above = atm.merge_ratio(atm.merge_plan(rho, tau + 1e-3))
        assert above < target, (f"target {target}: tau = {tau:.4f} is too low; tau + 0.001 still merges "
                                f"mu = {above:.4f}: find the largest such tau")
    print(f"Exercise 5: correct (tau = {float(tau_for_ratio(rho, 0.11)):.3f} for mu = 0.11 on uniform similarities)")


def _step_case():
    """Two identical tiny models with AdamW built at lr 1.0 (so a step that never sets the rate shows), two fixed
    batches whose gradients are far above the clip of 0.05 (so a step that does not clip shows too)."""
    from minwiola.model import LanguageModel, preset
    torch.manual_seed(0)
    cfg = preset("tiny-llama", init_std=0.5)
    models = [LanguageModel(cfg).double() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1.0, weight_decay=0.1) for m in models]
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, cfg.vocab_size, (3, 9), generator=g) for _ in range(2)]
    return models, opts, [(b[:, :-1], b[:, 1:]) for b in batches]


def _reference_step(model, opt, x, y, lr, clip, zero=True, clipped=True, set_rate=True) -> float:
    """minwiola.train.Trainer.train_step's order (one micro-batch): rate, forward, loss, backward, clip, step, zero.
    The switches turn one part off, to name what a wrong answer forgot."""
    from minwiola.model import next_token_loss
    if set_rate:
        for group in opt.param_groups:
            group["lr"] = lr
    loss = next_token_loss(model(x), y)
    loss.backward()
    if clipped:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    if zero:
        opt.zero_grad(set_to_none=True)
    return loss.item()


def _same_weights(a, b) -> bool:
    return all(torch.allclose(p, q, atol=1e-9, rtol=0) for p, q in zip(a.parameters(), b.parameters()))


def check_6(train_step) -> None:
    """train_step(model, optimizer, x, y, lr, clip): one optimizer step as the trainer takes it; returns the loss."""
    models, opts, batches = _step_case()
    lr, clip = 1e-2, 0.05
    first = train_step(models[0], opts[0], *batches[0], lr, clip)
    if not attempted(first, 6):
        return
    want = _reference_step(models[1], opts[1], *batches[0], lr, clip)
    close(first, want, "the loss your step returns for the first batch (mean next-token cross-entropy, nats)", 1e-9)
    assert _same_weights(*models), _diagnose(models[0], 1, lr, clip)
    train_step(models[0], opts[0], *batches[1], lr, clip)
    _reference_step(models[1], opts[1], *batches[1], lr, clip)
    assert _same_weights(*models), _diagnose(models[0], 2, lr, clip)
    print(f"Exercise 6: correct (two steps agree with the trainer's order; first loss {first:.4f} nats/token)")


def _diagnose(learner, steps: int, lr: float, clip: float) -> str:
    """Replay `steps` steps with one part switched off; name the part whose absence the learner's weights match."""
    fixes = {"zero": "the gradients of the first step were still there at the second: zero them after the step",
             "clipped": f"the gradient was not clipped to norm {clip} before the step (clip_grad_norm_)",
             "set_rate": f"the rate was not set: put lr = {lr} in every param group before the step"}
    for part, hint in fixes.items():
        models, opts, batches = _step_case()
        for batch in batches[:steps]:
            _reference_step(models[1], opts[1], *batch, lr, clip, **{part: False})
        if _same_weights(learner, models[1]):
            return f"after step {steps} the weights differ from the trainer's: {hint}"
    return (f"after step {steps} the weights differ from the trainer's order (set the rate, forward, loss, backward, "
            "clip, step, zero the gradients)")


def _rank_case(sizes, seed=0):
    """A linear model's mean-squared-error gradient, the whole batch's and each rank's shard's (the shard's own mean
    loss, as a rank computes it), for shards of `sizes` rows."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(3, generator=g, dtype=torch.float64)
    x = torch.randn(sum(sizes), 3, generator=g, dtype=torch.float64)
    y = torch.randn(sum(sizes), generator=g, dtype=torch.float64)
    grad = lambda rows: torch.func.grad(lambda v: ((x[rows] @ v - y[rows]) ** 2).mean())(w)
    starts = [sum(sizes[:r]) for r in range(len(sizes))]
    return grad(slice(None)), [grad(slice(s, s + n)) for s, n in zip(starts, sizes)]


def _combine_hint(got, whole, ranks) -> str:
    """What a wrong `combine` most likely did, judged from its answer on one case."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(whole.shape):
        return ""                                        # same_tensor already says what the type or shape is
    if got.dtype != whole.dtype:
        return f"keep the gradients' dtype ({whole.dtype}): the check compares to 1e-12"
    if torch.allclose(got, sum(ranks)):
        return "each rank's gradient is already a mean over its rows: the batch's mean is their average, not sum"
    ratio = got / whole
    if torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio)):
        return f"your answer is {ratio.flatten()[0].item():.4g} times the batch's gradient: divide by the total rows"
    return ""


def check_7(combine) -> None:
    """combine(rank_grads, rank_rows): the gradient of the mean loss over all rows, from each rank's gradient of its
    own shard's mean loss and the shard's number of rows."""
    whole, ranks = _rank_case([4, 4])
    if not attempted(combine(ranks, [4, 4]), 7):
        return
    got = combine(ranks, [4, 4])
    same_tensor(got, whole, "two ranks of 4 rows each", 1e-12, _combine_hint(got, whole, ranks))
    for sizes in ([4, 4, 4, 4], [8]):
        whole, ranks = _rank_case(sizes, 1)
        got = combine(ranks, sizes)
        same_tensor(got, whole, f"{len(sizes)} rank(s) of {sizes[0]} rows", 1e-12, _combine_hint(got, whole, ranks))
    sizes = [3, 5]
    whole, ranks = _rank_case(sizes, 2)
    plain = sum(ranks) / len(ranks)
    got = combine(ranks, sizes)
    hint = ("that is the plain mean of the two gradients, what DDP's all-reduce computes: with shards of 3 and 5 rows "
            "each row of the smaller one would count 5/3 as much; weight each rank by its rows" if
            isinstance(got, torch.Tensor) and got.shape == plain.shape and torch.allclose(got, plain) else
            _combine_hint(got, whole, ranks) or "weight each rank's gradient by its rows")
    same_tensor(got, whole, "shards of 3 and 5 rows (a batch that does not split evenly)", 1e-12, hint)
    print("Exercise 7: correct (weights by rows; with equal shards that is DDP's plain average)")


EXERCISES = {1: "bits_per_byte", 2: "rate_at", 3: "dsff_widths", 4: "distinct", 5: "tau_for_ratio",
             6: "train_step", 7: "combine"}   # check -> name
