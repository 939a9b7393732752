"""benchmarks/convergence.py's design: the arms hold equal parameters, each rate is chosen on a seed that is
never reported (the grid growing at an edge), and a tiny run end to end resumes, reuses and says when it is partial."""
import argparse
import json
import math
from pathlib import Path

import pytest

import common
import convergence
from minwiola.verdict import judge
from minwiola.budget import count_params
from minwiola.model import preset


def test_the_arms_hold_equal_parameters():
    b = convergence
    args = argparse.Namespace(dropout=0.1, shape=None)
    counts = {name: b.params(name, args) for name in b.ARMS}
    assert counts == {"llama-style+width": 512_576, "wiola": 513_156, "llama-style+gcla": 512_580,
                      "wiola-srpe-offset": 513_156, "llama-style": 463_424}
    control = b.overrides(b.REFERENCE, None, args)
    assert control == {"dropout": 0.1, "d_ff": 240} == {"dropout": 0.1, **b.PARTS["width"]}   # the ablation's +width
    assert abs(counts[b.REFERENCE] / counts["wiola"] - 1) < 0.0012                   # 580 fewer: 0.11%
    assert abs(counts[b.REFERENCE] - counts["llama-style+gcla"]) <= 4
    wiola = preset("llama-style", **b.overrides("wiola", 0.57, args))
    assert (wiola.norm, wiola.positions, wiola.ffn, wiola.gcla, wiola.atm) == ("wiola", "srpe", "dsff", "causal",
                                                                                "copy-forward")
    assert wiola.atm_tau == 0.57 and wiola.srpe_radius == "paper" and wiola.dropout == 0.1     # the story model's
    offset = preset("llama-style", **b.overrides("wiola-srpe-offset", 0.57, args))
    assert offset.srpe_radius == "offset" and count_params(offset) == count_params(wiola)


def test_the_rate_rule(tmp_path, monkeypatch):
    b = convergence
    sweep = lambda values: {f"{r:g}": {"bits_per_byte": v} for r, v in values.items()}
    assert b.best_rate(sweep({1e-3: 1.2, 3e-3: 1.1, 1e-2: 1.15})) == 3e-3
    assert b.best_rate(sweep({1e-3: 1.1, 3e-3: 1.1})) == 1e-3                         # a tie: the lower rate
    assert b.next_rate(sweep({1e-3: 1.2, 3e-3: 1.1, 1e-2: 1.15})) is None             # inside: done
    assert b.next_rate(sweep({1e-3: 1.2, 3e-3: 1.15, 1e-2: 1.1})) == 3e-2              # half a decade up
    assert b.next_rate(sweep({1e-3: 1.1, 3e-3: 1.15, 1e-2: 1.2})) == 3e-4              # half a decade down
    assert b.next_rate(sweep({1e-2: 1.2, 3e-2: 1.1})) == 1e-1
    monkeypatch.setattr(b, "run", lambda *a, **k: pytest.fail("it trained"))
    with pytest.raises(SystemExit):                                                     # the sweep's seed is never reported
        b.main(["--seeds", "0", "100", "--sweep-seed", "100", "--runs", str(tmp_path), "--result", str(tmp_path / "c.json")])


def test_flatness_measures_the_fall_at_the_end():
    b = convergence
    evals = [{"step": s, "valid_nats_per_token": v} for s, v in [(200, 4.0), (1400, 3.0), (1600, 2.9),
                                                                 (2600, 2.82), (2800, 2.81), (3000, 2.805)]]
    f = b.flatness(evals, 3000)
    assert f["last_10pct"] == {"from_step": 2600, "to_step": 3000, "drop_nats_per_token": pytest.approx(0.015)}
    assert f["last_50pct"] == {"from_step": 1400, "to_step": 3000, "drop_nats_per_token": pytest.approx(0.195)}


def test_each_arm_sweeps_on_the_unreported_seed_then_trains_the_seeds_at_its_best(tmp_path, monkeypatch):
    """The experiment's order and rate rule, with each run replaced by a stand-in whose loss is lowest at 3e-2 for
    the Wiolas and at 3e-3 otherwise, 0.1 lower for wiola (no training)."""
    b = convergence
    calls = []

    def fake_run(name, lr, seed, steps, tau, args, look_inside, recorded=None):
        if not calls:                                       # the comparisons are on disk before the first run
            assert json.loads(result.read_text())["registered"]["comparisons"] == b.registration([0, 1, 2])
        calls.append((name, lr, seed))
        taus.setdefault((name, seed), []).append(tau)
        folder = Path(args.runs) / b.run_name(name, lr, seed, steps, tau, args)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "loss.png").touch()
        best = 3e-2 if name.startswith("wiola") else 3e-3
        bpb = (0.9 if name == "wiola" else 1.0) + (math.log10(lr) - math.log10(best)) ** 2 + 0.001 * seed
        return {"bits_per_byte": bpb, "nats_per_token": 2.8 * bpb, "final_bits_per_byte": bpb, "train_seconds": 1.0,
                "flops_per_token": 4e6, "tau": tau, "run": folder.name}

    taus = {}
    calibrated = lambda folder, target, batches, args: {      # the reference's states 0.57, an ATM arm's its own
        "tau": 0.57 if folder.name.startswith(b.REFERENCE) else 0.6 + len(folder.name) / 1000,
        "on": f"{folder.name} best weights"}
    monkeypatch.setattr(b, "run", fake_run)
    monkeypatch.setattr(b, "calibrate_tau", calibrated)
    monkeypatch.setattr(b, "timing", lambda tau, args: {"seconds_per_step": {n: 1.0 for n in b.ARMS}})
    monkeypatch.setattr(b, "plot", None)
    result = tmp_path / "c.json"
    assert b.main(["--runs", str(tmp_path / "runs"), "--result", str(result), "--extend", "2"]) == 0
    r = json.loads(result.read_text())

    sweeps = {name: [lr for n, lr, s in calls if n == name and s == 100] for name in b.ARMS}
    assert sweeps["wiola"] == [1e-3, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]      # calibration run; grown twice, then inside
    assert sweeps[b.REFERENCE] == sweeps["llama-style+gcla"] == [1e-3, 3e-3, 1e-2]
    assert sweeps["llama-style"] == []                                                 # it borrows the control's rate
    assert sweeps["wiola-srpe-offset"] == []                            # wiola's rate and tau: no run of its own
    assert r["atm_calibration"]["on"] == f"{b.REFERENCE}-lr0.003-s100 best weights"
    own = r["arms"]["wiola"]["atm_calibration"]     # a calibration run at the reference's tau, then all at its own
    assert own["on"] == "wiola-lr0.001-s100-tau0.57 best weights" and own["tau"] > 0.6
    assert r["arms"]["wiola"]["calibration_run"]["run"] == "wiola-lr0.001-s100-tau0.57"
    assert taus["wiola", 100] == [0.57] + [own["tau"]] * len(r["arms"]["wiola"]["sweep"])
    assert taus["wiola", 0] == taus["wiola", 2] == taus["wiola-srpe-offset", 0] == [own["tau"]]
    assert all(e["run"].endswith(f"-tau{own['tau']:g}") for e in r["arms"]["wiola"]["sweep"].values())
    assert r["arms"]["wiola-srpe-offset"]["atm_calibration"] == {**own, "from": "wiola"}
    assert "calibration_run" not in r["arms"]["wiola-srpe-offset"]
    assert "atm_calibration" not in r["arms"]["llama-style+gcla"]
    assert f"at tau {own['tau']:g}, calibrated on wiola-lr0.001-s100-tau0.57 (" in b.report(r)
    assert f"(wiola's rate and tau {own['tau']:g})" in b.report(r)
    assert b.run_name(b.REFERENCE, 1e-3, 0, 3000, 0.5, argparse.Namespace(steps=3000)) == f"{b.REFERENCE}-lr0.001-s0"

    for name, lr in [("wiola", 3e-2), ("wiola-srpe-offset", 3e-2), (b.REFERENCE, 3e-3), ("llama-style", 3e-3)]:
        assert [(l, s) for n, l, s in calls if n == name and s != 100] == [(lr, 0), (lr, 1), (lr, 2)], name
        assert r["arms"][name]["best_lr"] == lr and r["arms"][name].get("best_at_edge") in (False, None)
    assert calls.index(("wiola", 3e-2, 0)) < calls.index(("llama-style+gcla", 1e-3, 100))   # the main pair first
    assert r["partial"] is False and set(r["arms"]["wiola"]["seeds"]) == {"0", "1", "2"}
    registered = r["registered"]["comparisons"]
    assert registered == b.registration([0, 1, 2]) and "added" not in r["registered"]   # every seed, never 100
    assert all(c["seeds"] == ["0", "1", "2"] and c["paired"] for c in registered.values())
    assert r["verdicts"] == common.decide(r) and set(r["verdicts"]) == set(registered)
    del r["arms"]["llama-style"]["seeds"]["2"]
    b.summarise(r, argparse.Namespace(seeds=[0, 1, 2]))
    assert r["partial"] is True                                                         # one seed missing
    assert r["verdicts"] == common.decide(r)                    # the comparisons with llama-style wait for its seed
    assert set(r["verdicts"]) == set(r["comparison"]) == set(registered) - {f"{b.REFERENCE} vs llama-style",
                                                                             "wiola vs llama-style"}
    v = r["comparison"]["wiola vs llama-style+width"]
    judged = r["verdicts"]["wiola vs llama-style+width"]            # the comparison carries the registered verdict
    assert {k: v[k] for k in judged} == {**judged, "seeds": [3, 3]}
    # seed s adds 0.001 s to both arms: paired, that luck cancels (each seed's difference is -0.1, the bound 0);
    # unpaired, the spread of the seeds would be the noise
    assert v["verdict"] == "lower" and v["shape"] == "paired" and v["difference"] == pytest.approx(-0.1)
    assert v["bound"] == pytest.approx(0, abs=1e-12)
    assert judge([0.900, 0.901, 0.902], [1.000, 1.001, 1.002])["bound"] == pytest.approx(0.0023, abs=1e-4)
    assert v["final"]["verdict"] == "lower" and v["paired"] == pytest.approx({"0": -0.1, "1": -0.1, "2": -0.1})
    assert "| wiola vs llama-style+width | 3 vs 3 | -0.1000 | 0.0000 | lower | -0.1000 lower | -0.1000, -0.1000, " \
           "-0.1000 |" in b.report(r)
    # an entry of an ATM arm's sweep at another tau (an earlier calibration) is dropped
    stored = json.loads(result.read_text())
    stored["arms"]["wiola"]["sweep"]["0.0003"] = {**stored["arms"]["wiola"]["sweep"]["0.001"], "run": "wiola-lr0.0003-s100"}
    result.write_text(json.dumps(stored))
    assert b.main(["--runs", str(tmp_path / "runs"), "--result", str(result), "--extend", "2"]) == 0
    assert "0.0003" not in json.loads(result.read_text())["arms"]["wiola"]["sweep"]
    calls.clear()
    b.main(["--runs", str(tmp_path / "runs2"), "--result", str(tmp_path / "d.json"), "--extend", "1"])
    assert [lr for n, lr, s in calls if n == "wiola" and s == 100] == [1e-3, 1e-3, 3e-3, 1e-2, 3e-2]
    assert json.loads((tmp_path / "d.json").read_text())["arms"]["wiola"]["best_at_edge"] is True


def test_a_tiny_run_end_to_end_resumes_and_says_partial(tmp_path):
    b = convergence
    runs, result = tmp_path / "runs", tmp_path / "c.json"
    cli = ["--shape", '{"d": 16, "n_layers": 3, "n_heads": 2}', "--steps", "4", "--batch-size", "2",
              "--block-size", "32", "--eval-every", "2", "--eval-max-windows", "2", "--rates", "1e-3", "1e-2",
              "--extend", "0", "--calibration-batches", "2", "--timing-repeat", "1", "--runs", str(runs),
              "--result", str(result), "--arms", b.REFERENCE, "wiola"]
    assert b.main([*cli, "--seeds", "0"]) == 0
    r = json.loads(result.read_text())
    assert r["partial"] is True and set(r["arms"]) == {b.REFERENCE, "wiola"}
    assert r["registered"]["comparisons"] == b.registration([0])
    assert r["verdicts"] == common.decide(r) and set(r["verdicts"]) == {"wiola vs llama-style+width"}
    one = r["verdicts"]["wiola vs llama-style+width"]           # one seed: no noise to measure, so no verdict
    assert one["verdict"] == "no verdict" and one["bound"] is None and one["seeds"]["arm"] == ["0"]
    assert "| wiola vs llama-style+width | 1 vs 1 |" in b.report(r)
    assert set(r["timing"]["seconds_per_step"]) == set(b.ARMS) and r["threads"] == 1
    wiola = r["arms"]["wiola"]
    assert set(wiola["sweep"]) == {"0.001", "0.01"} and wiola["best_lr"] == b.best_rate(wiola["sweep"])
    seed0 = wiola["seeds"]["0"]
    held = json.loads((runs / seed0["run"] / "config.json").read_text())["train"]
    assert (held["seed"], held["lr"], held["steps"], held["overrides"]["dropout"]) == (0, wiola["best_lr"], 4, 0.1)
    own, calibration = wiola["atm_calibration"]["tau"], wiola["calibration_run"]["run"]
    assert calibration == f"wiola-lr0.001-s100-tau{r['atm_calibration']['tau']:g}"     # at the reference's tau
    assert wiola["atm_calibration"]["on"].startswith(calibration + " ")                 # own tau: from that run
    stored_tau = lambda run: json.loads((runs / run / "config.json").read_text())["train"]["overrides"]["atm_tau"]
    assert stored_tau(calibration) == r["atm_calibration"]["tau"] and held["overrides"]["atm_tau"] == own
    assert stored_tau(wiola["sweep"]["0.01"]["run"]) == stored_tau(wiola["sweep"]["0.001"]["run"]) == own
    assert held.get("eval_tokens") is None                                              # the whole held-out split
    assert len(seed0["learned"]["gcla_beta"]) == 3 and len(seed0["learned"]["norm_delta_abs_mean"]) == 7
    assert len(seed0["learned"]["norm_delta_over_input"]) == len(seed0["learned"]["norm_output_change"]) == 7
    assert len(seed0["learned"]["dsff_alpha"]) == 3 and seed0["atm_mu"] and seed0["flatness"]["last_10pct"]
    assert "learned" not in wiola["sweep"]["0.01"] and seed0["valid_wall_seconds"]
    # a setting added to TrainConfig since a run was written counts as that run's default: the run is reused
    config = runs / seed0["run"] / "config.json"
    stored = json.loads(config.read_text())
    del stored["train"]["objective"]
    config.write_text(json.dumps(stored))
    first = json.loads(result.read_text())
    first["registered"]["when"] = "an earlier minute"          # common.register tells launches apart by the minute
    result.write_text(json.dumps(first))
    before = {p.name: (p / "metrics.jsonl").stat().st_mtime_ns for p in runs.iterdir()}
    assert b.main([*cli, "--seeds", "0", "1"]) == 0                                  # resumes: only seed 1 trains
    after = {p.name: (p / "metrics.jsonl").stat().st_mtime_ns for p in runs.iterdir()}
    assert {k: after[k] for k in before} == before and len(after) == len(before) + 2   # seed 1 of both arms
    r = json.loads(result.read_text())
    assert set(r["arms"]["wiola"]["seeds"]) == {"0", "1"} and len(r["launches"]) == 2
    assert r["partial"] is True                                                         # three arms never ran
    entry = r["registered"]                             # the second launch added seed 1 before its runs
    assert entry["comparisons"] == b.registration([0, 1]) and set(entry["added"]) == set(b.registration([0]))
    assert r["verdicts"] == common.decide(r) and set(r["verdicts"]) == {"wiola vs llama-style+width"}
    two = r["verdicts"]["wiola vs llama-style+width"]
    assert two["seeds"]["arm"] == ["0", "1"] and two["shape"] == "paired" and two["bound"] is not None
    assert two["verdict"] == ("no verdict" if abs(two["difference"]) <= two["bound"] else
                              "lower" if two["difference"] < 0 else "higher")
    assert r["comparison"]["wiola vs llama-style+width"]["verdict"] == two["verdict"]
    assert (tmp_path / "c.png").exists() and "| `wiola` |" in b.report(r)
    assert r["timing"]["atm_tau"]["wiola"] == r["atm_calibration"]["tau"]            # timed before its own tau
    assert b.main([*cli, "--timing-only"]) == 0                                      # again: at the seeds' tau
    r = json.loads(result.read_text())
    own = r["arms"]["wiola"]["atm_calibration"]["tau"]                    # srpe-offset trains at wiola's tau
    assert r["timing"]["atm_tau"] == {"wiola": own, "wiola-srpe-offset": own}
    best = {n: r["arms"][n]["sweep"][f"{r['arms'][n]['best_lr']:g}"]["run"] for n in (b.REFERENCE, "wiola")}
    assert r["timing"]["weights"] == {n: best.get(n, "initialisation") for n in b.ARMS}   # trained where it can
    swept_or_seed = {"a": {"best_lr": 0.01, "sweep": {"0.01": {"run": "a-lr0.01-s100"}}, "seeds": {"0": {"run": "a0"}}},
                     "b": {"best_lr": 0.01, "sweep": {}, "seeds": {"0": {"run": "b-lr0.01-s0"}}},   # a borrowed rate
                     "c": {"sweep": {"0.001": {"run": "c1"}}, "seeds": {}}}                     # its sweep unfinished
    assert b.trained_runs({"arms": swept_or_seed}, runs) == {}                        # no folder on disk
    for folder in ("a-lr0.01-s100", "a0", "b-lr0.01-s0", "c1"):
        (runs / folder / "best").mkdir(parents=True)
    assert b.trained_runs({"arms": swept_or_seed}, runs) == {"a": runs / "a-lr0.01-s100", "b": runs / "b-lr0.01-s0"}
    (runs / "a-lr0.01-s100" / "best").rmdir()                                 # its sweep run is gone: its seed 0
    assert b.trained_runs({"arms": swept_or_seed}, runs) == {"a": runs / "a0", "b": runs / "b-lr0.01-s0"}
    from common import step_times
    wiola_config = json.loads((runs / best["wiola"] / "best" / "config.json").read_text())
    with pytest.raises(ValueError, match="another model"):                      # weights of another arm: refused
        step_times({"wiola": preset("llama-style", **{k: v for k, v in wiola_config.items() if k != "vocab_size"})},
                   32, 2, 1, trained={"wiola": runs / best[b.REFERENCE] / "best"})
    # the run folders are gone (a new machine): what --result records is kept, nothing is trained again
    import shutil
    shutil.rmtree(runs)
    before = json.loads(result.read_text())["arms"]
    assert b.main([*cli, "--seeds", "0", "1"]) == 0
    assert not runs.exists() or not any(runs.iterdir())
    assert json.loads(result.read_text())["arms"] == before
    assert b.main([*cli, "--seeds", "0", "1", "2"]) == 0                             # a new seed: only it trains
    assert sorted(p.name for p in runs.iterdir()) == sorted(b.run_name(n, r["arms"][n]["best_lr"], 2, 4, r["arms"]
                                                            [n].get("atm_calibration", r["atm_calibration"])["tau"],
                                                            argparse.Namespace(steps=4)) for n in (b.REFERENCE, "wiola"))


def fake_training(monkeypatch, runs, interrupt):
    """convergence with its training, calibration, timing and figure replaced by stand-ins: a run makes its folder,
    calls interrupt(name, seed) (where a test starts a second process), and scores 1 + lr + 0.01 seed."""
    b = convergence

    def fake_run(name, lr, seed, steps, tau, args, look_inside, recorded=None):
        if recorded:
            return recorded
        folder = runs / b.run_name(name, lr, seed, steps, tau, args)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "loss.png").touch()
        interrupt(name, seed)
        bpb = 1.0 + lr + 0.01 * seed
        return {"bits_per_byte": bpb, "nats_per_token": 2.8 * bpb, "final_bits_per_byte": bpb, "train_seconds": 1.0,
                "flops_per_token": 4e6, "tau": tau, "run": folder.name}

    monkeypatch.setattr(b, "run", fake_run)
    monkeypatch.setattr(b, "calibrate_tau", lambda folder, target, batches, args: {"tau": 0.57})
    monkeypatch.setattr(b, "timing", lambda tau, args: {"seconds_per_step": {n: 1.0 for n in b.ARMS}})
    monkeypatch.setattr(b, "plot", None)


def test_the_figure_is_drawn_once_a_minute_and_at_the_end_not_after_every_run(tmp_path, monkeypatch):
    """--result is saved after every run; drawing its figure takes seconds (most of a tiny launch's time): the first
    save and the launch's last draw it, from the result as written."""
    runs = tmp_path / "runs"
    fake_training(monkeypatch, runs, lambda name, seed: None)
    drawn = []
    monkeypatch.setattr(convergence, "plot", lambda result, path: drawn.append(json.dumps(result)))
    result = tmp_path / "c.json"
    assert convergence.main(["--runs", str(runs), "--result", str(result), "--extend", "0"]) == 0
    assert len(drawn) == 2 and json.loads(drawn[-1]) == json.loads(result.read_text())
    assert json.loads(drawn[-1])["partial"] is False and not json.loads(drawn[0])["arms"]


def test_two_processes_with_disjoint_arms_share_one_result(tmp_path, monkeypatch):
    """The second process (its arms: llama-style+gcla, wiola-srpe-offset) runs whole while the first is inside
    wiola's first run: after the first writes again, the file still holds the second's arms, and both launches;
    wiola-srpe-offset, which takes wiola's rate, trains its calibration run and waits for the next launch."""
    b = convergence
    runs, result = tmp_path / "runs", tmp_path / "c.json"
    first, second = [b.REFERENCE, "wiola", "llama-style"], ["llama-style+gcla", "wiola-srpe-offset"]
    cli = lambda arms: ["--runs", str(runs), "--result", str(result), "--rates", "1e-3", "1e-2", "--extend", "0",
                        "--seeds", "0", "--arms", *arms]
    nested = []

    def interrupt(name, seed):
        if name == "wiola" and not nested:                 # the first process is training: the second runs now
            nested.append(b.main(cli(second)))

    fake_training(monkeypatch, runs, interrupt)
    with pytest.raises(SystemExit):                        # no calibration yet: the reference's process goes first
        b.main(cli(second))
    assert b.main(cli(first)) == 0 and nested == [0]
    r = json.loads(result.read_text())
    assert {n: set(a["seeds"]) for n, a in r["arms"].items()} == {n: set() if n == "wiola-srpe-offset" else {"0"}
                                                                  for n in b.ARMS}
    assert len(r["launches"]) == 2 and [x["arms"] for x in r["launches"]] == [first, second]
    assert [x["command"].split(" --arms ")[1] for x in r["launches"]] == [" ".join(first), " ".join(second)]
    assert "llama-style+gcla vs llama-style+width" in r["comparison"]
    offset = r["arms"]["wiola-srpe-offset"]
    assert offset["seeds"] == {} and "calibration_run" not in offset      # nothing trained: it waited for wiola
    assert b.main(cli(second)) == 0                        # wiola's sweep is finished now: its rate is taken
    r = json.loads(result.read_text())
    offset = r["arms"]["wiola-srpe-offset"]
    assert offset["best_lr"] == r["arms"]["wiola"]["best_lr"] and offset["sweep"] == {} and set(offset["seeds"]) == {"0"}
    assert offset["atm_calibration"]["tau"] == r["arms"]["wiola"]["atm_calibration"]["tau"]      # and its tau
    assert r["partial"] is False and "wiola-srpe-offset vs wiola" in r["comparison"]
    # a timing measured since (a --timing-only while the trainers were paused) is kept; an older one is not
    r["timing"] = {"when": "2026-01-02T00:00:00", "seconds_per_step": {}}
    on_disk = json.loads(result.read_text())
    result.write_text(json.dumps({**on_disk, "timing": {"when": "2026-01-03T00:00:00", "seconds_per_step": {}}}))
    b.take_others(r, result, first)
    assert r["timing"]["when"] == "2026-01-03T00:00:00"
    result.write_text(json.dumps({**on_disk, "timing": {"when": "2026-01-01T00:00:00", "seconds_per_step": {}}}))
    b.take_others(r, result, first)
    assert r["timing"]["when"] == "2026-01-03T00:00:00"
    # a file written with other settings is not merged into
    r["arms"]["wiola"]["seeds"].clear()
    result.write_text(json.dumps({**r, "steps": 5}))
    b.take_others(r, result, first)
    assert r["arms"]["wiola"]["seeds"] == {}


def test_two_processes_may_split_one_arms_seeds(tmp_path, monkeypatch):
    """A second process trains seed 1 of the reference while the first is inside its seed 0 (the sweep recorded):
    the file ends with seeds 0, 1 and 2 of the arm, whichever process wrote last, and the seeds both asked for."""
    b = convergence
    runs, result = tmp_path / "runs", tmp_path / "c.json"
    cli = lambda seeds: ["--runs", str(runs), "--result", str(result), "--rates", "1e-3", "1e-2", "--extend", "0",
                         "--seeds", *seeds, "--arms", b.REFERENCE]
    nested = []

    def interrupt(name, seed):
        if seed == 0 and not nested:                       # the first process is in seed 0: the second runs now
            nested.append(b.main(cli(["1"])))

    fake_training(monkeypatch, runs, interrupt)
    assert b.main(cli(["0", "2"])) == 0 and nested == [0]
    r = json.loads(result.read_text())
    assert set(r["arms"][b.REFERENCE]["seeds"]) == {"0", "1", "2"} and r["seeds"] == [0, 1, 2]
    assert r["arms"][b.REFERENCE]["mean_bits_per_byte"] == pytest.approx(1.001 + 0.01)     # at 1e-3
    assert r["partial"] is True                            # the other arms have no seeds
