"""benchmarks/wiola_step_bench.py: the arms it compares hold what it says (equal parameters, one part each), ATM
merges the share asked for, and a run writes its ratios and keeps the history."""
import json

import wiola_step_bench as bench
from minwiola import atm
from minwiola.budget import count_params
from minwiola.model import LanguageModel, preset


def test_the_arms_are_the_comparisons_the_docstring_names():
    configs = {name: preset(p, **o) for name, (p, o) in bench.arms(0.5).items()}
    reference, wiola = count_params(configs[bench.REFERENCE]), count_params(configs[bench.WIOLA])
    assert reference == 512_576 and wiola == 513_156                   # equal parameters, to 0.11%
    for part in ("norm", "srpe", "dsff", "gcla", "atm"):
        changed = {k for k, v in vars(configs[f"llama-style+{part}"]).items() if v != getattr(configs["llama-style"], k)}
        assert changed and changed <= {"norm", "positions", "ffn", "d_ff_a", "d_ff", "gcla", "atm", "atm_tau"}
    assert bench.reference_of(bench.WIOLA) == bench.REFERENCE and bench.reference_of("llama-style+gcla") == "llama-style"


def test_the_threshold_merges_the_share_asked_for():
    import torch
    ids = torch.randint(0, 4096, (2, 65))
    tau = bench.merge_threshold(ids, 0.11)
    torch.manual_seed(0)
    model = LanguageModel(preset("llama-style", **bench.arms(tau)[bench.WIOLA][1]))
    mu = atm.merge_ratio(atm.merge_plan(atm.atm_similarities(model, ids[:, :-1]), tau))
    assert abs(mu - 0.11) < 0.02


def test_a_run_writes_its_ratios_and_keeps_the_history(tmp_path, capsys):
    result = tmp_path / "steps.json"
    argv = ["--batch", "2", "--block", "16", "--repeat", "1", "--result", str(result)]
    assert bench.main([*argv, "--change", "a change"]) == 0
    out = json.loads(result.read_text())
    assert set(out["arms"]) == set(bench.arms(0.5)) and out["history"][0]["change"] == "a change"
    assert out["arms"][bench.REFERENCE]["time_ratio"] == 1 and out["arms"][bench.REFERENCE]["flop_ratio"] == 1
    assert out["arms"]["llama-style+gcla"]["flop_ratio"] > 1                  # GCLA adds arithmetic
    assert bench.main(argv) == 0 and len(json.loads(result.read_text())["history"]) == 1
    capsys.readouterr()
    assert bench.main(["--report", "--result", str(result)]) == 0
    assert "| a change |" in capsys.readouterr().out
