"""Self-checks for lesson 11's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which input, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson11.py` (look after trying)."""
import torch

from exercises import attempted, close, correct, same_tensor
from minwiola.model import LanguageModel, next_token_loss
from minwiola.train import learning_rate, parameter_groups


def check_1(rate_at) -> None:
    """rate_at(step): eq. 43 for 2,000 steps, peak 3e-3, 5% warm-up."""
    if not attempted(rate_at(0), 1):
        return
    for step in (0, 1, 37, 99, 100, 101, 1000, 1999, 2000):
        close(rate_at(step), learning_rate(step / 2000, 3e-3, 0.05),
              f"step {step} (progress {step / 2000:g}; warm-up ends at step 100)", 1e-9)
    correct("Exercise 1: correct (the peak is reached at step 100)", rate_at)


def _adamw_replay(p, grads, lrs, betas, eps, wd, *, bias=True, l2=False, eps_inside=False, offset=0,
                  decay="decoupled", fresh=False):
    """Hand-written AdamW over the given steps; the switches make one of the plausible mistakes, to name it."""
    b1, b2 = betas
    m, v, p = torch.zeros_like(p), torch.zeros_like(p), p.clone()
    for t, (g, lr) in enumerate(zip(grads, lrs), 1):
        if fresh:
            m, v, t = torch.zeros_like(p), torch.zeros_like(p), 1
        g = g + wd * p if l2 else g
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        t += offset
        m_hat, v_hat = (m / (1 - b1 ** t), v / (1 - b2 ** t)) if bias else (m, v)
        step = lr * m_hat / ((v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps)
        if decay == "decoupled" and not l2:
            p = p * (1 - lr * wd) - step
        elif decay == "without lr":
            p = p * (1 - wd) - step
        elif decay == "after":
            p = (p - step) * (1 - lr * wd)
        else:
            p = p - step
    return p


def _adamw_hint(learner, grads, lrs, betas, eps, wd) -> str:
    """Replay the steps so far with each plausible mistake; name the one whose weights the learner's match."""
    b1, b2 = betas
    mistakes = {
        "no bias correction: divide m by (1 - beta1^t) and v by (1 - beta2^t), or the first steps are far too "
        "small (m and v start at 0)": dict(bias=False),
        "the weight decay was added to the gradient (L2 regularisation, Adam's old form); AdamW decouples it: "
        "multiply the weights by (1 - lr * weight_decay), outside m and v": dict(l2=True),
        f"eps went inside the square root: the denominator is sqrt(v_hat) + eps, not sqrt(v_hat + eps) (with "
        f"eps = {eps:g} and gradients this small, the difference shows)": dict(eps_inside=True),
        "the step count is one too high in the bias correction: the first step is t = 1": dict(offset=1),
        "the decay is lr * weight_decay per step, not weight_decay alone (the rate scales it)":
            dict(decay="without lr"),
        "the weights were not decayed at all (that is Adam; AdamW also multiplies them by 1 - lr * weight_decay)":
            dict(decay="none"),
        "the decay was applied after the Adam update; torch.optim.AdamW (and the paper) decays the weights the "
        "step started from": dict(decay="after"),
        "m, v and the step count were not kept between calls: store them in `state` (every step looked like a "
        "first step)": dict(fresh=True),
    }
    for hint, switch in mistakes.items():
        if torch.allclose(learner, _adamw_replay(_ADAM_P0, grads, lrs, betas, eps, wd, **switch),
                          atol=1e-10, rtol=0):
            return hint
    return (f"AdamW at step t: m = {b1} m + (1 - {b1}) g, v = {b2} v + (1 - {b2}) g^2, m_hat = m / (1 - {b1}^t), "
            f"v_hat = v / (1 - {b2}^t), p = p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)")


_ADAM_P0 = torch.linspace(-1.5, 1.5, 12, dtype=torch.float64).reshape(3, 4)


def check_2(adamw_step) -> None:
    """adamw_step(p, grad, state, lr, betas, eps, weight_decay): one AdamW step for one tensor; returns the new p."""
    betas, eps, wd = (0.9, 0.95), 1e-6, 0.1
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(3, 4, generator=g, dtype=torch.float64) * 1e-3 for _ in range(5)]   # eps shows beside them
    lrs = [0.1, 0.2, 0.05, 0.1, 0.3]                                  # a schedule: the rate changes every step
    state = {}
    p = adamw_step(_ADAM_P0.clone(), grads[0].clone(), state, lrs[0], betas, eps, wd)
    if not attempted(p, 2):
        return
    ref = torch.nn.Parameter(_ADAM_P0.clone())
    opt = torch.optim.AdamW([ref], lr=lrs[0], betas=betas, eps=eps, weight_decay=wd)
    for t, (grad, lr) in enumerate(zip(grads, lrs), 1):
        if t > 1:
            p = adamw_step(p, grad.clone(), state, lr, betas, eps, wd)
        opt.param_groups[0]["lr"] = lr
        ref.grad = grad.clone()
        opt.step()
        what = (f"after step {t} (rates {lrs[:t]}, betas {betas}, eps {eps:g}, weight decay {wd}), your p against "
                "torch.optim.AdamW's")
        hint = ""
        if isinstance(p, torch.Tensor) and p.shape == ref.shape:
            if not torch.isfinite(p).all():
                hint = ("not finite: at t = 0 the bias correction 1 - beta^t is 0; count the step before using it "
                        "(the first step is t = 1)")
            elif not torch.allclose(p, ref.detach(), atol=1e-10, rtol=0):
                hint = "likely: " + _adamw_hint(p, grads[:t], lrs[:t], betas, eps, wd)
        same_tensor(p, ref.detach(), what, 1e-10, hint)
    correct("Exercise 2: correct (5 steps equal torch.optim.AdamW's to 1e-10)", adamw_step)


def _clip_variants(grads, max_norm):
    """The plausible mistakes of gradient clipping, each as the gradients it would produce."""
    norms = [g.norm() for g in grads]
    total = torch.stack(norms).norm()
    return {"each tensor was clipped by its own norm; the clip is by the global norm, over all the tensors "
            "together (sqrt of the sum of every entry's square), so that all keep their relative sizes":
            [g * min(1.0, max_norm / float(n)) for g, n in zip(grads, norms)],
            "that clips each entry to [-max_norm, max_norm] (clipping by value); clip by the global norm instead":
            [g.clamp(-max_norm, max_norm) for g in grads],
            "the gradients were scaled to norm max_norm although their norm was already below it: scale only when "
            "the norm is above max_norm (the factor is min(1, max_norm / norm))":
            [g * max_norm / float(total) for g in grads],
            "the global norm is sqrt(sum of the tensors' squared norms), not the sum of their norms":
            [g * min(1.0, max_norm / float(sum(norms))) for g in grads],
            "the global norm is the square root of the sum of squares; the square root is missing":
            [g * min(1.0, max_norm / float(total ** 2)) for g in grads]}


def check_3(clip_global_norm) -> None:
    """clip_global_norm(grads, max_norm): the list of gradients scaled so that their global norm is at most
    max_norm, as torch.nn.utils.clip_grad_norm_ does."""
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 5), (5,), (3, 3)]
    first = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    if not attempted(clip_global_norm([x.clone() for x in first], 1.0), 3):
        return
    cases = [("3 tensors of global norm about 5, max_norm 1", first, 1.0),
             ("the same tensors, max_norm 100 (the norm is already below)", first, 100.0),
             ("4 tensors of norm 0.8 each (global norm 1.6), max_norm 1",
              [torch.full((4,), 0.4, dtype=torch.float64) for _ in range(4)], 1.0),
             ("a tensor of norm 10 beside two of norm 0.1, max_norm 1",
              [torch.full((4,), 5.0, dtype=torch.float64), torch.full((4,), 0.05, dtype=torch.float64),
               torch.full((1,), 0.1, dtype=torch.float64)], 1.0)]
    for what, grads, max_norm in cases:
        params = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
        for prm, x in zip(params, grads):
            prm.grad = x.clone()
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        got = clip_global_norm([x.clone() for x in grads], max_norm)
        assert isinstance(got, (list, tuple)) and len(got) == len(grads), (
            f"{what}: expected a list of {len(grads)} tensors (one per gradient), got {type(got).__name__}"
            f"{f' of {len(got)}' if isinstance(got, (list, tuple)) else ''}")
        hint = ""
        if all(isinstance(x, torch.Tensor) and x.shape == p.grad.shape for x, p in zip(got, params)):
            hint = next((h for h, v in _clip_variants(grads, max_norm).items()          # to 1e-5: with or without
                         if all(torch.allclose(x, w, atol=1e-5, rtol=0) for x, w in zip(got, v))), "")   # torch's 1e-6
        for i, (x, prm) in enumerate(zip(got, params)):
            same_tensor(x, prm.grad, f"{what}: gradient {i}, against torch.nn.utils.clip_grad_norm_", 1e-6,
                        f"likely: {hint}" if hint else "")
    correct("Exercise 3: correct (one factor for all the tensors, and none when the norm is already small)", clip_global_norm)


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


def check_4(train_step) -> None:
    """train_step(model, optimizer, x, y, lr, clip): one optimizer step as the trainer takes it; returns the loss."""
    models, opts, batches = _step_case()
    lr, clip = 1e-2, 0.05
    first = train_step(models[0], opts[0], *batches[0], lr, clip)
    if not attempted(first, 4):
        return
    assert isinstance(first, float), (f"your step returned a {type(first).__name__}; return the loss as a Python "
                                      "float (loss.item()): a tensor keeps the step's graph alive, and the trainer "
                                      "adds these numbers up")
    want = _reference_step(models[1], opts[1], *batches[0], lr, clip)
    close(first, want, "the loss your step returns for the first batch (mean next-token cross-entropy, nats)", 1e-9)
    assert _same_weights(*models), _diagnose(models[0], 1, lr, clip)
    train_step(models[0], opts[0], *batches[1], lr, clip)
    _reference_step(models[1], opts[1], *batches[1], lr, clip)
    assert _same_weights(*models), _diagnose(models[0], 2, lr, clip)
    correct(f"Exercise 4: correct (two steps agree with the trainer's order; first loss {first:.4f} nats/token)", train_step)


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


# -------------------------------------------------------------------- exercise 5: the checkpoint round trip
_PIECES = {"model": "the weights (model.state_dict())",
           "optimizer": "AdamW's state (optimizer.state_dict(): m, v and the step count of every parameter); "
                        "without it the first resumed step is a first step again, bias correction and all",
           "step": "the step (it sets the scheduled rate, and where the run stops)",
           "torch_rng": "torch's global random state (torch.get_rng_state()), which dropout draws from",
           "data_rng": "the data generator's state (generator.get_state()), which draws the batches"}


def _resume_objects(seed: int):
    """A tiny model with dropout, its AdamW and a batch generator; `seed` sets the initial weights."""
    from minwiola.model import LanguageModel, preset
    torch.manual_seed(seed)
    model = LanguageModel(preset("tiny-llama", dropout=0.1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), torch.Generator()


def _train_steps(model, opt, gen, start: int, stop: int) -> None:
    """Steps start..stop-1: the rate depends on the step, the batch on `gen`, dropout on torch's global state."""
    from minwiola.model import next_token_loss
    model.train()
    for step in range(start, stop):
        for group in opt.param_groups:
            group["lr"] = 1e-2 * (1 - step / 10)
        x = torch.randint(0, 64, (4, 9), generator=gen)
        next_token_loss(model(x[:, :-1]), x[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _started(stop: int = 3):
    """A run 3 steps in, and the truth about everything a checkpoint of it must hold."""
    model, opt, gen = _resume_objects(0)
    gen.manual_seed(1)
    torch.manual_seed(2)
    _train_steps(model, opt, gen, 0, stop)
    truth = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optimizer": opt.state_dict(),
             "step": stop, "torch_rng": torch.get_rng_state(), "data_rng": gen.get_state()}
    return model, opt, gen, truth


def _scrambled():
    """Fresh objects in a state unlike the run's: other weights, an empty optimizer, other random states."""
    model, opt, gen = _resume_objects(5)
    gen.manual_seed(99)
    torch.manual_seed(77)
    return model, opt, gen


def _same_optimizer(a: dict, b: dict) -> bool:
    return a["state"].keys() == b["state"].keys() and all(
        torch.equal(x[k], y[k]) for i in a["state"] for x, y in [(a["state"][i], b["state"][i])] for k in x)


def _missing(model, opt, gen, step, truth) -> str:
    """The first piece of the run's state that the fresh objects did not get back, or ''."""
    weights = model.state_dict()
    if not all(torch.equal(weights[k], truth["model"][k]) for k in weights):
        return "model"
    if not _same_optimizer(opt.state_dict(), truth["optimizer"]):
        return "optimizer"
    if step != truth["step"]:
        return "step"
    if not torch.equal(torch.get_rng_state(), truth["torch_rng"]):
        return "torch_rng"
    if not torch.equal(gen.get_state(), truth["data_rng"]):
        return "data_rng"
    return ""


def _continue_and_compare(model, opt, gen, step, what: str, hint: str) -> None:
    _train_steps(model, opt, gen, step, 6)
    want = _started(6)[0].state_dict()                 # the same run, never stopped
    got = model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want), (
        f"{what}: after 3 steps, a checkpoint and 3 more the weights differ from an uninterrupted run of 6 steps"
        f"{'. ' + hint if hint else ''}")


def _load_half(save, load):
    """The learner's load_checkpoint: the one passed, else the one defined beside save_checkpoint (the grader and the
    tests call every check with one function; in a notebook both halves live in the same namespace)."""
    return load if load is not None else getattr(save, "__globals__", {}).get("load_checkpoint")


def check_5(save_checkpoint, load_checkpoint=None) -> None:
    """The checkpoint round trip. save_checkpoint(path, model, optimizer, step, generator) writes with torch.save a
    dict with the keys "model", "optimizer", "step", "torch_rng", "data_rng"; load_checkpoint(path, model, optimizer,
    generator) puts it back into fresh objects and returns the step. A run saved with your save after 3 steps, loaded
    with your load and continued 3 more must equal 6 steps straight through; a failure names the half that is wrong."""
    import tempfile
    from pathlib import Path
    load = _load_half(save_checkpoint, load_checkpoint)
    with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.pt"
        model, opt, gen, truth = _started()
        save_checkpoint(path, model, opt, 3, gen)
        if not path.exists():                          # the save half untouched: is the load half written?
            torch.save(truth, path)
            model, opt, gen = _scrambled()
            before = {k: v.clone() for k, v in model.state_dict().items()}
            step = load(path, model, opt, gen) if load is not None else None
            changed = any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
            if not attempted(True if step is not None or changed else None, 5):
                return
            raise AssertionError("your save_checkpoint wrote no file at `path`: torch.save the dict there")
        saved = torch.load(path, weights_only=False)
        assert isinstance(saved, dict), (f"your save_checkpoint: the file holds a {type(saved).__name__}, expected "
                                         "a dict")
        gone = [k for k in _PIECES if k not in saved]
        assert not gone, ("your save_checkpoint: the checkpoint has no " +
                          ", no ".join(f"{k!r}: {_PIECES[k]}" for k in gone) + ". A continued run without it is a "
                          "different run")
        piece = _missing(*_put_back(saved), saved["step"], truth)
        assert not piece, (f"your save_checkpoint: saved after step 3, the checkpoint's {piece!r} (it begins "
                           f"{str(saved[piece])[:40]!r}) is not what the run had then; it must hold {_PIECES[piece]}")
        assert load is not None, ("your save_checkpoint is right; define load_checkpoint beside it (or pass it: "
                                  "check_5(save_checkpoint, load_checkpoint))")
        model, opt, gen = _scrambled()
        step = load(path, model, opt, gen)
        piece = _missing(model, opt, gen, step, truth)
        assert not piece, (f"your load_checkpoint: after loading a checkpoint saved at step 3, the fresh objects lack "
                           f"{_PIECES[piece]}{f' (you returned {step!r}: return the saved step)' if piece == 'step' else ''}")
        _continue_and_compare(model, opt, gen, step, "after your save and load", "")
    correct("Exercise 5: correct (saved, loaded and continued, the run equals the uninterrupted one, bit for bit)", save_checkpoint, load)


def _put_back(saved: dict):
    """Fresh objects with a checkpoint dict put back the reference way, to judge the save half on its own."""
    model, opt, gen = _scrambled()
    try:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        gen.set_state(saved["data_rng"])
    except (TypeError, ValueError, RuntimeError, KeyError, AttributeError) as e:
        raise AssertionError(f"your save_checkpoint: loading the checkpoint back failed ({type(e).__name__}: "
                             f"{str(e)[:200]}): save model.state_dict(), optimizer.state_dict(), torch.get_rng_state() "
                             "and generator.get_state()") from None
    return model, opt, gen


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


def check_6(combine) -> None:
    """combine(rank_grads, rank_rows): the gradient of the mean loss over all rows, from each rank's gradient of its
    own shard's mean loss and the shard's number of rows."""
    whole, ranks = _rank_case([4, 4])
    if not attempted(combine(ranks, [4, 4]), 6):
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
    correct("Exercise 6: correct (weights by rows; with equal shards that is DDP's plain average)", combine)


# ------------------------------------------------------------------- the finale: a run made of the learner's parts
# The library's side of each part, in the exercise's own signature: what two_runs uses while a part is not yours yet.

def library_forward(model, ids, targets):
    logits = model(ids)
    return logits, next_token_loss(logits, targets)


def library_cross_entropy(logits, targets):
    return torch.nn.functional.cross_entropy(logits, targets)


def library_adamw_step(p, grad, state, lr, betas, eps, weight_decay):
    if not state:                                        # one torch AdamW per tensor, its state kept in `state`
        state["p"] = torch.nn.Parameter(p.detach().clone())
        state["opt"] = torch.optim.AdamW([state["p"]], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    state["p"].data.copy_(p)
    state["p"].grad = grad.clone()
    state["opt"].param_groups[0]["lr"] = lr
    state["opt"].step()
    return state["p"].detach().clone()


def library_clip(grads, max_norm):
    copies = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for c, g in zip(copies, grads):
        c.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(copies, max_norm)
    return [c.grad for c in copies]


def library_rate(step):
    return learning_rate(step / 2000, 3e-3, 0.05)


def yours_or_library():
    """Each part the run needs: the learner's from their workspace (lessons 03 and 11), or the library's."""
    from exercises import mine
    return {"forward": mine("my_forward", library_forward), "loss": mine("my_cross_entropy", library_cross_entropy),
            "adamw": mine("adamw_step", library_adamw_step), "clip": mine("clip_global_norm", library_clip),
            "rate": mine("rate_at", library_rate)}


def two_runs(parts, batches, config, seed=0, clip=1.0, decay=0.1, betas=(0.9, 0.95), eps=1e-8):
    """Train two copies of one model on the same batches: one with `parts` (forward, loss, AdamW step, clipping,
    schedule), one with the library's (LanguageModel, F.cross_entropy, torch.optim.AdamW, clip_grad_norm_,
    learning_rate). The schedule is exercise 1's 2,000 steps squeezed onto len(batches). Returns both models and
    their loss at every step."""
    torch.manual_seed(seed)
    yours = LanguageModel(config)
    library = LanguageModel(config)
    library.load_state_dict(yours.state_dict())               # the same start
    groups = parameter_groups(library, decay)
    optimizer = torch.optim.AdamW(groups, betas=betas, eps=eps)
    no_decay = {id(p) for g in parameter_groups(yours, decay) if g["weight_decay"] == 0 for p in g["params"]}
    params = [p for p in yours.parameters() if p.requires_grad]
    states = {id(p): {} for p in params}
    curves = {"yours": [], "library": []}
    for step, (x, y) in enumerate(batches):
        lr = parts["rate"](step * 2000 // len(batches))
        logits, _ = parts["forward"](yours, x, y)            # yours: forward, loss, clip, AdamW, by hand
        loss = parts["loss"](logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        grads = torch.autograd.grad(loss, params)
        grads = parts["clip"](list(grads), clip)
        with torch.no_grad():
            for p, g in zip(params, grads):
                wd = 0.0 if id(p) in no_decay else decay
                p.copy_(parts["adamw"](p.detach(), g, states[id(p)], lr, betas, eps, wd))
        curves["yours"].append(loss.item())
        for group in optimizer.param_groups:                  # the library's: the trainer's step, in short
            group["lr"] = library_rate(step * 2000 // len(batches))
        optimizer.zero_grad()
        ref = next_token_loss(library(x), y)
        ref.backward()
        torch.nn.utils.clip_grad_norm_(library.parameters(), clip)
        optimizer.step()
        curves["library"].append(ref.item())
    return yours, library, curves


EXERCISES = {1: "rate_at", 2: "adamw_step", 3: "clip_global_norm", 4: "train_step",
             5: "save_checkpoint",                   # the checkpoint round trip: save_checkpoint with load_checkpoint
             6: "combine"}   # check -> name
