"""benchmarks/convergence_cs336.py: the CS336-shape arms hold equal parameters, each arm's rate is the best MEAN over
the reported seeds (only rates every seed trained), the registered comparisons are the arms at each rate (the
chosen rates are shown, not judged: the reported seeds chose them), a tiny launch end to end (processes,
calibration, timing) on the CPU, and the committed GPU result agrees with its own runs."""
import argparse
import json
import shutil
import statistics
from pathlib import Path

import pytest

import convergence_cs336 as cs
import common
from minwiola.verdict import judge
from minwiola.budget import count_params
from minwiola.model import preset

ROOT = Path(__file__).resolve().parents[1]


def test_the_arms_hold_equal_parameters_and_only_wiola_takes_tau():
    args = argparse.Namespace(dropout=0.1, shape=None)
    llama, wiola = (preset(a, **cs.overrides(a, 0.3, args)) for a in cs.ARMS)
    assert (count_params(llama), count_params(wiola)) == (17_306_112, 17_245_188)
    assert abs(count_params(llama) / count_params(wiola) - 1) < 0.004
    assert wiola.atm_tau == 0.3 and llama.atm_tau == preset(cs.LLAMA).atm_tau and llama.dropout == wiola.dropout == 0.1
    assert (wiola.norm, wiola.positions, wiola.gcla, wiola.atm) == ("wiola", "srpe", "causal", "copy-forward")


def fake(rates: dict[str, list[float]]) -> dict:
    return {lr: {str(s): {"bits_per_byte": v, "nats_per_token": v * 2, "best_step": 100} for s, v in enumerate(vs)}
            for lr, vs in rates.items()}


def test_the_rate_is_the_best_mean_over_complete_rates_and_the_verdicts_are_the_registered_ones():
    result = {"seeds": [0, 1, 2], "rates": [1e-3, 3e-3, 1e-2], "arms": {
        cs.LLAMA: {"runs": fake({"0.001": [1.10, 1.11, 1.12], "0.003": [1.00, 1.01, 1.02], "0.01": [0.9, 0.9]})},
        cs.WIOLA: {"runs": fake({"0.001": [1.05, 0.97, 1.06], "0.003": [1.03, 1.04, 1.05]})}}}
    common.register(result, cs.registration(result["rates"], result["seeds"]))
    assert set(result["registered"]["comparisons"]) == {"at rate 0.001", "at rate 0.003", "at rate 0.01"}
    cs.summarise(result)
    assert result["arms"][cs.LLAMA]["best_lr"] == "0.003"        # 0.01 is lower but has two seeds of three
    assert result["arms"][cs.WIOLA]["best_lr"] == "0.001"        # the lowest mean, not the lowest single seed
    # the chosen rates: shown, never judged (the reported seeds chose them)
    assert result["at_chosen_rates"] == {"rates": [1e-3, 3e-3], "difference": pytest.approx(
        statistics.mean([1.05, 0.97, 1.06]) - statistics.mean([1.00, 1.01, 1.02]))}
    assert result["verdicts"] == common.decide(result)
    assert set(result["verdicts"]) == {"at rate 0.001", "at rate 0.003"}      # 0.01 waits for its runs
    at = lambda vs: dict(zip("012", vs))
    low, mid = result["verdicts"]["at rate 0.001"], result["verdicts"]["at rate 0.003"]
    assert low == judge(at([1.05, 0.97, 1.06]), at([1.10, 1.11, 1.12]), paired=True)
    assert mid == judge(at([1.03, 1.04, 1.05]), at([1.00, 1.01, 1.02]), paired=True)
    assert low["shape"] == mid["shape"] == "paired" and low["seeds"]["arm"] == ["0", "1", "2"]
    assert low["verdict"] == "no verdict" and low["difference"] == pytest.approx(-0.25 / 3)   # -.05, -.14, -.06
    assert mid["verdict"] == "higher" and mid["difference"] == pytest.approx(0.03)           # +.03 on every seed
    assert "at each arm's rate" not in result["verdicts"] and "shown but not judged" in cs.report(
        {**result, "arms": {a: {**x, "params": 1} for a, x in result["arms"].items()}})
    assert result["partial"] is True                               # 17 of 18 runs


@pytest.mark.once          # the shipped model and its own folders (or small_data): CI runs it in its first pass only
def test_a_tiny_launch_end_to_end(tmp_path, small_data, monkeypatch):  # noqa: F811
    out = tmp_path / "r.json"
    argv = ["--steps", "2", "--eval-every", "2", "--batch-size", "2", "--block-size", "16", "--rates", "3e-3",
            "--seeds", "0", "1", "--jobs", "3", "--calibration-batches", "1", "--timing-repeat", "1", "--device", "cpu",
            "--shape", '{"d": 32, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64, "d_ff_a": 16}',
            "--runs", str(tmp_path / "runs"), "--result", str(out)]
    assert cs.main(argv) == 0
    r = json.loads(out.read_text())
    assert r["partial"] is False and r["device"].startswith("cpu") and r["rate_rule"] == cs.RATE_RULE
    tau = r["atm_calibration"]["tau"]
    assert r["atm_calibration"]["run"] == "wiola-cs336-lr0.003-s100-tau0.92"      # the unreported seed, paper's tau
    for arm in cs.ARMS:
        runs = r["arms"][arm]["runs"]["0.003"]
        assert sorted(runs) == ["0", "1"] and r["arms"][arm]["best_lr"] == "0.003"
        assert all(s["steps"] == 2 and s["best_step"] == 2 for s in runs.values())
    assert r["arms"][cs.WIOLA]["runs"]["0.003"]["0"]["run"] == f"wiola-cs336-lr0.003-s0-tau{tau:g}"
    assert "gcla_beta" in r["arms"][cs.WIOLA]["runs"]["0.003"]["0"]["learned"]
    assert set(r["timing"]["seconds_per_step"]) == set(cs.ARMS) and out.with_suffix(".png").exists()
    assert r["registered"]["comparisons"] == cs.registration([3e-3], [0, 1]) and "added" not in r["registered"]
    assert r["verdicts"] == common.decide(r) and set(r["verdicts"]) == {"at rate 0.003"}
    assert r["verdicts"]["at rate 0.003"]["seeds"]["arm"] == ["0", "1"]          # the calibration seed 100 not
    assert r["at_chosen_rates"]["rates"] == [3e-3, 3e-3] and "| at rate 0.003 | paired, 0, 1 |" in cs.report(r)
    assert all(s["wall_seconds"] > 0 for a in cs.ARMS for s in r["arms"][a]["runs"]["0.003"].values())
    real_launch = cs.launch
    monkeypatch.setattr(cs, "launch", lambda *a: pytest.fail("a finished run was trained again"))
    assert cs.main(argv) == 0                                        # a second launch reuses every finished run
    again = json.loads(out.read_text())
    assert again["arms"] == r["arms"] and again["atm_calibration"] == r["atm_calibration"]
    # a new machine (the run folders gone) grows the grid: only the new rate trains, at the recorded tau
    shutil.rmtree(tmp_path / "runs")
    out.write_text(json.dumps({**again, "registered": {**again["registered"], "when": "an earlier minute"}}))
    trained = []
    monkeypatch.setattr(cs, "launch", lambda *a: trained.append(cs.run_name(*a[:4])) or real_launch(*a))
    assert cs.main(argv[:argv.index("--rates") + 1] + ["1e-3"] + argv[argv.index("--rates") + 2:]) == 0
    grown = json.loads(out.read_text())
    assert sorted(trained) == sorted(f"{a}-lr0.001-s{s}" + (f"-tau{tau:g}" if a == cs.WIOLA else "")
                                     for a in cs.ARMS for s in (0, 1))
    assert grown["rates"] == [1e-3, 3e-3] and grown["partial"] is False and len(grown["launches"]) == 3
    assert all(grown["arms"][a]["runs"]["0.003"] == r["arms"][a]["runs"]["0.003"] for a in cs.ARMS)
    assert grown["atm_calibration"] == r["atm_calibration"] and "seconds_per_step" in grown["timing"]
    assert grown["registered"]["comparisons"] == cs.registration([1e-3, 3e-3], [0, 1])
    assert set(grown["registered"]["added"]) == {"at rate 0.001"}           # registered by the launch that added it
    assert grown["verdicts"] == common.decide(grown) and set(grown["verdicts"]) == {"at rate 0.001", "at rate 0.003"}


def test_the_committed_gpu_result_agrees_with_its_runs():
    r = json.loads((ROOT / "results" / "convergence_cs336.json").read_text())
    assert r["partial"] is False and r["steps"] == 1000
    # two launches: the grid 1e-3..1e-2 on an H100, then 3e-4 added on an H200 (its runs only; the rest kept)
    assert ["H100" in x["device"] for x in r["launches"]] == [True, False] and "H200" in r["device"]
    assert r["rates"] == [3e-4, 1e-3, 3e-3, 1e-2]
    for arm in r["arms"].values():
        means = {lr: statistics.mean(s["bits_per_byte"] for s in seeds.values()) for lr, seeds in arm["runs"].items()}
        assert arm["best_lr"] == min(means, key=means.get)
        assert min(r["rates"]) < float(arm["best_lr"]) < max(r["rates"])       # inside the grid, not at its edge
        assert all(len(seeds) == 3 for seeds in arm["runs"].values())
    assert r["registered"]["comparisons"] == cs.registration(r["rates"], r["seeds"])
    assert r["verdicts"] == common.decide(r) and set(r["verdicts"]) == {f"at rate {lr:g}" for lr in r["rates"]}
    for lr in r["rates"]:                                  # each rate: both arms' seeds, paired
        a, b = ({s: x["bits_per_byte"] for s, x in r["arms"][arm]["runs"][f"{lr:g}"].items()}
                for arm in (cs.WIOLA, cs.LLAMA))
        assert r["verdicts"][f"at rate {lr:g}"] == judge(a, b, paired=True)
    a, b = (r["arms"][x] for x in (cs.WIOLA, cs.LLAMA))          # the chosen rates: shown, not judged
    assert r["at_chosen_rates"] == {"rates": [float(a["best_lr"]), float(b["best_lr"])], "difference": pytest.approx(
        statistics.mean(s["bits_per_byte"] for s in a["runs"][a["best_lr"]].values())
        - statistics.mean(s["bits_per_byte"] for s in b["runs"][b["best_lr"]].values()))}
    assert r["atm_calibration"]["mu_at_tau"] == pytest.approx(r["target_mu"], abs=0.01)
