"""Not the course's subject: where and how a run trains. The trainer (minwiola/train.py) asks this file for its
device, its precision, its processes and what to do when memory runs out or Ctrl-C is pressed.

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
generator). Every rank must be started alike (the same settings, data files, tokenizer and version: `Processes.check_alike`).
A rank that fails prints one `error: rank R: ...` line and exits, and torchrun then stops the others.
Ctrl-C reaches every process; they agree to stop after the same step, and rank 0 saves. A process killed outright
(SIGKILL, or torchrun's SIGTERM) never leaves a half-written checkpoint: checkpoints are swapped in whole.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import os
import signal
import threading
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from .. import __version__, first_line
from . import runs

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}    # the precisions that train under autocast
DDP_TIMEOUT = datetime.timedelta(minutes=30)    # the longest a rank waits for the others (rank 0 tokenising, ...)


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

Batch = Callable[[int], tuple[torch.Tensor, torch.Tensor]]     # rows -> (x, y) windows, from a generator of its own
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]     # (logits, targets) -> a loss to take the backward of


OUT_OF_MEMORY = (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), MemoryError)


def is_out_of_memory(error: BaseException) -> bool:
    """A GPU's out-of-memory error, or the CPU allocator's (a RuntimeError saying it cannot allocate)."""
    return isinstance(error, OUT_OF_MEMORY) or (isinstance(error, RuntimeError) and "allocate" in str(error))


def divisors(n: int) -> list[int]:
    """The divisors of n, smallest first."""
    return [k for k in range(1, n + 1) if n % k == 0]


class Sizes(NamedTuple):
    """What the out-of-memory messages name: the run's --batch-size (global), --block-size and --grad-accum, and
    whether it already checkpoints activations."""

    batch_size: int
    block_size: int
    grad_accum: int
    activation_checkpointing: bool


def out_of_memory(sizes: Sizes, device: torch.device | str, world: int, split: int | None) -> str:
    """The one line for a run that does not fit on `device`: at which size, and either the settings with the same
    tokens per step whose micro-batches are `split` times smaller, or (split None) what else to try."""
    per = f" ({sizes.batch_size // world} per process)" if world > 1 else ""
    where = f"out of memory on {device} at --batch-size {sizes.batch_size}{per} x --block-size {sizes.block_size}"
    if split is None:
        return (f"{where}: not even one window per process fits; lower --block-size or pick a smaller model"
                + ("" if sizes.activation_checkpointing else ", or add --activation-checkpointing"))
    return (f"{where}: try --batch-size {sizes.batch_size // split} --grad-accum {sizes.grad_accum * split} "
            "(the same tokens per step)")


OOM, NOT_FINITE = "out of memory", "not finite"


def first_pass(model: torch.nn.Module, forward, batch: Batch, loss: Loss, device: torch.device, precision: str,
               rows: int) -> str | None:
    """One forward and backward pass as a step takes it (training mode, the run's precision, compiled if the run
    compiles) on `rows` windows: None if it went through, else OOM, NOT_FINITE or another error's first line.
    It leaves no trace: `batch(rows)` draws its windows from a generator of its own, the gradients are dropped and
    torch's random states (dropout draws here) are put back, so the run that follows is the same as without it."""
    x, y = batch(rows)
    x, y = x.to(device), y.to(device)
    saved = runs.random_states(device, torch.Generator())
    model.train()
    try:
        with autocast(precision, device):
            logits = forward(x)
            value = loss(logits, y)                # any loss over the logits costs the memory a step's does
        finite = bool(torch.isfinite(logits).all())
        del logits
        value.backward()
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


def try_a_batch(model: torch.nn.Module, forward, batch: Batch, loss: Loss, sizes: Sizes, device: torch.device,
                precision: str = "fp32", world: int = 1) -> None:
    """A first micro-batch (batch_size / world windows) forward and backward on the device (`first_pass`): a data,
    device, compiler or memory problem, or a model whose output is already not finite, shows before a trainer
    touches its folder, not after. Out of memory, it tries micro-batches 2, 3, 4, ... times smaller until one fits,
    and the error names the --batch-size / --grad-accum with the same tokens per step."""
    micro = sizes.batch_size // world
    failure = first_pass(model, forward, batch, loss, device, precision, micro)
    if failure is None:
        return
    if failure == NOT_FINITE:
        also = " or --precision (fp16 overflows beyond 65504)" if precision == "fp16" else ""
        raise ValueError("the model's output is not finite on a first batch, before any training: check the "
                         f"model settings (init_std?){also}")
    if failure != OOM:
        raise ValueError(f"a first batch of {micro} x {sizes.block_size} tokens failed on {device}: {failure}")
    for split in divisors(micro)[1:]:
        free_memory(device)
        if first_pass(model, forward, batch, loss, device, precision, micro // split) is None:
            break
    else:
        split = None
    free_memory(device)
    raise ValueError(out_of_memory(sizes, device, world, split))


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


def check_world(batch_size: int, objective: str, world: int) -> None:
    """What several processes cannot do (ValueError naming the setting)."""
    if world > 1 and batch_size % world:
        raise ValueError(f"batch_size must be a multiple of the {world} processes (it is the global batch, split "
                         f"evenly between them), got {batch_size}")
    if world > 1 and objective == "diffusion":
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


class Processes:
    """This process's place in a launch (`launched_ranks`) and what the processes do together. In one process
    (world 1) every method is a no-op or the identity: the trainer reads the same either way."""

    def __init__(self, device_name: str):
        self.rank, self.world, local = launched_ranks()
        self.main = self.rank == 0
        self.device = rank_device(pick_device(device_name), local, self.world)

    def start(self, record: dict) -> None:
        """Join the process group, then check that every process was started alike (`check_alike`)."""
        start_distributed(self.world, self.device)
        self.check_alike({**record, "minwiola": {"version": __version__}})

    def check_alike(self, record: dict) -> None:
        """Every process must run the experiment `record` describes (each part a dict: trainer settings, model,
        tokenizer, data files, version): torchrun gives the processes of one machine the same command line, but on
        several machines, or with another environment per node, another --lr or MINWIOLA_DATA would train one
        model from different experiments without a word. All processes gather every record, so each refuses with
        the same line, naming the first field that differs from rank 0's."""
        if self.world == 1:
            return
        records = [None] * self.world
        dist.all_gather_object(records, record)
        for rank, other in enumerate(records[1:], start=1):
            changed = [line for part in record for line in runs.differences(
                records[0].get(part, {}), other.get(part, {}), "" if part == "train" else f"{part}.",
                ("on rank 0", f"on rank {rank}"))]
            if changed:
                what = changed[0] if len(changed[0]) <= 160 else \
                    f"{changed[0].split(':')[0]} differs between rank 0 and rank {rank}"     # a list of files
                raise ValueError(f"the processes were not started alike: {what}; start every process with the same "
                                 "options, MINWIOLA_DATA and version of minwiola")

    def barrier(self) -> None:
        """Wait for every process (nothing to wait for in one)."""
        if self.world > 1:
            dist.barrier(**({"device_ids": [self.device.index]} if self.device.type == "cuda" else {}))

    def mean(self, values: list[float]) -> list[float]:
        """Each value's mean over the processes (one all-reduce; every process gets the same numbers)."""
        if self.world == 1:
            return values
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return (total / self.world).tolist()

    def rows(self, batch_size: int) -> slice:
        """This process's rows of a global batch: [rank B/world, (rank + 1) B/world)."""
        return slice(self.rank * batch_size // self.world, (self.rank + 1) * batch_size // self.world)

    def wrap(self, forward, unused_parameters: bool):
        """What a step calls: `forward` itself, or wrapped in DistributedDataParallel under torchrun.
        `unused_parameters`: a layer may leave parameters without gradient in a step (a mixture of experts may
        send no token to an expert), which DDP must be told to expect."""
        if self.world == 1:
            return forward
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(forward, device_ids=[self.device] if self.device.type == "cuda" else None,
                                       find_unused_parameters=unused_parameters)

    def sync_at(self, forward, last: bool):
        """The context a micro-batch's backward runs in: DDP averages gradients only at the last micro-batch."""
        return contextlib.nullcontext() if self.world == 1 or last else forward.no_sync()


class CtrlC:
    """The trainer's Ctrl-C handler (`on_ctrl_c`): the first press asks to stop at the next step boundary, so a
    checkpoint never holds half a step; a second stops at once, leaving a state that cannot go on (`half_step`)."""

    def __init__(self):
        self.requested = False
        self.half_step = False

    def __call__(self, signum=None, frame=None) -> None:
        if self.requested:
            self.half_step = True
            raise KeyboardInterrupt
        self.requested = True
