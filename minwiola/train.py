"""Training a language model on TinyStories: the loop, its schedule and its evaluation (lesson 11).

    python -m minwiola.train --preset wiola-yocto --minutes 10 --out runs/wiola-yocto

The recipe is the Wiola paper's (eqs. 42-43):

* loss: mean next-token cross-entropy (eq. 42), in nats per token. A layer may add a loss of its own (a mixture of
  experts' balancing and z-losses, `model.aux_loss()`): it is trained on, but the logged train_loss and every
  evaluation stay pure cross-entropy. objective="diffusion" (lesson 15) trains a model without the causal mask as a
  masked-diffusion denoiser instead (`diffusion.training_loss`; its evaluation is the ELBO's bound);
* AdamW, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on weight *matrices* only: vectors and scalars (norm gains
  gamma, WiolaRMSNorm offsets delta, biases, GCLA's blend phi) are not decayed, since decay would pull them toward
  0, nor an SSM's A and step sizes (marked `_no_weight_decay`). The tied embedding is a matrix and is decayed;
* gradients clipped to global norm 1.0;
* learning rate: linear warmup over the first 5% of the run, then cosine decay to 0 (eq. 43). The "run" is the
  step budget, or the time budget if that ends first (time spent evaluating is not counted).

Each step's record holds the loss, the rate, the speed and what the layers report (`model.stats()`: ATM's merge
ratio "atm_mu", MoE's loads ...). Evaluation scores the first `eval_tokens` predicted tokens of the held-out split
(2^18 by default, the whole split of the sample or the built-in stories; `--eval-tokens all` for any split) in
consecutive windows of the training length, and reports nats/token, perplexity exp(nats/token) and bits per byte
(total nats / ln 2 / bytes of the predicted text), which compares models with different tokenizers.

A run folder holds config.json, metrics.jsonl, checkpoint/ (for `--resume`), best/, samples.txt and loss.png.
Tooling, kept out of this file: the run folder's rules (minwiola/tools/runs.py), the device, precision, several
processes, Ctrl-C and out-of-memory (tools/launch.py), and the command line (tools/train_cli.py).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch

from . import budget, data, diffusion
from .generate import check_seed, generate
from .model import ADDED_LATER, LanguageModel, ModelConfig, check_field_types, evaluating, next_token_loss, preset
from .tokenizer import default_tokenizer
from .tools import launch, runs
from .tools.runs import RunFolderError, plot_run, read_metrics  # noqa: F401 (lessons import them from here)


@dataclass
class TrainConfig:
    """Everything that defines a run besides the data. Two runs with equal configs are the same experiment."""

    preset: str = "wiola-yocto"
    overrides: dict = field(default_factory=dict)   # ModelConfig fields to change, e.g. {"dropout": 0.1}
    steps: int = 2000                     # optimizer steps (the schedule's length unless `minutes` ends first)
    minutes: float | None = None          # budget of training time (evaluations not counted); None: steps only
    batch_size: int = 32
    block_size: int = 256                 # training window (at most the model's context)
    grad_accum: int = 1                   # micro-batches per optimizer step
    lr: float = 3e-3
    warmup: float = 0.05                  # fraction of the run spent warming up (eq. 43)
    min_lr: float = 0.0                   # the floor the cosine decays to (eq. 43: 0; CS336 keeps a floor)
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    clip: float = 1.0
    eval_every: int = 250                 # steps between evaluations (and checkpoints)
    eval_batch: int = 32                  # windows per evaluation forward
    eval_max_windows: int | None = None   # None: no cap; a number caps the windows scored (after eval_tokens)
    eval_tokens: int | None = 262_144     # score the first this many held-out tokens (2^18); None: the whole split
    seed: int = 0
    device: str = "auto"                  # "auto" (cuda, then mps, then cpu), or a torch device name
    compile: bool = False                 # torch.compile the model: a slower start (12-37 s on a CPU), then 7-13%
                                          # faster steps (benchmarks/compile_bench.py, docs/training.md)
    activation_checkpointing: bool = False
    prompt: str = "Once upon a time"
    sample_tokens: int = 120
    objective: str = "next-token"         # "next-token" (a decoder) or "diffusion" (a causal=False denoiser, lesson 15)
    precision: str = "auto"               # "auto", "fp32", "bf16" or "fp16" (autocast; fp16 with a gradient scaler)

    def __post_init__(self):
        self.betas = tuple(self.betas)
        check_field_types(self)                           # e.g. minutes=inf or steps=2.5 from a script
        for name in ("steps", "batch_size", "block_size", "grad_accum", "eval_every", "eval_batch", "sample_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("eval_max_windows", "eval_tokens"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if self.minutes is not None and not (self.minutes > 0 and math.isfinite(60 * self.minutes)):
            raise ValueError(f"minutes must be a finite number > 0 or None, got {self.minutes}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup is a fraction of the run in [0, 1), got {self.warmup}")
        if not self.lr > 0 or not self.clip > 0 or self.weight_decay < 0:
            raise ValueError("lr and clip must be > 0 and weight_decay >= 0")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must be in [0, lr], got {self.min_lr} with lr {self.lr}")
        if not (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)) or not self.eps > 0:
            raise ValueError(f"betas must be two numbers in [0, 1) and eps > 0, got {self.betas}, {self.eps}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {tuple(OBJECTIVES)}, got {self.objective!r}")
        if self.precision not in launch.PRECISIONS:
            raise ValueError(f"precision must be one of {launch.PRECISIONS}, got {self.precision!r}")
        if not isinstance(self.overrides, dict):
            raise ValueError(f"overrides must be a dict of model config fields, got {self.overrides!r}")
        check_seed(self.seed)

    def model_config(self, tokenizer=None) -> ModelConfig:
        """The model's config; with `tokenizer`, also checked to fit it and these settings."""
        model_cfg = preset(self.preset, **self.overrides)
        if self.objective == "diffusion" and model_cfg.causal:
            raise ValueError(f"objective='diffusion' needs a model without the causal mask (causal=False, e.g. "
                             f"preset diffusion-llama-style); {self.preset!r} is causal")
        if self.objective == "next-token" and not model_cfg.causal:
            raise ValueError(f"objective='next-token' needs a causal model: {self.preset!r} has causal=False (it "
                             "sees the token it should predict); train it with objective='diffusion'")
        if self.objective == "diffusion" and tokenizer is not None and model_cfg.vocab_size <= tokenizer.vocab_size:
            raise ValueError(f"objective='diffusion' needs vocab_size > the tokenizer's {tokenizer.vocab_size} (room "
                             f"for [MASK], id vocab_size - 1); preset {self.preset!r} has {model_cfg.vocab_size}")
        if tokenizer is not None and model_cfg.vocab_size < tokenizer.vocab_size:
            raise ValueError(f"preset {self.preset!r} has vocab_size={model_cfg.vocab_size}, fewer than the "
                             f"tokenizer's {tokenizer.vocab_size}")
        if self.block_size > model_cfg.context:
            raise ValueError(f"block_size={self.block_size} exceeds the model's context={model_cfg.context}")
        prompt = 1 + len(tokenizer.encode(self.prompt)) if tokenizer is not None else 0   # after <|endoftext|>
        if prompt >= model_cfg.context:
            raise ValueError(f"the sample prompt is {prompt} tokens, leaving no room in context={model_cfg.context}")
        return model_cfg


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW with the paper's settings over `parameter_groups`."""
    return torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             fused=fused)


def learning_rate(progress: float, peak: float, warmup: float, floor: float = 0.0) -> float:
    """Eq. 43 with progress p = step / total in [0, 1]: peak * p / warmup during warmup, then a cosine from peak
    down to `floor` at p = 1 (eq. 43 has floor 0; CS336's schedule keeps a minimum rate)."""
    if progress < warmup:
        return peak * progress / warmup
    decay = (progress - warmup) / (1 - warmup)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * min(decay, 1.0)))


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: matrices (dim >= 2) decay; vectors and scalars (norms, offsets, biases, phi) do not, nor
    parameters marked `_no_weight_decay` (an SSM's A and step sizes: tables of numbers, not weight matrices)."""
    decays = lambda p: p.dim() >= 2 and not getattr(p, "_no_weight_decay", False)
    decay = [p for p in model.parameters() if decays(p)]
    rest = [p for p in model.parameters() if not decays(p)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def token_bytes(tokenizer) -> torch.Tensor:
    """Length in bytes of each token id's text (special tokens count 0: they stand for no text)."""
    specials = set(tokenizer.specials.values())
    return torch.tensor([0 if i in specials else len(tokenizer.decode_bytes([i]))
                         for i in range(tokenizer.vocab_size)])


@torch.no_grad()
def evaluate(model: LanguageModel, tokens: np.ndarray, block_size: int, nbytes: torch.Tensor,
             batch: int = 32, device: torch.device | str = "cpu", max_windows: int | None = None,
             progress: bool = False) -> dict:
    """Held-out loss over the whole token stream, in consecutive windows of `block_size` (the last one shorter):
    every token but the first is predicted exactly once. Returns nats/token, perplexity and bits per byte.
    `progress` shows a bar (gone when done): a long evaluation should not look like a frozen run."""
    from tqdm.auto import tqdm
    if len(tokens) < 2:
        raise ValueError(f"the held-out split has {len(tokens)} token(s): nothing to evaluate")
    nats, count, text_bytes = 0.0, 0, 0
    predicted = len(tokens) - 1 if max_windows is None else min(len(tokens) - 1, max_windows * block_size)
    with evaluating(model), tqdm(total=predicted, unit="tok", unit_scale=True, leave=False, disable=not progress,
                                 desc="evaluating") as bar:
        for window in data.stream_windows(tokens, block_size, batch, max_windows, overlap=1):
            x, y = window[:, :-1].to(device), window[:, 1:].to(device)
            logits = model(x)
            nats += next_token_loss(logits, y, reduction="sum").item()
            count += y.numel()
            text_bytes += int(nbytes[y.cpu()].sum())
            bar.update(y.numel())
    per_token = nats / count
    return {"nats_per_token": per_token, "perplexity": math.exp(per_token),
            "bits_per_byte": nats / math.log(2) / max(text_bytes, 1), "tokens": count, "bytes": text_bytes}


def bound(result: dict) -> str:
    """The label a diffusion model's evaluation carries: its figures are an upper bound (the ELBO), not exact."""
    return " (ELBO bound)" if result.get("bound") else ""


def next_token_objective(forward, x: torch.Tensor, y: torch.Tensor, config: ModelConfig,
                         generator: torch.Generator) -> torch.Tensor:
    """A decoder's training loss: the mean next-token cross-entropy of the batch (eq. 42)."""
    return next_token_loss(forward(x), y)


def diffusion_objective(forward, x: torch.Tensor, y: torch.Tensor, config: ModelConfig,
                        generator: torch.Generator) -> torch.Tensor:
    """A masked-diffusion denoiser's training loss (lesson 15): the ELBO estimate on the windows x, which are x_0
    themselves (y is not used), masked with draws from the data generator."""
    return diffusion.training_loss(forward, x, diffusion.mask_id(config), generator)


def next_token_evaluation(model: LanguageModel, tokens: np.ndarray, cfg: TrainConfig, nbytes: torch.Tensor,
                          device: torch.device, progress: bool) -> dict:
    """A decoder's exact held-out figures (`evaluate`)."""
    return evaluate(model, tokens, cfg.block_size, nbytes, cfg.eval_batch, device, cfg.eval_max_windows, progress)


def diffusion_evaluation(model: LanguageModel, tokens: np.ndarray, cfg: TrainConfig, nbytes: torch.Tensor,
                         device: torch.device, progress: bool) -> dict:
    """A denoiser's held-out ELBO bound (`diffusion.evaluate`: the same keys, plus "bound" and "stderr_nats")."""
    return diffusion.evaluate(model, tokens, cfg.block_size, nbytes, cfg.eval_batch, device, cfg.eval_max_windows)


class Objective(NamedTuple):
    """What the training objective decides in a run; the trainer picks one from OBJECTIVES when it starts."""

    loss: Callable            # (forward, x, y, model config, generator) -> the batch's training loss
    evaluate: Callable        # (model, held-out tokens, TrainConfig, nbytes, device, progress) -> evaluation dict
    context_tokens: int       # held-out tokens read beyond those scored (a decoder's first token is context only)


OBJECTIVES = {"next-token": Objective(next_token_objective, next_token_evaluation, 1),
              "diffusion": Objective(diffusion_objective, diffusion_evaluation, 0)}


def mean_stats(records: list[dict]) -> dict:
    """Each statistic's mean over `records` (dicts of numbers, or of lists of them as `LanguageModel.stats` gives);
    a statistic missing from some records is averaged over those that have it."""
    names = dict.fromkeys(name for record in records for name in record)
    return {name: average([record[name] for record in records if name in record]) for name in names}


def average(values: list):
    """The mean of numbers, or of equally long lists of them element by element."""
    if isinstance(values[0], list):
        return [average(list(column)) for column in zip(*values)]
    return sum(values) / len(values)


def run_record(cfg: TrainConfig, model_cfg: ModelConfig, tokenizer) -> dict:
    """What decides a run besides its budget's progress (config.json): trainer settings, the model config as
    resolved, the tokenizer and the data files."""
    return {"train": json.loads(json.dumps(dataclasses.asdict(cfg))),     # tuples -> lists, as stored
            "model": dataclasses.asdict(model_cfg),
            "tokenizer": {"sha256": tokenizer.hash(), "vocab_size": tokenizer.vocab_size},
            "data": data.source_record()}


def added_later() -> dict:
    """Each model config field added since the first runs, with its default: what a run written before it had."""
    defaults = dataclasses.asdict(ModelConfig())
    return {name: defaults[name] for name in ADDED_LATER}


def diverged(loss: float, norm: float, step: int, out: Path, first_checkpoint: int) -> FloatingPointError:
    """The error that stops a run whose loss or gradient norm is not finite, saying what is left to go back to."""
    what = f"the training loss became {loss}" if not math.isfinite(loss) else f"the gradient norm became {norm}"
    kept = f"the last good checkpoint is in {out / 'checkpoint'}" if (out / "checkpoint").is_dir() else \
        f"no checkpoint was saved yet (the first comes at step {first_checkpoint})"
    return FloatingPointError(f"{what} at step {step}; {kept} (start again with --overwrite and a lower --lr)")


def read_tokens(tokenizer, procs: launch.Processes, progress: bool, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The training and held-out tokens (tokenised on first use, with a bar when `progress`). Under torchrun rank 0
    reads first and the others then find its cache: two processes must not write one cache file. Every training id is
    checked against the model's `vocab_size` here, once, so that the steps' forwards skip that scan (`ids_checked`)."""
    if not procs.main:
        procs.barrier()
    splits = tuple(data.tokens(split, tokenizer, progress=progress) for split in ("train", "valid"))
    if procs.main:
        procs.barrier()
    if len(splits[0]) and int(splits[0].max()) >= vocab_size:
        raise ValueError(f"the training tokens hold ids up to {int(splits[0].max())}, beyond the model's vocabulary "
                         f"of {vocab_size}: were they made with another tokenizer?")
    return splits


def read_step(losses: list[torch.Tensor], norm: torch.Tensor, grad_accum: int) -> tuple[float, float]:
    """(the step's mean loss, its gradient norm) in one read back from the device: each `.item()` would make the host
    wait for the device again (benchmarks/step_syncs.py counts these reads)."""
    *values, norm = torch.stack([*(v.float() for v in losses), norm.float()]).tolist()
    return sum(value / grad_accum for value in values), norm


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU batch on `device`. To a GPU from pinned memory: the copy is queued behind the GPU's work, where one from
    ordinary memory would make the host wait for it."""
    if device.type == "cuda":
        batch = batch.pin_memory()
    return batch.to(device, non_blocking=True)


def try_first_batch(model, forward, tokens: np.ndarray, cfg: TrainConfig, device, precision: str, world: int):
    """A first micro-batch forward and backward (`launch.try_a_batch`), on windows drawn from a generator of its
    own: a data, device, compiler or memory problem shows before the trainer touches its folder."""
    first = lambda rows: data.get_batch(tokens, rows, cfg.block_size, torch.Generator().manual_seed(cfg.seed))
    sizes = launch.Sizes(cfg.batch_size, cfg.block_size, cfg.grad_accum, cfg.activation_checkpointing)
    launch.try_a_batch(model, forward, first, next_token_loss, sizes, device, precision, world)


def evaluation_means(steps: list[dict], names) -> dict:
    """The statistics `names` (those the layers declare: `LanguageModel.evaluation_means()`, ATM's mu of each merging
    layer), each averaged over `steps` (the records since the last evaluation; {} for a model that declares none)."""
    return mean_stats([{name: step[name] for name in names if name in step} for step in steps])


class Trainer:
    """One run: `Trainer(cfg, out).run()`. Everything it needs to continue exactly is in `out/checkpoint/`.
    Before anything in `out` is written or deleted, every setting is checked, the model is built, the data is read
    and a first batch goes forward and backward: a mistake fails here, with the old run untouched. Under torchrun
    every process builds one (`launch.Processes`); rank 0 alone writes the folder."""

    def __init__(self, cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, quiet: bool = False):
        self.cfg, self.out = cfg, Path(out)
        self.procs = launch.Processes(cfg.device)          # rank, world size, this process's device
        self.main, self.world, self.device = self.procs.main, self.procs.world, self.procs.device
        self.progress, self.quiet = progress and self.main, quiet or not self.main   # one process speaks
        self.tokenizer = default_tokenizer()
        model_cfg = cfg.model_config(self.tokenizer)
        self.precision = launch.resolve_precision(cfg.precision, self.device)
        launch.check_world(cfg.batch_size, cfg.objective, self.world)
        state = runs.check_options(self.out, resume, overwrite) if self.main else None   # read-only
        self.record = run_record(cfg, model_cfg, self.tokenizer)   # what config.json holds: --resume checks it
        self.procs.start(self.record)                     # under torchrun: every process must hold the same record
        torch.manual_seed(cfg.seed)                       # the same initial weights in every process
        self.ctrl_c = launch.CtrlC()                      # Ctrl-C: stop at the next step boundary
        self.model = runs.build_model(lambda: LanguageModel(model_cfg).to(self.device),
                                      budget.count_params(model_cfg), f"on {self.device}")
        self.model.activation_checkpointing = cfg.activation_checkpointing
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        self.opt = make_optimizer(self.model, cfg, launch.fused_adamw(self.device))
        fp16 = self.precision == "fp16"                   # a disabled scaler passes everything through unchanged
        self.scaler = torch.amp.GradScaler(self.device.type if fp16 else "cpu", enabled=fp16)
        self.train_tokens, self.valid_tokens = read_tokens(self.tokenizer, self.procs, self.progress, model_cfg.vocab_size)
        self.nbytes = token_bytes(self.tokenizer)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.step, self.elapsed, self.best = 0, 0.0, math.inf
        self.objective = OBJECTIVES[cfg.objective]        # its training loss and its evaluation
        self.logs_aux = any(hasattr(layer, "added_loss") for layer in self.model.modules())   # MoE: log "aux_loss"
        self.step_stats: list[dict] = []                  # each step's layer statistics since the last evaluation
        if resume and self.main:
            runs.check_same_run(self.out, self.record, added_later())
        if len(self.valid_tokens) < 2:
            raise ValueError(f"the held-out split has {len(self.valid_tokens)} token(s): nothing to evaluate on")
        try_first_batch(self.model, self.forward, self.train_tokens, cfg, self.device, self.precision, self.world)
        self.lock = runs.FolderLock(self.out) if self.main else None
        if self.main:
            runs.open_run(self.out, self.lock, state, resume, self.record)
        self.procs.barrier()                              # the others wait until rank 0 has checked and taken it
        if resume:
            self.load_checkpoint()
        self.step_forward = self.procs.wrap(self.forward, self.model.leaves_parameters_unused())

    # -------------------------------------------------------------------------------------------- a step
    def train_step(self) -> float:
        """One optimizer step over `grad_accum` micro-batches; returns this process's mean training loss."""
        cfg = self.cfg
        lr = learning_rate(self.progress_fraction(), cfg.lr, cfg.warmup, cfg.min_lr)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.model.train()
        losses, stats = [], []
        forward = functools.partial(self.step_forward, ids_checked=True)   # the ids were checked in `read_tokens`
        for i in range(cfg.grad_accum):
            x, y = self.next_batch()
            with self.procs.sync_at(self.step_forward, last=i == cfg.grad_accum - 1):
                with launch.autocast(self.precision, self.device):
                    loss = self.objective.loss(forward, x, y, self.model.config, self.generator)
                aux = self.model.aux_loss()               # what layers add (MoE's weighted balancing losses), or 0
                self.scaler.scale((loss + aux) / cfg.grad_accum).backward()   # fp16: scaled against underflow
            losses.append(loss.detach())
            stats.append({"aux_loss": aux.item(), **self.model.stats()} if self.logs_aux else self.model.stats())
        self.scaler.unscale_(self.opt)                    # the true gradients, for clipping
        total, norm = read_step(losses, torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip), cfg.grad_accum)
        # fp16 gradients that overflow are normal while the scaler's factor settles (it skips the step and halves the
        # factor); once the factor is below 1 the gradients themselves are not finite, and the run stops
        overflow = self.scaler.is_enabled() and self.scaler.get_scale() >= 1.0
        if not (math.isfinite(total) and (math.isfinite(norm) or overflow)):
            self.opt.zero_grad(set_to_none=True)          # a finite loss can still have inf grads
            raise diverged(total, norm, self.step + 1, self.out, min(cfg.eval_every, cfg.steps))
        self.scaler.step(self.opt)                        # fp16: skipped if the gradients overflowed
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.step_stats.append(mean_stats(stats))        # ATM's mu, MoE's loads...: the micro-batches' mean
        return total

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's rows of the next batch (every process draws the whole batch: generators stay in step)."""
        x, y = data.get_batch(self.train_tokens, self.cfg.batch_size, self.cfg.block_size, self.generator)
        rows = self.procs.rows(self.cfg.batch_size)
        return to_device(x[rows], self.device), to_device(y[rows], self.device)

    def progress_fraction(self) -> float:
        by_clock = self.elapsed / (60 * self.cfg.minutes) if self.cfg.minutes is not None else 0.0
        return max(self.step / self.cfg.steps, by_clock)

    def finished(self) -> bool:
        return self.step >= self.cfg.steps or self.progress_fraction() >= 1

    # --------------------------------------------------------------------------------------------- the loop
    def run(self) -> dict:
        """Train until the budget is spent; evaluate every `eval_every` steps and at the end; return the last
        evaluation ({} on ranks but 0). Ctrl-C lets the current step finish, saves a checkpoint and raises
        KeyboardInterrupt; a NaN or inf stops the run and keeps the last good checkpoint."""
        if self.ctrl_c.half_step:
            raise RuntimeError(f"this trainer was stopped in the middle of a step; continue from the last checkpoint "
                               f"with Trainer(..., resume=True) (or --resume)")
        self.ctrl_c.requested = False
        if self.main:
            self.lock.acquire()                           # held again if an earlier run() gave it back
        try:
            last = runs.last_evaluation(self.out) if self.step and self.main else {}
            if self.finished():
                return last
            with launch.on_ctrl_c(self.ctrl_c), launch.tensor_float_32(self.device):
                return self.train_loop(last)
        finally:
            if self.main:
                self.lock.release()                       # another trainer may --resume this folder now

    def train_loop(self, last: dict) -> dict:
        from tqdm.auto import tqdm
        cfg = self.cfg
        tokens_per_step = cfg.batch_size * cfg.block_size * cfg.grad_accum
        by_clock = cfg.minutes is not None                # then the bar counts seconds, so its ETA is right
        bar = tqdm(total=round(60 * cfg.minutes) if by_clock else cfg.steps,
                   initial=round(self.elapsed) if by_clock else self.step, unit="s" if by_clock else "step",
                   disable=not self.progress, desc=self.out.name)
        try:
            while not self.finished():
                if self.procs.mean([float(self.ctrl_c.requested)])[0] > 0:     # Ctrl-C in any process: all stop
                    if self.main:
                        self.save_checkpoint()
                        bar.write(f"interrupted at step {self.step}: saved {self.out / 'checkpoint'}; continue "
                                  "with --resume")
                    self.procs.barrier()
                    raise KeyboardInterrupt
                start = time.perf_counter()
                loss = self.train_step()
                loss, seconds = self.procs.mean([loss, time.perf_counter() - start])   # the same in every process
                self.elapsed += seconds
                record = {"step": self.step, "tokens": self.step * tokens_per_step, "train_loss": loss,
                          "lr": self.opt.param_groups[0]["lr"], "tokens_per_s": tokens_per_step / seconds,
                          "elapsed_s": self.elapsed, **self.step_stats[-1]}
                if self.main:
                    runs.append_metrics(self.out, record)
                bar.update(min(round(self.elapsed) - bar.n, bar.total - bar.n) if by_clock else 1)
                bar.set_postfix(step=self.step, loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_s']:,.0f}")
                if self.step % cfg.eval_every == 0 or self.finished():
                    if self.main:
                        last = self.evaluate_and_log(tokens_per_step, bar)
                    self.procs.barrier()                  # the others wait while rank 0 evaluates and saves
        finally:
            bar.close()
        if self.main:
            runs.plot_run(self.out)
        return last

    # ------------------------------------------------------------------------------------------ evaluation
    def held_out(self) -> np.ndarray:
        """The first `eval_tokens` predictions of the held-out split (a decoder's first token is context only)."""
        n = self.cfg.eval_tokens
        if n is None:
            return self.valid_tokens
        return self.valid_tokens[:n + self.objective.context_tokens]

    def evaluate_and_log(self, tokens_per_step: int, bar) -> dict:
        """Evaluate, write a story, keep the best weights, log the evaluation, save a checkpoint, and say so."""
        last = self.objective.evaluate(self.model, self.held_out(), self.cfg, self.nbytes, self.device,
                                       self.progress and not self.quiet)
        story = generate(self.model, self.tokenizer, self.cfg.prompt, self.cfg.sample_tokens, seed=0)
        runs.append_sample(self.out, f"step {self.step}, held-out {last['nats_per_token']:.3f} nats/token"
                           f"{bound(last)}", story)
        if last["nats_per_token"] < self.best:
            self.best = last["nats_per_token"]
            record = json.dumps({"step": self.step, **last}, indent=2) + "\n"
            runs.save_weights(self.out, "best", self.model, self.tokenizer,
                              {"eval.json": lambda path: path.write_text(record)})
        at = {"step": self.step, "tokens": self.step * tokens_per_step, "elapsed_s": self.elapsed}
        runs.append_metrics(self.out, {**at, **evaluation_means(self.step_stats, self.model.evaluation_means()),
                                       **{f"valid_{k}": v for k, v in last.items()},
                                       "precision": self.precision, "world_size": self.world})
        self.step_stats = []                              # the next evaluation's means start here
        self.save_checkpoint()
        if not self.quiet:
            bar.write(f"step {self.step}: held-out {last['nats_per_token']:.4f} nats/token{bound(last)} over "
                      f"{last['tokens']:,} tokens, perplexity {last['perplexity']:.2f}, "
                      f"{last['bits_per_byte']:.4f} bits/byte")
        return last

    def save_checkpoint(self) -> None:
        runs.save_checkpoint(self.out, self.model, self.tokenizer, {
            "optimizer": self.opt.state_dict(), "step": self.step, "elapsed": self.elapsed, "best": self.best,
            "scaler": self.scaler.state_dict(), **runs.random_states(self.device, self.generator)})

    def load_checkpoint(self) -> None:
        """Every process loads rank 0's checkpoint (reading only), whatever number of processes saved it."""
        weights, state = runs.load_checkpoint(self.out, self.record["model"], LanguageModel.from_pretrained)
        self.model.load_state_dict(weights)
        runs.restore_trainer_state(self.out, state, self.opt, self.scaler, self.device, self.generator)
        self.step, self.elapsed, self.best = state["step"], state["elapsed"], state["best"]
        if self.main:
            runs.forget_after(self.out, self.step, state["samples_bytes"])


if __name__ == "__main__":          # `python -m minwiola.train ...`: the command line is tooling (tools/train_cli.py)
    from .tools.train_cli import main
    raise SystemExit(main())
