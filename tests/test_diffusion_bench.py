"""benchmarks/diffusion_bench.py's design: the arms' parameters (equal up to the [MASK] row), the quality
proxies by hand, the registered rule on a bound against an exact value, resumable partial results, and a tiny run end to end."""
import dataclasses
import json
import math

import pytest
import torch

import common
from common import train_or_reuse
import diffusion_bench as bench
from minwiola import sha256_file, verdict
from minwiola.generate import STORY_MODEL
from minwiola.model import LanguageModel, preset
from minwiola.tokenizer import default_tokenizer


def test_the_arms_are_equal_up_to_the_mask_row():
    b = bench
    c = b.counts(128)
    assert c == {"decoder": 463_424, "diffusion": 463_488}
    assert c["diffusion"] - c["decoder"] == 64                      # one embedding row of d = 64: [MASK]
    dec, dif = (preset(*b.arm_config(n, 128)[:1], **b.arm_config(n, 128)[1]) for n in ("decoder", "diffusion"))
    assert dec.causal and not dif.causal and dif.vocab_size == dec.vocab_size + 1
    assert {f.name: getattr(dec, f.name) for f in dataclasses.fields(dec) if f.name not in ("causal", "vocab_size")} \
        == {f.name: getattr(dif, f.name) for f in dataclasses.fields(dif) if f.name not in ("causal", "vocab_size")}
    args = b.argparse.Namespace(block_size=128, shape=None, steps=600, batch_size=16, eval_every=200,
                                eval_max_windows=None, trainer_bound_windows=384)
    assert b.train_config("decoder", 0.01, 0, args).objective == "next-token"
    assert b.train_config("diffusion", 0.01, 0, args).objective == "diffusion"
    assert b.train_config("diffusion", 0.01, 0, args).eval_max_windows == 384        # the bound's cost, in training
    assert b.train_config("decoder", 0.01, 0, args) == b.TrainConfig(            # exactly ssm_bench's llama-style runs
        preset="llama-style", overrides={"dropout": 0.0, "context": 128}, steps=600, batch_size=16, block_size=128,
        lr=0.01, seed=0, eval_every=200, sample_tokens=60)


def test_quality_proxies_by_hand():
    b = bench
    assert b.distinct_words("the cat saw the dog") == pytest.approx(4 / 5)
    assert b.distinct_words("...") == 0.0
    assert b.blank_span(100, 16) == (42, 58) and b.blank_span(33, 4) == (14, 18)
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama")).eval()
    ids = torch.randint(0, 60, (2, 7))
    x = torch.cat([torch.full((2, 1), 63), ids[:, :-1]], 1)
    logp = model(x).log_softmax(-1)
    by_hand = -logp.gather(-1, ids[..., None]).squeeze(-1).mean(-1)
    assert torch.allclose(b.nll_after_eot(model, ids, 63), by_hand, atol=1e-6)
    assert b.best_rate({"0.001": {"bits_per_byte": 1.5}, "0.01": {"bits_per_byte": 1.4}}) == 0.01
    assert b.best_rate({}) is None


def _arm(bpbs, stderr=None):
    seeds = {str(i): {"bits_per_byte": v, "nats_per_token": 3 * v, **({"stderr_bits_per_byte": stderr, "draws": 16}
                                                                    if stderr else {})} for i, v in enumerate(bpbs)}
    return {"params": 1, "sweep": {"0.01": seeds["0"]}, "seeds": seeds}


def _registered(result):
    common.register(result, bench.registration(result["seeds"]))
    return result


def _by_hand(arm, reference):
    """Student's t, unpaired, written out: the difference and the bound it must exceed."""
    na, nr = len(arm), len(reference)
    ma, mr = sum(arm) / na, sum(reference) / nr
    pooled = (sum((v - ma) ** 2 for v in arm) + sum((v - mr) ** 2 for v in reference)) / (na + nr - 2)
    return ma - mr, verdict.t_critical(na + nr - 2) * math.sqrt(pooled * (1 / na + 1 / nr))


def test_the_rule_and_partial():
    b = bench
    result = _registered({"rates": [0.01], "seeds": [0, 1, 2], "arms": {
        "decoder": _arm([1.30, 1.35, 1.40]), "diffusion": _arm([1.60, 1.62, 1.61], stderr=0.002)}})
    assert result["registered"]["comparisons"]["diffusion vs decoder"] == {
        "arm": "arms/diffusion/seeds/{seed}/bits_per_byte", "reference": "arms/decoder/seeds/{seed}/bits_per_byte",
        "seeds": ["1", "2"], "paired": False}                        # unpaired: the diffusion noise shifts batches
    b.summarise(result)
    assert result["verdicts"] == common.decide(result)
    v = result["verdicts"]["diffusion vs decoder"]
    difference, bound = _by_hand([1.62, 1.61], [1.35, 1.40])        # 0.24 against 4.30 x 0.0255 = 0.110
    assert v["shape"] == "unpaired" and v["seeds"] == {"arm": ["1", "2"], "reference": ["1", "2"]}
    assert v["difference"] == pytest.approx(difference) == pytest.approx(0.24)
    assert v["bound"] == pytest.approx(bound) and bound < 0.24 and v["verdict"] == "higher"
    assert result["partial"] is True                                # no samples yet
    result |= {"generation": {}, "infilling": {}}
    b.summarise(result)
    assert result["partial"] is False
    del result["generation"], result["infilling"]
    result["arms"]["diffusion"] = _arm([1.40, 1.45, 1.42], stderr=0.002)
    b.summarise(result)
    difference, bound = _by_hand([1.45, 1.42], [1.35, 1.40])        # 0.06 against 4.30 x 0.0292 = 0.125
    v = result["verdicts"]["diffusion vs decoder"]
    assert v["difference"] == pytest.approx(difference) and v["bound"] == pytest.approx(bound) and bound > abs(difference)
    assert v["verdict"] == "no verdict"
    del result["arms"]["diffusion"]["seeds"]["2"]
    b.summarise(result)
    assert result["partial"] is True and result["verdicts"] == {}   # a registered seed missing: no verdict yet
    table = b.report(result)
    assert "| `decoder` |" in table and "exact" in table and "upper bound (ELBO, 16 draws" in table


def test_train_or_reuse_counts_a_field_added_since_as_its_default(tmp_path):
    from minwiola.train import TrainConfig
    cfg = TrainConfig(preset="tiny-llama", steps=2)
    held = dataclasses.asdict(cfg)
    del held["objective"]                                          # a run made before the field existed
    (tmp_path / "config.json").write_text(json.dumps({"train": held}))
    (tmp_path / "loss.png").write_bytes(b"")
    assert train_or_reuse(cfg, tmp_path) == tmp_path        # reused, nothing trained
    with pytest.raises(SystemExit):                                 # not its default: another experiment
        train_or_reuse(dataclasses.replace(cfg, objective="diffusion", preset="tiny-diffusion"), tmp_path)
    with pytest.raises(SystemExit):
        train_or_reuse(dataclasses.replace(cfg, steps=3), tmp_path)


def test_a_tiny_run_end_to_end(tmp_path):
    b = bench
    result = tmp_path / "diffusion.json"
    opts = ["--shape", '{"d": 16, "n_layers": 1, "n_heads": 2}', "--steps", "3", "--eval-every", "3",
              "--eval-max-windows", "4", "--trainer-bound-windows", "4", "--block-size", "32", "--draws", "2", "--rates", "0.01", "0.003",
              "--samples", "2", "--unmask-steps", "2", "4", "32", "--block", "16", "--blank", "4",
              "--infill-stories", "3", "--runs", str(tmp_path / "runs"), "--result", str(result)]
    assert b.main([*opts, "--arms", "diffusion", "--parts", "sweep", "--lrs", "0.01", "--seeds", "0", "1"]) == 0
    r = json.loads(result.read_text())
    assert r["partial"] is True and set(r["arms"]["diffusion"]["sweep"]) == {"0.01"}
    planned = bench.registration([0, 1])                             # registered by the first launch, before its run
    assert r["registered"]["comparisons"] == planned and planned["diffusion vs decoder"]["seeds"] == ["1"]
    assert r["verdicts"] == {}                                       # nothing to judge yet
    run = r["arms"]["diffusion"]["sweep"]["0.01"]
    assert run["bound"] is True and run["draws"] == 2 and math.isfinite(run["stderr_bits_per_byte"])
    assert b.main([*opts, "--arms", "diffusion", "--parts", "seeds", "--seeds", "1"]) == 0   # sweep unfinished;
    # a process of one seed keeps what the first launch registered (seed 1 of seeds 0, 1), adds and drops nothing
    assert json.loads(result.read_text())["arms"]["diffusion"]["seeds"] == {}
    assert b.main([*opts, "--seeds", "0", "1"]) == 0               # the rest: sweep, seeds, samples, infilling
    r = json.loads(result.read_text())
    assert r["partial"] is False and r["arms"]["decoder"]["seeds"]["0"]["bound"] is False
    assert set(r["arms"]["diffusion"]["seeds"]) == {"0", "1"}
    assert r["registered"]["comparisons"] == planned and "added" not in r["registered"]    # unchanged since
    assert r["verdicts"] == common.decide(r) and r["verdicts"]["diffusion vs decoder"]["seeds"]["arm"] == ["1"]
    assert r["verdicts"]["diffusion vs decoder"]["verdict"] == "no verdict"          # one fresh seed a side
    settings = r["generation"]["settings"]
    assert [(s["block"], s["steps"]) for s in settings if s["sampler"] == "diffusion"] == \
        [(16, 2), (16, 4), (16, 32), (None, 2), (None, 4), (None, 32)]
    for s in settings:
        assert len(s["texts"]) == 2 and len(s["judge_nats"]) == 2 and all(math.isfinite(v) for v in s["judge_nats"])
        assert s["forward_passes_per_token"] == pytest.approx(s["forward_passes"] / 31)    # after <|endoftext|>
    assert {s["forward_passes"] for s in settings} == {2, 4, 31}    # N passes (at most one per mask); decoder: 31
    inf = r["infilling"]
    shipped = sha256_file(STORY_MODEL / "model.safetensors")        # every score names the judge that made it
    assert r["generation"]["judge"]["weights_sha256"] == inf["judge"]["weights_sha256"] == shipped
    assert inf["stories"] == 3 and inf["mean"]["original"]["exact"] == 1.0
    assert inf["example"] is None or inf["example"]["forward_passes"] == 4
    assert (tmp_path / "diffusion.png").exists() and "| diffusion, blocks of 16 | 4 |" in b.report(r)
    assert (tmp_path / "diffusion.png").stat().st_mtime_ns >= result.stat().st_mtime_ns   # drawn by the last write
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert set(before) == {f"{arm}-lr{lr}-s0" for arm in b.ARMS for lr in ("0.003", "0.01")} | \
        {f"{arm}-lr{r['arms'][arm]['best_lr']:g}-s1" for arm in b.ARMS}           # the sweep, then seed 1 at the best
    assert b.main([*opts, "--evaluate-only", "--seeds", "0", "1"]) == 0
    again = json.loads(result.read_text())
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before              # trained nothing
    assert again["arms"]["diffusion"]["mean_bits_per_byte"] == pytest.approx(r["arms"]["diffusion"]["mean_bits_per_byte"])


def test_the_registered_verdict_leaves_out_the_seed_that_chose_the_rate():
    b = bench
    assert b.registration([0, 1, 2])["diffusion vs decoder"]["seeds"] == ["1", "2"]
    assert b.registration([1])["diffusion vs decoder"]["seeds"] == ["1"]      # a process of one fresh seed
    result = _registered({"rates": [0.01], "seeds": [0, 1, 2], "arms": {
        "decoder": _arm([1.20, 1.40, 1.41]), "diffusion": _arm([1.50, 1.52, 1.51], stderr=0.002)}})
    b.summarise(result)
    fresh = result["verdicts"]["diffusion vs decoder"]
    assert fresh["seeds"] == {"arm": ["1", "2"], "reference": ["1", "2"]}
    difference, bound = _by_hand([1.52, 1.51], [1.40, 1.41])        # 0.11 against 4.30 x 0.0071 = 0.030
    assert fresh["verdict"] == "higher" and fresh["difference"] == pytest.approx(difference) == pytest.approx(0.11)
    assert fresh["bound"] == pytest.approx(bound)
    # decoder's seed 0, the run that chose its rate, is lucky (1.20): counted, it would hide the difference
    every = verdict.judge([1.50, 1.52, 1.51], [1.20, 1.40, 1.41])
    assert every["verdict"] == "no verdict" and every["bound"] > every["difference"]
    result["arms"]["decoder"]["seeds"]["0"]["bits_per_byte"] = 0.5   # luckier still: the verdict does not move
    b.summarise(result)
    assert result["verdicts"] == {"diffusion vs decoder": fresh}
    assert result["arms"]["decoder"]["fresh"]["seeds"] == ["1", "2"]
    assert result["arms"]["decoder"]["fresh"]["mean_bits_per_byte"] == pytest.approx(1.405)
