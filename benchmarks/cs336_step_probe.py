"""Why does `wiola-cs336`'s training step on a GPU take 40 ms one time and 200 ms the next? (lesson 11, section 7.1)

    python benchmarks/cs336_step_probe.py --device cuda            # step times with each part left out, profiles
    python benchmarks/cs336_step_probe.py --lengths                # ATM's merged length at each step (any device)

benchmarks/convergence_cs336.py times both arms in turns on one batch and found Wiola's step 1.92x LLaMA's at the
best of 20 turns on an H100 but 7.6x at the median, and 8.1x at the best on an H200. This probe asks which part makes
the step vary. Each model trains --repeat steps (after 3 untimed ones) on one batch of random token ids (--batch
windows of --block tokens), bf16 autocast and the fused AdamW on a GPU, float32 on a CPU, with the clock waiting for
the GPU: `llama-cs336`, `wiola-cs336` at the tau its convergence runs used (0.2875) and at the tau that merges 11%
of this batch at initialisation, and `wiola-cs336` with one part left out at a time (ATM, GCLA, SRPE -> RoPE,
WiolaRMSNorm -> RMSNorm) and with both ATM and GCLA left out. Then torch.profiler over 3 steps of `wiola-cs336` and
of `llama-cs336`: the kernels' GPU time against the host's time.

--lengths records, for the same loop, how many slots ATM's merging layer keeps at each step (the merged length T',
the largest over the batch's rows). On a GPU a step whose T' the process has not met yet pays for new kernels'
set-up (the attention backend plans per shape); a T' met before does not. Writes --result (JSON; with --lengths
its default is results/cs336_step_probe_lengths.json).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from common import commit, hardware, positive_int, read_result, result_options, user_errors, write_result

from minwiola import atm
from minwiola.model import LanguageModel, preset
from minwiola.tools.launch import autocast, pick_device

TAU = 0.2875          # the tau every wiola-cs336 run of results/convergence_cs336.json merged at


def variants(tau_init: float) -> dict:
    """name -> ModelConfig: llama-cs336, wiola-cs336 at two thresholds, and wiola-cs336 with parts left out."""
    w = dict(dropout=0.1, atm_tau=TAU)
    return {"llama-cs336": preset("llama-cs336", dropout=0.1),
            f"wiola-cs336 (tau {TAU})": preset("wiola-cs336", **w),
            "wiola-cs336 (tau merging 11% at init)": preset("wiola-cs336", **{**w, "atm_tau": tau_init}),
            "wiola - atm": preset("wiola-cs336", **{**w, "atm": "off"}),
            "wiola - gcla": preset("wiola-cs336", **{**w, "gcla": "off"}),
            "wiola - srpe (rope)": preset("wiola-cs336", **{**w, "positions": "rope"}),
            "wiola - wiolanorm": preset("wiola-cs336", **{**w, "norm": "rmsnorm"}),
            "wiola - atm - gcla": preset("wiola-cs336", **{**w, "atm": "off", "gcla": "off"})}


def trained_steps(cfg, ids: torch.Tensor, device: torch.device, repeat: int, precision: str):
    """A model at seed 0 and its AdamW; 3 untimed steps, then `repeat` timed ones: (model, optimizer, seconds)."""
    torch.manual_seed(0)
    model = LanguageModel(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), 1e-3, fused=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step():
        with autocast(precision, device):
            loss = model.loss(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    seconds = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        step()
        sync()
        seconds.append(time.perf_counter() - start)
    return model, step, seconds


def merged_lengths(cfg, ids, device, repeat, precision) -> list[int]:
    """T' of ATM's merging layer at every step of trained_steps' loop (3 untimed steps first)."""
    seen, plan = [], atm.merge_plan

    def recording(rho, tau):
        slot = plan(rho, tau)
        seen.append(int(slot.max()) + 1)
        return slot
    atm.merge_plan = recording
    try:
        trained_steps(cfg, ids, device, repeat, precision)
    finally:
        atm.merge_plan = plan
    return seen


def profiled(name, cfg, ids, device, precision) -> str:
    """torch.profiler's tables over 3 steps (after 3 untimed): by the GPU's own time, and by the host's."""
    from torch.profiler import ProfilerActivity, profile
    _, step, _ = trained_steps(cfg, ids, device, 0, precision)
    gpu = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
        for _ in range(3):
            step()
        if gpu:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if gpu else "self_cpu_time_total"
    table = prof.key_averages()
    return (f"== {name}: by {key}\n" + table.table(sort_by=key, row_limit=22) + f"\n== {name}: by self_cpu_time_total\n"
            + table.table(sort_by="self_cpu_time_total", row_limit=22))


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", help="the trainer's --device")
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--block", type=positive_int, default=256)
    parser.add_argument("--repeat", type=positive_int, default=15)
    parser.add_argument("--lengths", action="store_true", help="record ATM's merged length at each step instead")
    result_options(parser, "cs336_step_probe")
    args = parser.parse_args(argv)
    if args.lengths and args.result == parser.get_default("result"):
        args.result = args.result.replace(".json", "_lengths.json")
    if args.report:
        print(json.dumps(read_result(args.result), indent=1))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    if args.block > preset("wiola-cs336").context:
        raise ValueError(f"--block {args.block}: windows must fit the context of {preset('wiola-cs336').context}")
    device = pick_device(args.device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    torch.manual_seed(0)
    ids = torch.randint(0, 4096, (args.batch, args.block + 1), device=device)
    with torch.no_grad():
        rho = LanguageModel(variants(TAU)[f"wiola-cs336 (tau {TAU})"]).to(device).atm_similarities(ids[:, :-1])
    tau_init = atm.tau_for_ratio(rho.float().cpu(), 0.11)
    table = variants(tau_init)
    result = {"command": "python benchmarks/cs336_step_probe.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "commit": commit(), "hardware": hardware(), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "precision": precision, "batch": args.batch, "block": args.block, "repeat": args.repeat,
              "tau_merging_11pct_at_init": tau_init,
              "mu_at_tau_at_init": atm.merge_ratio(atm.merge_plan(rho.float().cpu(), TAU))}
    if args.lengths:
        result["merged_lengths"] = {n: merged_lengths(table[n], ids, device, args.repeat, precision)
                                    for n in table if table[n].atm != "off" and n.startswith("wiola-cs336")}
        for name, lengths in result["merged_lengths"].items():
            print(f"{name}: {lengths}")
    else:
        result["step_ms"] = {}
        for name, cfg in table.items():
            t = trained_steps(cfg, ids, device, args.repeat, precision)[2]
            result["step_ms"][name] = {"median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t),
                                       "max_ms": 1e3 * max(t)}
            print(f"{name:40s} " + "  ".join(f"{k} {v:8.1f}" for k, v in result["step_ms"][name].items()), flush=True)
        result["profiles"] = {n: profiled(n, table[n], ids, device, precision)
                              for n in (f"wiola-cs336 (tau {TAU})", "llama-cs336")}
    write_result(result, Path(args.result), overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
