"""benchmarks/ssm_bench.py's design: the arms hold equal parameters, the recall probe picks the words its
rule names, the probe's numbers are the model's loss, the stated rule, and a tiny run end to end."""
import json
import re

import pytest
import torch

import analysis
import experiments
import common
import ssm_bench
from minwiola import verdict
from minwiola.budget import count_params
from minwiola.model import LanguageModel, preset
from minwiola.tokenizer import default_tokenizer


def test_the_arms_hold_equal_parameters():
    b = ssm_bench
    counts = {name: count_params(preset(*b.arm_config(name, 128)[:1], **b.arm_config(name, 128)[1])) for name in b.ARMS}
    assert counts["llama-style"] == counts["ssm-llama-style"] == 463_424
    assert b.arm_config("ssm-llama-style", 128)[1] == {"dropout": 0.0, "context": 128}    # the preset's own d_ff
    assert b.arm_config("selective", 128)[1]["d_ff"] == 159
    assert abs(counts["selective"] - counts["llama-style"]) <= 3 * 64 * 4 // 2           # within half a SwiGLU unit
    for name in b.ARMS:                                                                  # scaled down alike
        cfg = preset(*b.arm_config(name, 64, {"d": 32, "n_layers": 2})[:1], **b.arm_config(name, 64, {"d": 32, "n_layers": 2})[1])
        assert (cfg.d, cfg.n_layers, cfg.context, cfg.dropout) == (32, 2, 64, 0.0)
        assert abs(count_params(cfg) - count_params(preset("llama-style", d=32, n_layers=2, context=64))) <= 3 * 32


def test_closest_d_ff_finds_the_width_of_equal_parameters():
    closest_d_ff = experiments.closest_d_ff
    target = count_params(preset("llama-style"))
    assert closest_d_ff("ssm-llama-style", {}, target) == 186
    assert count_params(preset("ssm-llama-style", d_ff=closest_d_ff("ssm-llama-style", {}, target + 3 * 64 * 4 * 5)
                               )) == target + 3 * 64 * 4 * 5


STORY = ('Lily went to the park. She saw Tom and a dog. Lily smiled at Tom. "Tom, look!" said Lily.\n'
         'Lily ran. I like Tom, said Max. Then Max and Tom-Tom played with Lily\'s ball.')


def test_the_probe_selects_names_seen_before_in_mid_sentence():
    tok = default_tokenizer()
    ids = tok.encode(STORY)
    picked = [tok.decode(ids[k:k + 2]) for k in analysis.recall_targets(ids, tok)]
    words = [re.match(r"\s*([A-Za-z]+)", tok.decode(ids[k:])).group(1) for k in analysis.recall_targets(ids, tok)]
    # "saw Tom": the first Tom (not seen before); "Lily smiled", "Tom, look", "Lily ran", "I like", "Then": a
    # sentence's first word, after a quote or a line break, or "I"; "said Max": the first Max; "Tom-Tom": both
    assert words == ["Tom", "Lily", "Tom", "Max", "Tom", "Tom", "Lily"], picked
    for k in analysis.recall_targets(ids, tok):
        assert tok.decode(ids[k:k + 1]).lstrip(" ")[:1].isupper(), "a picked token starts its word"


def test_probe_windows_and_the_probe_are_the_models_loss():
    b = ssm_bench
    tok = default_tokenizer()
    stories = [STORY, "Sam had a cat. The cat liked Sam. Sam fed it."]
    windows = b.probe_windows(stories, tok, 32)
    assert windows["ids"].shape == (2, 33) and (windows["ids"][:, 0] == tok.eot_id).all()
    short = len(tok.encode(stories[1]))
    assert windows["valid"][1].sum() == short and (windows["ids"][1, 1 + short:] == tok.eot_id).all()
    assert windows["recall"][1].nonzero().flatten().tolist() == analysis.recall_targets(tok.encode(stories[1]), tok)
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama", vocab_size=tok.vocab_size, context=32)).eval()
    got = b.probe(model, windows, chunk=1)
    ids = windows["ids"][:1]
    with torch.no_grad():
        assert got["all"]["positions"] == 32 + short
        row0 = torch.nn.functional.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:], reduction="none")
        alone = torch.nn.functional.cross_entropy(model(windows["ids"][1:, :short])[0], windows["ids"][1, 1:1 + short],
                                                  reduction="none")      # the short story without its padding
    mean = (row0.sum() + alone.sum()) / (32 + short)
    assert got["all"]["loss"] == pytest.approx(mean.item(), abs=1e-5)
    assert got["recall"]["positions"] == int(windows["recall"].sum()) > 0


def _runs(bpbs):
    return {str(seed): {"bits_per_byte": v, "nats_per_token": v, "tokens_per_s": 1.0, "train_seconds": 1.0}
            for seed, v in enumerate(bpbs)}


def _judged(arms, borrowed=None):
    """A result of swept arms (bits per byte by seed) and, optionally, the selective arm on seed 0 at a borrowed rate,
    registered as ssm_bench registers them, then summarised."""
    result = {"arms": {n: {"rate_from": "sweep", "sweep": {"0.01": _runs(v)["0"]}, "seeds": _runs(v)}
                       for n, v in arms.items()}}
    seeds = list(range(len(arms["llama-style"])))
    common.register(result, ssm_bench.registration([n for n in arms if n != "llama-style"], seeds))
    if borrowed is not None:
        result["arms"]["selective"] = {"rate_from": "ssm-llama-style", "best_lr": 0.01, "sweep": {},
                                       "seeds": _runs([borrowed])}
        common.register(result, ssm_bench.registration(["selective"], [0], seeds))
    ssm_bench.resummarise(result)
    assert result["verdicts"] == common.decide(result)
    return result["verdicts"]


def test_the_stated_rule():
    b = ssm_bench
    reference = [1.30, 1.50, 1.51]                           # seed 0 chose the rate: it never counts
    t1 = verdict.t_critical(1)                               # two fresh seeds, paired: sd of the differences / sqrt(2)
    v = _judged({"llama-style": reference, "ssm-llama-style": [1.0, 1.40, 1.42]})["ssm-llama-style vs llama-style"]
    assert v["shape"] == "paired" and v["seeds"] == {"arm": ["1", "2"], "reference": ["1", "2"]}
    assert v["difference"] == pytest.approx(-0.095) and v["bound"] == pytest.approx(t1 * 0.01 / 2)
    assert v["verdict"] == "lower"                                                 # 0.095 > 12.7 x 0.005
    v = _judged({"llama-style": reference, "ssm-llama-style": [1.0, 1.60, 1.62]})["ssm-llama-style vs llama-style"]
    assert v["difference"] == pytest.approx(0.105) and v["verdict"] == "higher"
    v = _judged({"llama-style": reference, "ssm-llama-style": [1.0, 1.45, 1.60]})["ssm-llama-style vs llama-style"]
    assert v["difference"] == pytest.approx(0.02) and v["bound"] == pytest.approx(t1 * 0.14 / 2)
    assert v["verdict"] == "no verdict"                                            # 0.02 < 12.7 x 0.07
    # selective, on seed 0 at a borrowed rate, against the reference's fresh seeds: unpaired
    v = _judged({"llama-style": reference, "ssm-llama-style": reference}, borrowed=1.30)["selective vs llama-style"]
    pooled = ((1.50 - 1.505) ** 2 + (1.51 - 1.505) ** 2) / (1 + 2 - 2)
    assert v["shape"] == "unpaired" and v["seeds"] == {"arm": ["0"], "reference": ["1", "2"]}
    assert v["difference"] == pytest.approx(-0.205) and v["bound"] == pytest.approx(t1 * (pooled * 1.5) ** 0.5)
    assert v["verdict"] == "lower"                                                 # 0.205 > 12.7 x 0.0087
    v = _judged({"llama-style": [1.30, 1.40, 1.60], "ssm-llama-style": reference}, borrowed=1.40)
    assert v["selective vs llama-style"]["verdict"] == "no verdict"                  # 0.1 within 12.7 x 0.17
    assert b.best_rate({"0.001": {"bits_per_byte": 1.6}, "0.003": {"bits_per_byte": 1.5}}) == 0.003


def test_a_tiny_run_end_to_end(tmp_path):
    b = ssm_bench
    result = tmp_path / "ssm.json"
    opts = ["--shape", '{"d": 16, "n_layers": 1, "n_heads": 2}', "--steps", "2", "--eval-every", "2",
              "--eval-max-windows", "2", "--block-size", "32", "--rates", "0.01", "0.003", "--seeds", "0", "1",
              "--probe-stories", "20", "--runs", str(tmp_path / "runs"), "--result", str(result)]
    assert b.main(["--parts", "costs", "--lengths", "16", "32", "--repeat", "1", "--decode-steps", "2", *opts]) == 0
    assert b.main(["--parts", "train", "long", "--long-steps", "3", "--arms", "llama-style", "ssm-llama-style",
                   *opts]) == 0
    r = json.loads(result.read_text())
    cost = r["costs"]
    assert set(cost["mixers"]) == set(b.MIXERS) and all(len(v) == 2 for v in cost["mixers"].values())
    assert set(cost["train_step"]["seconds"]) == set(b.ARMS)
    for dec in cost["decoding"].values():
        assert dec["bytes"] == dec["analytic_bytes"]                   # the caches hold what budget says
    assert cost["decoding"]["ssm-llama-style"]["bytes"][0] == cost["decoding"]["ssm-llama-style"]["bytes"][1]
    assert cost["decoding"]["llama-style"]["bytes"][1] == 2 * cost["decoding"]["llama-style"]["bytes"][0]
    for name in ("llama-style", "ssm-llama-style"):
        arm = r["arms"][name]
        assert set(arm["sweep"]) == {"0.01", "0.003"} and set(arm["seeds"]) == {"0", "1"}
        assert arm["best_lr"] in (0.01, 0.003) and "probe" in arm["seeds"]["1"]
        assert arm["spread_bits_per_byte"] >= 0 and arm["probe_recall_loss"] > 0
        assert arm["long"]["3"]["steps"] == 3 and arm["long"]["3"]["lr"] == arm["best_lr"] and "probe" in arm["long"]["3"]
    assert r["registered"]["comparisons"] == b.registration(["llama-style", "ssm-llama-style"], [0, 1])
    assert r["verdicts"] == common.decide(r) and set(r["verdicts"]) == {"ssm-llama-style vs llama-style"}
    assert (tmp_path / "ssm.png").stat().st_mtime_ns >= result.stat().st_mtime_ns      # drawn by the last write
    # --evaluate-only trains nothing, gathers the same runs and keeps the costs
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert b.main(["--evaluate-only", "--long-steps", "3", *opts]) == 0
    again = json.loads(result.read_text())
    # a costs-only run later replaces the costs and keeps what describes the trained arms
    assert b.main(["--parts", "costs", "--lengths", "16", "--repeat", "1", "--decode-steps", "2", *opts]) == 0
    costs_again = json.loads(result.read_text())
    assert {k: costs_again[k] for k in ("command", "commit", "probe_positions", "arms")} == {
        k: again[k] for k in ("command", "commit", "probe_positions", "arms")}
    assert costs_again["costs"]["command"].endswith("--decode-steps 2 " + " ".join(opts))
    result.write_text(json.dumps(again))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before
    assert again["costs"] == cost and again["arms"]["llama-style"]["seeds"].keys() == {"0", "1"}
    assert again["arms"]["ssm-llama-style"]["long"]["3"] == r["arms"]["ssm-llama-style"]["long"]["3"]
    assert "| `ssm-llama-style` | " in b.report(again)
    assert again["arms"]["llama-style"]["mean_bits_per_byte"] == pytest.approx(r["arms"]["llama-style"]["mean_bits_per_byte"])
    # seed 0 chose each swept arm's rate: the fresh summary and verdict count seed 1 only
    for name in ("llama-style", "ssm-llama-style"):
        arm = again["arms"][name]
        assert arm["fresh"]["seeds"] == ["1"] and arm["fresh"]["mean_bits_per_byte"] == arm["seeds"]["1"]["bits_per_byte"]
    fresh = again["verdicts"]["ssm-llama-style vs llama-style"]
    assert fresh["seeds"] == {"arm": ["1"], "reference": ["1"]} and fresh["bound"] is None
    assert fresh["verdict"] == "no verdict" and again["verdicts"] == common.decide(again)
    # --summarise-only reads no run: the same summaries from the file alone, and the figure redrawn
    (tmp_path / "ssm.png").unlink()
    stripped = {**again, "verdicts": {},
                "arms": {n: {k: v for k, v in a.items() if k not in ("fresh", "mean_bits_per_byte")}
                         for n, a in again["arms"].items()}}
    result.write_text(json.dumps(stripped))
    assert b.main(["--summarise-only", "--runs", str(tmp_path / "nowhere"), "--result", str(result)]) == 0
    assert json.loads(result.read_text()) == again and (tmp_path / "ssm.png").exists()


def test_fresh_seeds_set_apart_only_the_seed_that_chose_the_rate():
    b = ssm_bench
    runs = _runs([1.30, 1.40, 1.42])
    swept = {"rate_from": "sweep", "sweep": {"0.01": runs["0"]}, "seeds": runs}
    borrowed = {"rate_from": "ssm-llama-style", "best_lr": 0.01, "sweep": {},
                "seeds": {"0": {**runs["0"], "bits_per_byte": 1.25}}}
    assert b.fresh_seeds(swept) == ["1", "2"] and b.fresh_seeds(borrowed) == ["0"]
    # the registration counts only the seeds that chose no rate: swept arms give up seed 0, selective keeps it
    planned = b.registration(["ssm-llama-style"], [0, 1, 2]) | b.registration(["selective"], [0], [0, 1, 2])
    assert planned["ssm-llama-style vs llama-style"]["seeds"] == ["1", "2"]
    assert planned["ssm-llama-style vs llama-style"]["paired"] is True
    assert planned["selective vs llama-style"]["seeds"] == {"arm": ["0"], "reference": ["1", "2"]}
    assert planned["selective vs llama-style"]["paired"] is False
    # ssm-llama-style is 0.15 lower on seeds 1 and 2 (0.15 and 0.14); on seed 0, which chose its rate, it was
    # lucky the other way: counted, seed 0 would hide the difference
    ssm = [1.45, 1.25, 1.28]
    every = verdict.judge(ssm, [1.30, 1.40, 1.42], paired=True)
    assert every["verdict"] == "no verdict"
    result = {"arms": {"llama-style": swept, "ssm-llama-style": {**swept, "seeds": _runs(ssm)}, "selective": borrowed}}
    common.register(result, planned)
    b.resummarise(result)
    assert swept["fresh"]["mean_bits_per_byte"] == pytest.approx(1.41) and swept["mean_bits_per_byte"] == pytest.approx(4.12 / 3)
    v = result["verdicts"]
    assert v == common.decide(result) and v["ssm-llama-style vs llama-style"]["seeds"]["arm"] == ["1", "2"]
    assert v["ssm-llama-style vs llama-style"]["difference"] == pytest.approx(-0.145)
    assert v["ssm-llama-style vs llama-style"]["verdict"] == "lower"
    assert v["selective vs llama-style"]["seeds"] == {"arm": ["0"], "reference": ["1", "2"]}
    result["arms"]["ssm-llama-style"]["seeds"]["0"]["bits_per_byte"] = 0.5      # seed 0 moved: the verdicts do not
    result["arms"]["llama-style"]["seeds"]["0"]["bits_per_byte"] = 9.0
    b.resummarise(result)
    assert result["verdicts"] == v
