"""benchmarks/layouts_bench.py's design: the two arms hold equal parameters, the decoder-only arm's loss
is taken on the target positions only, both greedy decoders are plain argmax loops, the held-out pairs are fixed,
and a tiny run end to end: results, resume after a kill, --evaluate-only."""
import json

import pytest
import torch

import analysis
import common as common_module
import layouts_bench
from minwiola.budget import count_params, encdec_params
from minwiola.encdec import restore
from minwiola.model import LanguageModel, preset
from minwiola.tokenizer import default_tokenizer

TINY = ["--shape", '{"d": 16, "n_layers": 1, "n_heads": 2}', "--window", "32", "--steps", "4", "--save-every", "2",
        "--eval-windows", "4", "--decode-windows", "3"]


def test_the_arms_hold_equal_parameters_and_the_costs_are_the_llama_widths():
    b = layouts_bench
    c = b.configs(4096, 128)
    assert encdec_params(c["encdec"]) == 731_008
    assert abs(count_params(c["decoder"]) - 731_008) / 731_008 < 0.001          # 731,200: within 0.1%
    assert c["decoder"].n_layers == 2 * c["encdec"].n_layers == 8 and c["encdec"].d == c["decoder"].d == 64
    costs = b.costs(128, 4096)
    assert (costs["source_len"], costs["target_len"]) == (115, 25)              # 128 - 19 + 6, 19 + 6
    assert costs["layouts"]["encoder-decoder"]["params"] == 731_008
    assert costs["layouts"]["decoder-only"]["params"] == 463_936                 # llama-style with V = 4,104


def test_the_decoder_only_loss_counts_the_target_positions_only():
    b = layouts_bench
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama", vocab_size=72, context=16)).double()
    src, tgt = torch.randint(0, 64, (2, 6)), torch.randint(0, 64, (2, 4))
    logits = torch.log_softmax(model(torch.cat([src, torch.full((2, 1), 63), tgt[:, :-1]], 1)), -1)
    by_hand = -torch.stack([logits[r, 6 + j, tgt[r, j]] for r in range(2) for j in range(4)]).mean()
    assert b.target_loss("decoder", model, src, tgt, 63).item() == pytest.approx(by_hand.item(), abs=1e-12)


@pytest.mark.parametrize("name", ["encdec", "decoder"])
def test_greedy_decoding_is_an_argmax_loop(name):
    b = layouts_bench
    torch.manual_seed(0)
    cfg = preset("tiny-llama", init_std=0.3, context=16)
    model = b.build(name, cfg).double().eval()
    src = torch.randint(0, 64, (2, 6))
    out = b.decode(name, model, src, 5, 1)
    tgt = torch.full((2, 1), 1)
    for _ in range(5):                                             # the whole target recomputed each step
        logits = model(src, tgt) if name == "encdec" else model(torch.cat([src, tgt], 1))
        tgt = torch.cat([tgt, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, tgt[:, 1:])


def test_held_out_pairs_are_fixed_and_invertible():
    b = layouts_bench
    tok = default_tokenizer()
    x, src, tgt = b.held_out(tok, 5, 32, seed=7)
    again = b.held_out(tok, 5, 32, seed=7)
    assert x.shape == (5, 32) and src.shape == (5, 32 - 5 + 2) and tgt.shape == (5, 5 + 2)
    assert all(torch.equal(a, c) for a, c in zip((x, src, tgt), again))
    assert torch.equal(restore(src, tgt, tok.vocab_size), x)


def test_a_tiny_run_end_to_end_resumes_after_a_kill(tmp_path, monkeypatch):
    b = layouts_bench
    result = tmp_path / "layouts.json"
    common = [*TINY, "--runs", str(tmp_path / "runs"), "--result", str(result)]
    assert b.main([*common, "--seeds", "0"]) == 0
    r = json.loads(result.read_text())
    assert r["partial"] is False and set(r["arms"]) == {"encdec", "decoder"}
    assert r["registered"]["comparisons"] == b.registration([0])         # registered before the runs: paired, seed 0
    assert r["verdicts"] == common_module.decide(r)
    one = r["verdicts"]["encdec vs decoder"]
    assert one["shape"] == "paired" and one["bound"] is None and one["verdict"] == "no verdict"   # one seed: no noise
    for arm in r["arms"].values():
        seed = arm["seeds"]["0"]
        assert seed["nats_per_target_token"] > 0 and 0 <= seed["spans_restored"] <= 1
        assert 0 <= seed["hidden_tokens_right"] <= 1
        assert seed["nats_per_target_token_other_source"] != seed["nats_per_target_token"]     # it reads the source
        assert seed["spans"] == 3 * 2 and len(seed["example"]["spans"]) == 2       # 32 tokens: 5 hidden in 2 spans
        assert len(seed["example"]["model_target_ids"]) == 7
    for key in ("command", "commit", "hardware", "threads", "torch", "data"):
        assert key in r
    assert r["costs"]["layouts"]["encoder-decoder"]["layers"] == 8             # (a) is at llama width always
    assert r["arms"]["encdec"]["seeds"]["0"]["train_curve"]["steps"] == [1, 2, 3, 4]
    assert (tmp_path / "layouts.png").exists()

    # a kill after the first checkpoint of seed 1, then a resume: the same weights as an uninterrupted run
    real_save = b.save

    def killed(path, state):
        real_save(path, state)
        if path.name == "checkpoint.pt":
            raise KeyboardInterrupt
    monkeypatch.setattr(b, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        b.main([*common, "--seeds", "0", "1", "--arms", "encdec"])
    monkeypatch.setattr(b, "save", real_save)
    assert (tmp_path / "runs" / "encdec-s1" / "checkpoint.pt").exists()
    assert b.main([*common, "--seeds", "0", "1"]) == 0
    assert not (tmp_path / "runs" / "encdec-s1" / "checkpoint.pt").exists()
    assert b.main([*common, "--seeds", "1", "--arms", "encdec", "--runs", str(tmp_path / "whole"),
                   "--result", str(tmp_path / "whole.json")]) == 0
    resumed = torch.load(tmp_path / "runs" / "encdec-s1" / "final.pt", weights_only=False)
    whole = torch.load(tmp_path / "whole" / "encdec-s1" / "final.pt", weights_only=False)
    assert resumed["losses"] == whole["losses"]
    assert all(torch.equal(resumed["model"][k], whole["model"][k]) for k in whole["model"])

    r = json.loads(result.read_text())
    assert r["partial"] is False and set(r["arms"]["decoder"]["seeds"]) == {"0", "1"}
    assert r["registered"]["comparisons"] == b.registration([0, 1]) and r["verdicts"] == common_module.decide(r)
    assert r["verdicts"]["encdec vs decoder"]["seeds"] == {"arm": ["0", "1"], "reference": ["0", "1"]}
    assert b.main([*common, "--seeds", "0", "1", "--evaluate-only"]) == 0     # the settings that trained them:
    kept = json.loads(result.read_text())
    assert kept["command"] == r["command"] and "--evaluate-only" not in r["command"]   # the training command kept
    assert "--evaluate-only" in kept["evaluated_by"] and kept["partial"] is False
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert b.main([*common, "--seeds", "0", "1", "2", "--evaluate-only"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before          # trained nothing, not even seed 2
    again = json.loads(result.read_text())
    assert again["partial"] is True and set(again["arms"]["encdec"]["seeds"]) == {"0", "1"}
    assert again["registered"]["comparisons"] == b.registration([0, 1, 2]) and again["verdicts"] == {}   # seed 2 due
    assert again["arms"]["encdec"]["mean_nats_per_target_token"] == \
        pytest.approx(r["arms"]["encdec"]["mean_nats_per_target_token"])


def test_the_sort_task_is_stored_beside_the_span_corruption_runs_and_needs_the_source(tmp_path):
    """--task sort trains both arms on the synthetic task and adds only the result's "sort" entry; the target is
    fixed by the source alone, and after a short run each arm reads it: another row's source costs whole nats."""
    b = layouts_bench
    src, tgt = analysis.sort_task(5, torch.Generator().manual_seed(0))
    assert torch.equal(tgt, src.sort(1).values) and src.shape == (5, b.SPAN) and int(src.max()) < b.DIGITS
    cfgs = b.sort_configs()
    assert abs(count_params(cfgs["decoder"]) - encdec_params(cfgs["encdec"])) < 0.01 * encdec_params(cfgs["encdec"])
    result = tmp_path / "layouts.json"
    result.write_text(json.dumps({"command": "python benchmarks/layouts_bench.py", "arms": {"kept": 1}}))
    assert b.main(["--task", "sort", "--sort-steps", "150", "--seeds", "0", "--result", str(result)]) == 0
    r = json.loads(result.read_text())
    assert r["arms"] == {"kept": 1} and r["sort"]["steps"] == 150 and r["sort"]["seeds"] == [0]
    for arm in r["sort"]["arms"].values():
        seed = arm["seeds"]["0"]
        assert seed["nats_per_target_token_other_source"] > seed["nats_per_target_token"] + 1
        assert 0 <= seed["targets_exact"] <= 1 and len(seed["train_curve"]["loss"]) > 0
    assert "| sort task arm |" in b.report_sort(r)
