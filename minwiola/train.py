"""Training a language model on TinyStories: the loop, its schedule, evaluation and run folders (lesson 11).

    python -m minwiola.train --preset wiola-yocto --minutes 10 --out runs/wiola-yocto

The recipe is the Wiola paper's (eqs. 42-43):

* loss: mean next-token cross-entropy (eq. 42), in nats per token;
* AdamW, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on weight *matrices* only: vectors and scalars (norm gains
  gamma, WiolaRMSNorm offsets delta, biases, GCLA's blend phi) are not decayed, since decay would pull them toward
  0 (a norm's gain toward 0, delta toward plain RMSNorm), nor an SSM's A and step sizes (marked
  `_no_weight_decay`: decay would pull its decay rates and frequencies toward 0). The tied embedding is a matrix
  and is decayed;
* gradients clipped to global norm 1.0;
* a mixture of experts (ffn="moe", lesson 14) adds its weighted balancing and z-losses (`model.aux_loss()`) to the
  loss it trains on; the logged train_loss and every evaluation stay pure cross-entropy;
* each step's record holds what the layers report (`model.stats()`, the mean over the step's micro-batches): with
  MoE the added "aux_loss", each layer's load per expert ("moe_load") and fraction dropped ("moe_dropped"); with
  ATM the merge ratio mu of each merging layer ("atm_mu"), whose mean since the last evaluation the evaluation
  record holds too;
* objective="diffusion" (lesson 15) trains a model without the causal mask as a masked-diffusion denoiser instead:
  the loss is `diffusion.training_loss` (the ELBO estimate on a training window), evaluation reports the ELBO's
  bound (`diffusion.evaluate`: the same keys, plus "bound" and "stderr_nats") and the sample story fills masks
  after the prompt (`generate.fill_stories`);
* learning rate: linear warmup over the first 5% of the run, then cosine decay to 0 (eq. 43). The "run" is the
  step budget, or the time budget if that ends first (the schedule then follows elapsed training time; time spent
  evaluating is not counted, so two models with the same budget get the same training time).

Evaluation scores a fixed, stated stretch of the held-out split: its first `eval_tokens` predicted tokens (262,144 =
2^18 by default; `--eval-tokens all` takes the whole split), cut into consecutive windows of the training length.
The held-out splits of the TinyStories sample (196,322 tokens) and of the built-in stories (70,916) are shorter, so
there it is the whole split; the full download's (some 22,000 stories, about 20 times the sample's) would take
minutes at every evaluation on a small GPU, so a run scores the same first 2^18 tokens each time, and every
evaluation record says how many it scored ("valid_tokens"; the log line too). It reports nats/token, perplexity
exp(nats/token) and bits per byte (total nats / ln 2 / bytes of the predicted text), which compares models with
different tokenizers. A run folder holds config.json, metrics.jsonl (one JSON object per log or evaluation),
checkpoint/ (the latest state: weights, optimizer, gradient scaler, random states) and best/ (the weights with the
lowest held-out loss, and best/eval.json saying at which step), samples.txt and loss.png.

`--resume` continues from the last checkpoint (saved at every evaluation and on Ctrl-C). A run budgeted by steps
then ends with exactly the weights an uninterrupted run would have; a run budgeted by minutes follows the clock, so
it ends wherever the time runs out.

Precision (`--precision`): "auto" trains in bf16 on a GPU that has it (autocast: weights, optimizer and gradients
stay float32; matrix products run in bf16), fp16 on one that does not (a hosted notebook's free T4), and fp32 on a
CPU or a Mac. fp16's narrow range needs a gradient scaler (`torch.amp.GradScaler`): the loss is multiplied by a
large factor before the backward pass, the gradients are divided by it before clipping, and a step whose gradients
overflow is skipped and the factor halved (the run stops as diverged only once the factor is below 1); its state is
part of the checkpoint. Evaluation and the sample story run without autocast, in float32. On CUDA, while a run
trains and evaluates, every float32 matrix product (all of training with "fp32"; evaluation always) uses
TensorFloat-32 (`torch.set_float32_matmul_precision("high")`: inputs rounded to a 10-bit mantissa, sums in float32),
several times faster and what "fp32" means on a modern GPU; the setting is put back when `run` returns. The CPU has
no such mode. AdamW is the fused kernel on CUDA (`fused_adamw`).

Several processes (`torchrun --nproc_per_node=N -m minwiola.train ...`) train one model with PyTorch's
DistributedDataParallel: NCCL on CUDA (rank r on cuda:LOCAL_RANK), gloo on the CPU. `--batch-size` stays the
*global* batch (it must be a multiple of N): every rank draws the same global batch of windows from the same seeded
generator and trains on its own rows [r B/N, (r + 1) B/N); DDP averages the gradients (and synchronises only at the
last micro-batch of `--grad-accum`). So the run is the same experiment for any N, up to the order in which the
all-reduce sums (float rounding), and `--resume` works with another number of processes: the world size is recorded
in each evaluation's metrics, not in the run's identity. Rank 0 alone touches the run folder (marker, lock,
checkpoints, metrics, samples, best/, plot) and evaluates; the others wait for it at a barrier, and every wait gives
up after `DDP_TIMEOUT` (30 minutes), so no rank hangs for ever. Dropout draws from the same seed on every rank (rows
of different ranks get the same masks); with dropout, or MoE (its capacity and balancing loss are computed per
rank's micro-batch), N processes make a statistically equal run, not a bit-equal one; the logged MoE loads and ATM
merge ratios are rank 0's. objective="diffusion" is refused under torchrun (its masking draws per row from the data
generator). A rank that fails prints one `error: rank R: ...` line and exits, and torchrun then stops the others.
Ctrl-C reaches every process; they agree to stop after the same step, and rank 0 saves. A process killed outright
(SIGKILL, or torchrun's SIGTERM) never leaves a half-written checkpoint: checkpoints are swapped in whole.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import errno
import gc
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from . import budget, data, diffusion, first_line, quick_mode, runs
from .generate import check_seed, generate
from .model import (LanguageModel, ModelConfig, check_field_types, evaluating, field_types, next_token_loss,
                    preset)
from .runs import RunFolderError, plot_run, read_metrics  # noqa: F401 (lessons import them from here)
from .tokenizer import default_tokenizer


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}    # the precisions that train under autocast
DDP_TIMEOUT = datetime.timedelta(minutes=30)    # the longest a rank waits for the others (rank 0 tokenising, ...)


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
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
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


def pick_device(name: str = "auto") -> torch.device:
    """cuda if there is one, else Apple's mps, else the cpu; or the device named (ValueError if this machine has
    no such device)."""
    if name != "auto":
        if name.split(":")[0] == "meta":
            raise ValueError("--device meta holds shapes, not numbers: nothing can be trained on it; try auto or cpu")
        try:
            device = torch.device(name)
            torch.empty(1, device=device)                 # fails now if the machine lacks it, not mid-run
        except (RuntimeError, AssertionError) as e:
            why = first_line(e, limit=100, sentence=True)
            raise ValueError(f"--device {name}: not usable on this machine ({why}); try auto or cpu") from None
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision a run trains in on `device`: "auto" is bf16 on a GPU that computes in bf16 natively, fp16 on
    one that does not (a T4: bf16 there would be emulated, slowly), fp32 on a CPU or a Mac (CPU autocast is slower
    than float32 for models this small); any other choice is taken as it is."""
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:                                  # torch < 2.3 has no such argument and counts native only
        native = torch.cuda.is_bf16_supported()
    return "bf16" if native else "fp16"


def autocast(precision: str, device: torch.device):
    """The autocast context a step runs under: bf16 or fp16 matrix products, float32 weights (a no-op for fp32)."""
    return torch.autocast(device.type, dtype=AUTOCAST.get(precision, torch.bfloat16), enabled=precision in AUTOCAST)


def fused_adamw(device: torch.device) -> bool:
    """Whether AdamW runs as one fused kernel: on CUDA, yes (fewer launches, the same update to float rounding);
    on the CPU no, so that CPU runs keep the numbers of the runs recorded in results/ (torch >= 2.4 could fuse
    there too: tests/test_train.py checks both give the same weights)."""
    return device.type == "cuda"


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
EVALUATION_MEANS = ("atm_mu",)   # layer statistics an evaluation record also holds, as the mean since the last one


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


OUT_OF_MEMORY = (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), MemoryError)


def is_out_of_memory(error: BaseException) -> bool:
    """A GPU's out-of-memory error, or the CPU allocator's (a RuntimeError saying it cannot allocate)."""
    return isinstance(error, OUT_OF_MEMORY) or (isinstance(error, RuntimeError) and "allocate" in str(error))


def divisors(n: int) -> list[int]:
    """The divisors of n, smallest first."""
    return [k for k in range(1, n + 1) if n % k == 0]


def out_of_memory(cfg: TrainConfig, device: torch.device | str, world: int, split: int | None) -> str:
    """The one line for a run that does not fit on `device`: at which size, and either the settings with the same
    tokens per step whose micro-batches are `split` times smaller, or (split None) what else to try."""
    per = f" ({cfg.batch_size // world} per process)" if world > 1 else ""
    where = f"out of memory on {device} at --batch-size {cfg.batch_size}{per} x --block-size {cfg.block_size}"
    if split is None:
        return (f"{where}: not even one window per process fits; lower --block-size or pick a smaller model"
                + ("" if cfg.activation_checkpointing else ", or add --activation-checkpointing"))
    return (f"{where}: try --batch-size {cfg.batch_size // split} --grad-accum {cfg.grad_accum * split} "
            "(the same tokens per step)")


OOM, NOT_FINITE = "out of memory", "not finite"


def first_pass(model: LanguageModel, forward, tokens: np.ndarray, cfg: TrainConfig, device: torch.device,
               precision: str, rows: int) -> str | None:
    """One forward and backward pass as a step takes it (training mode, the run's precision, compiled if the run
    compiles) on `rows` windows: None if it went through, else OOM, NOT_FINITE or another error's first line.
    It leaves no trace: the windows come from a generator of its own, the gradients are dropped and torch's random
    states (dropout draws here) are put back, so the run that follows is the same as without it."""
    x, y = data.get_batch(tokens, rows, cfg.block_size, torch.Generator().manual_seed(cfg.seed))
    x, y = x.to(device), y.to(device)
    saved = runs.random_states(device, torch.Generator())
    model.train()
    try:
        with autocast(precision, device):
            logits = forward(x)
            loss = next_token_loss(logits, y)      # any loss over the logits costs the memory a step's does
        finite = bool(torch.isfinite(logits).all())
        del logits
        loss.backward()
    except OUT_OF_MEMORY:                           # returned, not raised: the error's frames would hold the memory
        return OOM
    except RuntimeError as e:                       # torch's and the compiler's errors (InductorError is one)
        return first_line(e)
    finally:
        model.zero_grad(set_to_none=True)
        runs.restore_random_states(saved, device, torch.Generator())
    return None if finite else NOT_FINITE


def free_memory(device: torch.device) -> None:
    """Give what a failed pass allocated back, so that the next try starts from an empty device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def try_a_batch(model: LanguageModel, forward, tokens: np.ndarray, cfg: TrainConfig, device: torch.device,
                precision: str = "fp32", world: int = 1) -> None:
    """A first micro-batch (batch_size / world windows) forward and backward on the device (`first_pass`): a data,
    device, compiler or memory problem, or a model whose output is already not finite, shows before a trainer
    touches its folder, not after. Out of memory, it tries micro-batches 2, 3, 4, ... times smaller until one fits,
    and the error names the --batch-size / --grad-accum with the same tokens per step."""
    micro = cfg.batch_size // world
    failure = first_pass(model, forward, tokens, cfg, device, precision, micro)
    if failure is None:
        return
    if failure == NOT_FINITE:
        also = " or --precision (fp16 overflows beyond 65504)" if precision == "fp16" else ""
        raise ValueError("the model's output is not finite on a first batch, before any training: check the "
                         f"model settings (init_std?){also}")
    if failure != OOM:
        raise ValueError(f"a first batch of {micro} x {cfg.block_size} tokens failed on {device}: {failure}")
    for split in divisors(micro)[1:]:
        free_memory(device)
        if first_pass(model, forward, tokens, cfg, device, precision, micro // split) is None:
            break
    else:
        split = None
    free_memory(device)
    raise ValueError(out_of_memory(cfg, device, world, split))


def diverged(loss: float, norm: float, step: int, out: Path, first_checkpoint: int) -> FloatingPointError:
    """The error that stops a run whose loss or gradient norm is not finite, saying what is left to go back to."""
    what = f"the training loss became {loss}" if not math.isfinite(loss) else f"the gradient norm became {norm}"
    kept = f"the last good checkpoint is in {out / 'checkpoint'}" if (out / "checkpoint").is_dir() else \
        f"no checkpoint was saved yet (the first comes at step {first_checkpoint})"
    return FloatingPointError(f"{what} at step {step}; {kept} (start again with --overwrite and a lower --lr)")


@contextlib.contextmanager
def on_ctrl_c(handler):
    """Within the block, Ctrl-C calls `handler` instead of raising KeyboardInterrupt at once: the trainer sets a
    flag that is read between steps, so a checkpoint never holds half a step. Signal handlers can only be
    installed from the main thread; elsewhere Ctrl-C is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def tensor_float_32(device: torch.device):
    """Within the block, float32 matrix products on CUDA use TensorFloat-32 (module docstring); afterwards the
    setting is what it was, so a notebook's own float32 comparisons after a run stay exact."""
    if device.type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


# ------------------------------------------------------------------------------------- several processes
def launched_ranks() -> tuple[int, int, int]:
    """(rank, world size, local rank) as torchrun sets them (RANK, WORLD_SIZE, LOCAL_RANK); (0, 1, 0) in a plain
    process. A world of one is a plain process: no process group, nothing changes."""
    try:
        rank, world, local = (int(os.environ.get(name, default)) for name, default in
                              (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")))
    except ValueError:
        raise ValueError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (torchrun sets them)") from None
    if not (world >= 1 and 0 <= rank < world and local >= 0):
        raise ValueError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local} do not describe a launch")
    return rank, world, local


def rank_device(device: torch.device, local: int, world: int) -> torch.device:
    """The device of this process: under torchrun each rank takes its own GPU, cuda:LOCAL_RANK (whatever index was
    named); the CPU stays the CPU; Apple's mps has no backend for several processes."""
    if world == 1 or device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"--device {device} cannot train with several processes; use cuda or cpu")
    if local >= torch.cuda.device_count():
        raise ValueError(f"LOCAL_RANK {local}: this machine has {torch.cuda.device_count()} GPU(s); start at most "
                         "that many processes on it (--nproc_per_node)")
    return torch.device("cuda", local)


def check_world(cfg: TrainConfig, world: int) -> None:
    """What several processes cannot do (ValueError naming the setting)."""
    if world > 1 and cfg.batch_size % world:
        raise ValueError(f"batch_size must be a multiple of the {world} processes (it is the global batch, split "
                         f"evenly between them), got {cfg.batch_size}")
    if world > 1 and cfg.objective == "diffusion":
        raise ValueError("objective='diffusion' cannot train with several processes: its masking draws each row's "
                         "noise from the data generator, so rows split between processes would not make the same "
                         "run as one process; train it in one process")


def lost_contact(error: BaseException) -> bool:
    """Whether `error` is a collective failing because another process is gone (gloo's closed connection, NCCL's
    aborted communicator): a consequence, not a cause, so no traceback."""
    text = str(error)
    return isinstance(error, getattr(dist, "DistError", ())) or any(
        sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "NCCL communicator"))


def start_distributed(world: int, device: torch.device) -> None:
    """Join torchrun's process group (once): NCCL between GPUs, gloo between CPU processes. Every collective and
    barrier gives up after DDP_TIMEOUT."""
    if world == 1 or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=DDP_TIMEOUT)


def stop_distributed() -> None:
    """Leave the process group at the end of a run that went well (after an error the process just exits, and
    torchrun stops the others)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class Trainer:
    """One run: `Trainer(cfg, out).run()`. Everything it needs to continue exactly is in `out/checkpoint/`.

    Before anything in `out` is written or deleted, every setting is checked, the model is built on the device,
    the data is read and a first batch goes forward and backward through the model: a mistake fails here, with the
    old run untouched. The folder's bookkeeping (marker, lock, checkpoints, metrics) is `minwiola.runs`.

    Under torchrun (WORLD_SIZE > 1) every process builds a Trainer: `rank` 0 of `world` owns the folder, the
    others read only the checkpoint they resume from, once rank 0 has checked and locked the folder."""

    def __init__(self, cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, quiet: bool = False):
        self.rank, self.world, local = launched_ranks()
        self.main = self.rank == 0
        self.cfg, self.out = cfg, Path(out)
        self.progress, self.quiet = progress and self.main, quiet or not self.main   # one process speaks
        self.tokenizer = default_tokenizer()
        model_cfg = cfg.model_config(self.tokenizer)
        self.device = rank_device(pick_device(cfg.device), local, self.world)
        self.precision = resolve_precision(cfg.precision, self.device)
        check_world(cfg, self.world)
        state = runs.check_options(self.out, resume, overwrite) if self.main else None   # read-only
        start_distributed(self.world, self.device)
        torch.manual_seed(cfg.seed)                       # the same initial weights in every process
        self.stop_requested = False                       # set by Ctrl-C; the loop stops at the next step boundary
        self.half_step = False                            # a second Ctrl-C stopped a step midway: state unusable
        self.model = runs.build_model(lambda: LanguageModel(model_cfg).to(self.device), model_cfg,
                                      f"on {self.device}")      # a model too big for this machine: one line
        self.model.activation_checkpointing = cfg.activation_checkpointing
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        self.opt = make_optimizer(self.model, cfg, fused_adamw(self.device))
        fp16 = self.precision == "fp16"                   # a disabled scaler passes everything through unchanged
        self.scaler = torch.amp.GradScaler(self.device.type if fp16 else "cpu", enabled=fp16)
        self.train_tokens, self.valid_tokens = self.read_data()
        self.nbytes = token_bytes(self.tokenizer)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.step, self.elapsed, self.best = 0, 0.0, math.inf
        self.objective = OBJECTIVES[cfg.objective]        # its training loss and its evaluation
        self.logs_aux = any(hasattr(layer, "added_loss") for layer in self.model.modules())   # MoE: log "aux_loss"
        self.step_stats: list[dict] = []                  # each step's layer statistics since the last evaluation
        self.record = {"train": json.loads(json.dumps(dataclasses.asdict(cfg))),     # tuples -> lists, as stored
                       "model": dataclasses.asdict(model_cfg),
                       "tokenizer": {"sha256": self.tokenizer.hash(), "vocab_size": self.tokenizer.vocab_size},
                       "data": data.source_record()}
        if resume and self.main:
            runs.check_same_run(self.out, self.record)
        if len(self.valid_tokens) < 2:
            raise ValueError(f"the held-out split has {len(self.valid_tokens)} token(s): nothing to evaluate on")
        try_a_batch(self.model, self.forward, self.train_tokens, cfg, self.device, self.precision, self.world)
        self.lock = runs.FolderLock(self.out) if self.main else None
        if self.main:
            runs.open_run(self.out, self.lock, state, resume, self.record)
        self.barrier()                                    # the others wait until rank 0 has checked and taken it
        if resume:
            self.load_checkpoint()
        self.step_forward = self.distributed(model_cfg)

    def read_data(self) -> tuple[np.ndarray, np.ndarray]:
        """The training and held-out tokens (tokenised on first use, with a bar when `progress`). Under torchrun
        rank 0 reads first and the others then find its cache: two processes must not write one cache file."""
        if not self.main:
            self.barrier()
        splits = tuple(data.tokens(split, self.tokenizer, progress=self.progress) for split in ("train", "valid"))
        if self.main:
            self.barrier()
        return splits

    def distributed(self, model_cfg: ModelConfig):
        """What a step calls: the (compiled) model, wrapped in DistributedDataParallel under torchrun. A mixture of
        experts may leave an expert without tokens in a batch, which DDP must be told to expect."""
        if self.world == 1:
            return self.forward
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(self.forward, device_ids=[self.device] if self.device.type == "cuda" else None,
                                       find_unused_parameters=model_cfg.ffn == "moe")

    # ------------------------------------------------------------------------------------ between processes
    def barrier(self) -> None:
        """Wait for every process (nothing to wait for in one)."""
        if self.world > 1:
            dist.barrier(**({"device_ids": [self.device.index]} if self.device.type == "cuda" else {}))

    def across_ranks(self, values: list[float]) -> list[float]:
        """Each value's mean over the processes (one all-reduce; every process gets the same numbers)."""
        if self.world == 1:
            return values
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return (total / self.world).tolist()

    # ------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> None:
        runs.save_checkpoint(self.out, self.model, self.tokenizer, {
            "optimizer": self.opt.state_dict(), "step": self.step, "elapsed": self.elapsed, "best": self.best,
            "scaler": self.scaler.state_dict(), **runs.random_states(self.device, self.generator)})

    def load_checkpoint(self) -> None:
        """Every process loads rank 0's checkpoint (reading only): the processes hold the same state, so rank 0's is
        each one's, whatever number of processes saved it."""
        weights, state = runs.load_checkpoint(self.out, self.record["model"])
        self.model.load_state_dict(weights)
        try:
            self.opt.load_state_dict(state["optimizer"])
            if state.get("scaler") and self.scaler.is_enabled():   # {} from a run that had no scaler
                self.scaler.load_state_dict(state["scaler"])
            runs.restore_random_states(state, self.device, self.generator)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise RunFolderError(f"{self.out / 'checkpoint' / 'trainer_state.pt'} does not fit this run "
                                 f"({first_line(e)})") from None
        self.step, self.elapsed, self.best = state["step"], state["elapsed"], state["best"]
        if self.main:
            runs.forget_after(self.out, self.step, state["samples_bytes"])

    # -------------------------------------------------------------------------------------------- steps
    def progress_fraction(self) -> float:
        done = self.step / self.cfg.steps
        if self.cfg.minutes is not None:
            done = max(done, self.elapsed / (60 * self.cfg.minutes))
        return done

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's rows of the next batch. Every process draws the same `batch_size` windows from the same
        generator (so the generators stay in step) and keeps its own slice [rank B/world, (rank + 1) B/world)."""
        cfg = self.cfg
        x, y = data.get_batch(self.train_tokens, cfg.batch_size, cfg.block_size, self.generator)
        rows = slice(self.rank * cfg.batch_size // self.world, (self.rank + 1) * cfg.batch_size // self.world)
        return x[rows].to(self.device), y[rows].to(self.device)

    def train_step(self) -> float:
        """One optimizer step over `grad_accum` micro-batches; returns this process's mean training loss. Under DDP
        the gradients are averaged over the processes at the last micro-batch only (`no_sync` before it)."""
        cfg = self.cfg
        lr = learning_rate(self.progress_fraction(), cfg.lr, cfg.warmup, cfg.min_lr)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.model.train()
        total, stats = 0.0, []
        for i in range(cfg.grad_accum):
            x, y = self.next_batch()
            last = self.world == 1 or i == cfg.grad_accum - 1
            with contextlib.nullcontext() if last else self.step_forward.no_sync():
                with autocast(self.precision, self.device):
                    loss = self.objective.loss(self.step_forward, x, y, self.model.config, self.generator)
                aux = self.model.aux_loss()               # what layers add (MoE's weighted balancing losses), or 0
                self.scaler.scale((loss + aux) / cfg.grad_accum).backward()   # fp16: scaled against underflow
            total += loss.item() / cfg.grad_accum
            measured = self.model.stats()                 # what the layers report: ATM's mu, MoE's loads, ...
            stats.append({"aux_loss": aux.item(), **measured} if self.logs_aux else measured)
        self.scaler.unscale_(self.opt)                    # the true gradients, for clipping
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip)
        if not (math.isfinite(total) and (math.isfinite(norm.item()) or self.overflow_allowed())):
            self.opt.zero_grad(set_to_none=True)          # a finite loss can still have inf grads
            raise diverged(total, norm.item(), self.step + 1, self.out, min(cfg.eval_every, cfg.steps))
        self.scaler.step(self.opt)                        # fp16: skipped if the gradients overflowed
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.step_stats.append(mean_stats(stats))        # ATM's mu, MoE's loads...: the micro-batches' mean
        return total

    def overflow_allowed(self) -> bool:
        """fp16 gradients that overflowed: the scaler skips the step and halves its factor, which is normal while
        the factor settles; once it has fallen below 1 the gradients themselves are not finite, and the run stops."""
        return self.scaler.is_enabled() and self.scaler.get_scale() >= 1.0

    def held_out(self) -> np.ndarray:
        """The held-out tokens an evaluation scores: the first `eval_tokens` predictions (a next-token model's
        first token is context only, so it takes one more), or the whole split."""
        n = self.cfg.eval_tokens
        if n is None:
            return self.valid_tokens
        return self.valid_tokens[:n + self.objective.context_tokens]

    def evaluate_and_sample(self) -> dict:
        result = self.objective.evaluate(self.model, self.held_out(), self.cfg, self.nbytes, self.device,
                                         self.progress and not self.quiet)
        story = generate(self.model, self.tokenizer, self.cfg.prompt, self.cfg.sample_tokens, seed=0)
        with open(self.out / "samples.txt", "a") as f:
            f.write(f"--- step {self.step}, held-out {result['nats_per_token']:.3f} nats/token{bound(result)}\n"
                    f"{story}\n\n")
        if result["nats_per_token"] < self.best:
            self.best = result["nats_per_token"]
            record = json.dumps({"step": self.step, **result}, indent=2) + "\n"
            runs.save_weights(self.out, "best", self.model, self.tokenizer,
                              {"eval.json": lambda path: path.write_text(record)})
        return result

    def evaluation_means(self) -> dict:
        """The EVALUATION_MEANS statistics (ATM's mu of each merging layer), each averaged over the steps since the
        last evaluation ({} for a model that reports none). After a resume the mean covers the steps since it."""
        steps, self.step_stats = self.step_stats, []
        return mean_stats([{name: step[name] for name in EVALUATION_MEANS if name in step} for step in steps])

    def request_stop(self, signum=None, frame=None) -> None:
        """Ctrl-C during `run`: finish the current step, save a checkpoint, stop. A second Ctrl-C stops at once."""
        if self.stop_requested:
            self.half_step = True
            raise KeyboardInterrupt
        self.stop_requested = True

    def finished(self) -> bool:
        return self.step >= self.cfg.steps or (self.cfg.minutes is not None and
                                               self.elapsed >= 60 * self.cfg.minutes)

    def run(self) -> dict:
        """Train until the budget is spent; evaluate every `eval_every` steps and at the end. Returns the last
        evaluation (of a run that had already finished: the one it logged; under torchrun, {} on ranks but 0).
        Ctrl-C lets the current step finish, saves a checkpoint and raises KeyboardInterrupt; a NaN or inf stops
        the run and keeps the last good checkpoint. The first step's time includes one-off start-up costs (and
        compilation, with `compile`)."""
        if self.half_step:
            raise RuntimeError(f"this trainer was stopped in the middle of a step; continue from the last checkpoint "
                               f"with Trainer(..., resume=True) (or --resume)")
        self.stop_requested = False
        if self.main:
            self.lock.acquire()                           # held again if an earlier run() gave it back
        try:
            evals = [r for r in read_metrics(self.out) if "valid_nats_per_token" in r] if self.step and self.main \
                else []
            last = {k[len("valid_"):]: v for k, v in evals[-1].items() if k.startswith("valid_")} if evals else {}
            if self.finished():
                return last
            with on_ctrl_c(self.request_stop), tensor_float_32(self.device):
                return self.train_loop(last)
        finally:
            if self.main:
                self.lock.release()                       # another trainer may --resume this folder now

    def stop_here(self) -> bool:
        """Whether a Ctrl-C has asked to stop, in any process (they must all stop at the same step)."""
        return self.across_ranks([float(self.stop_requested)])[0] > 0 if self.world > 1 else self.stop_requested

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
                if self.stop_here():
                    if self.main:
                        self.save_checkpoint()
                        bar.write(f"interrupted at step {self.step}: saved {self.out / 'checkpoint'}; continue with "
                                  "--resume")
                    self.barrier()
                    raise KeyboardInterrupt
                start = time.perf_counter()
                loss = self.train_step()
                loss, seconds = self.across_ranks([loss, time.perf_counter() - start])   # the same in every process
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
                    self.barrier()                        # the others wait while rank 0 evaluates and saves
        finally:
            bar.close()
        if self.main:
            plot_run(self.out)
        return last

    def evaluate_and_log(self, tokens_per_step: int, bar) -> dict:
        """Evaluate, write the story, log the evaluation (with what it scored and how the run trained), save a
        checkpoint, and say so."""
        last = self.evaluate_and_sample()
        runs.append_metrics(self.out, {"step": self.step, "tokens": self.step * tokens_per_step,
                                       "elapsed_s": self.elapsed, **self.evaluation_means(),
                                       **{f"valid_{k}": v for k, v in last.items()},
                                       "precision": self.precision, "world_size": self.world})
        self.save_checkpoint()
        if not self.quiet:
            bar.write(f"step {self.step}: held-out {last['nats_per_token']:.4f} nats/token{bound(last)} over "
                      f"{last['tokens']:,} tokens, perplexity {last['perplexity']:.2f}, "
                      f"{last['bits_per_byte']:.4f} bits/byte")
        return last


def command_line() -> argparse.ArgumentParser:
    """One option per TrainConfig field (--batch-size for batch_size, ...), plus the folder options and --set."""
    parser = argparse.ArgumentParser(prog="python -m minwiola.train", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="run folder (default: runs/PRESET)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace whatever run --out holds")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                        help="model config overrides, e.g. --set dropout=0.1 atm=off (may be repeated)")
    defaults = TrainConfig()
    for name, (kind, _) in field_types(TrainConfig).items():
        if name in ("overrides", "betas"):
            continue
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, action="store_true")
        elif name == "eval_tokens":
            parser.add_argument(flag, type=tokens_or_all, default=defaults.eval_tokens, metavar="N|all",
                                help=f"held-out tokens each evaluation scores (default: {defaults.eval_tokens:,}); "
                                     "all: the whole split")
        else:
            parser.add_argument(flag, type=kind, default=getattr(defaults, name),
                                help=f"default: {getattr(defaults, name)}")
    return parser


def command_for(cfg: TrainConfig, out: str | Path | None = None) -> str:
    """The `python -m minwiola.train` line that trains `cfg` (into `out`): every setting spelled out (a default
    that changes later cannot change what the line trains), --set FIELD=VALUE for each model override.
    `command_line()` reads it back to an equal TrainConfig (tests/test_train.py), so a shipped model can say exactly
    how it was made. Left out: a flag that is off, and minutes or eval_max_windows when None (no option says None)."""
    if cfg.betas != TrainConfig().betas:
        raise ValueError(f"betas={cfg.betas} has no command-line option")
    words = ["python", "-m", "minwiola.train"] + (["--out", str(out)] if out is not None else [])
    for name in field_types(TrainConfig):
        value, flag = getattr(cfg, name), "--" + name.replace("_", "-")
        if name in ("overrides", "betas") or value is False or (value is None and name != "eval_tokens"):
            continue
        if value is True:
            words.append(flag)                                  # a store_true option: present means true
        else:
            words += [flag, "all" if value is None else str(value)]      # eval_tokens None: the whole split
    if cfg.overrides:
        text = lambda v: "none" if v is None else ("true" if v else "false") if isinstance(v, bool) else str(v)
        words += ["--set"] + [f"{k}={text(v)}" for k, v in cfg.overrides.items()]
    return " ".join(shlex.quote(w) for w in words)


def tokens_or_all(text: str) -> int | None:
    """--eval-tokens: a number of tokens, or "all" (None: the whole held-out split)."""
    return None if text.strip().lower() == "all" else int(text)


TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_overrides(parser: argparse.ArgumentParser, items: list[str]) -> dict:
    """["dropout=0.1", "attn_bias=off", "atm=off"] -> {"dropout": 0.1, "attn_bias": False, "atm": "off"}.

    Each value is read as its field's type: a bool field takes true/false (yes/no, on/off, 1/0), never the string
    "False" (which Python would take as true); int and float fields take numbers; "none" empties an optional one.
    A malformed item is a usage error; a value of the wrong type is a ValueError naming the field."""
    kinds = field_types(ModelConfig)
    overrides = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            parser.error(f"--set takes FIELD=VALUE, got {item!r}")
        if key not in kinds:
            raise ValueError(f"--set {item}: no model config field {key!r}; fields are {sorted(kinds)}")
        overrides[key] = parse_value(key, *kinds[key], text)
    return overrides


def parse_value(name: str, kind: type, optional: bool, text: str):
    """`text` as a value of type `kind` (bool, int, float or str; None too if `optional`)."""
    if optional and text.lower() in ("none", "null"):
        return None
    if kind is bool:
        if text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        raise ValueError(f"--set {name}={text}: {name} is true or false (or yes/no, on/off, 1/0)")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"--set {name}={text}: {name} takes {'an integer' if kind is int else 'a number'}"
                             f"{' or none' if optional else ''}") from None
    return text


def main(argv: list[str] | None = None) -> int:
    """`python -m minwiola.train ...`: 0 when the run finished, 1 with one `error:` line, 130 on Ctrl-C."""
    parser = command_line()
    return run_command(parser, parser.parse_args(argv))


def announce(cfg: TrainConfig, world: int) -> None:
    """The command's first line, printed before the trainer reads (and perhaps tokenises, for minutes) the data:
    preset, parameters, device and precision, data source."""
    model_cfg = cfg.model_config(default_tokenizer())
    device = pick_device(cfg.device)
    processes = f" x {world} processes" if world > 1 else ""
    print(f"{cfg.preset}: {budget.count_params(model_cfg):,} parameters on {device}{processes} "
          f"({resolve_precision(cfg.precision, device)}); data: {data.describe_source()}", flush=True)
    if data.find_data_dir() is None:
        print(f"(not TinyStories: fetch it with `{data.DOWNLOAD_HINT}`)", flush=True)


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Train as the parsed command line says (the main job, `python -m minwiola`, comes in here too). Under
    torchrun every process runs this; rank 0 prints, and an error names the rank it happened in."""
    values = {name: getattr(args, name) for name in field_types(TrainConfig) if name not in ("overrides", "betas")}
    if quick_mode():                  # CI: the same code path with smaller budgets (a clock budget stays a clock)
        values.update(steps=min(values["steps"], 20), eval_every=min(values["eval_every"], 10))
        if values["minutes"] is not None:
            values["minutes"] = min(values["minutes"], 0.1)
    rank, world = 0, 1                                    # until launched_ranks() has read torchrun's variables

    def fail(message: str) -> int:
        lead, where = ("", "") if world == 1 else ("\n", f"rank {rank}: ")   # a line of its own, not after a bar
        print(f"{lead}error: {where}{message}", file=sys.stderr, flush=True)
        return 1

    if args.out == "":
        return fail("--out is empty (an unset variable?): name the run folder")
    out = args.out or f"runs/{values['preset']}"
    cfg = trainer = None
    try:
        rank, world, _ = launched_ranks()
        check_seed(values["seed"], "--seed")              # TrainConfig checks it too, but names no option
        cfg = TrainConfig(**values, overrides=parse_overrides(parser, args.set))
        if rank == 0:
            announce(cfg, world)
        trainer = Trainer(cfg, out, resume=args.resume, overwrite=args.overwrite)
        if trainer.finished():
            if rank == 0:
                print(f"{out} holds a finished run ({trainer.step} steps); its best weights are in {out}/best")
            stop_distributed()
            return 0
        result = trainer.run()
    except (ValueError, OSError, FloatingPointError) as e:  # settings, folders (RunFolderError), data, NaN, disk
        full = isinstance(e, OSError) and e.errno == errno.ENOSPC
        return fail(f"{e}" + ("; free some space, then continue with --resume" if full else ""))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if is_out_of_memory(e):                           # in a step (the first batch is tried in Trainer())
            micro = cfg.batch_size // world
            return fail(out_of_memory(cfg, trainer.device if trainer else values["device"], world,
                                      next(iter(divisors(micro)[1:]), None)))
        if world == 1:
            raise                                         # not the user's doing: a bug to see in full
        if lost_contact(e):                               # the cause is another process's, which says why
            return fail("lost contact with the other processes: one of them stopped (its own error says why)")
        traceback.print_exc()                             # the others must stop too: say which rank, and exit
        return fail(f"{type(e).__name__}: {first_line(e)}")
    if rank == 0:
        print(f"done: {trainer.step} steps, held-out {result['nats_per_token']:.4f} nats/token{bound(result)}, "
              f"perplexity {result['perplexity']:.2f}, {result['bits_per_byte']:.4f} bits/byte; best weights in "
              f"{out}/best")
    stop_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
