"""The course's one rule (minwiola.verdict) and the verdicts committed under it: every result file's verdicts are the
rule applied to the comparisons and seeds its registration names, and nothing still speaks the old rule."""
import json
import random
import re
from pathlib import Path

import pytest

import ablation
import common
import convergence
import convergence_cs336
import diffusion_bench
import extrapolation
import layouts_bench
import moe_bench
import norm_bench
import ssm_bench
from minwiola.verdict import RULE, judge, t_critical

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "results").glob("*.json"))


def test_t_critical_matches_the_printed_tables():
    # two-sided 5% points of Student's t, as every statistics table prints them
    for df, x in [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)]:
        assert t_critical(df) == pytest.approx(x, abs=1e-3)
    with pytest.raises(ValueError, match="degree of freedom"):
        t_critical(0)


def test_pairing_cancels_the_luck_a_seed_gives_both_arms():
    luck = {"0": 0.0, "1": 0.5, "2": -0.4}                       # a seed's batches help or hurt both arms alike
    reference = {s: 1.0 + v for s, v in luck.items()}
    arm = {s: v - 0.02 + (0.001 if s == "1" else 0.0) for s, v in reference.items()}
    assert judge(arm, reference, paired=True)["verdict"] == "lower"
    assert judge(arm, reference, paired=False)["verdict"] == "no verdict"   # the luck swamps 0.02 when unpaired


def test_the_rule_raises_a_false_alarm_five_times_in_a_hundred():
    rng = random.Random(0)
    draw = lambda n: [rng.gauss(0, 1) for _ in range(n)]
    for n in (2, 3):
        for paired in (True, False):
            alarms = sum(judge(draw(n), draw(n), paired=paired)["verdict"] != "no verdict" for _ in range(4000))
            assert 0.035 < alarms / 4000 < 0.065, (n, paired, alarms)
    alarms = sum(judge(draw(3), 0.0)["verdict"] != "no verdict" for _ in range(4000))
    assert 0.035 < alarms / 4000 < 0.065


def test_shapes_and_clear_errors():
    v = judge([1.0], [2.0])
    assert v["verdict"] == "no verdict" and v["bound"] is None               # one seed a side: no noise to judge by
    assert judge([0.5, 0.52, 0.49], 0.1)["verdict"] == "higher"              # against a threshold
    with pytest.raises(ValueError, match="same seeds"):
        judge({"0": 1.0, "1": 2.0}, {"0": 1.0, "2": 2.0}, paired=True)
    with pytest.raises(ValueError, match="at least one number"):
        judge([], [1.0])


@pytest.mark.parametrize("path", [p for p in RESULTS if "verdicts" in json.loads(p.read_text())],
                         ids=lambda p: p.name)
def test_committed_verdicts_are_the_registered_rule_on_the_registered_seeds(path):
    result = json.loads(path.read_text())
    registered = result.get("registered")
    assert registered and registered["rule"] == RULE, f"{path.name} holds verdicts but no registration of the rule"
    assert result["verdicts"] == common.decide(result), f"{path.name}: a verdict is not the registered rule's"
    for name, v in result["verdicts"].items():
        c = registered["comparisons"][name]
        seeds = c["seeds"] if isinstance(c["seeds"], dict) else {"arm": c["seeds"], "reference": c["seeds"]}
        assert v["rule"] == RULE
        assert v["seeds"]["arm"] == sorted(seeds["arm"]), f"{path.name} {name}: other seeds than registered"


def test_each_benchmark_registers_what_its_committed_result_holds():
    load = lambda name: json.loads((ROOT / "results" / f"{name}.json").read_text())
    comparisons = lambda name: load(name)["registered"]["comparisons"]
    r = load("ablation")
    assert ablation.registration(r["seeds"]) == comparisons("ablation")
    assert convergence.registration(load("convergence")["seeds"]) == comparisons("convergence")
    r = load("convergence_cs336")
    assert convergence_cs336.registration(r["rates"], r["seeds"]) == comparisons("convergence_cs336")
    r = load("moe_bench")
    assert moe_bench.registration(r["seeds"], r["seeds_no_aux"]) == comparisons("moe_bench")
    assert diffusion_bench.registration(load("diffusion_bench")["seeds"]) == comparisons("diffusion_bench")
    assert layouts_bench.registration(load("layouts")["seeds"]) == comparisons("layouts")
    r = load("extrapolation")
    arms = list(dict.fromkeys([*r["encodings"], *r.get("reruns", {})]))     # an arm trained again keeps its own
    methods = [m for m in r.get("rope_scaled", {}) if m != "none"]         # plain RoPE, read again, is no comparison
    assert (extrapolation.registration(arms, r["seeds"], 0.1)
            | extrapolation.scaling_registration(methods, r["seeds"], 0.1)) == comparisons("extrapolation")
    assert norm_bench.registration(load("norm_bench")["seeds"]) == comparisons("norm_bench")
    r = load("ssm_bench")
    assert (ssm_bench.registration(["ssm-llama-style"], r["seeds"]) | ssm_bench.registration(["selective"], [0],
            r["seeds"])) == comparisons("ssm_bench")


def test_a_registration_is_never_changed_only_added_to():
    result = {}
    c = lambda path, seeds: {"arm": path, "reference": "y/{seed}", "seeds": seeds, "paired": True}
    common.register(result, {"a vs b": c("x/{seed}", ["1"])})
    result["registered"]["when"] = "earlier"                              # a later launch
    common.register(result, {"c vs b": c("z/{seed}", ["1"])})             # a new comparison
    common.register(result, {"a vs b": c("x/{seed}", ["1", "2"])})        # a seed added before its run
    assert set(result["registered"]["comparisons"]) == {"a vs b", "c vs b"}
    assert set(result["registered"]["added"]) == {"a vs b", "c vs b"}
    for bad in (c("x/{seed}", ["2"]), c("w/{seed}", ["1", "2"]), {**c("x/{seed}", ["1", "2"]), "paired": False}):
        with pytest.raises(SystemExit, match="registered"):             # a seed dropped, another number, unpaired
            common.register(result, {"a vs b": bad})


def test_nothing_speaks_the_old_rule():
    old = re.compile(r"twice the larger seed|within noise|2 x the larger|comparison_fresh|analysis\.compare|"
                     r"common\.compare")
    places = [*RESULTS, *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "lessons").glob("*.ipynb"),
              ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    speaking = [p.relative_to(ROOT).as_posix() for p in places if old.search(p.read_text())]
    assert not speaking, f"still the old rule (twice the larger seed range) in {speaking}"
