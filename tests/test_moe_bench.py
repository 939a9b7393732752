"""benchmarks/moe_bench.py's design: the arms hold the parameters they claim (equal active, equal total),
the stated rule, the look inside (per-expert token counts), and a tiny run end to end."""
import json

import pytest
import torch

import analysis
import moe_bench
from minwiola.budget import forward_flops
from minwiola.model import LanguageModel, preset
from minwiola.moe import moe_layers
from minwiola.tokenizer import default_tokenizer


def test_the_arms_hold_equal_active_and_total_parameters():
    b = moe_bench
    c = {name: b.counts(name) for name in b.ARMS}
    assert c["dense"] == {"total": 463_424, "active": 463_424}
    assert c["moe"] == c["moe-no-aux"] == {"total": 730_688, "active": 463_424}       # equal ACTIVE with dense
    assert c["dense-total"] == {"total": 730_688, "active": 730_688}                  # equal TOTAL with moe
    assert c["dsff"] == {"total": 463_424, "active": 463_424}                         # DSFF: every parameter active
    assert b.arm_config("moe-no-aux", 128)[1]["moe_aux"] == 0.0
    assert b.arm_config("moe", 128)[1] == {"dropout": 0.0, "context": 128}             # the preset as it is
    cfg = {name: preset(*b.arm_config(name, 128)[:1], **b.arm_config(name, 128)[1]) for name in ("dense", "moe")}
    assert forward_flops(cfg["dense"], 128) == forward_flops(cfg["moe"], 128)     # equal forward FLOPs per token


def test_the_registered_rule():
    # every comparison paired on the seeds both arms train (moe-no-aux: its own seeds), judged by minwiola.verdict
    c = moe_bench.registration([0, 1, 2], [0])
    assert set(c) == {f"{a} vs {b}" for a, b in moe_bench.COMPARE} and all(v["paired"] for v in c.values())
    assert c["moe vs dense"]["seeds"] == ["0", "1", "2"] and c["moe-no-aux vs moe"]["seeds"] == ["0"]
    assert c["moe vs dense"]["arm"] == "arms/moe/seeds/{seed}/bits_per_byte"


def test_expert_tokens_counts_each_experts_tokens():
    b = moe_bench
    tok = default_tokenizer()
    ids = torch.tensor(tok.encode(" the cat the dog the cat"))
    top1 = torch.tensor([[0 if i % 2 == 0 else 1 for i in range(len(ids))]])      # even positions to expert 0
    got = b.expert_tokens(top1, ids, tok, top=2)
    assert len(got) == 1 and len(got[0]) == 2
    assert sum(e["share"] for e in got[0]) == pytest.approx(1.0)
    names = [t[0] for t in got[0][0]["tokens"]]
    assert names[0] == " the" and got[0][0]["tokens"][0][1:] == [3, 1.0]              # every " the" went to 0
    by_id = torch.tensor([[hash(t) % 3 for t in ids.tolist()]])
    assert b.purity(by_id, ids) == [1.0]                                               # a function of the id
    assert b.purity(torch.tensor([[0, 1, 0, 1]]), torch.tensor([5, 5, 5, 5])) == [0.5]


def test_routing_measures_load_and_top1():
    b = moe_bench
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-moe", moe_capacity=1.0)).eval()
    batch = torch.randint(0, 64, (4, 32))
    seen = b.routing(model, batch, chunk=2)
    assert seen["top1"].shape == (2, 4 * 32)
    for layer, load in zip(moe_layers(model), seen["load"]):
        assert sum(load) == pytest.approx(1.0)
    assert all(0 <= d <= 1 for d in seen["dropped"])
    assert ((seen["top1"] >= 0) & (seen["top1"] < 4)).all()


def test_a_tiny_run_end_to_end(tmp_path):
    b = moe_bench
    result = tmp_path / "moe.json"
    common = ["--shape", '{"d": 16, "n_layers": 1, "n_heads": 2}', "--steps", "3", "--eval-every", "3",
              "--eval-max-windows", "2", "--block-size", "32", "--inside-tokens", "256",
              "--runs", str(tmp_path / "runs"), "--result", str(result)]
    assert b.main([*common, "--seeds", "0", "1", "--seeds-no-aux", "0", "--arms", "dense", "moe"]) == 0
    r = json.loads(result.read_text())
    assert r["partial"] is True and set(r["arms"]) == {"dense", "moe"}
    assert set(r["verdicts"]) == {"moe vs dense"}                       # only the comparisons whose runs are in
    assert b.main([*common, "--seeds", "0", "1", "--seeds-no-aux", "0"]) == 0           # resumes; the rest trains
    r = json.loads(result.read_text())
    assert r["partial"] is False and set(r["arms"]) == set(b.ARMS)
    moe = r["arms"]["moe"]["seeds"]["0"]
    assert len(moe["held_out_load"]) == 1 and sum(moe["held_out_load"][0]) == pytest.approx(1.0)
    assert moe["held_out_dropped"] == [0.0]                                            # no capacity limit
    assert moe["load_over_training"]["steps"][-1] == 3
    assert "load_over_training" not in r["arms"]["dense"]["seeds"]["0"]
    assert len(r["inside"]["experts"][0]) == 6 and r["inside"]["run"] == "moe-s0"
    assert len(r["inside"]["purity"]) == 1 and 0 < r["inside"]["purity"][0] <= 1
    assert r["verdicts"]["moe vs dense"]["verdict"] in ("lower", "higher", "no verdict")
    assert (tmp_path / "moe.png").exists() and "| `moe` | 730" not in analysis.moe_report(r)     # shrunk: other counts
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert b.main([*common, "--evaluate-only", "--seeds", "0", "1", "--seeds-no-aux", "0"]) == 0
    again = json.loads(result.read_text())
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before             # trained nothing
    assert again["arms"]["moe"]["mean_bits_per_byte"] == pytest.approx(r["arms"]["moe"]["mean_bits_per_byte"])
    assert "| `dense-total` | " in analysis.moe_report(again)


def test_moe_table_comes_from_results():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    readme = (root / "docs" / "results.md").read_text()
    r = json.loads((root / "results" / "moe_bench.json").read_text())
    assert f"`{r['command']}`" in readme and r["data"].startswith("TinyStories sample")
    assert analysis.moe_report(r) in readme
    for pair, v in r["verdicts"].items():
        assert f"{pair}: {v['difference']:+.4f} ({v['verdict']})" in readme, pair
    assert ("partial" in readme.split("**Mixture of experts**")[1][:600]) == r["partial"]
