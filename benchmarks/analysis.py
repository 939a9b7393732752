"""What the lessons read from the benchmarks, in one module: every name lessons 04, 05, 09 and 11-16 use to reuse a
benchmark's own analysis on its recorded result (its figure, its tables, the functions that measure), in sections by
lesson. The scripts import their names back from here, so a lesson and its script run the same code. Lessons load it
with `minwiola.lesson.benchmarks()`; tests/test_benchmarks_package.py checks that every name a lesson reads is here.
"""
import cProfile
import dataclasses
import math
import os
import pstats
import re
import statistics
import time
import timeit
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common import best_eval, decide, registered_numbers, save_or_return   # lessons 12-16 read the last three
from experiments import closest_d_ff

from minwiola import data
from minwiola.budget import count_params, encdec_params
from minwiola.encdec import EncoderDecoder, greedy, shift_right
from minwiola.generate import generate_ids
from minwiola.model import LanguageModel, next_token_loss, preset
from minwiola.train import TrainConfig, learning_rate, parameter_groups

# ---------------------------------------------------------- lesson 09: what a step asks of the host (step_syncs.py)

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "__array__")   # value to the host
DATA_SHAPED = {"aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique", "aten::_unique2",
               "aten::unique_dim", "aten::unique_consecutive", "aten::repeat_interleave"}   # output size from values


class HostReads:
    """Count, while active (`with HostReads() as reads:`), every place where a step needs a value on the host: on a
    GPU each makes the host wait until the device has computed it (a synchronisation), so it cannot queue the next
    kernels meanwhile. Two kinds, seen on any device, the CPU included:
      * a read: `.item()`, `.tolist()`, `bool(t)`, `int(t)`, `float(t)`, an index, `.numpy()` (Python's view, a
        torch-function mode, which also records the queries of `scaled_dot_product_attention`: `attention_shapes`);
      * an operation whose output size depends on the values (nonzero, masked_select, unique, boolean indexing, ...),
        or one that reads a value inside PyTorch (`_local_scalar_dense` outside a read above): the dispatcher's view,
        a torch-dispatch mode, which also counts every operation dispatched (`ops`).
    `torch._assert_async` is not a read: it checks on the device and the host goes on."""

    def __init__(self):
        self.reads: dict[str, int] = {}
        self.ops = 0
        self.attention_shapes: list[tuple[int, ...]] = []
        outer = self
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        class Python(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in READS:
                    outer.count(name)
                    outer.inside += 1
                    try:
                        return func(*args, **(kwargs or {}))
                    finally:
                        outer.inside -= 1
                if func is F.scaled_dot_product_attention:
                    outer.attention_shapes.append(tuple(args[0].shape))
                return func(*args, **(kwargs or {}))

        class Dispatcher(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._schema.name
                outer.ops += 1
                boolean_index = name in ("aten::index", "aten::index_put", "aten::index_put_") and any(
                    t is not None and t.dtype == torch.bool for t in args[1])
                if name in DATA_SHAPED or boolean_index or (name == "aten::_local_scalar_dense" and not outer.inside):
                    outer.count(name)
                return func(*args, **(kwargs or {}))

        self.inside = 0
        self.modes = (Python(), Dispatcher())

    def count(self, name: str) -> None:
        self.reads[name] = self.reads.get(name, 0) + 1

    def total(self) -> int:
        """How many times the host had to wait for a value."""
        return sum(self.reads.values())

    def __enter__(self):
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)


def model_step(model: LanguageModel, optimizer, ids: torch.Tensor) -> None:
    """One training step as the trainer takes it: forward with the ids checked where they came from
    (`ids_checked`), the next-token loss, backward, the optimizer's step."""
    next_token_loss(model(ids[:, :-1], ids_checked=True), ids[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ----------------------------------------------------------------- lesson 04: decoding (generation_bench.py)

@torch.no_grad()
def reference_decode(model: LanguageModel, first: int, n: int, seed: int) -> list[int]:
    """`n` tokens after the token `first`, sampled at temperature 1 by a generator seeded with `seed`: the
    library's model (Yocto's block) computed with torch's functions on its weights, one token at a time."""
    cfg, W = model.config, model.state_dict()
    d, H, L = cfg.d, cfg.n_heads, cfg.n_layers
    d_h = d // (3 * H)                                  # the unified projection: three bands of d/3
    half = d_h // 2
    angles = torch.arange(cfg.context, dtype=torch.float64)[:, None] * \
        cfg.rope_theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / d_h)
    cos, sin = angles.cos().to(W["embed.weight"].dtype), angles.sin().to(W["embed.weight"].dtype)
    K = W["embed.weight"].new_zeros(L, 1, H, n + 1, d_h)       # every layer's keys and values, preallocated
    V = torch.zeros_like(K)
    generator = torch.Generator().manual_seed(seed)
    token, out = torch.tensor([first]), [first]

    def rope(x, p):                                     # rotate the pairs (x_j, x_{j + d_h/2}) by angle p w_j
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos[p] - x2 * sin[p], x1 * sin[p] + x2 * cos[p]], -1)

    for p in range(n):
        x = W["embed.weight"][token]                                     # (1, d)
        for layer in range(L):
            w = lambda name: W[f"blocks.{layer}.{name}"]                 # noqa: E731
            h = F.layer_norm(x, (d,), w("norm1.weight"), w("norm1.bias"))
            q, k, v = F.linear(h, w("attn.qkv.weight")).view(3, H, d_h)
            K[layer, 0, :, p], V[layer, 0, :, p] = rope(k, p), v
            o = F.scaled_dot_product_attention(rope(q, p)[None, :, None], K[layer, :, :, :p + 1],
                                               V[layer, :, :, :p + 1])   # one query sees every key: no mask
            x = x + F.linear(o.reshape(1, H * d_h), w("attn.out.weight"))
            h = F.layer_norm(x, (d,), w("norm2.weight"), w("norm2.bias"))
            x = x + F.linear(F.gelu(F.linear(h, w("ffn.up.weight"), w("ffn.up.bias"))), w("ffn.down.weight"),
                             w("ffn.down.bias"))
        logits = F.linear(F.layer_norm(x, (d,), W["norm.weight"], W["norm.bias"]), W["embed.weight"])
        token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[0]
        out.append(int(token))
    return out


def library_decode(model: LanguageModel, first: int, n: int, seed: int, use_cache: bool = True) -> list[int]:
    """The same through the library: `generate_ids` at temperature 1."""
    prompt = torch.tensor([[first]])
    return generate_ids(model, prompt, n, temperature=1.0, seed=seed, use_cache=use_cache)[0].tolist()


def operations_profile(decode, n: int) -> dict[str, float]:
    """What PyTorch's profiler sees of `decode(n)`, per written token: the operations it runs (aten calls, which do
    not depend on the machine), the milliseconds spent inside them, and the milliseconds of the whole decode under
    the profiler; the difference is time outside any operation: Python, module calls, checks, dispatch. (The
    profiler slows every operation a little, so these milliseconds run above the unprofiled ones.)"""
    decode(n)                                           # warm up outside the count
    os.environ.setdefault("KINETO_LOG_LEVEL", "10")     # the profiler's own start and stop lines, unprinted
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        decode(n)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    inside = sum(event.self_cpu_time_total for event in events) / 1e3       # microseconds -> ms
    return {"ops_per_token": round(sum(event.count for event in events) / n, 1),
            "ms_in_operations": round(inside / n, 4), "ms_profiled": round(1e3 * wall / n, 4),
            "ms_outside_operations": round((1e3 * wall - inside) / n, 4)}


MODULE_FILE = os.path.join("torch", "nn", "modules", "module.py")


def python_profile(decode, n: int) -> dict[str, float]:
    """What Python's profiler counts of `decode(n)`, per written token: every Python-level call (functions, methods,
    torch's bindings), the `nn.Module` calls among them, and the look-ups `nn.Module` answers itself (its
    `__getattr__`: a layer, weight or buffer read as `self.name`, which Python first fails to find on the object).
    Counts, not times: they do not depend on the machine."""
    decode(n)                                           # warm up outside the count
    profiler = cProfile.Profile()
    profiler.runcall(decode, n)
    calls = {key: row[1] for key, row in pstats.Stats(profiler).stats.items()}   # (file, line, name) -> calls
    in_module = lambda name: sum(c for (file, _, fn), c in calls.items()                  # noqa: E731
                                 if fn == name and file.endswith(MODULE_FILE))
    return {"python_calls_per_token": round(sum(calls.values()) / n, 1),
            "module_calls_per_token": round(in_module("_call_impl") / n, 1),
            "module_lookups_per_token": round(in_module("__getattr__") / n, 1)}


def lookup_microseconds() -> dict[str, float]:
    """Microseconds of one read of a layer's weight (`layer.weight`, answered by nn.Module's `__getattr__`) and of
    one plain attribute of the same object (`layer.in_features`), on this machine: the best of five timings."""
    layer = torch.nn.Linear(1, 1)
    best = lambda stmt: min(timeit.repeat(stmt, number=100_000, repeat=5)) / 100_000 * 1e6     # noqa: E731
    return {"weight": round(best(lambda: layer.weight), 3), "plain attribute": round(best(lambda: layer.in_features), 3)}


# ----------------------------------------------------- lesson 05: does the offset prevent collapse? (norm_bench.py)

NORM_ARMS = ("rmsnorm", "wiola")                    # the reference first: every comparison is wiola vs rmsnorm
NORM_SEEDS = (0, 1, 2)
NORM_SIZE = {"full": (300, 16), "quick": (100, 4)}  # (steps, windows per batch) of the full run and of quick mode


def mean_pairwise_cosine(h) -> float:
    """The mean cosine similarity over all pairs of token vectors (rows) of h: 1 when every token points one way."""
    u = F.normalize(h.reshape(-1, h.shape[-1]), dim=-1)
    n = len(u)
    return (((u @ u.T).sum() - n) / (n * (n - 1))).item()


def residual(h) -> float:
    """Dong et al.'s rank-collapse measure: ||X - 1 xbar^T||_F / ||X||_F over the token vectors (rows) of h."""
    h = h.reshape(-1, h.shape[-1])
    return ((h - h.mean(0)).norm() / h.norm()).item()


def effective_rank(h) -> float:
    """exp(entropy of the normalised singular values of the centred token matrix): from 1 to d."""
    h = h.reshape(-1, h.shape[-1])
    s = torch.linalg.svdvals(h - h.mean(0))
    p = s / s.sum()
    return torch.exp(-(p * torch.log(p + 1e-12)).sum()).item()


def layer_outputs(model: LanguageModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's output (the embeddings, then each block's) for a model whose forward is embed -> blocks. A
    second copy of LanguageModel.forward, so it refuses the configs it does not reproduce."""
    cfg = model.config
    handled = dict(positions=("rope", "srpe", "none"), gcla=("off",), atm=("off",))
    for field, values in handled.items():
        if getattr(cfg, field) not in values:
            raise ValueError(f"layer_outputs reproduces LanguageModel.forward only for {field} in {values}, "
                             f"not {getattr(cfg, field)!r}")
    if cfg.dropout and model.training:
        raise ValueError("layer_outputs: dropout is active; call model.eval() first")
    hs = [model.embed(ids)]
    for block in model.blocks:
        hs.append(block(hs[-1]))
    return hs


def collapse(model: LanguageModel, probe: torch.Tensor) -> tuple[list, list, list]:
    """Per layer, on the token windows `probe`: the residual, the mean pairwise cosine and the effective rank;
    checks that the last layer, through the final norm and the head, gives exactly the model's own logits."""
    with torch.no_grad():
        hs = layer_outputs(model, probe)
        h = model.norm(hs[-1])
        head = h @ model.embed.weight.T if model.head is None else model.head(h)
        assert torch.equal(head, model(probe)), "layer_outputs has drifted from LanguageModel.forward"
    return [residual(h) for h in hs], [mean_pairwise_cosine(h) for h in hs], [effective_rank(h) for h in hs]


def norm_train(norm_kind: str, seed: int, steps: int, batch: int, warmup: int = 20) -> dict:
    """One run of lesson 05's experiment: an 8-layer llama-style model with norm `norm_kind`, AdamW at 2e-3 (no
    weight decay), linear warm-up, gradient clipped to norm 1, `steps` steps of `batch` windows of 128 tokens. The
    seed fixes both the initial weights and the batches, so the two norms' runs of one seed differ only in delta.
    Returns the measures of `collapse` at init and after training, the held-out loss and the model."""
    train_stream, valid_stream = data.tokens("train"), data.tokens("valid")
    probe, _ = data.get_batch(valid_stream, 8, 128, torch.Generator().manual_seed(1))
    torch.manual_seed(seed)                               # the same initial weights for both norms
    cfg = preset("llama-style", n_layers=8, norm=norm_kind, context=128)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)                # weights drawn in float64 (lesson 05 works in float64) ...
    try:
        model = LanguageModel(cfg).float()                # ... and trained in float32
    finally:
        torch.set_default_dtype(default)
    at_init = collapse(model, probe)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)             # ... and the same batches
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 2e-3 * min(1.0, (step + 1) / warmup)     # linear warm-up, then constant
        xb, yb = data.get_batch(train_stream, batch, 128, gen)
        loss = model.loss(xb, yb)
        opt.zero_grad(); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    with torch.no_grad():
        xv, yv = data.get_batch(valid_stream, 32, 128, torch.Generator().manual_seed(2))
        held_out = model.loss(xv, yv).item()
    return dict(init=at_init, trained=collapse(model, probe), held_out=held_out, model=model)


# what each comparison judges, from one run's record: the collapse measures averaged over blocks 1-8, the loss
NORM_MEASURES = {"mean residual, blocks 1-8": lambda r: float(np.mean(r["trained"][0][1:])),
                 "mean cosine, blocks 1-8": lambda r: float(np.mean(r["trained"][1][1:])),
                 "mean effective rank, blocks 1-8": lambda r: float(np.mean(r["trained"][2][1:])),
                 "held-out loss": lambda r: r["held_out"]}


def norm_per_seed(runs: dict, seeds=NORM_SEEDS) -> dict:
    """{measure: {norm: {seed: number}}} from runs keyed (norm, seed): what the comparisons judge."""
    return {name: {kind: {str(s): f(runs[kind, s]) for s in seeds} for kind in NORM_ARMS}
            for name, f in NORM_MEASURES.items()}


# --------------------------- lessons 11 and 16: the convergence study (convergence.py, convergence_cs336.py)

def convergence_plot(result: dict, path: Path | None = None):
    """(a-c) held-out loss of every seed against tokens, model FLOPs and seconds (the step times measured in turns);
    (d) each sweep; (e) each seed's best held-out bits per byte and the mean; (f) the trainer's wall clock."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    arms = {n: a for n, a in result["arms"].items() if a["seeds"]}
    colour = {n: f"C{i}" for i, n in enumerate(result["arms"])}
    per_step = result["batch_size"] * result["block_size"]
    ends = [s["valid_curve"][-1][1] for a in arms.values() for s in a["seeds"].values()]
    top = max(ends, default=math.inf) + 1.0                   # the curves' ends, not their first steep points
    axes_x = [("tokens seen (millions)", lambda r, t: t / 1e6),
              ("model training FLOPs (10^12)", lambda r, t: t * r["flops_per_token"] / 1e12),
              ("seconds at the arm's step time (one thread, arms timed in turns)", None)]
    for ax, (label, x) in zip(axes[0], axes_x):
        for name, arm in arms.items():
            if x is None and not arm.get("seconds_per_step"):
                continue
            for k, r in enumerate(arm["seeds"].values()):
                xs = [(x(r, t) if x else t / per_step * arm["seconds_per_step"]) for t, _ in r["valid_curve"]]
                ax.plot(xs, [v for _, v in r["valid_curve"]], color=colour[name], alpha=0.7,
                        label=name if k == 0 else None)
        ax.set_xlabel(label, fontsize=9)
        ax.set_ylabel("held-out loss (nats/token)")
        ax.set_ylim(top=min(top, ax.get_ylim()[1]))
    if axes[0][0].lines:
        axes[0][0].legend(fontsize=7)
    d, e, f = axes[1]
    for name, arm in result["arms"].items():
        if arm["sweep"]:
            rates = sorted(arm["sweep"], key=float)
            d.semilogx([float(r) for r in rates], [arm["sweep"][r]["bits_per_byte"] for r in rates], "o-",
                       color=colour[name], label=name)
    d.set_xlabel(f"peak learning rate (seed {result['sweep_seed']}, not reported)")
    d.set_ylabel("best held-out bits/byte")
    if d.lines:
        d.legend(fontsize=7)
    for i, (name, arm) in enumerate(arms.items()):
        bpb = [s["bits_per_byte"] for s in arm["seeds"].values()]
        e.plot([i] * len(bpb), bpb, "o", color=colour[name])
        e.hlines(statistics.mean(bpb), i - 0.25, i + 0.25, color=colour[name])
        for k, r in enumerate(arm["seeds"].values()):
            f.plot([s / 3600 for s, _ in r["valid_wall_seconds"]], [v for _, v in r["valid_wall_seconds"]],
                   color=colour[name], alpha=0.7, label=name if k == 0 else None)
    e.set_xticks(range(len(arms)), [f"{n}\nlr {a['best_lr']:g}" for n, a in arms.items()], fontsize=7)
    e.set_ylabel("best held-out bits/byte (dots: seeds; line: mean)")
    f.set_xlabel("hours on the trainer's clock (shared machine: NOT a clean timing)", fontsize=9)
    f.set_ylabel("held-out loss (nats/token)")
    f.set_ylim(top=min(top, f.get_ylim()[1]))
    for ax, letter in zip(axes.flat, "abcdef"):                       # the panels, as the lesson names them
        ax.set_title(f"({letter})", loc="left", fontsize=9)
    fig.suptitle(f"{result['steps']} steps of {result['batch_size']} x {result['block_size']} tokens, dropout "
                 f"{result['dropout']} | {result['data']} | {result['hardware']}"
                 + (" | PARTIAL" if result.get("partial") else ""), fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


def seed_record(result: dict, run: str) -> dict | None:
    """The reported seed whose run folder is named `run` (e.g. the shipped story model's, from its made.json)."""
    return next((s for arm in result["arms"].values() for s in arm["seeds"].values() if s["run"] == run), None)


CS336_ARMS = ("llama-cs336", "wiola-cs336")               # convergence_cs336.py's (LLAMA, WIOLA)


def cs336_report(result: dict) -> str:
    """The tables: every arm at every rate (mean, spread, where the best evaluation was), then the verdicts."""
    rows = ["| arm | parameters | peak rate | seeds | bits/byte (mean) | spread | nats/token | best at step (mean) "
            "| chosen |", "|---" * 9 + "|"]
    for name, arm in result["arms"].items():
        for lr, r in sorted(arm["by_rate"].items(), key=lambda x: float(x[0])):
            rows.append(f"| `{name}` | {arm['params']:,} | {float(lr):g} | {r['seeds']} | {r['mean_bits_per_byte']:.4f}"
                        f" | {r['spread_bits_per_byte']:.4f} | {r['mean_nats_per_token']:.4f} | "
                        f"{r['mean_best_step']:.0f} | {'yes' if lr == arm.get('best_lr') else ''} |")
    rows += ["", "| wiola-cs336 vs llama-cs336 | seeds | difference (bits/byte) | bound | verdict | seed by seed |",
             "|---" * 6 + "|"]
    for label, v in result.get("verdicts", {}).items():          # registered per rate: minwiola.verdict.judge
        arm, reference = registered_numbers(result, label)
        paired = ", ".join(f"{arm[s] - reference[s]:+.4f}" for s in v["seeds"]["arm"])
        bound = f"{v['bound']:.4f}" if v["bound"] is not None else "none (one seed)"
        rows.append(f"| {label} | {v['shape']}, {', '.join(v['seeds']['arm'])} | {v['difference']:+.4f} | {bound} | "
                    f"{v['verdict']} | {paired} |")
    if result.get("at_chosen_rates"):
        c = result["at_chosen_rates"]
        rows += ["", f"Each arm at its chosen rate ({c['rates'][0]:g} against {c['rates'][1]:g}): {c['difference']:+.4f}"
                     " bits/byte, shown but not judged: the reported seeds chose those rates."]
    if result.get("timing"):
        t, m = result["timing"]["seconds_per_step"], result["timing"]["median_seconds_per_step"]
        rows += ["", f"Step time, both arms in turns alone on the device ({result['device']}, "
                     f"{result['timing']['precision']}), best of {result['timing']['turns']} turns: " + ", ".join(
            f"`{a}` {1e3 * t[a]:.1f} ms (median {1e3 * m[a]:.1f})" for a in CS336_ARMS if a in t)
            + (f"; ratio {result['step_time_ratio']:.2f}x" if result.get("step_time_ratio") else "")]
    return "\n".join(rows)


def cs336_plot(result: dict, path: Path | None = None):
    """(a-c) held-out loss of every seed at each arm's chosen rate against tokens, model FLOPs and seconds (the
    step times measured in turns); (d) best held-out bits/byte against the peak rate (dots: seeds, line: mean)."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    per_step = result["batch_size"] * result["block_size"]
    timing = result.get("timing", {}).get("seconds_per_step", {})
    xs = [("tokens seen (millions)", lambda r, t, a: t / 1e6),
          ("model training FLOPs (10^15)", lambda r, t, a: t * r["flops_per_token"] / 1e15),
          ("seconds at the arm's step time (timed in turns, alone, on the last launch's GPU)",
           lambda r, t, a: t / per_step * timing[a] if timing.get(a) else None)]
    for i, (name, arm) in enumerate(result["arms"].items()):
        runs = arm["runs"].get(arm.get("best_lr") or "", {})
        for ax, (label, x) in zip(axes[:3], xs):
            for k, r in enumerate(runs.values()):
                points = [(x(r, t, name), v) for t, v in r["valid_curve"]]
                if points and points[0][0] is not None:
                    ax.plot(*zip(*points), color=f"C{i}", alpha=0.7,
                            label=f"{name} (lr {float(arm['best_lr']):g})" if k == 0 else None)
            ax.set_xlabel(label, fontsize=9)
            ax.set_ylabel("held-out loss (nats/token)")
        rates = sorted(arm["by_rate"], key=float)
        axes[3].semilogx([float(lr) for lr in rates], [arm["by_rate"][lr]["mean_bits_per_byte"] for lr in rates],
                         "-", color=f"C{i}", label=name)
        for lr in rates:
            bpb = [s["bits_per_byte"] for s in arm["runs"][lr].values()]
            axes[3].semilogx([float(lr)] * len(bpb), bpb, "o", color=f"C{i}", alpha=0.6)
    axes[3].set_xlabel("peak learning rate")
    axes[3].set_ylabel("best held-out bits/byte (dots: seeds; line: mean)")
    for ax, letter in zip(axes, "abcd"):
        ax.set_title(f"({letter})", loc="left", fontsize=9)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(f"CS336 shape: {result['steps']} steps of {result['batch_size']} x {result['block_size']} tokens, "
                 f"dropout {result['dropout']} | {result['data']} | "
                 + " then ".join(dict.fromkeys(x["device"] for x in result.get("launches") or [result]))
                 + (" | PARTIAL" if result.get("partial") else ""), fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


# ------------------------------------------------ lesson 11: at the real size (scale_bench.py, recipes.py)

def token_cache_memory(stories: list[str], tokenizer, first_design, copies=(1, 2, 4)) -> list[tuple]:
    """Peak Python memory (tracemalloc) of two ways to tokenise a train split made of `stories` `copies` times over:
    `first_design(path, tokenizer)` and the library's streaming `data.tokens`, each in a throw-away data folder and
    cache (with small blocks, so a few MB of text stream in several). Rows (text MB, tokens, first design's peak MB,
    streaming peak MB); both must give the same ids."""
    import contextlib
    import tempfile
    import tracemalloc
    from unittest import mock

    from minwiola.tokenizer import EOT

    @contextlib.contextmanager
    def corpus_of(n):
        saved = {k: os.environ.get(k) for k in ("MINWIOLA_DATA", "MINWIOLA_CACHE")}
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            text = "".join(s + "\n" + EOT + "\n" for s in stories)
            (folder / "TinyStories-train.txt").write_text(text * n, encoding="utf-8")
            (folder / "TinyStories-valid.txt").write_text(text, encoding="utf-8")
            os.environ.update(MINWIOLA_DATA=str(folder), MINWIOLA_CACHE=str(folder / "cache"))
            try:
                yield folder / "TinyStories-train.txt"
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

    def peak_mb(fn):
        tracemalloc.start()
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return out, peak / 1e6

    tokenizer.fast.encode_ordinary("warm up")                 # the tokenizer's own tables are part of neither pass
    rows = []
    with mock.patch.object(data, "CHUNK_BYTES", 256 << 10):  # small blocks for a few MB of text; put back after
        for n in copies:
            with corpus_of(n) as path:
                old, old_mb = peak_mb(lambda: first_design(path, tokenizer))
                new, new_mb = peak_mb(lambda: data.tokens("train", tokenizer, workers=1))
                assert np.array_equal(old, new)               # the same ids, token for token
                rows.append((path.stat().st_size / 1e6, len(new), old_mb, new_mb))
    return rows


def scale_report(scale: dict, resume: dict) -> str:
    """results/scale_bench.json as lesson 11 prints it: each step's peak memory and wall time at each corpus size,
    then the tokenising speed, the warm trainer's start and the killed-and-resumed tokenising."""
    sizes = sorted(scale["sizes"], key=float)
    rows = ["command: " + scale["command"].split("python ", 1)[-1],
            f"{scale['hardware']}, {scale['memory_gib']} GiB; corpus built from: {scale['corpus']['built_from']}",
            f"{'step':14s}" + "".join(f"{float(s) * 1.924:>17.2f} GB" for s in sizes)]
    for name in SCALE_STEPS:
        cells = [scale["sizes"][s]["steps"].get(name) for s in sizes]
        rows.append(f"{name:14s}" + "".join(f"{c['peak_rss_gib']:>9.2f} GiB {c['wall_s']:>6.0f} s" if c else
                                            f"{'-':>20s}" for c in cells))
    full, speed = scale["sizes"]["1"]["steps"], scale["targets"]["full_split_tokenising"]
    rows += [f"the full split tokenised in {full['tokens_train']['wall_s']:.0f} s on {scale['cores']} cores "
             f"({full['tokens_train']['result']['tokens']:,} tokens), {speed['bytes_per_s'] / 1e6:.1f} MB/s; tiktoken "
             f"alone on the same text and processes, its faster way: {speed['tiktoken_bytes_per_s'] / 1e6:.1f} MB/s "
             f"({speed['fraction_of_tiktoken']:.2f} of it); load average at the start "
             f"{scale['load_average_at_start'][0]}",
             f"trainer on the full-size corpus, warm cache: first step "
             f"{scale['targets']['warm_trainer_start']['first_step_s']:.0f} s after launch; the row's time is 3 steps "
             "and one evaluation of 262,144 tokens",
             f"tokenize killed at {resume['done_at_kill']:.0%} of the ids, run again: ids equal {resume['ids_equal']}, "
             f"{resume['fraction_of_cold_cpu']:.2f} of a whole pass's CPU time, processes left behind "
             f"{resume['orphans_after_kill']}",
             "(tokens_valid: the smallest corpus's held-out split fits one block, so it starts no worker processes)"]
    return "\n".join(rows)


SCALE_STEPS = ["iter_stories", "load_10k", "tokens_valid", "tokens_train", "tokens_warm", "tokenizer", "trainer"]


def recipes_report(recipes: dict) -> str:
    """results/recipes.json's recipes as lesson 11 prints them: the command, its note, the measured speed (or what is
    owed) and the loss it reached."""
    rows = []
    for name, r in recipes.items():
        rows.append(f"--- {name}: {r['budget']}\n    {r['command']}\n    {r['note']}")
        speed = r["speed"]
        if isinstance(speed, dict):
            mfu = f", MFU {speed['mfu']:.0%}" if speed.get("mfu") else ""
            rows.append(f"    speed: {speed['tokens_per_s']:,} tokens/s on {speed['hardware']} ({speed['precision']}, "
                        f"{speed['threads']} threads{mfu}): {speed['tokens_per_budget'] / 1e6:.0f} M tokens in the "
                        f"budget; one evaluation ({speed['eval_tokens']:,} tokens) {speed['eval_seconds']:.0f} s")
        else:
            rows.append(f"    speed: {speed}")
        loss = r["loss"]
        rows.append("    loss: " + (f"{loss['nats_per_token']:.3f} nats/token, {loss['bits_per_byte']:.3f} bits/byte "
                                    f"after {loss['tokens'] / 1e6:.0f} M tokens ({loss['data']})"
                                    if isinstance(loss, dict) else loss))
        sample = r.get("loss_on_the_sample_at_one_hour")
        if sample:
            rows.append(f"    on the TinyStories sample, the same settings reached {sample['nats_per_token']:.3f} "
                        f"nats/token after {sample['tokens'] / 1e6:.1f} M tokens ({sample['source'].split(' (')[0]})")
    return "\n".join(rows)


def step_cost_report(cs: dict, bench: dict, turns: dict, compiled: dict) -> str:
    """Lesson 11's step costs: the CS336-shape and Yocto-size rows run one after the other (train_bench_cs336.json,
    train_bench.json), the arms taking turns in one process (wiola_step_bench.json), and --compile's pay-back."""
    step = {r["preset"]: r for r in [*cs["rows"], *bench["rows"]]}
    rows = [f"command: {cs['command']} | {cs['hardware']} | {cs['threads']} threads, batch {cs['batch']} x {cs['T']}"]
    rows += [f"{name:12s} {step[name]['params']:>11,} parameters  median {step[name]['seconds_per_step']:.3f} s/step "
             f"(fastest {step[name]['fastest_step']:.3f}, slowest {step[name]['slowest_step']:.3f})  "
             f"{step[name]['tokens_per_s']:,} tokens/s" for name in ("llama-cs336", "wiola-cs336", "llama-style",
                                                                     "wiola-yocto")]
    rows.append(f"taking turns ({turns['hardware']}, {turns['threads']} threads, ATM merging {turns['target_mu']:.0%}):")
    rows += [f"  {name:17s} {turns['arms'][name]['time_ratio']:.2f}x the step of {turns['arms'][name]['against']} for "
             f"{turns['arms'][name]['flop_ratio']:.3f}x its FLOPs"
             for name in ("wiola", "wiola-yocto", "llama-style+gcla", "llama-style+dsff")]
    rows.append(f"--compile, {compiled['preset']}: compiles in {compiled['compile_seconds']:.0f} s, then steps "
                f"{compiled['speedup']:.2f}x as fast; pays for runs longer than {compiled['break_even_minutes']:.1f} "
                "minutes")
    return "\n".join(rows)



def matmul_peak(threads: int, n: int = 1024, repeats: int = 10) -> float:
    """FLOP/s of this CPU now on one n x n matrix product at `threads` threads, the fastest of `repeats` (lesson 11's
    peak for a CPU's MFU); the thread count is restored afterwards."""
    a, before = torch.randn(n, n), torch.get_num_threads()
    torch.set_num_threads(threads)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - start)
    torch.set_num_threads(before)
    return 2 * n ** 3 / min(times)


def story_model_report(conv: dict, sq: dict, made: dict, best: str, ranked: list, control: dict, seeds: list) -> str:
    """Lesson 11's story model as it prints it: the designs of at most 0.6M parameters by their three-seed mean, the
    shipped (median) seed, its command, budget and best held-out numbers, the 1.00 bits-per-byte target and the
    stretch goal 0.97, and the verdict against the equal-parameter control (from convergence.json)."""
    arms = conv["arms"]
    small = sorted((n for n, a in arms.items() if a["params"] <= 600_000), key=lambda n: arms[n]["mean_bits_per_byte"])
    seed, run = ranked[len(ranked) // 2]
    minutes = conv["timing"]["seconds_per_step"][best] * run["steps"] / 60
    mean = arms[best]["mean_bits_per_byte"]
    goal = lambda g: f"{'met' if mean <= g else 'not met'} ({mean - g:+.4f})"
    return "\n".join([
        "designs of at most 0.6M parameters, by their mean: "
        + ", ".join(f"{n} {arms[n]['mean_bits_per_byte']:.4f}" for n in small),
        f"shipped: {best} ({arms[best]['params']:,} parameters, rate {arms[best]['best_lr']:g}), seed {seed}, the "
        "median of " + ", ".join(f"seed {k} {s['bits_per_byte']:.4f}" for k, s in ranked),
        "trains again with: " + made["train_command"],
        f"{run['steps']:,} steps, {run['tokens'] / 1e6:.1f}M tokens ({run['tokens'] / sq['train_tokens']:.0f} passes "
        f"over the {sq['train_tokens']:,} training tokens); {minutes:.0f} minutes of training steps on one thread",
        f"best held-out: {run['nats_per_token']:.4f} nats/token, perplexity {run['perplexity']:.2f}, "
        f"{run['bits_per_byte']:.4f} bits/byte at step {run['best_step']:,}",
        f"target: at most 1.00 bits/byte as the mean of three seeds: {mean:.4f}, {goal(1.0)}; the stretch goal 0.97: "
        f"{goal(0.97)}",
        f"against the equal-parameter control llama-style+width ({arms['llama-style+width']['mean_bits_per_byte']:.4f}): "
        f"{control['difference']:+.4f} bits/byte, bound {control['bound']:.4f} ({control['shape']} t-test, seeds "
        f"{', '.join(seeds)}): {control['verdict']}"])


def story_table(sq: dict) -> str:
    """results/story_quality.json as lesson 11 prints it: distinct-1, distinct-2 and 2-gram repetition of each
    decoding setting's stories, the held-out stories and Yocto's README."""
    rows = [f"{sq['per_prompt']} samples from each of {len(sq['prompts'])} prompts (greedy: 1 each), at most "
            f"{sq['tokens']} new tokens, first {sq['n_words']} words",
            f"{'':22s} {'stories':>7s} {'distinct-1':>10s} {'distinct-2':>10s} {'2-gram rep.':>11s}"]
    for name, r in {**sq["settings"], "held-out stories": sq["reference"]}.items():
        rows.append(f"{name:22s} {r['stories']:>7d} {r['distinct_1']:>10.3f} {r['distinct_2']:>10.3f} "
                    f"{r['repetition_2']:>11.3f}")
    rows.append(f"{'Yocto (its README)':22s} {'':>7s} {0.670:>10.3f} {'':>10s} {0.047:>11.3f}")
    return "\n".join(rows)

# ------------------------------------------- lesson 16: every comparison the course makes, judged by one rule

def verdict_rows(result: dict) -> list[dict]:
    """One row per comparison a result file registered: what each seed's number is (the last part of the
    registered path, e.g. bits_per_byte), the shape and the seeds the rule counted, the difference, the bound and the
    verdict, all as decide(result) recomputes them now from the registered numbers (the lesson asserts that they
    equal the committed verdicts)."""
    rows = []
    for name, v in decide(result).items():
        c = result["registered"]["comparisons"][name]
        arm, reference = registered_numbers(result, name)
        seeds = (", ".join(v["seeds"]["arm"]) if v["shape"] != "unpaired" or v["seeds"]["arm"] == v["seeds"]["reference"]
                 else f"{', '.join(v['seeds']['arm'])} / {', '.join(v['seeds']['reference'])}")
        rows.append({"comparison": name, "measure": c["arm"].split("/")[-1], "shape": v["shape"], "seeds": seeds,
                     "difference": v["difference"], "bound": v["bound"], "verdict": v["verdict"],
                     "reference": reference if isinstance(reference, (int, float)) else None})
    return rows


# ---------------------------------------------------- lesson 12: past the training length (extrapolation.py)

ENCODINGS = {
    "learned": {"positions": "learned"},
    "sinusoidal": {"positions": "sinusoidal"},
    "rope": {"positions": "rope"},
    "rope base 1e6": {"positions": "rope", "rope_theta": 1e6},
    "srpe": {"positions": "srpe"},                                       # the paper's setting
    "srpe a_s=0": {"positions": "srpe", "srpe_a": 0.0},
    "srpe offset": {"positions": "srpe", "srpe_radius": "offset"},        # the relative fix of lesson 06
    "alibi": {"positions": "alibi"},
    "none": {"positions": "none"},                                        # NoPE: only the causal mask
}
# RoPE read past its trained length with no training (positions.rope_scaled), evaluated on the "rope" arm's runs
ROPE_SCALINGS = ("interpolation", "ntk", "yarn")
# the one rule's verdict on a gap against the threshold, in the benchmark's words
EXTRAPOLATION_WORDS = {"lower": "holds", "higher": "breaks", "no verdict": "no verdict"}


def stretched(folder: Path, context: int, rope_scaling: str = "none") -> LanguageModel:
    """The trained model in `folder` rebuilt with a longer context. Nothing else changes: RoPE, SRPE and ALiBi
    compute their tables for any position, the sinusoidal table is a formula; a learned table keeps its trained rows
    and its new rows keep the initial values of a fresh model (seed 0): they were never trained. `rope_scaling`
    (a RoPE model only) reads it with that inference-time method at s = context / the trained context
    (`minwiola.positions.rope_scaled`): the same weights, other angles."""
    short = LanguageModel.from_pretrained(folder)
    torch.manual_seed(0)
    factor = context / short.config.context if rope_scaling != "none" else 1.0
    long = LanguageModel(dataclasses.replace(short.config, context=context, rope_scaling=rope_scaling,
                                             rope_factor=factor))
    state = long.state_dict()
    for key, value in short.state_dict().items():
        if key == "pos.weight":
            state[key][: value.shape[0]] = value                     # the rows it was trained on
        else:
            state[key] = value
    long.load_state_dict(state)
    return long.eval()


def windows(length: int, count: int) -> torch.Tensor:
    """`count` non-overlapping windows of `length` + 1 held-out tokens (inputs and shifted targets)."""
    stream = data.tokens("valid")
    count = min(count, (len(stream) - 1) // length)
    if count < 1:
        raise SystemExit(f"the held-out split has {len(stream):,} tokens, fewer than one window of {length + 1}")
    starts = np.arange(count) * length
    return torch.from_numpy(np.stack([stream[s:s + length + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def loss_by_position(model: LanguageModel, batch: torch.Tensor, chunk: int = 8) -> list[float]:
    """Mean next-token loss (nats) at each position of the windows in `batch`."""
    total = torch.zeros(batch.shape[1] - 1, dtype=torch.float64)
    for rows in batch.split(chunk):
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none")     # (B, T)
        total += loss.double().sum(0)
    return (total / batch.shape[0]).tolist()


def gap(curve: list[float], L: int) -> float:
    """Mean loss over positions [2L, end) minus the mean over [L/2, L)."""
    return far(curve, L) - near(curve, L)


def near(curve: list[float], L: int) -> float:
    """Mean loss over positions [L/2, L): trained positions with long context (the gap's reference)."""
    return statistics.mean(curve[L // 2:L])


def far(curve: list[float], L: int) -> float:
    """Mean loss over positions [2L, end): the positions well past the training length."""
    return statistics.mean(curve[2 * L:])


def extrapolation_plot(result: dict, path: Path | None = None):
    """Loss against position for every encoding (left), and each one's loss minus ALiBi's at the same position
    (right: every encoding is evaluated on the same windows, so the noise of the windows cancels). The left panel's
    height is set by the encodings that stay within 1.5 nats of their loss before L; one that climbs higher runs off
    the top, and its name says so. Saved to `path` if given; the figure is returned."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    L = result["block_size"]
    means = {name: np.mean([s["loss_by_position"] for s in arm["seeds"].values()], axis=0)
             for name, arm in result["encodings"].items()}
    k = max(1, len(next(iter(means.values()))) // 128)                # smooth over k positions for reading
    smooth = {name: np.convolve(m, np.ones(k) / k, mode="valid") for name, m in means.items()}
    x = np.arange(len(next(iter(smooth.values())))) + k // 2
    tame = [s for name, s in smooth.items() if result["encodings"][name]["gap"] < 1.5]
    top = max(s.max() for s in tame or smooth.values()) + 0.2
    reference = "alibi" if "alibi" in means else None
    fig, axes = plt.subplots(1, 2 if reference else 1, figsize=(13 if reference else 8, 4.8), squeeze=False)
    left, right = axes[0, 0], axes[0, -1]
    for name, s in smooth.items():
        seeds = len(result["encodings"][name]["seeds"])
        off = " (off the top past L)" if s.max() > top else ""
        line, = left.plot(x, s, label=f"{name} ({seeds} seed{'s' * (seeds > 1)}){off}")
        if reference and name != reference:
            diff = np.convolve(means[name] - means[reference], np.ones(k) / k, mode="valid")
            right.plot(x, diff, color=line.get_color(), label=name + (" (off the top)" if off else ""))
    left.set_ylim(top=top)
    left.set_ylabel("held-out loss (nats/token), mean over windows and seeds")
    left.set_title(f"Loss against position, trained at L = {L}", fontsize=9)
    left.legend(fontsize=7, ncol=2, loc="lower left")
    if reference:
        right.axhline(0, color="grey", lw=0.8)
        right.set_ylim(-0.3, top - min(s.min() for s in tame or smooth.values()))
        right.set_ylabel(f"loss minus {reference}'s at the same position (nats/token)")
        right.set_title(f"The same, relative to {reference} (the same windows)", fontsize=9)
        right.legend(fontsize=7, ncol=2, loc="upper left")
    for ax in {left, right}:
        ax.axvline(L, color="k", ls=":", lw=1)
        ax.text(L, ax.get_ylim()[1], " training length", va="top", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("position in the window (tokens)")
    fig.suptitle(result["data"], fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


# -------------------------------------------- lesson 13: state-space models against attention (ssm_bench.py)

# name: the preset, its overrides, and where its rate comes from ("sweep" or another arm's best rate)
SSM_ARMS = {
    "llama-style": {"preset": "llama-style", "overrides": {}, "rate_from": "sweep"},
    "ssm-llama-style": {"preset": "ssm-llama-style", "overrides": {}, "rate_from": "sweep"},
    "selective": {"preset": "ssm-llama-style", "overrides": {"ssm_kind": "selective"}, "rate_from": "ssm-llama-style",
                  "match_params_of": "llama-style"},
}

SSM_REFERENCE = "llama-style"                # the arm every other is compared with

MIXERS = ("attention (fused)", "attention (explicit)", "S4D (FFT convolution)", "S4D (scan)", "selective (scan)",
          "S4D kernel K alone")


def ssm_arm_config(name: str, block_size: int, shape: dict | None = None) -> tuple[str, dict]:
    """(preset, overrides) of arm `name` for windows of block_size tokens; `shape` (e.g. {"d": 32, "n_layers": 2})
    shrinks every arm alike, and an arm that must match the reference's parameters gets its d_ff chosen again."""
    arm = SSM_ARMS[name]
    overrides = {"dropout": 0.0, "context": block_size, **(shape or {}), **arm["overrides"]}
    if arm.get("match_params_of") or (shape and arm["preset"] != SSM_ARMS[SSM_REFERENCE]["preset"]):
        reference = SSM_ARMS[arm.get("match_params_of", SSM_REFERENCE)]
        target = count_params(preset(reference["preset"], **{"dropout": 0.0, "context": block_size, **(shape or {}),
                                                             **reference["overrides"]}))
        overrides["d_ff"] = closest_d_ff(arm["preset"], overrides, target)
    return arm["preset"], overrides

SENTENCE_END = set(".!?:\"'\u201c\u201d\u2018\u2019")


def recall_targets(ids: list[int], tokenizer) -> list[int]:
    """Indices k of the tokens in `ids` (one story) that start a probe word: capitalised, not "I", not the first word
    of a sentence, and seen earlier in `ids`. Position k of a window [<|endoftext|>] + ids predicts token k."""
    pieces = [tokenizer.decode_bytes([i]) for i in ids]
    starts = np.cumsum([0] + [len(p) for p in pieces])         # byte offset of each token
    text = b"".join(pieces)
    seen, out = set(), []
    for match in re.finditer(rb"[A-Za-z]+", text):
        word, at = match.group(), match.start()
        before = text[:at]
        gap = before[len(before.rstrip()):]
        previous = before.rstrip().decode("utf-8", "ignore")[-1:]
        mid_sentence = previous != "" and b"\n" not in gap and previous not in SENTENCE_END
        if word[:1].isupper() and word != b"I" and mid_sentence and word in seen:
            k = int(np.searchsorted(starts, at, side="right")) - 1          # the token holding the word's first byte
            if not text[starts[k]:at].strip():                               # it starts there (after spaces only)
                out.append(k)
        seen.add(word)
    return out


def probe_windows(stories: list[str], tokenizer, length: int) -> dict:
    """Each story as a window [<|endoftext|>] + its first `length` tokens, padded with <|endoftext|> to length + 1:
    ids (S, length + 1) int64, `valid` (S, length) marking real targets, `recall` (S, length) the probe's positions."""
    S = len(stories)
    ids = torch.full((S, length + 1), tokenizer.eot_id, dtype=torch.int64)
    valid = torch.zeros(S, length, dtype=torch.bool)
    recall = torch.zeros(S, length, dtype=torch.bool)
    for s, story in enumerate(stories):
        story_ids = tokenizer.encode(story)[:length]
        ids[s, 1:1 + len(story_ids)] = torch.tensor(story_ids, dtype=torch.int64)
        valid[s, :len(story_ids)] = True
        for k in recall_targets(story_ids, tokenizer):
            recall[s, k] = True
    return {"ids": ids, "valid": valid, "recall": recall}


@torch.no_grad()
def probe(model: LanguageModel, windows: dict, chunk: int = 32) -> dict:
    """Mean loss (nats) and top-1 accuracy of `model` on the probe's positions and on all positions of the windows.
    Padding comes after a story, so (the models being causal) it changes no real position's prediction."""
    model.eval()
    losses, hits = [], []
    for rows in windows["ids"].split(chunk):
        logits = model(rows[:, :-1])
        losses.append(F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none").double())
        hits.append(logits.argmax(-1) == rows[:, 1:])
    loss, hit = torch.cat(losses), torch.cat(hits)
    out = {}
    for key, mask in (("recall", windows["recall"]), ("all", windows["valid"])):
        out[key] = {"positions": int(mask.sum()), "loss": loss[mask].mean().item(),
                    "top1": hit[mask].double().mean().item()}
    return out


def ssm_fresh_seeds(arm: dict) -> list[str]:
    """The arm's seeds whose run did not choose its rate: its sweep ran on seed 0 and the best sweep run is its seed
    0, so seed 0 is set apart; an arm whose rate came from another arm's sweep keeps every seed."""
    return [seed for seed in arm["seeds"] if arm["rate_from"] != "sweep" or seed != "0"]


def ssm_plot(result: dict, path: Path | None = None):
    """In the order of lesson 13's text. Costs: (a) seconds per forward of each mixer against T, (b) seconds per
    decoded token against T, (c) decoding memory against T. Training: (d) held-out bits per byte per arm and seed
    (seed 0, which chose the rate, hollow; the line is the mean of the fresh seeds), (e) the recall probe's loss per
    arm, (f) the same after the longer runs."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.6))
    (a, b, c), (d, e, f) = axes
    cost = result.get("costs")
    if cost:
        Ts = cost["lengths"]
        for mixer, seconds in cost["mixers"].items():
            a.loglog(Ts, seconds, "o-", label=mixer)
        a.set_title(f"(a) one mixer's forward, batch 1, d = {cost['d']} ({cost['threads']} thread)", fontsize=9)
        a.set_xlabel("sequence length T (tokens)")
        a.set_ylabel("seconds per forward (best of repeats)")
        a.legend(fontsize=7)
        for name, dec in cost["decoding"].items():
            b.semilogx(Ts, np.array(dec["seconds_per_token"]) * 1e3, "o-", label=f"{name} ({dec['cache']})")
            line, = c.loglog(Ts, np.array(dec["bytes"]) / 2**20, "o-", ms=8, label=f"{name}: {dec['cache']}, measured")
            c.loglog(Ts, np.array(dec["analytic_bytes"]) / 2**20, "x", ms=6, color="k",
                     label=f"{name}: budget's formula" if name == SSM_REFERENCE else None)
        b.set_yscale("linear")
        b.set_title("(b) the whole model, one new token at position T", fontsize=9)
        b.set_xlabel("position T (tokens)")
        b.set_ylabel("ms per token (best of the decoded tokens)")
        b.legend(fontsize=7)
        c.set_title("(c) decoding memory at position T (float32, batch 1)", fontsize=9)
        c.set_xlabel("position T (tokens)")
        c.set_ylabel("MiB held by the caches")
        handles, labels = c.get_legend_handles_labels()
        c.legend(handles, [label.replace(f"{SSM_REFERENCE}: ", "") if "formula" in label else label
                           for label in labels], fontsize=7, loc="center right")
        for ax in (a, b, c):
            ax.set_xticks(Ts, [str(T) for T in Ts])
            ax.minorticks_off()
    arms = {n: a_ for n, a_ in result.get("arms", {}).items() if a_["seeds"]}
    for i, (name, arm) in enumerate(arms.items()):
        fresh = ssm_fresh_seeds(arm)
        for k, (seed, run) in enumerate(arm["seeds"].items()):     # side by side: close values never overprint
            x = i + (k - (len(arm["seeds"]) - 1) / 2) * 0.2
            d.plot(x, run["bits_per_byte"], "o", color=f"C{i}", ms=7, mfc=f"C{i}" if seed in fresh else "white")
            d.annotate(f"s{seed}", (x, run["bits_per_byte"]), xytext=(5, 0), textcoords="offset points",
                       va="center", fontsize=7)
        if fresh:
            d.hlines(statistics.mean(arm["seeds"][s]["bits_per_byte"] for s in fresh), i - 0.38, i + 0.38,
                     color=f"C{i}", lw=1, zorder=0)
        probes = [s["probe"] for s in arm["seeds"].values() if "probe" in s]
        for j, part in enumerate(("recall", "all")):
            values = [p[part]["loss"] for p in probes]
            if values:
                e.bar(i + (j - 0.5) * 0.38, statistics.mean(values), 0.36, color=f"C{i}", alpha=1.0 if j else 0.55,
                      hatch="" if j else "//", edgecolor="k")
                e.plot([i + (j - 0.5) * 0.38] * len(values), values, "k.", ms=4)
    names = list(arms)
    d.set_xticks(range(len(names)), [f"{n}\nlr {arms[n].get('best_lr', 0):g}" for n in names], fontsize=8)
    d.set_xlim(-0.5, max(len(names), 1) - 0.5)
    d.margins(y=0.08)
    d.set_ylabel("held-out bits per byte (best evaluation)")
    d.set_title(f"(d) {result['steps']} steps of {result['batch_size']} x {result['block_size']} tokens, per seed sN;\n"
                "hollow: seed 0, its run chose the rate; line: mean of the other seeds", fontsize=9)
    e.set_xticks(range(len(names)), names, fontsize=8)
    e.set_ylabel("held-out loss (nats/token)")
    e.set_title("(e) recall probe, mean of the seeds (dots: each seed);\nhatched: names seen before; plain: all tokens",
                fontsize=9)
    longer = [(n, steps, run) for n, arm in arms.items() for steps, run in arm.get("long", {}).items()]
    for i, (name, steps, run) in enumerate(longer):
        for j, part in enumerate(("recall", "all")):
            f.bar(i + (j - 0.5) * 0.38, run["probe"][part]["loss"], 0.36, color=f"C{list(arms).index(name)}",
                  alpha=1.0 if j else 0.55, hatch="" if j else "//", edgecolor="k")
            f.text(i + (j - 0.5) * 0.38, run["probe"][part]["loss"], f"{run['probe'][part]['top1']:.0%}",
                   ha="center", va="bottom", fontsize=7)
    if longer:
        f.set_xticks(range(len(longer)), [f"{n}\n{s} steps, seed 0" for n, s, _ in longer], fontsize=8)
        f.set_ylabel("held-out loss (nats/token)")
        f.set_title("(f) after the longer runs, as (e);\nnumbers: how often the top guess is right", fontsize=9)
        f.margins(y=0.08)
    else:
        f.axis("off")
    fig.suptitle(f"{result['data']} | {result['hardware']}", fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path, dpi=100)


# -------------------------------------------------------------- lesson 14: mixture of experts (moe_bench.py)

MOE_ARMS = {
    "dense": ("llama-style", {}),
    "moe": ("moe-llama-style", {}),
    "dense-total": ("llama-style", {"d_ff": 524}),
    "dsff": ("llama-style", {"ffn": "dsff", "d_ff_a": 44, "d_ff": 134}),
    "moe-no-aux": ("moe-llama-style", {"moe_aux": 0.0}),
}


def moe_arm_config(name: str, block_size: int, shape: dict | None = None) -> tuple[str, dict]:
    """(preset, overrides) of arm `name`; `shape` (e.g. {"d": 16, "n_layers": 1}) shrinks every arm alike (for
    tests and the lesson's live run; then the equalities of parameters hold only roughly)."""
    name_of_preset, extra = MOE_ARMS[name]
    return name_of_preset, {"dropout": 0.0, "context": block_size, **(shape or {}), **extra}


def held_out(max_tokens: int, tokenizer, length: int = 128) -> torch.Tensor:
    """The first rows of `length` held-out tokens, at most `max_tokens` of them."""
    stream = data.tokens("valid", tokenizer)
    rows = max(1, min(max_tokens, len(stream)) // length)
    return torch.from_numpy(stream[:rows * length].astype(np.int64)).view(rows, -1)


@torch.no_grad()
def routing(model, batch: torch.Tensor, chunk: int = 16) -> dict:
    """Held-out routing of a trained MoE: per layer the load per expert (top-k assignments), the fraction dropped,
    and every token's top-1 expert ((layers, tokens), in the batch's row-major order)."""
    model.eval()
    top1 = {i: [] for i in range(len(model.moe_layers()))}
    hooks = []
    for i, layer in enumerate(model.moe_layers()):
        def hook(module, args, output, i=i):
            x = args[0]
            logits = module.router(x.reshape(-1, x.shape[-1]))        # row-major (the layer serves position-major)
            top1[i].append(logits.argmax(-1))
        hooks.append(layer.register_forward_hook(hook))
    loads, dropped = [], []
    try:
        for rows in batch.split(chunk):
            model(rows)
            stats = model.moe_stats()
            loads.append(stats["moe_load"] * rows.numel())
            dropped.append(stats["moe_dropped"] * rows.numel())
    finally:
        for h in hooks:
            h.remove()
    n = batch.numel()
    return {"load": (sum(loads) / n).tolist(), "dropped": (sum(dropped) / n).tolist(),
            "top1": torch.stack([torch.cat(top1[i]) for i in top1])}


def moe_report(result: dict) -> str:
    """docs/results.md's table."""
    rows = ["| arm | parameters (total / active) | seeds | nats/token | bits/byte | spread | tokens/s | vs dense |",
            "|---|---|---|---|---|---|---|---|"]
    for name, arm in result["arms"].items():
        verdict = result["verdicts"].get(f"{name} vs dense")
        v = f"{verdict['difference']:+.4f} ({verdict['verdict']})" if verdict else "—"
        rows.append(f"| `{name}` | {arm['params']['total']:,} / {arm['params']['active']:,} | {len(arm['seeds'])} | "
                    f"{arm['mean_nats_per_token']:.3f} | {arm['mean_bits_per_byte']:.4f} | "
                    f"{arm['spread_bits_per_byte']:.4f} | {arm['mean_tokens_per_s']:,.0f} | {v} |")
    return "\n".join(rows)


# ---------------------------------------------------------- lesson 15: masked diffusion (diffusion_bench.py)

# name: (preset, objective)
DIFFUSION_ARMS = {"decoder": ("llama-style", "next-token"), "diffusion": ("diffusion-llama-style", "diffusion")}


def diffusion_arm_config(name: str, block_size: int, shape: dict | None = None) -> tuple[str, dict]:
    """(preset, overrides) of arm `name`; `shape` (e.g. {"d": 16, "n_layers": 1}) shrinks both arms alike."""
    return DIFFUSION_ARMS[name][0], {"dropout": 0.0, "context": block_size, **(shape or {})}


def diffusion_counts(block_size: int = 128, shape: dict | None = None) -> dict:
    """Parameters of each arm (analytic, budget.count_params)."""
    return {name: count_params(preset(*diffusion_arm_config(name, block_size, shape)[:1],
                                      **diffusion_arm_config(name, block_size, shape)[1])) for name in DIFFUSION_ARMS}


def blank_span(n: int, blank: int) -> tuple[int, int]:
    """The blank's [start, end): `blank` positions in the middle of a sequence of n."""
    start = (n - blank) // 2
    return start, start + blank


def diffusion_report(result: dict) -> str:
    """docs/results.md's tables: quality per arm, then generation per sampler."""
    rows = ["| arm | parameters | peak rate | seeds | held-out bits/byte (mean) | spread (max - min) | nats/token | "
            "what the number is |", "|---|---|---|---|---|---|---|---|"]
    for name, arm in result["arms"].items():
        if not arm["seeds"]:
            continue
        what = (f"upper bound (ELBO, {arm['seeds']['0']['draws'] if '0' in arm['seeds'] else '?'} draws; standard "
                f"error at most {arm['max_stderr_bits_per_byte']:.4f})" if "max_stderr_bits_per_byte" in arm
                else "exact")
        rows.append(f"| `{name}` | {arm['params']:,} | {arm['best_lr']:g} | {len(arm['seeds'])} | "
                    f"{arm['mean_bits_per_byte']:.4f} | {arm['spread_bits_per_byte']:.4f} | "
                    f"{arm['mean_nats_per_token']:.3f} | {what} |")
    if "generation" in result:
        rows += ["", "| sampler | steps | forward passes per token | seconds per sample | judge nats/token | "
                 "decoder nats/token | distinct words |", "|---|---|---|---|---|---|---|"]
        for s in result["generation"]["settings"]:
            kind = ("decoder (KV cache)" if s["sampler"] == "decoder"
                    else f"diffusion, blocks of {s['block']}" if s["block"] else "diffusion, whole window")
            rows.append(f"| {kind} | {s['steps']} | {s['forward_passes_per_token']:.3f} | {s['mean_seconds']:.2f} | "
                        f"{s['mean_judge_nats']:.3f} | {s['mean_decoder_nats']:.3f} | {s['mean_distinct_words']:.3f} |")
    if "infilling" in result:
        inf = result["infilling"]
        rows += ["", f"| blank of {inf['blank']} tokens ({inf['stories']} held-out stories) | tokens equal to the "
                 "original | judge nats/token of the blank | judge nats/token after the blank |", "|---|---|---|---|"]
        for method, m in inf["mean"].items():
            rows.append(f"| {method} | {m['exact']:.3f} | {m['fill_nats']:.3f} | {m['after_nats']:.3f} |")
    return "\n".join(rows)


def diffusion_plot(result: dict, path: Path | None = None):
    """(a) held-out bits/byte per arm and seed (the diffusion arm's a bound, with its standard error); (b) the
    judge's nats/token of samples against the number of unmasking steps; (c) held-out loss over training."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.5))
    names = [n for n in result["arms"] if result["arms"][n]["seeds"]]
    for i, name in enumerate(names):
        seeds = result["arms"][name]["seeds"]
        bpb = [s["bits_per_byte"] for s in seeds.values()]
        bound = name == "diffusion"
        # a short line at the mean, not a bar: the axis cannot start at 0 without flattening the difference
        a.plot([i - 0.3, i + 0.3], [statistics.mean(bpb)] * 2, color="orangered" if bound else "steelblue", lw=3,
               label="upper bound (negative ELBO)" if bound else "exact")
        a.errorbar([i] * len(bpb), bpb, yerr=[s.get("stderr_bits_per_byte", 0) for s in seeds.values()], fmt="k.",
                   capsize=3)
    if names:
        a.set_xticks(range(len(names)), names)
        a.set_xlim(-0.6, len(names) - 0.4)
        lows = [s["bits_per_byte"] for n in names for s in result["arms"][n]["seeds"].values()]
        a.set_ylim(min(lows) - 0.1, max(lows) + 0.1)
        a.legend(fontsize=8)
    a.set_ylabel("held-out bits/byte (line: mean; dots: seeds)")
    a.set_title("(a) quality: a bound against an exact value", fontsize=9)
    if "generation" in result:
        settings = result["generation"]["settings"]
        for block, style in ((result["generation"]["settings"][0]["block"], "o-"), (None, "s--")):
            pts = [(s["steps"], s["mean_judge_nats"]) for s in settings if s["sampler"] == "diffusion" and s["block"] == block]
            if pts:
                b.plot(*zip(*pts), style, label=f"diffusion, blocks of {block}" if block else "diffusion, whole window")
        dec = [s for s in settings if s["sampler"] == "decoder"]
        if dec:
            b.axhline(dec[0]["mean_judge_nats"], color="k", ls=":", label="decoder (one pass per token)")
        # the anchor: a token drawn uniformly costs ln V nats, V the tokenizer's vocabulary (the decoder arm's, which
        # the judge shares; the diffusion arm's is one id larger, for [MASK])
        plain = [arm for arm in result["arms"].values() if arm.get("objective") != "diffusion" and "preset" in arm]
        if plain:
            vocab = preset(plain[0]["preset"], **plain[0].get("overrides", {})).vocab_size
            b.axhline(math.log(vocab), color="grey", ls="-.",
                      label=f"uniform random token (ln {vocab:,} = {math.log(vocab):.2f})")
        b.set_xscale("log", base=2)
        b.legend(fontsize=8)
    b.set_xlabel(f"unmasking steps N for {result.get('generation', {}).get('generated', '?')} tokens after <|endoftext|>")
    b.set_ylabel("judge's nats/token of the samples (lower: more plausible)")
    b.set_title("(b) samples against the number of steps", fontsize=9)
    for name in names:
        arm = result["arms"][name]
        run = arm["seeds"].get("0") or next(iter(arm["seeds"].values()))
        curve = np.array(run["valid_curve"])
        c.plot(curve[:, 0] / 1e6, curve[:, 1], "o-", label=f"{name}, held-out" + (
            f" (bound, first {result.get('trainer_bound_windows', '?')} windows)" if name == "diffusion" else ""))
        train = np.array(run["train_curve"])
        c.plot(train[:, 0] / 1e6, train[:, 1], "-", alpha=0.5, label=f"{name}, training loss")
    c.set_xlabel("training tokens (millions)")
    c.set_ylabel("nats/token")
    c.set_title("(c) loss over training (seed 0, best rate)", fontsize=9)
    if c.lines:
        c.legend(fontsize=8)
    fig.suptitle(result["data"] + (" (partial)" if result.get("partial") else ""), fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


# -------------------------------------------- lesson 15: the three layouts, the sort task (layouts_bench.py)

DIGITS, SPAN = 10, 8          # the source: 8 digits 0..9; the target: the same digits sorted; id 10 starts targets


def build(name: str, cfg):
    return EncoderDecoder(cfg) if name == "encdec" else LanguageModel(cfg)


def target_loss(name: str, model, src: torch.Tensor, tgt: torch.Tensor, start: int) -> torch.Tensor:
    """Mean cross-entropy of the targets (B, U) in nats per target token, for either layout."""
    if name == "encdec":
        return model.loss(src, shift_right(tgt, start), tgt)
    seq = torch.cat([src, shift_right(tgt, start)], 1)             # source, start, target without its last
    return next_token_loss(model(seq)[:, src.shape[1]:], tgt)     # only the target positions count


@torch.no_grad()
def decode(name: str, model, src: torch.Tensor, length: int, start: int) -> torch.Tensor:
    """Greedy targets (B, length) for sources (B, S)."""
    if name == "encdec":
        return greedy(model, src, length, start)
    prefix = torch.cat([src, torch.full_like(src[:, :1], start)], 1)
    return generate_ids(model, prefix, length, temperature=0.0)[:, prefix.shape[1]:]


def optimiser_step(name: str, model, opt, batch: tuple, lr: float) -> float:
    """One step at rate `lr` on the target loss of batch = (source, target, start id), gradients clipped at 1.0;
    returns the loss (nats per target token, rounded to 4 places)."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = target_loss(name, model, *batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return round(loss.item(), 4)


def sort_task(n: int, generator: torch.Generator, span: int = SPAN) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, target), each (n, span): rows of random digits 0..DIGITS-1, and the same digits in ascending order.
    A target's tokens are fixed by its source and by nothing else, so a model that does not read its source can do
    no better than guess sorted digits (several nats per target); one that reads it can reach 0."""
    source = torch.randint(0, DIGITS, (n, span), generator=generator)
    return source, source.sort(1).values


def sort_configs(shape: dict | None = None, span: int = SPAN) -> dict:
    """The two arms for the sort task: llama-style at d = 32 with 2 + 2 layers (encdec) and the decoder-only
    model of 4 layers whose SwiGLU width brings its parameters closest (one sequence: source, start, target).
    The vocabulary is the 10 digits and the start id."""
    common = dict(vocab_size=DIGITS + 1, dropout=0.0, d=32, n_layers=2, **(shape or {}))
    encdec = preset("llama-style", **common, context=span)
    common["n_layers"] = 2 * encdec.n_layers
    decoder_with = lambda h: preset("llama-style", **common, d_ff=h, context=2 * span + 1)  # noqa: E731
    best = min(range(8, 8 * encdec.d), key=lambda h: abs(count_params(decoder_with(h)) - encdec_params(encdec)))
    return {"encdec": encdec, "decoder": decoder_with(best)}


def sort_train(name: str, cfg, seed: int, steps: int, batch_size: int = 32, lr: float = 1e-2):
    """Train arm `name` on fresh sort pairs (AdamW, warmup 5% then cosine, clipping at 1.0; the loss on the
    target tokens only, as `target_loss`). Returns (model, losses). A few seconds per hundred steps on one thread."""
    torch.manual_seed(seed)
    model = build(name, cfg)
    opt = torch.optim.AdamW(parameter_groups(model, 0.0), lr=lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for step in range(steps):
        losses.append(optimiser_step(name, model, opt, (*sort_task(batch_size, g), DIGITS),
                                     learning_rate(step / steps, lr, 0.05)))
    return model.eval(), losses


@torch.no_grad()
def sort_evaluate(name: str, model, rows: int = 512, seed: int = 4321) -> dict:
    """On `rows` held-out pairs (drawn with `seed`): the target loss in nats per target token with each row's own
    source and with another row's source (the source rolled by one row), and by greedy decoding the fraction of
    targets written exactly and of target digits right."""
    model.eval()
    src, tgt = sort_task(rows, torch.Generator().manual_seed(seed))
    predicted = decode(name, model, src, tgt.shape[1], DIGITS)
    return {"nats_per_target_token": target_loss(name, model, src, tgt, DIGITS).item(),
            "nats_per_target_token_other_source": target_loss(name, model, src.roll(1, 0), tgt, DIGITS).item(),
            "targets_exact": (predicted == tgt).all(1).float().mean().item(),
            "digits_right": (predicted == tgt).float().mean().item(), "rows": rows}


def report_sort(result: dict) -> str:
    """The sort task's table: per arm, the target loss with its own source and with another row's source."""
    rows = ["| sort task arm | parameters | seeds | held-out nats per target token | with another row's source | "
            "targets written exactly |", "|---|---|---|---|---|---|"]
    for name, arm in result["sort"]["arms"].items():
        rows.append(f"| {name} | {arm['params']:,} | {len(arm['seeds'])} | {arm['mean_nats_per_target_token']:.3f} | "
                    f"{arm['mean_nats_per_target_token_other_source']:.3f} | {arm['mean_targets_exact']:.1%} |")
    return "\n".join(rows)


def hardware() -> str:
    """How the benchmarks name this machine (common.hardware), for a lesson to print beside a stored result."""
    from minwiola.lesson import benchmarks
    return benchmarks("common").hardware()
