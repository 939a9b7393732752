"""Solutions to lesson 11's exercises (try them first). Load one into the notebook with
`%load exercises/solutions/lesson11.py`."""
import math
import types


def rate_at(step, total=2000, peak=3e-3, warmup=0.05):
    p = step / total
    if p < warmup:
        return peak * p / warmup                                    # linear warm-up from 0
    return peak * 0.5 * (1 + math.cos(math.pi * (p - warmup) / (1 - warmup)))   # half cosine down to 0


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
    """train_step with one part left out: the plausible mistakes of exercise 4."""
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
        return loss.detach() if part == "item" else loss.item()
    return step


def combine(rank_grads, rank_rows):
    # rank r's gradient is the mean over its n_r rows: times n_r it is their sum; the sums add up; divide by all rows
    return sum(g * n for g, n in zip(rank_grads, rank_rows)) / sum(rank_rows)


def adamw_step(p, grad, state, lr, betas, eps, weight_decay):
    import torch
    b1, b2 = betas
    if not state:
        state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
    state["step"] += 1                                           # the first step is t = 1
    t = state["step"]
    state["m"] = b1 * state["m"] + (1 - b1) * grad               # running mean of the gradient
    state["v"] = b2 * state["v"] + (1 - b2) * grad * grad        # ... and of its square
    m_hat = state["m"] / (1 - b1 ** t)                           # bias correction: m and v started at 0
    v_hat = state["v"] / (1 - b2 ** t)
    p = p * (1 - lr * weight_decay)                              # decoupled decay, on the weights themselves
    return p - lr * m_hat / (v_hat.sqrt() + eps)


def clip_global_norm(grads, max_norm):
    import torch
    total = torch.sqrt(sum((g ** 2).sum() for g in grads))       # one norm over every entry of every tensor
    scale = min(1.0, max_norm / (float(total) + 1e-6))           # shrink only; torch adds the same 1e-6
    return [g * scale for g in grads]


def save_checkpoint(path, model, optimizer, step, generator):
    import torch
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "torch_rng": torch.get_rng_state(), "data_rng": generator.get_state()}, path)


def load_checkpoint(path, model, optimizer, generator):
    import torch
    saved = torch.load(path, weights_only=True)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch_rng"])                      # dropout draws the same masks again
    generator.set_state(saved["data_rng"])                       # ... and the sampler the same batches
    return saved["step"]


def _adamw_wrong(mistake):
    """adamw_step with one plausible mistake of exercise 2."""
    def step(p, grad, state, lr, betas, eps, weight_decay):
        import torch
        b1, b2 = betas
        if not state:
            state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
        if mistake == "l2":
            grad = grad + weight_decay * p                       # Adam with L2: decay inside the moments
        t = state["step"] + (0 if mistake == "late count" else 1)
        state["step"] += 1
        state["m"] = b1 * state["m"] + (1 - b1) * grad
        state["v"] = b2 * state["v"] + (1 - b2) * grad * grad
        m_hat, v_hat = state["m"], state["v"]
        if mistake != "no bias correction":
            m_hat, v_hat = m_hat / (1 - b1 ** t), v_hat / (1 - b2 ** t)
        denom = (v_hat + eps).sqrt() if mistake == "eps inside" else v_hat.sqrt() + eps
        if mistake != "l2":
            p = p * (1 - lr * weight_decay)
        return p - lr * m_hat / denom
    return step


def _clip_per_tensor(grads, max_norm):
    return [g * min(1.0, max_norm / (float(g.norm()) + 1e-6)) for g in grads]   # each tensor on its own


def _save_without(*pieces):
    """save_checkpoint that leaves pieces out: the plausible mistakes of exercise 5's save half."""
    def save(path, model, optimizer, step, generator):
        import torch
        every = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "torch_rng": torch.get_rng_state(), "data_rng": generator.get_state()}
        torch.save({k: v for k, v in every.items() if k not in pieces}, path)
    return save


def _save_wrong_generator(path, model, optimizer, step, generator):
    import torch
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "torch_rng": torch.get_rng_state(), "data_rng": torch.get_rng_state()}, path)   # torch's, twice


def _load_without(piece):
    """load_checkpoint that does not put one piece back: the plausible mistakes of exercise 5's load half."""
    def load(path, model, optimizer, generator):
        import torch
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["model"])
        if piece != "optimizer":
            optimizer.load_state_dict(saved["optimizer"])
        if piece != "torch_rng":
            torch.set_rng_state(saved["torch_rng"])
        if piece != "data_rng":
            generator.set_state(saved["data_rng"])
        return {"step": 0, "no return": None}.get(piece, saved["step"])
    return load


def _beside(load):
    """The right save_checkpoint, defined beside a wrong load_checkpoint (as both halves sit in one notebook): the
    check's one-argument call finds its load half there."""
    return types.FunctionType(save_checkpoint.__code__, {**globals(), "load_checkpoint": load})


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {
    "rate_at": lambda step: 3e-3 * 0.5 * (1 + math.cos(math.pi * step / 2000)),  # no warm-up
    "train_step": _forgets("zero"),                                             # gradients pile up
    "combine": lambda grads, rows: sum(grads) / len(grads),                     # DDP's plain mean: unequal shards
    "adamw_step": _adamw_wrong("no bias correction"),
    "clip_global_norm": _clip_per_tensor,                                         # per tensor, not global
    "save_checkpoint": _save_without("optimizer"),                                # the moments restart at 0
}
ALSO_WRONG = {"train_step": [_forgets("clip"), _forgets("rate"), _forgets("item")],
              "combine": [lambda grads, rows: sum(grads),                   # summed, not averaged
                          lambda grads, rows: sum(g * n for g, n in zip(grads, rows)),   # weighted, not divided
                          lambda grads, rows: sum(g * n for g, n in zip(grads, rows)).float() / sum(rows)],
              "adamw_step": [_adamw_wrong("l2"), _adamw_wrong("eps inside"), _adamw_wrong("late count")],
              "clip_global_norm": [lambda grads, c: [g.clamp(-c, c) for g in grads],          # by value
                                   lambda grads, c: [g * c / float(sum((x ** 2).sum() for x in grads) ** 0.5)
                                                     for g in grads]],                         # always rescales
              "save_checkpoint": [_save_without("torch_rng", "data_rng"), _save_without("data_rng"),
                                  _save_wrong_generator,                     # the save half wrong, then the load half:
                                  _beside(_load_without("torch_rng")),      # dropout draws other masks
                                  _beside(_load_without("optimizer")), _beside(_load_without("data_rng")),
                                  _beside(_load_without("step")), _beside(_load_without("no return"))]}
