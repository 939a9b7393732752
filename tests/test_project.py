"""The project itself: install files agree, the two README commands exist, the numbers in docs/ match results/."""
import json
import re
import tomllib
from pathlib import Path

import yaml

import ablation
import compile_bench
import convergence
import diffusion_bench
import generation_bench
import layouts_bench
import recipes
import scale_bench
import scan_bench
import ssm_bench
import train_runs
import wiola_step_bench
from minwiola import quick_mode
from minwiola.lesson import check_environment, requirements

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
RESULTS = (DOCS / "results.md").read_text()     # every measurement, with its command and hardware
MODELS = (DOCS / "models.md").read_text()       # the presets
DATA = (DOCS / "data.md").read_text()           # the data pipeline, measured at full size
TRAINING = (DOCS / "training.md").read_text()   # the trainer, GPUs and the recipes per budget
LAYOUT = (DOCS / "layout.md").read_text()


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = PYPROJECT["project"]["dependencies"] + extras["dev"] + extras["hf"]
    assert sorted(r for r in pip if not r.startswith("-e")) == sorted(declared)
    assert "-e ." in pip
    assert any(str(d).startswith("python=3.11") for d in env["dependencies"])


def test_torch_is_pinned_only_by_the_constraints_file():
    torch_req = [r for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch")]
    assert torch_req == ["torch>=2.4"]                       # a lower bound only
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().split()
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def test_installed_metadata_matches_pyproject():
    # the environment check of lesson 00 reads these, so they must be what pyproject declares
    assert sorted(requirements()) == sorted(PYPROJECT["project"]["dependencies"])
    assert sorted(requirements("dev")) == sorted(PYPROJECT["project"]["optional-dependencies"]["dev"])
    assert sorted(requirements("hf")) == sorted(PYPROJECT["project"]["optional-dependencies"]["hf"])
    assert check_environment()


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    assert "make run" in README and "make test" in README
    assert "conda env create -f environment.yml" in README
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: setup\n\t\$\(BIN\)/python -m minwiola$", makefile, re.M)
    assert re.search(r"^test: setup\n.*-m pytest \$\(PYTEST_ARGS\)$", makefile, re.M)
    assert re.search(r"^PYTEST_ARGS \?=$", makefile, re.M)              # empty unless a caller gives some
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    assert "env -u MINWIOLA_DATA make test PYTEST_ARGS=tests" in ci      # a newcomer: no data at all (the lessons
    # run there through the student edition, tests/test_student.py)
    assert any(line.startswith("MINWIOLA_DATA=") and line.endswith("OMP_NUM_THREADS=1 make test") for line in ci)
    assert "export MINWIOLA_QUICK=1" in ci and "set -euo pipefail" in ci


def test_readme_findings_come_from_results():
    """The README's headline numbers are results/convergence.json's and the shipped model's."""
    from minwiola.generate import STORY_MODEL
    conv = json.loads((ROOT / "results" / "convergence.json").read_text())
    main, arms = conv["verdicts"]["wiola vs llama-style+width"], conv["arms"]
    shipped = json.loads((STORY_MODEL / "eval.json").read_text())
    found = README.split("## What the course found", 1)[1].split("\n## ", 1)[0]
    text = " ".join(found.split())
    for claim in (f"{arms['wiola']['params']:,} parameters", f"widened to {arms['llama-style+width']['params']:,}",
                  f"{arms['wiola']['mean_bits_per_byte']:.4f} against {arms['llama-style+width']['mean_bits_per_byte']:.4f}",
                  f"**{main['verdict']}** by {-main['difference']:.4f} bits per byte (bound {main['bound']:.4f})",
                  f"{conv['comparison']['wiola vs llama-style+width']['step_time_ratio']:.2f}x",
                  f"{shipped['bits_per_byte']:.4f} bits per byte"):
        assert claim in text, f"README's findings do not say {claim!r}"
    assert all(d < 0 for d in conv["comparison"]["wiola vs llama-style+width"]["paired"].values())
    assert "lower on every seed" in found
    plain, nats = conv["verdicts"]["wiola vs llama-style"], conv["comparison"]["wiola vs llama-style"]
    assert (f"is {-nats['difference_nats_per_token']:.4f} nats/token ({-plain['difference']:.4f} bits per byte), with "
            f"**{plain['verdict']}** (bound {plain['bound']:.4f})") in text
    gpu = json.loads((ROOT / "results" / "convergence_cs336.json").read_text())
    w, l = (gpu["arms"][a]["by_rate"][gpu["arms"][a]["best_lr"]] for a in ("wiola-cs336", "llama-cs336"))
    assert gpu["arms"]["wiola-cs336"]["best_lr"] == gpu["arms"]["llama-cs336"]["best_lr"] == "0.001"
    at = gpu["verdicts"]["at rate 0.001"]
    assert (f"{w['mean_bits_per_byte']:.4f} against {l['mean_bits_per_byte']:.4f} bits per byte at the rate both arms "
            f"chose (1e-3, inside the grid), **{at['verdict']}** (bound {at['bound']:.4f})") in text
    words = {r: gpu["verdicts"][f"at rate {r}"]["verdict"] for r in ("0.0003", "0.003", "0.01")}
    assert words == {"0.0003": "lower", "0.003": "no verdict", "0.01": "higher"}   # what the bullet says of them
    assert f"costs {gpu['step_time_ratio']:.2f}x" in found and found.count("**no verdict**") == 2


def test_readme_lists_every_lesson():
    lessons_doc = (DOCS / "lessons.md").read_text()
    for nb in sorted((ROOT / "lessons").glob("*.ipynb")):
        assert f"(lessons/{nb.name})" in README, f"{nb.name} is missing from the README's lesson table"
        assert f"(../lessons/{nb.name})" in lessons_doc, f"{nb.name} is missing from docs/lessons.md's table"


def test_layout_names_every_library_file():
    layout = LAYOUT.split("# Layout\n", 1)[1].split("```")[1]                  # the code block
    named = set(re.findall(r"^  (\S+\.py) ", layout, flags=re.M))             # the indented minwiola/ rows
    library = {f.name for f in (ROOT / "minwiola").glob("*.py")}                  # __init__.py holds code too
    assert named == library, f"docs/layout.md is wrong about {sorted(named ^ library)} (missing or gone)"
    rooms = set(re.findall(r"^    (\S+\.py) ", layout, flags=re.M))              # the rows of tools/ and classroom/
    files = {f.name for room in ("tools", "classroom") for f in (ROOT / "minwiola" / room).glob("*.py")}
    assert rooms | {"__init__.py"} == files, f"docs/layout.md is wrong about {sorted(rooms ^ files)} in the rooms"
    top = re.findall(r"^(\S+) ", layout, flags=re.M)                          # the repository's own rows
    assert len(top) >= 10 and all((ROOT / path).exists() for path in top if path not in ("data/", "runs/")), top
    assert "common.py" in layout and (ROOT / "benchmarks" / "common.py").is_file()


def test_tokenizer_numbers_come_from_results():
    bench = json.loads((ROOT / "results" / "tokenizer_bench.json").read_text())
    assert f"| {bench['train_seconds']:.2f} s |" in RESULTS
    assert f"| {bench['fast_mb_per_s']:.1f} MB/s |" in RESULTS
    assert f"| {bench['reference_mb_per_s']:.2f} MB/s |" in RESULTS
    assert f"({bench['train_megabytes']:.2f} MB)" in RESULTS
    assert f"| {bench['valid_bytes_per_token']:.2f} bytes/token |" in RESULTS
    assert bench["data"].startswith("TinyStories sample") and "TinyStories sample" in RESULTS


def test_benchmark_numbers_come_from_results():
    a = json.loads((ROOT / "results" / "attention_bench.json").read_text())
    T = max(r["T"] for r in a["rows"])
    for r in (r for r in a["rows"] if r["T"] == T):
        assert f"| {r['seconds'] * 1e3:.1f} ms | {r['peak_bytes'] / 2**20:.0f} MiB |" in RESULTS
    g = json.loads((ROOT / "results" / "generation_bench.json").read_text())
    rate, flat = g["tokens_per_s"], " ".join(RESULTS.split())          # sentences may wrap anywhere
    assert f"{rate['library']:,.0f} tokens/s with the KV cache, {rate['no cache']:,.0f} without" in flat
    assert f"writes {rate['reference']:,.0f} tokens/s, {rate['reference, inference mode']:,.0f} in inference mode" in flat
    assert f"runs at {g['library_over_reference']:.2f}x the reference ({g['library_over_reference_inference_mode']:.2f}x" in flat
    assert generation_bench.history_table(g) in RESULTS
    ours, plain = g["python"]["library"], g["python"]["reference, inference mode"]
    assert (f"the library makes {ours['python_calls_per_token']:.0f} Python-level calls against the reference's "
            f"{plain['python_calls_per_token']:.0f}, among them {ours['module_calls_per_token']:.0f} `nn.Module` calls "
            f"and {ours['module_lookups_per_token']:.0f} look-ups") in flat
    assert (f"One such look-up costs {g['lookup_us']['weight']:.2f} µs on this machine (Python 3.11), a plain "
            f"attribute {g['lookup_us']['plain attribute']:.2f} µs") in flat
    t = json.loads((ROOT / "results" / "train_bench.json").read_text())
    for r in t["rows"]:
        assert f"| `{r['preset']}` | {r['params']:,} | {r['tokens_per_s']:,} |" in RESULTS
    c = json.loads((ROOT / "results" / "train_bench_cs336.json").read_text())
    assert c["command"] in RESULTS
    for r in c["rows"]:
        assert f"| `{r['preset']}` | {r['params']:,} | {r['tokens_per_s']:,} | {r['seconds_per_step']:.3f} |" in RESULTS
    rows = {r["preset"]: r for r in [*c["rows"], *t["rows"]]}
    ratio = rows["wiola-cs336"]["seconds_per_step"] / rows["llama-cs336"]["seconds_per_step"]
    yocto_size = rows["wiola-yocto"]["seconds_per_step"] / rows["llama-style"]["seconds_per_step"]
    assert f"Wiola's training step costs {ratio:.2f}x LLaMA's at the CS336 shape and {yocto_size:.2f}x" in RESULTS
    training = " ".join((ROOT / "docs" / "training.md").read_text().split())
    for name in ("compile_bench", "compile_bench_llama"):
        compiled = json.loads((ROOT / "results" / f"{name}.json").read_text())
        assert compile_bench.sentence(compiled) in training
        assert compiled["largest_loss_difference"] < 1e-5               # "the two losses agree to 1e-6 nats"
    w = json.loads((ROOT / "results" / "wiola_step_bench.json").read_text())
    assert wiola_step_bench.arms_table(w) in RESULTS
    assert wiola_step_bench.history_table(w) in RESULTS
    wiola, gcla = w["arms"]["wiola"], w["arms"]["llama-style+gcla"]
    flat = " ".join(RESULTS.split())
    assert f"Wiola's step costs {wiola['time_ratio']:.2f}x LLaMA's for {wiola['flop_ratio']:.3f}x the FLOPs" in flat
    assert f"its {gcla['flop_ratio']:.2f}x FLOPs take {gcla['time_ratio']:.2f}x the time" in flat


def test_ablation_table_comes_from_results():
    result = json.loads((ROOT / "results" / "ablation.json").read_text())
    assert ablation.table(result) in RESULTS           # the table `--report` prints, verbatim
    assert result["command"] in RESULTS and result["data"].startswith("TinyStories sample")
    assert len(result["arms"]) == 14 and all(len(a["seeds"]) >= 3 for a in result["arms"].values())
    cal = result["atm_calibration"]
    assert f"tau = {cal['tau']}" in RESULTS and f"{cal['mu_at_paper_tau_0.92']:.1%} of the tokens at 0.92" in RESULTS


def test_convergence_tables_come_from_results():
    result = json.loads((ROOT / "results" / "convergence.json").read_text())
    assert convergence.report(result) in RESULTS        # what `--report` prints, verbatim
    assert result["data"].startswith("TinyStories sample")
    heading = re.search(r"\*\*([^*]+)\*\* \(`results/convergence\.json`", RESULTS).group(1)
    assert ("PARTIAL" in heading) == result["partial"]                 # the docs say so while runs are missing


def test_the_cs336_tables_come_from_results():
    result = json.loads((ROOT / "results" / "convergence_cs336.json").read_text())
    assert result["data"].startswith("TinyStories sample") and result["device"] in RESULTS
    runs = {a: result["arms"][a]["runs"] for a in ("wiola-cs336", "llama-cs336")}
    for label, v in result["verdicts"].items():                          # the verdicts table, row by row
        rate, seeds = label.split()[-1], v["seeds"]["arm"]
        paired = ", ".join(f"{runs['wiola-cs336'][rate][s]['bits_per_byte'] - runs['llama-cs336'][rate][s]['bits_per_byte']:+.4f}"
                           for s in seeds)
        assert (f"| {label} | {v['shape']}, {', '.join(seeds)} | {v['difference']:+.4f} | {v['bound']:.4f} | "
                f"{v['verdict']} | {paired} |") in RESULTS, label
    for name, arm in result["arms"].items():                             # the arms table, row by row
        for lr, r in arm["by_rate"].items():
            assert (f"| `{name}` | {arm['params']:,} | {float(lr):g} | {r['seeds']} | {r['mean_bits_per_byte']:.4f} | "
                    f"{r['spread_bits_per_byte']:.4f} |") in RESULTS, (name, lr)
    v = result["verdicts"]["at rate 0.001"]
    assert f"have **{v['verdict']}** at this shape ({v['difference']:+.4f}" in " ".join(RESULTS.split())


def test_story_model_comes_from_results():
    """The shipped model is the median seed of the convergence arm with the lowest three-seed mean (lesson 11
    section 8), its weights score what the result recorded, and docs/results.md quotes the command and the stories'
    statistics."""
    from minwiola.generate import STORY_MODEL
    conv = json.loads((ROOT / "results" / "convergence.json").read_text())
    complete = {n: a for n, a in conv["arms"].items() if len(a["seeds"]) == len(conv["seeds"]) and a["params"] <= 600_000}
    best = min(complete, key=lambda n: complete[n]["mean_bits_per_byte"])
    ranked = sorted(complete[best]["seeds"].values(), key=lambda s: s["bits_per_byte"])
    run = ranked[len(ranked) // 2]
    sq = json.loads((ROOT / "results" / "story_quality.json").read_text())
    made = json.loads((STORY_MODEL / "made.json").read_text())
    assert made["run"] == sq["run"] == run["run"], f"the rule picks {run['run']}; made.json: {made['run']}, story_quality.json: {sq['run']}"
    assert made["shipped_by"] == sq["command"] and made["params"] == complete[best]["params"]
    shipped = json.loads((STORY_MODEL / "eval.json").read_text())
    assert shipped["bits_per_byte"] == run["bits_per_byte"]        # the shipped weights are that run's best
    assert sq["command"].removeprefix("python ") in RESULTS and f"mean **{complete[best]['mean_bits_per_byte']:.4f} bits per byte**" in RESULTS
    for name, r in [*sq["settings"].items(), ("held-out stories", sq["reference"])]:
        assert f"| {name} | {r['stories']} | {r['distinct_1']:.3f} | {r['distinct_2']:.3f} | {r['repetition_2']:.3f} |" in RESULTS


def test_longer_run_comes_from_results():
    result = json.loads((ROOT / "results" / "quality_run.json").read_text())
    assert train_runs.table(result) in RESULTS and result["command"] in RESULTS
    (r,) = result["presets"].values()
    seeds = r["seeds"].values()
    assert len(seeds) >= 3
    # what docs/results.md says of these runs
    assert all(s["bits_per_byte"] < 1.10 for s in seeds) and r["mean_bits_per_byte"] < 1.05
    assert all(s["best_step"] == s["steps"] for s in seeds)


def test_atm_numbers_come_from_results():
    b = json.loads((ROOT / "results" / "atm_bench.json").read_text())
    assert f"a Wiola-shaped model of {b['params']:,} parameters" in RESULTS and b["command"] in RESULTS
    base = b["rows"][0]["median_seconds"]
    for r in b["rows"]:
        assert (f"| {r.get('measured_mu', 0):.3f} | {r['seconds_per_step']:.3f} | {r['median_seconds']:.3f} | "
                f"{r.get('flops_saving', 0):.1%} | {r.get('time_saving', 0):.1%} | "
                f"{1 - r['median_seconds'] / base:.1%} |") in RESULTS
    assert f"takes {b['merge_machinery_ms']['vectorised plan + merge + unmerge']:.1f} ms" in RESULTS
    assert b["data"].startswith("TinyStories sample")


def test_checkpointing_numbers_come_from_results():
    b = json.loads((ROOT / "results" / "checkpointing_bench.json").read_text())
    assert b["command"] in RESULTS and b["hardware"].rsplit(",", 1)[0] in RESULTS and b["threads"] == 2
    assert f"time is the median of {b['repeat']}\nsteps" in RESULTS
    for r in b["rows"]:
        assert (f"| `{r['preset']}` | {'on' if r['checkpointing'] else 'off'} | {r['peak_bytes'] / 2**20:.0f} MiB | "
                f"{r['seconds']:.3f} | {r['fastest']:.3f} - {r['slowest']:.3f} |") in RESULTS
    llama, wiola = b["summary"]["llama-style"], b["summary"]["wiola-yocto"]
    assert (f"saves {llama['memory_saving']:.0%} of a step's peak memory for `llama-style` and "
            f"{wiola['memory_saving']:.0%} for `wiola-yocto`") in RESULTS
    assert f"took {llama['time_ratio']:.2f}x the step time for `llama-style` and {wiola['time_ratio']:.2f}x" in RESULTS
    first_use = [on["warmup_bytes"] - off["warmup_bytes"] for off, on in zip(b["rows"][::2], b["rows"][1::2])]
    assert f"costs about {first_use[0] / 2**20:.0f} MiB once" in RESULTS
    steps = [t for r in b["rows"] for t in (r["fastest"], r["slowest"])]
    assert f"(steps from {min(steps):.2f} s to {max(steps):.2f} s)" in RESULTS
    # what docs/results.md says of them: checkpointing saves memory (at least a fifth); what is left is mostly the
    # logits' three B x T x V float32 tensors (log-softmax, its gradient, the logits' gradient); the first use
    # costs tens of MiB once in both presets
    assert all(s["memory_saving"] > 0.2 for s in b["summary"].values())
    from minwiola.model import preset
    B, T = map(int, re.match(r"batch (\d+) x (\d+) tokens", b["shape"]).groups())
    V = {preset(name).vocab_size for name in b["summary"]}.pop()
    logits = B * T * V * 4
    assert f"({B} x {T} x {V:,} numbers, {logits / 2**20:.0f} MiB in float32)" in RESULTS
    assert all(3 * logits > r["peak_bytes"] / 2 for r in b["rows"] if r["checkpointing"])
    assert all(30 * 2**20 < extra < 100 * 2**20 for extra in first_use)


def test_models_doc_names_every_preset():
    from minwiola.model import PRESETS
    missing = [name for name in PRESETS if f"`{name}`" not in MODELS]
    assert not missing, f"docs/models.md never names the preset(s) {missing}"


def test_models_doc_preset_parameter_counts():
    from minwiola.model import LanguageModel, preset
    for name in ("gpt2-style", "llama-style", "ssm-llama-style"):
        assert f"| {LanguageModel(preset(name)).n_params():,} |" in MODELS
    assert "| 484,272 (as published) |" in MODELS and LanguageModel(preset("yocto")).n_params() == 484_272
    from minwiola.budget import count_params
    for name in ("wiola-yocto", "wiola-story", "wiola-cs336", "wiola-120m", "wiola-360m", "wiola-700m", "wiola-1.5b"):
        c = preset(name)
        assert f"| `{name}` | {c.d} | {c.n_layers} | {c.n_heads} / {c.H_kv} |" in MODELS   # H_kv = H unless set
        assert f"| {c.d_ff_a} / {c.d_ff} | {count_params(c):,} |" in MODELS


def test_tokenizer_job_trains_and_saves_but_never_over_a_file_of_yours(tmp_path, capsys):
    from minwiola.tokenizer import Tokenizer
    from minwiola.tools.data_cli import main
    out = tmp_path / "tok.bpe"
    assert main(["tokenizer", "--vocab-size", "300", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "trained Tokenizer(vocab_size=300" in printed and "bytes/token" in printed and "data:" in printed
    assert Tokenizer.load(out).vocab_size == 300
    assert main(["tokenizer", "--vocab-size", "300", "--out", str(out)]) == 1           # there is one already
    assert "--overwrite" in capsys.readouterr().err
    assert main(["tokenizer", "--vocab-size", "280", "--out", str(out), "--overwrite"]) == 0
    assert Tokenizer.load(out).vocab_size == 280
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["tokenizer", "--out", str(tmp_path / "notes.txt"), "--overwrite"]) == 1
    assert (tmp_path / "notes.txt").read_text() == "mine" and "left alone" in capsys.readouterr().err
    assert main(["tokenizer", "--vocab-size", "10", "--out", str(tmp_path / "small.bpe")]) == 1
    assert capsys.readouterr().err.startswith("error: vocab_size must be at least")


def test_the_tokenizer_never_imports_data_and_the_model_never_imports_the_tokenizer():
    import ast
    for module, banned in [("tokenizer", "data"), ("model", "tokenizer")]:
        tree = ast.parse((ROOT / "minwiola" / f"{module}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {banned, f"minwiola.{banned}"} & imported, f"{module}.py imports {banned}"


def test_quick_mode_switch(monkeypatch):
    for value, expected in [("1", True), ("0", False), ("", False)]:
        monkeypatch.setenv("MINWIOLA_QUICK", value)
        assert quick_mode() is expected
    monkeypatch.delenv("MINWIOLA_QUICK")
    assert quick_mode() is False


def test_results_doc_names_the_hardware_of_the_training_results():
    for name in ("ablation", "quality_6000"):
        result = json.loads((ROOT / "results" / f"{name}.json").read_text())
        block = RESULTS.split(f"`results/{name}.json`", 1)[1][:400]
        assert result["hardware"] in block, f"docs/results.md names other hardware than results/{name}.json"


def test_extrapolation_table_comes_from_results():
    import statistics
    r = json.loads((ROOT / "results" / "extrapolation.json").read_text())
    assert f"gathered by `{r['command']}`" in RESULTS and r["data"].startswith("TinyStories sample")
    for name, a in r["encodings"].items():
        at_L = statistics.mean(s["nats_per_token_at_L"] for s in a["seeds"].values())
        assert (f"| {name} | {len(a['seeds'])} | {a['gap']:+.3f} | {a['spread']:.3f} | {a['verdict']} | "
                f"{at_L:.3f} |") in RESULTS, name


def test_ssm_tables_come_from_results():
    r = json.loads((ROOT / "results" / "ssm_bench.json").read_text())
    assert r["data"].startswith("TinyStories sample") and "TinyStories sample" in RESULTS
    assert r["command"] in RESULTS and r["costs"]["command"] in RESULTS          # the commands that wrote them
    for line in ssm_bench.report(r).splitlines():       # every row of the three tables
        assert line in RESULTS, line
    arms, v = r["arms"], r["verdicts"]
    s4d, selective = v["ssm-llama-style vs llama-style"], v["selective vs llama-style"]
    long = {name: next(iter(arm["long"].values())) for name, arm in arms.items() if arm.get("long")}
    recall = long["ssm-llama-style"]["probe"]["recall"]["loss"] - long["llama-style"]["probe"]["recall"]["loss"]
    text = " ".join(RESULTS.split())
    for claim in (f"S4D is **{s4d['verdict']}**: {-s4d['difference']:.2f} bits per byte below attention, paired by "
                  f"seed, the bound being {s4d['bound']:.2f}",
                  f"layer is {-selective['difference']:.2f} below attention but has **{selective['verdict']}**",
                  f"its bound is {selective['bound']:.2f}",
                  f"{long['ssm-llama-style']['bits_per_byte'] - long['llama-style']['bits_per_byte']:.2f} bits per byte",
                  f"{recall:.2f} nats lower",
                  f"{long['llama-style']['probe']['recall']['top1']:.0%} of the time against the SSM's "
                  f"{long['ssm-llama-style']['probe']['recall']['top1']:.0%}"):
        assert claim in text, claim


def test_lesson_00_maps_every_lesson():
    cells = json.loads((ROOT / "lessons" / "00_start_here.ipynb").read_text())["cells"]
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    rows = set(re.findall(r"^\| (\d\d) \|", prose, flags=re.M))
    lessons = {path.name[:2] for path in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")}
    assert rows == lessons, f"lesson 00's map is wrong about lesson(s) {sorted(rows ^ lessons)}"


def test_scan_table_comes_from_results():
    r = json.loads((ROOT / "results" / "scan_bench.json").read_text())
    assert scan_bench.table(r) in RESULTS and "OMP_NUM_THREADS=2 python benchmarks/scan_bench.py" in RESULTS
    indexed = [row["seconds"]["loop, indexed"] for row in r["lengths"].values()]
    assert f"grew {indexed[1] / indexed[0]:.0f}-fold from 128 to 1,024 tokens" in " ".join(RESULTS.split())
    assert all(min(row["seconds"].values()) == row["seconds"]["loop"] for row in r["lengths"].values())  # "neither beats"


def test_diffusion_tables_come_from_results():
    r = json.loads((ROOT / "results" / "diffusion_bench.json").read_text())
    assert r["data"].startswith("TinyStories sample") and not r["partial"]
    section = RESULTS.split("**Masked diffusion against a decoder**")[1].split("\n**")[0]
    assert "(partial)" not in section and "python benchmarks/diffusion_bench.py --evaluate-only" in section
    for line in diffusion_bench.report(r).splitlines():       # every row of the three tables
        assert line in section, line
    v, arms = r["verdicts"]["diffusion vs decoder"], r["arms"]
    text = " ".join(section.split())
    for claim in (f"{v['difference']:+.4f} bits per byte", f"the rule's bound of {v['bound']:.4f}",
                  f"at most {arms['diffusion']['max_stderr_bits_per_byte']:.4f}", v["verdict"]):
        assert claim in text, claim


def test_layouts_tables_come_from_results():
    r = json.loads((ROOT / "results" / "layouts.json").read_text())
    assert r["data"].startswith("TinyStories sample") and not r["partial"]
    section = RESULTS.split("**Three layouts on one task**")[1].split("\n**")[0]
    assert "python benchmarks/layouts_bench.py --report" in section
    for line in layouts_bench.report(r).splitlines():        # every row of both tables
        assert line in section, line
    v = r["verdicts"]["encdec vs decoder"]
    text = " ".join(section.split())
    for claim in (f"has **{v['verdict']}** against the decoder: {v['difference']:+.3f} nats per target token, bound "
                  f"{v['bound']:.3f}",
                  f"seeds {' and '.join(map(str, r['seeds']))}", f"{r['steps']:,} steps of {r['batch_size']} windows"):
        assert claim in text, claim
    restored = {f"{arm['mean_spans_restored']:.1%}" for arm in r["arms"].values()}
    assert restored == {"0.3%"}, "the prose says each arm restores 0.3% of the spans"


def test_real_size_tables_come_from_results():
    """The scale table, the resume sentence (docs/data.md) and the recipes table (docs/training.md) are
    what the result files hold."""
    section = DATA.split("## The full download, at its real size")[1].split("\n## ")[0]
    scale = json.loads((ROOT / "results" / "scale_bench.json").read_text())
    assert not scale["partial"] and all(t.get("met") is not False for k, t in scale["targets"].items()
                                        if k not in ("resume", "failed_steps"))
    for line in scale_bench.docs_table(scale).splitlines():
        assert line in section, line
    fixed = json.loads((ROOT / "results" / "scale_bench_resume.json").read_text())["targets"]["resume"]
    text = " ".join(section.split())
    assert fixed["met"] and fixed["ids_equal"] and fixed["orphans_after_kill"] == 0
    assert (f"killed after {fixed['done_at_kill']:.0%} of its ids" in text and
            f"{fixed['fraction_of_cold_cpu']:.2f} of the cold pass's CPU time" in text)
    recipe_rows = json.loads((ROOT / "results" / "recipes.json").read_text())
    section = TRAINING.split("## One GPU, and several")[1].split("\n## ")[0]
    for line in recipes.report(recipe_rows).splitlines():
        assert line in section, line
