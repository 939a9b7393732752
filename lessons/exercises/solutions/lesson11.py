"""Solutions to lesson 11's exercises (try them first). Load one into the notebook with
`%load exercises/solutions/lesson11.py`."""
import math

from minwiola import atm


def bits_per_byte(nats_per_token, bytes_per_token):
    return nats_per_token / math.log(2) / bytes_per_token          # nats -> bits, per token -> per byte


def rate_at(step, total=2000, peak=3e-3, warmup=0.05):
    p = step / total
    if p < warmup:
        return peak * p / warmup                                    # linear warm-up from 0
    return peak * 0.5 * (1 + math.cos(math.pi * (p - warmup) / (1 - warmup)))   # half cosine down to 0


def dsff_widths(d, hidden):
    # 3 d d_A + 2 d d_B + 2 d^2 (the gate W_f: 2d -> d) = 3 d hidden, so 3 d_A + 2 d_B = 3 hidden - 2 d
    total = 3 * hidden - 2 * d
    pairs = [(a, (total - 3 * a) // 2) for a in range(1, hidden) if (total - 3 * a) % 2 == 0 and total > 3 * a]
    return min(pairs, key=lambda p: (abs(p[1] - 3 * p[0]), p[0]))   # closest to Wiola's d_B = 3 d_A


def distinct(words, n):
    grams = list(zip(*(words[i:] for i in range(n))))
    return len(set(grams)) / len(grams)


def tau_for_ratio(rho, target):
    lo, hi = -1.0, 1.0                 # mu(lo) >= target; mu only grows as tau falls, so bisect
    if atm.merge_ratio(atm.merge_plan(rho, hi)) >= target:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        if atm.merge_ratio(atm.merge_plan(rho, mid)) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def train_step(model, optimizer, x, y, lr, clip):
    import torch
    from minwiola.model import next_token_loss
    for group in optimizer.param_groups:
        group["lr"] = lr                                            # the schedule's rate for this step
    loss = next_token_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)        # clip the gradient, then step
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)                           # or the next step adds to these gradients
    return loss.item()


def _forgets(part):
    """train_step with one part left out: the plausible mistakes of exercise 6."""
    def step(model, optimizer, x, y, lr, clip):
        import torch
        from minwiola.model import next_token_loss
        if part != "rate":
            for group in optimizer.param_groups:
                group["lr"] = lr
        loss = next_token_loss(model(x), y)
        loss.backward()
        if part != "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if part != "zero":
            optimizer.zero_grad(set_to_none=True)
        return loss.item()
    return step


def combine(rank_grads, rank_rows):
    # rank r's gradient is the mean over its n_r rows: times n_r it is their sum; the sums add up; divide by all rows
    return sum(g * n for g, n in zip(rank_grads, rank_rows)) / sum(rank_rows)


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {
    "bits_per_byte": lambda nats, nbytes: nats / nbytes,                       # forgot nats -> bits
    "rate_at": lambda step: 3e-3 * 0.5 * (1 + math.cos(math.pi * step / 2000)),  # no warm-up
    "dsff_widths": lambda d, hidden: (hidden // 4, 3 * hidden // 4),          # forgot the gate's 2 d^2
    "distinct": lambda words, n: len(set(words)) / len(words),                  # ignores n
    "tau_for_ratio": lambda rho, target: 0.92,                                  # the paper's tau, uncalibrated
    "train_step": _forgets("zero"),                                             # gradients pile up
    "combine": lambda grads, rows: sum(grads) / len(grads),                     # DDP's plain mean: unequal shards
}
ALSO_WRONG = {"train_step": [_forgets("clip"), _forgets("rate")],
              "combine": [lambda grads, rows: sum(grads),                   # summed, not averaged
                          lambda grads, rows: sum(g * n for g, n in zip(grads, rows)),   # weighted, not divided
                          lambda grads, rows: sum(g * n for g, n in zip(grads, rows)).float() / sum(rows)]}
