"""What the experiments share: the arms' parts, what a finished run is read for, ATM's threshold, the sizing of a
control, the launch record. ablation.py, convergence.py, convergence_cs336.py and wiola_step_bench.py import these;
no script imports another script (tests/test_benchmarks_package.py)."""
import datetime
import math
import statistics
from pathlib import Path

import torch

from common import ROOT, best_eval

from minwiola import atm, data
from minwiola.budget import count_params, training_flops
from minwiola.generate import load_model
from minwiola.model import preset
from minwiola.train import TrainConfig, read_metrics

# ------------------------------------------------------------------------------------------------ the arms

BASE = "llama-style"
# DSFF at llama-style's parameter count: per layer 3 d d_A + 2 d d_B + 2 d^2 (the gate W_f) = 3 d 176 (SwiGLU's
# 8d/3 rounded up to 176), so 3 d_A + 2 d_B = 400; (44, 134) keeps Wiola's d_B ~ 3 d_A and is exactly equal.
PARTS = {
    "norm": {"norm": "wiola"},
    "srpe": {"positions": "srpe"},
    "srpe a_s=0": {"positions": "srpe", "srpe_a": 0.0},
    "dsff": {"ffn": "dsff", "d_ff_a": 44, "d_ff": 134},
    "gcla": {"gcla": "causal"},
    "atm": {"atm": "copy-forward"},                     # tau filled in by the calibration
    # not a Wiola part: the control for GCLA's extra parameters. SwiGLU widened from 176 to 240 adds
    # 4 layers x 3 x 64 x 64 = 49,152 parameters, GCLA adds 49,156: is a gain of GCLA a gain of size?
    "width": {"d_ff": 240},
}
FIVE = ["norm", "srpe", "dsff", "gcla", "atm"]         # the full Wiola (SRPE as the paper sets it)


def closest_d_ff(name: str, overrides: dict, target: int) -> int:
    """The SwiGLU width d_ff that brings preset `name` with `overrides` closest to `target` parameters (the smaller
    width on a tie): how an arm whose mixer holds other parameters is made equal to the reference."""
    base = {k: v for k, v in overrides.items() if k != "d_ff"}
    count = lambda h: count_params(preset(name, **base, d_ff=h))
    per_unit = count(2) - count(1)                          # a SwiGLU of width h holds 3 d h (+ biases) parameters
    guess = max(1, round((target - count(1)) / per_unit) + 1)
    return min(range(max(1, guess - 2), guess + 3), key=lambda h: (abs(count(h) - target), h))


# ------------------------------------------------------------------------------------------------ a run

def summary(out: Path, cfg: TrainConfig) -> dict:
    """A finished run's best_eval, its final held-out numbers, ATM's mu at every evaluation, its model FLOPs per
    training token (budget.training_flops, at the run's mean mu when ATM merges) and its parameters."""
    run = best_eval(out)
    evals = [r for r in read_metrics(out) if "valid_nats_per_token" in r]
    run["final_nats_per_token"] = evals[-1]["valid_nats_per_token"]
    run["final_bits_per_byte"] = evals[-1]["valid_bits_per_byte"]
    run["atm_mu"] = [[r["step"], r["atm_mu"]] for r in evals if "atm_mu" in r]
    model_cfg = cfg.model_config()
    mu = statistics.mean(m for _, mus in run["atm_mu"] for m in mus) if run["atm_mu"] else 0.0
    run["flops_per_token"] = training_flops(model_cfg, cfg.block_size, mu)
    run["params"] = count_params(model_cfg)
    return run


def calibrate_tau(folder: Path, target: float, batches: int, args) -> dict:
    """The tau at which the trained model in `folder` merges `target` of the tokens in ATM's layer
    (`atm.tau_for_ratio` on the similarities of that layer's normed input)."""
    model, tokenizer = load_model(folder / "best")
    layer = atm.atm_layers(model.config.n_layers)
    tokens = data.tokens("train", tokenizer)
    generator = torch.Generator().manual_seed(1234)
    rho = torch.cat([model.atm_similarities(data.get_batch(tokens, args.batch_size, args.block_size, generator,
                                                           torch.device("cpu"))[0]) for _ in range(batches)])
    tau = round(atm.tau_for_ratio(rho, target), 4)

    def mu(tau: float) -> float:
        return atm.merge_ratio(atm.merge_plan(rho, tau))

    return {"tau": tau, "mu_at_tau": mu(tau), "target_mu": target, "layers": list(layer),
            "on": f"{folder.name} best weights, {batches} training batches of {args.batch_size} x {args.block_size}",
            "mu_at_paper_tau_0.92": mu(0.92)}


def held_out_windows(tokenizer, n: int = 64, T: int = 128) -> torch.Tensor:
    """The first n windows of T held-out tokens (fewer when the split is shorter), (n, T): what `learned` reads."""
    tokens = data.tokens("valid", tokenizer)
    n = min(n, len(tokens) // T)
    return torch.from_numpy(tokens[:n * T].astype("int64")).view(n, T)


def learned(folder: Path) -> dict:
    """What the parts learned, read from a run's best weights."""
    model, tokenizer = load_model(folder / "best")
    out = {}
    phis = [float(b.attn.phi.detach()) for b in model.blocks if hasattr(b.attn, "phi")]
    if phis:                                            # GCLA: beta = sigmoid(phi) (eq. 27), per layer
        out["gcla_beta"] = [1 / (1 + math.exp(-p)) for p in phis]
    if model.config.ffn == "dsff":                      # the gate alpha per dimension on held-out text
        alphas = []
        with torch.no_grad():
            model(held_out_windows(tokenizer))
        for b in model.blocks:
            a = b.ffn.last_alpha.reshape(-1, model.config.d)
            alphas.append({"mean": a.mean(0).tolist(), "std": a.std(0).tolist(),
                           "decided": int(((a.mean(0) < 0.1) | (a.mean(0) > 0.9)).sum())})
        out["dsff_alpha"] = alphas
    norms = [m for m in model.modules() if hasattr(m, "delta")]
    if norms:                                           # WiolaRMSNorm's offsets
        out["norm_delta_abs_mean"] = [float(m.delta.detach().abs().mean()) for m in norms]
        out["norm_gamma_abs_mean"] = [float(m.gamma.detach().abs().mean()) for m in norms]
        out |= offset_effects(model, norms, tokenizer)
    return out


def offset_effects(model, norms: list, tokenizer) -> dict:
    """How much WiolaRMSNorm's offsets matter, per norm, on the first 8,192 held-out tokens (held_out_windows). delta is added to the
    input x before normalising (eq. 9), so its size counts against x's, not against gamma's: RMS(delta) over the
    mean RMS(x) of the tokens ("norm_delta_over_input"), and the relative change of the norm's output when delta is
    set to 0 for that token, |y(x + delta) - y(x)| / |y(x + delta)| averaged over tokens ("norm_output_change")."""
    ratio, change = {}, {}

    def measure(module, args, y):
        x = args[0].detach()
        rms = lambda t: t.pow(2).mean(-1).sqrt()
        without = module.gamma * x / (x.pow(2).mean(-1, keepdim=True) + module.eps).sqrt()   # delta = 0
        ratio[module] = float(rms(module.delta.detach()) / rms(x).mean())
        change[module] = float(((y - without).norm(dim=-1) / y.norm(dim=-1)).mean())

    hooks = [m.register_forward_hook(measure) for m in norms]
    try:
        with torch.no_grad():
            model(held_out_windows(tokenizer))
    finally:
        for h in hooks:
            h.remove()
    return {"norm_delta_over_input": [ratio[m] for m in norms], "norm_output_change": [change[m] for m in norms]}


def uncommitted() -> dict:
    """The library's and the benchmarks' files that differ from the commit at launch, each with the sha256 of its
    text then: the code that trains is the code imported at launch, which may hold others' uncommitted work."""
    import hashlib
    import subprocess
    out = subprocess.run(["git", "status", "--porcelain", "--", "minwiola", "benchmarks"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    files = [line[3:] for line in out.splitlines() if line[3:].endswith(".py")]
    return {f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest()[:16] for f in files if (ROOT / f).exists()}


def flatness(evals: list[dict], steps: int) -> dict:
    """How much the held-out loss still fell at the end: from the last evaluation at or before 90% (50%) of the
    steps to the last evaluation, in nats per token (positive: still falling)."""
    out = {}
    for label, fraction in (("last_10pct", 0.9), ("last_50pct", 0.5)):
        before = [r for r in evals if r["step"] <= fraction * steps]
        if before:
            out[label] = {"from_step": before[-1]["step"], "to_step": evals[-1]["step"],
                          "drop_nats_per_token": before[-1]["valid_nats_per_token"] - evals[-1]["valid_nats_per_token"]}
    return out


# ------------------------------------------------------------------------------------------------ a launch

def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%Y-%m-%d %H:%M:%S}] {message}", flush=True)
