"""Where each property the Wiola paper tests is covered here.

The paper says 22 unit tests pass (section XIV, Table IX) but its table is lost; the text names the properties
below. Each row gives the test (file::function) that checks it here, in float64 where precision matters. Where the
paper's own test could not fail (its 1e-4 "BF16" incremental bound), ours is stricter, and the literal forms of
GCLA and ATM are shown to fail it.

| property the paper describes | our test |
|---|---|
| logits have shape (B, T, V) | test_model.py::test_shapes_and_tied_head |
| the head is tied to the embedding (eq. 7) | test_model.py::test_shapes_and_tied_head |
| causal: a later token never changes an earlier logit | test_model.py::test_causality |
| incremental (cached) decoding equals the full forward | test_model.py::test_cached_decoding_matches_the_full_forward |
| ... with GCLA, only for the causal summaries | test_gcla_atm.py::test_chunked_cache_matches_full_forward_only_for_causal_summaries |
| ... and why a 1e-4 bound cannot tell | test_gcla_atm.py::test_a_1e4_tolerance_incremental_test_cannot_see_the_literal_leak_at_small_init |
| parameter count of every size (section X) | test_budget.py::test_analytic_count_equals_the_instantiated_model |
| wiola-360m is 360M | test_budget.py::test_wiola_sizes_and_their_dsff_widths |
| WiolaRMSNorm with delta = 0 is RMSNorm (eq. 9) | test_wiola_parts.py::test_parameters_are_gamma_and_delta_and_zero_delta_is_rmsnorm |
| WiolaRMSNorm's gradient (eq. 10, corrected) | test_wiola_parts.py::test_hand_written_backward_passes_gradcheck |
| eq. 10 as printed holds only at gamma = 1 | test_wiola_parts.py::test_paper_eq10_is_right_only_when_gamma_is_one |
| SRPE with a_s = 0 and 1/k_s = 0 is RoPE | test_wiola_parts.py::test_srpe_shapes_and_rope_limit |
| SRPE is RoPE with scaled frequencies times a radius | test_wiola_parts.py::test_srpe_is_scaled_rope_times_a_radius |
| SRPE's score is relative (eq. 19): only with srpe_radius="offset" | test_wiola_parts.py::test_offset_radius_keeps_the_score_relative_and_the_paper_radius_does_not |
| GCLA's blend starts at beta = sigmoid(-3) | test_gcla_atm.py::test_gcla_parameters_and_initial_blend |
| GCLA with beta = 0 is gated self-attention | test_gcla_atm.py::test_gcla_equals_gated_self_attention_when_beta_is_zero |
| GCLA does not leak the future (causal summaries) | test_gcla_atm.py::test_literal_summary_leaks_the_last_token_and_causal_does_not |
| ATM's merge follows Algorithm 1 | test_gcla_atm.py::test_vectorised_merge_plan_equals_algorithm_1 |
| ATM restores the original length (eq. 32) | test_gcla_atm.py::test_merge_and_unmerge |
| ATM runs in the middle third of the layers | test_gcla_atm.py::test_atm_layers_are_the_middle_third |
| ATM does not leak the future (copy-forward) | test_gcla_atm.py::test_literal_atm_leaks_and_copy_forward_does_not |
| DSFF with W_f = 0 is the average of the streams (eq. 37) | test_wiola_parts.py::test_dsff_starts_as_an_average_and_its_gate_can_learn |
| DSFF mixes with alpha and 1 - alpha | test_wiola_parts.py::test_dsff_mixes_with_alpha_and_one_minus_alpha |
| GQA groups query heads over shared key/value heads | test_core.py::test_gqa_equals_mha_with_copied_heads |
| KV-cache memory (eq. 38, corrected) | test_budget.py::test_kv_cache_formula_and_the_papers_figure |
| attention FLOPs (eqs. 39-41, corrected) | test_budget.py::test_layer_flops_match_pytorch_flop_counter |
| weights save and load (safetensors) | test_budget.py::test_save_and_load_round_trip |
| the loss at initialisation is ln V | test_model.py::test_loss_at_initialisation_is_close_to_log_v |

How this file checks the table. Running the named tests again here would take about half a minute (88 cases) on the
project's 2-core machine, and they run anyway in the same suite (every file in tests/). What the suite cannot see
is a table that points at the wrong place, so this file checks, by reading the test files with `ast` (well under a
second): every row of the table names file::function in the form above (a malformed row would otherwise drop out
silently); the file exists; the function is a top-level `test_` function defined once (pytest collects only the
last of two definitions of one name); it carries no skip or xfail mark; and it checks something: at least one
`assert` that reads a value computed at run time (not arithmetic on literals, which cannot fail), or a
`pytest.raises` or `pytest.warns`.
"""
import ast
import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROW = re.compile(r"\| ([\w.]+\.py)::(\w+) \|")


def table_rows(doc: str) -> list[tuple[str, str]]:
    """The (file, function) of every row of the table in `doc`; a row that does not name one fails."""
    lines = [line for line in doc.splitlines() if line.startswith("|")][2:]   # skip the header and its rule
    rows = []
    for line in lines:
        match = ROW.search(line)
        assert match, f"a table row names no file::test: {line}"
        rows.append(match.groups())
    return rows


def is_constant(node: ast.AST) -> bool:
    """True if `node` holds no name, attribute or call: literals and operators only, so its value never changes."""
    return not any(isinstance(n, (ast.Name, ast.Attribute, ast.Call)) for n in ast.walk(node))


def checks(function: ast.FunctionDef) -> list[str]:
    """What in `function` can fail: asserts of run-time values and pytest.raises / pytest.warns calls."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assert) and not is_constant(node.test):
            found.append("assert")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"
              and node.func.attr in ("raises", "warns")):
            found.append(f"pytest.{node.func.attr}")
    return found


def marks(function: ast.FunctionDef) -> set[str]:
    """The pytest.mark names on `function` (parametrize, skip, skipif, xfail, ...)."""
    out = set()
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) \
                and target.value.attr == "mark":
            out.add(target.attr)
    return out


def check_row(file: str, name: str, folder: Path = HERE) -> None:
    """Fail unless `folder/file` defines exactly one top-level, unskipped test `name` that can fail."""
    path = folder / file
    assert path.is_file(), f"the table names {file}, which does not exist"
    tree = ast.parse(path.read_text())
    defined = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    assert name.startswith("test_") and defined, f"{file} has no top-level test {name}"
    assert len(defined) == 1, f"{file} defines {name} {len(defined)} times: pytest runs only the last"
    assert not marks(defined[0]) & {"skip", "skipif", "xfail"}, f"{file}::{name} is skipped or expected to fail"
    assert checks(defined[0]), f"{file}::{name} has no assert on a computed value and no pytest.raises/warns"


def test_every_row_names_a_test_that_checks_something():
    rows = table_rows(__doc__)
    assert len(rows) >= 22                                       # at least as many as the paper claims
    for file, name in rows:
        check_row(file, name)


def test_the_table_check_catches_a_wrong_row(tmp_path):
    """The check above must be able to fail: a row pointing at each kind of wrong test is refused."""
    (tmp_path / "test_fake.py").write_text(
        "import pytest\n"
        "def test_sound():\n    assert len('ab') == 2\n"
        "def test_tautology():\n    x = 1\n    assert 3 * 12 * (8 * 12 / 3) == 2 * 12 * 48\n"
        "def test_no_check():\n    len('ab')\n"
        "@pytest.mark.skip(reason='later')\ndef test_skipped():\n    assert len('ab') == 2\n"
        "def test_twice():\n    assert len('ab') == 2\n"
        "def test_twice():\n    pass\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n")
    check_row("test_fake.py", "test_sound", tmp_path)
    check_row("test_fake.py", "test_raises", tmp_path)
    for name, why in [("test_tautology", "no assert on a computed value"), ("test_no_check", "no assert"),
                      ("test_skipped", "skipped"), ("test_twice", "2 times"), ("test_missing", "no top-level")]:
        with pytest.raises(AssertionError, match=why):
            check_row("test_fake.py", name, tmp_path)
    with pytest.raises(AssertionError, match="does not exist"):
        check_row("test_gone.py", "test_sound", tmp_path)
    with pytest.raises(AssertionError, match="names no file::test"):
        table_rows("| a | b |\n|---|---|\n| fine | test_core.py::test_ffns |\n| typo | test_core.py:test_ffns |\n")
