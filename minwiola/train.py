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
  loss it trains on; the logged train_loss and every evaluation stay pure cross-entropy, and each step's record
  holds the added "aux_loss", each MoE layer's load per expert ("moe_load") and fraction dropped ("moe_dropped");
* objective="diffusion" (lesson 15) trains a model without the causal mask as a masked-diffusion denoiser instead:
  the loss is `diffusion.training_loss` (the ELBO estimate on a training window), evaluation reports the ELBO's
  bound (`diffusion.evaluate`: the same keys, plus "bound" and "stderr_nats") and the sample story fills masks
  after the prompt (`generate.fill_stories`);
* learning rate: linear warmup over the first 5% of the run, then cosine decay to 0 (eq. 43). The "run" is the
  step budget, or the time budget if that ends first (the schedule then follows elapsed training time; time spent
  evaluating is not counted, so two models with the same budget get the same training time).

Evaluation runs over the *whole* held-out split, cut into consecutive windows of the training length, and reports
nats/token, perplexity exp(nats/token) and bits per byte (total nats / ln 2 / bytes of the predicted text), which
compares models with different tokenizers. A run folder holds config.json, metrics.jsonl (one JSON object per log
or evaluation), checkpoint/ (the latest state: weights, optimizer, random states) and best/ (the weights with the
lowest held-out loss, and best/eval.json saying at which step), samples.txt and loss.png.

`--resume` continues from the last checkpoint (saved at every evaluation and on Ctrl-C). A run budgeted by steps
then ends with exactly the weights an uninterrupted run would have; a run budgeted by minutes follows the clock, so
it ends wherever the time runs out.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import data, diffusion, quick_mode, runs
from .generate import generate
from .model import LanguageModel, ModelConfig, check_field_types, field_types, next_token_loss, preset
from .runs import RunFolderError, plot_run, read_metrics  # noqa: F401 (lessons import them from here)
from .tokenizer import default_tokenizer


OBJECTIVES = ("next-token", "diffusion")


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
    eval_max_windows: int | None = None   # None: the whole held-out split; a number caps it (a huge split)
    seed: int = 0
    device: str = "auto"                  # "auto" (cuda, then mps, then cpu), or a torch device name
    compile: bool = False                 # torch.compile the model (off by default: slow to start, CPU gains little)
    activation_checkpointing: bool = False
    prompt: str = "Once upon a time"
    sample_tokens: int = 120
    objective: str = "next-token"         # "next-token" (a decoder) or "diffusion" (a causal=False denoiser, lesson 15)

    def __post_init__(self):
        self.betas = tuple(self.betas)
        check_field_types(self)                           # e.g. minutes=inf or steps=2.5 from a script
        for name in ("steps", "batch_size", "block_size", "grad_accum", "eval_every", "eval_batch", "sample_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if self.eval_max_windows is not None and not (isinstance(self.eval_max_windows, int)
                                                      and self.eval_max_windows >= 1):
            raise ValueError(f"eval_max_windows must be a positive int or None, got {self.eval_max_windows!r}")
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
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if not isinstance(self.overrides, dict):
            raise ValueError(f"overrides must be a dict of model config fields, got {self.overrides!r}")

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
            first = (str(e).strip() or type(e).__name__).splitlines()[0].split(". ")[0]
            first = first if len(first) <= 100 else first[:97] + "..."
            raise ValueError(f"--device {name}: not usable on this machine ({first}); try auto or cpu") from None
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


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
             batch: int = 32, device: torch.device | str = "cpu", max_windows: int | None = None) -> dict:
    """Held-out loss over the whole token stream, in consecutive windows of `block_size` (the last one shorter):
    every token but the first is predicted exactly once. Returns nats/token, perplexity and bits per byte."""
    if len(tokens) < 2:
        raise ValueError(f"the held-out split has {len(tokens)} token(s): nothing to evaluate")
    was_training = model.training
    model.eval()
    nats, count, text_bytes = 0.0, 0, 0
    for window in data.stream_windows(tokens, block_size, batch, max_windows, overlap=1):
        x, y = window[:, :-1].to(device), window[:, 1:].to(device)
        logits = model(x)
        nats += next_token_loss(logits, y, reduction="sum").item()
        count += y.numel()
        text_bytes += int(nbytes[y.cpu()].sum())
    model.train(was_training)
    per_token = nats / count
    return {"nats_per_token": per_token, "perplexity": math.exp(per_token),
            "bits_per_byte": nats / math.log(2) / max(text_bytes, 1), "tokens": count, "bytes": text_bytes}


def bound(result: dict) -> str:
    """The label a diffusion model's evaluation carries: its figures are an upper bound (the ELBO), not exact."""
    return " (ELBO bound)" if result.get("bound") else ""


def moe_record(micro_batches: list[dict]) -> dict:
    """A step's MoE numbers for its metrics record, each the mean over the step's micro-batches: "aux_loss" (what
    was added to the loss), "moe_load" (per layer, the fraction of assignments each expert took) and "moe_dropped"
    (per layer, the fraction dropped by the capacity limit). Empty for a model without MoE layers."""
    if "moe_load" not in micro_batches[0]:
        return {}
    mean = {key: torch.stack([m[key] for m in micro_batches]).mean(0) for key in micro_batches[0]}
    return {"aux_loss": mean["aux_loss"].item(),
            "moe_load": [[round(f, 4) for f in layer] for layer in mean["moe_load"].tolist()],
            "moe_dropped": [round(f, 4) for f in mean["moe_dropped"].tolist()]}


def try_a_batch(model: LanguageModel, forward, tokens: np.ndarray, cfg: TrainConfig, device: torch.device) -> None:
    """One forward pass (compiled, if the run compiles) on a batch of training windows, on the device, with no
    gradient and no random draw the run uses: a data, device, compiler or memory problem, or a model whose output
    is already not finite, shows before a trainer touches its folder, not after."""
    model.eval()
    try:
        x, _ = data.get_batch(tokens, cfg.batch_size, cfg.block_size, torch.Generator().manual_seed(cfg.seed), device)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            finite = bool(torch.isfinite(forward(x)).all())
    except (RuntimeError, MemoryError) as e:          # torch's and the compiler's errors (InductorError is one)
        raise ValueError(f"a first batch of {cfg.batch_size} x {cfg.block_size} tokens failed on {device}: "
                         f"{runs.first_line(e)}") from None
    model.train()
    if not finite:
        raise ValueError("the model's output is not finite on a first batch, before any training: check the "
                         "model settings (init_std?)")


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


class Trainer:
    """One run: `Trainer(cfg, out).run()`. Everything it needs to continue exactly is in `out/checkpoint/`.

    Before anything in `out` is written or deleted, every setting is checked, the model is built on the device,
    the data is read and a first batch goes through the model: a mistake fails here, with the old run untouched.
    The folder's bookkeeping (marker, lock, checkpoints, metrics) is `minwiola.runs`."""

    def __init__(self, cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, quiet: bool = False):
        self.cfg, self.out, self.progress, self.quiet = cfg, Path(out), progress, quiet
        self.tokenizer = default_tokenizer()
        model_cfg = cfg.model_config(self.tokenizer)
        self.device = pick_device(cfg.device)
        state = runs.check_options(self.out, resume, overwrite)   # read-only: refuses folders not ours
        torch.manual_seed(cfg.seed)
        self.stop_requested = False                       # set by Ctrl-C; the loop stops at the next step boundary
        self.half_step = False                            # a second Ctrl-C stopped a step midway: state unusable
        try:
            self.model = LanguageModel(model_cfg).to(self.device)
        except (RuntimeError, MemoryError) as e:          # a model too big for this machine
            raise ValueError(f"cannot build the model on {self.device}: {runs.first_line(e)}") from None
        self.model.activation_checkpointing = cfg.activation_checkpointing
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        self.opt = torch.optim.AdamW(parameter_groups(self.model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas,
                                     eps=cfg.eps, fused=self.device.type == "cuda")
        self.train_tokens = data.tokens("train", self.tokenizer)
        self.valid_tokens = data.tokens("valid", self.tokenizer)
        self.nbytes = token_bytes(self.tokenizer)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.step, self.elapsed, self.best = 0, 0.0, math.inf
        self.mu_steps: list[list[float]] = []            # ATM's mu per merging layer, each step since the last eval
        self.moe_step: dict = {}                          # the last step's MoE aux loss, loads, drops (empty: none)
        self.record = {"train": json.loads(json.dumps(dataclasses.asdict(cfg))),     # tuples -> lists, as stored
                       "model": dataclasses.asdict(model_cfg),
                       "tokenizer": {"sha256": self.tokenizer.hash(), "vocab_size": self.tokenizer.vocab_size},
                       "data": data.source_record()}
        if resume:
            runs.check_same_run(self.out, self.record)
        if len(self.valid_tokens) < 2:
            raise ValueError(f"the held-out split has {len(self.valid_tokens)} token(s): nothing to evaluate on")
        try_a_batch(self.model, self.forward, self.train_tokens, cfg, self.device)
        self.lock = runs.FolderLock(self.out)
        runs.open_run(self.out, self.lock, state, resume, self.record)
        if resume:
            self.load_checkpoint()

    def save_checkpoint(self) -> None:
        runs.save_checkpoint(self.out, self.model, self.tokenizer, {
            "optimizer": self.opt.state_dict(), "step": self.step, "elapsed": self.elapsed, "best": self.best,
            **runs.random_states(self.device, self.generator)})

    def load_checkpoint(self) -> None:
        weights, state = runs.load_checkpoint(self.out, self.record["model"])
        self.model.load_state_dict(weights)
        try:
            self.opt.load_state_dict(state["optimizer"])
            runs.restore_random_states(state, self.device, self.generator)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise RunFolderError(f"{self.out / 'checkpoint' / 'trainer_state.pt'} does not fit this run "
                                 f"({runs.first_line(e)})") from None
        self.step, self.elapsed, self.best = state["step"], state["elapsed"], state["best"]
        runs.forget_after(self.out, self.step, state["samples_bytes"])

    # -------------------------------------------------------------------------------------------- steps
    def progress_fraction(self) -> float:
        done = self.step / self.cfg.steps
        if self.cfg.minutes is not None:
            done = max(done, self.elapsed / (60 * self.cfg.minutes))
        return done

    def train_step(self) -> float:
        cfg = self.cfg
        lr = learning_rate(self.progress_fraction(), cfg.lr, cfg.warmup, cfg.min_lr)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.model.train()
        total, moe = 0.0, []
        for _ in range(cfg.grad_accum):
            x, y = data.get_batch(self.train_tokens, cfg.batch_size, cfg.block_size, self.generator, self.device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                if cfg.objective == "diffusion":          # the window itself is x_0; y is not used
                    loss = diffusion.training_loss(self.forward, x, diffusion.mask_id(self.model.config),
                                                   self.generator)
                else:
                    loss = next_token_loss(self.forward(x), y)
            aux = self.model.aux_loss()                   # MoE's balancing (+ z) losses, weighted; 0 without MoE
            ((loss + aux) / cfg.grad_accum).backward()
            total += loss.item() / cfg.grad_accum
            moe.append({"aux_loss": aux.detach().float().cpu(), **self.model.moe_stats()})
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip)
        if not (math.isfinite(total) and math.isfinite(norm.item())):   # a finite loss can still have inf grads
            self.opt.zero_grad(set_to_none=True)
            raise diverged(total, norm.item(), self.step + 1, self.out, min(cfg.eval_every, cfg.steps))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.mu_steps.append(self.model.merge_ratios())  # ATM's merge ratio per merging layer (empty without ATM)
        self.moe_step = moe_record(moe)
        return total

    def evaluate_and_sample(self) -> dict:
        score = diffusion.evaluate if self.cfg.objective == "diffusion" else evaluate   # the bound, or exact
        result = score(self.model, self.valid_tokens, self.cfg.block_size, self.nbytes, self.cfg.eval_batch,
                       self.device, self.cfg.eval_max_windows)
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

    def mean_merge_ratios(self) -> dict:
        """{"atm_mu": [mean mu of each merging layer over the steps since the last evaluation]} (empty without
        ATM). After a resume the mean covers the steps since the resume."""
        steps, self.mu_steps = [m for m in self.mu_steps if m], []
        return {"atm_mu": [sum(layer) / len(steps) for layer in zip(*steps)]} if steps else {}

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
        evaluation (of a run that had already finished: the one it logged). Ctrl-C lets the current step finish,
        saves a checkpoint and raises KeyboardInterrupt; a NaN or inf stops the run and keeps the last good
        checkpoint. The first step's time includes one-off start-up costs (and compilation, with `compile`)."""
        if self.half_step:
            raise RuntimeError(f"this trainer was stopped in the middle of a step; continue from the last checkpoint "
                               f"with Trainer(..., resume=True) (or --resume)")
        self.stop_requested = False
        self.lock.acquire()                               # held again if an earlier run() gave it back
        try:
            evals = [r for r in read_metrics(self.out) if "valid_nats_per_token" in r] if self.step else []
            last = {k[len("valid_"):]: v for k, v in evals[-1].items() if k.startswith("valid_")} if evals else {}
            if self.finished():
                return last
            with on_ctrl_c(self.request_stop):
                return self.train_loop(last)
        finally:
            self.lock.release()                           # another trainer may --resume this folder now

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
                if self.stop_requested:
                    self.save_checkpoint()
                    bar.write(f"interrupted at step {self.step}: saved {self.out / 'checkpoint'}; continue with "
                              "--resume")
                    raise KeyboardInterrupt
                start = time.perf_counter()
                loss = self.train_step()
                seconds = time.perf_counter() - start
                self.elapsed += seconds
                record = {"step": self.step, "tokens": self.step * tokens_per_step, "train_loss": loss,
                          "lr": self.opt.param_groups[0]["lr"], "tokens_per_s": tokens_per_step / seconds,
                          "elapsed_s": self.elapsed, **({"atm_mu": self.mu_steps[-1]} if self.mu_steps[-1] else {}),
                          **self.moe_step}
                runs.append_metrics(self.out, record)
                bar.update(min(round(self.elapsed) - bar.n, bar.total - bar.n) if by_clock else 1)
                bar.set_postfix(step=self.step, loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_s']:,.0f}")
                if self.step % cfg.eval_every == 0 or self.finished():
                    last = self.evaluate_and_sample()
                    runs.append_metrics(self.out, {"step": self.step, "tokens": self.step * tokens_per_step,
                                                   "elapsed_s": self.elapsed, **self.mean_merge_ratios(),
                                                   **{f"valid_{k}": v for k, v in last.items()}})
                    self.save_checkpoint()
                    if not self.quiet:
                        bar.write(f"step {self.step}: held-out {last['nats_per_token']:.4f} nats/token{bound(last)}, "
                                  f"perplexity {last['perplexity']:.2f}, {last['bits_per_byte']:.4f} bits/byte")
        finally:
            bar.close()
        plot_run(self.out)
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
        else:
            parser.add_argument(flag, type=kind, default=getattr(defaults, name),
                                help=f"default: {getattr(defaults, name)}")
    return parser


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


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Train as the parsed command line says (the main job, `python -m minwiola`, comes in here too)."""
    values = {name: getattr(args, name) for name in field_types(TrainConfig) if name not in ("overrides", "betas")}
    if quick_mode():                  # CI: the same code path with smaller budgets (a clock budget stays a clock)
        values.update(steps=min(values["steps"], 20), eval_every=min(values["eval_every"], 10))
        if values["minutes"] is not None:
            values["minutes"] = min(values["minutes"], 0.1)
    if args.out == "":
        print("error: --out is empty (an unset variable?): name the run folder", file=sys.stderr)
        return 1
    out = args.out or f"runs/{values['preset']}"
    try:
        cfg = TrainConfig(**values, overrides=parse_overrides(parser, args.set))
        trainer = Trainer(cfg, out, resume=args.resume, overwrite=args.overwrite)
        if trainer.finished():
            print(f"{out} holds a finished run ({trainer.step} steps); its best weights are in {out}/best")
            return 0
        print(f"{cfg.preset}: {trainer.model.n_params():,} parameters on {trainer.device}; "
              f"data: {data.describe_source()}")
        if data.find_data_dir() is None:
            print(f"(not TinyStories: fetch it with `{data.DOWNLOAD_HINT}`)")
        result = trainer.run()
    except (ValueError, OSError, FloatingPointError) as e:  # settings, folders (RunFolderError), data, NaN, disk
        full = isinstance(e, OSError) and e.errno == errno.ENOSPC
        print(f"error: {e}" + ("; free some space, then continue with --resume" if full else ""), file=sys.stderr)
        return 1
    except (RuntimeError, MemoryError) as e:
        if not isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)) and "allocate" not in str(e):
            raise                                         # not the user's doing: a bug to see in full
        print(f"error: out of memory on {values['device']}: lower --batch-size (--grad-accum keeps the tokens per "
              "step)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"done: {trainer.step} steps, held-out {result['nats_per_token']:.4f} nats/token{bound(result)}, perplexity "
          f"{result['perplexity']:.2f}, {result['bits_per_byte']:.4f} bits/byte; best weights in {out}/best")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
