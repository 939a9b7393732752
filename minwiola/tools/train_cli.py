"""Not the course's subject: `python -m minwiola.train`, the trainer's command line (and the main job's,
`python -m minwiola`). One option per TrainConfig field, --set FIELD=VALUE for the model's, and one `error:` line for
every failure a user can cause.

    python -m minwiola.train --preset wiola-yocto --minutes 10 --out runs/wiola-yocto
    torchrun --nproc_per_node=2 -m minwiola.train --preset wiola-yocto --batch-size 64 --out runs/two
"""
from __future__ import annotations

import argparse
import errno
import shlex
import sys
import traceback
from pathlib import Path

from .. import budget, data, first_line, quick_mode
from ..generate import check_seed
from ..model import ModelConfig, field_types
from ..tokenizer import default_tokenizer
from ..train import TrainConfig, Trainer, bound
from . import launch


def command_line() -> argparse.ArgumentParser:
    """One option per TrainConfig field (--batch-size for batch_size, ...), plus the folder options and --set."""
    parser = argparse.ArgumentParser(prog="python -m minwiola.train",
                                     description="Train a language model on TinyStories (lesson 11)")
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
    device = launch.pick_device(cfg.device)
    processes = f" x {world} processes" if world > 1 else ""
    print(f"{cfg.preset}: {budget.count_params(model_cfg):,} parameters on {device}{processes} "
          f"({launch.resolve_precision(cfg.precision, device)}); data: {data.describe_source()}", flush=True)
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
    rank, world = 0, 1                                    # until launch.launched_ranks() has read torchrun's variables

    def fail(message: str) -> int:
        lead, where = ("", "") if world == 1 else ("\n", f"rank {rank}: ")   # a line of its own, not after a bar
        print(f"{lead}error: {where}{message}", file=sys.stderr, flush=True)
        return 1

    if args.out == "":
        return fail("--out is empty (an unset variable?): name the run folder")
    out = args.out or f"runs/{values['preset']}"
    cfg = trainer = None
    try:
        rank, world, _ = launch.launched_ranks()
        check_seed(values["seed"], "--seed")              # TrainConfig checks it too, but names no option
        cfg = TrainConfig(**values, overrides=parse_overrides(parser, args.set))
        if rank == 0:
            announce(cfg, world)
        trainer = Trainer(cfg, out, resume=args.resume, overwrite=args.overwrite)
        if trainer.finished():
            if rank == 0:
                print(f"{out} holds a finished run ({trainer.step} steps); its best weights are in {out}/best")
            launch.stop_distributed()
            return 0
        result = trainer.run()
    except (ValueError, OSError, FloatingPointError) as e:  # settings, folders (RunFolderError), data, NaN, disk
        full = isinstance(e, OSError) and e.errno == errno.ENOSPC
        return fail(f"{e}" + ("; free some space, then continue with --resume" if full else ""))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if launch.is_out_of_memory(e):                           # in a step (the first batch is tried in Trainer())
            micro = cfg.batch_size // world
            sizes = launch.Sizes(cfg.batch_size, cfg.block_size, cfg.grad_accum, cfg.activation_checkpointing)
            return fail(launch.out_of_memory(sizes, trainer.device if trainer else values["device"], world,
                                      next(iter(launch.divisors(micro)[1:]), None)))
        if world == 1:
            raise                                         # not the user's doing: a bug to see in full
        if launch.lost_contact(e):                               # the cause is another process's, which says why
            return fail("lost contact with the other processes: one of them stopped (its own error says why)")
        traceback.print_exc()                             # the others must stop too: say which rank, and exit
        return fail(f"{type(e).__name__}: {first_line(e)}")
    if rank == 0:
        print(f"done: {trainer.step} steps, held-out {result['nats_per_token']:.4f} nats/token{bound(result)}, "
              f"perplexity {result['perplexity']:.2f}, {result['bits_per_byte']:.4f} bits/byte; best weights in "
              f"{out}/best")
    launch.stop_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
