"""Every number a lesson's text states comes from a cell: no typed number can go stale.

For each lesson, the numbers in its markdown are read (math between $...$ and `code` left out: those are formulas
and names, not measurements) and each must appear, at the precision the sentence gives it, among:

* the lesson's code cells and their stored outputs (a value set in code, printed, or drawn in a table), or
* the results files the lesson reads (`results" / "NAME.json"` in its code), every number in them;
* the library's presets (minwiola.model.PRESETS: every field, and each preset's parameter count), the shapes a
  lesson describes.

"At the precision given": 0.315 matches any 0.3145 <= x < 0.3155; 463K matches 463,000 +- 500; 1.58x matches
1.58; a percentage matches itself, its fraction or a ratio it describes (10.7% matches 10.7, 0.107, 1.107, 0.893). What is not a measurement is left out by rule, not by hand: references
(eq. 19, eqs. 11-18, lesson 06, section 9.2, exercise 3, Algorithm 1, §XIV, arXiv ids), the numbering of headings,
whole numbers up to 10, and years. What remains and is still not a measurement (a constant of nature, a rate a
sentence assumes) sits in ALLOWED below, per lesson, each with its reason: a short list a reviewer reads.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))

# a number, not part of a name (wiola-360m, gpt2, U+0301, llama-cs336): no letter or "-" after a letter before it,
# no letter after it but a K/M/B suffix or an "x" (1.58x)
NUMBER = re.compile(r"(?<![\w.+])(?<![A-Za-z]-)[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-−+]?\d+)?"
                    r"(?: ?(?:[KMGT]i?B|[KMB])(?![a-zA-Z]))?(?:%|x(?![a-zA-Z])|(?![\w]))")
REFERENCE = re.compile(r"(?:\beqs?\.|\bequations?|§|\blessons?|\bsections?|\bexercises?|\bAlg(?:orithm)?\.?|"
                       r"\bcells?|\bTable|\bFig(?:ure)?\.?|\bstage|arXiv:?|\bslides?)\s*"
                       r"[\dIVXL]+(?:[.\d]*)(?:\s*(?:[-–,]|and|to)\s*[\dIVXL]+(?:[.\d]*))*", re.I)
HEADING = re.compile(r"^(#+\s*)[\d.]+", re.M)
SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2**10, "MiB": 2**20,
          "GiB": 2**30, "TiB": 2**40}

# lesson stem -> {number as written: why it is not read from a cell}
ALLOWED: dict[str, dict[str, str]] = {
    "02_attention": {"1e-6": "a tolerance named to say why the test is exact, not a measurement"},
    "03_llama_block": {"7.5": "arithmetic on the cited papers' numbers: 1.0T tokens / 6.7B parameters / Chinchilla's 20"},
    "04_inference": {"99%": "follows in the sentence from 'a few hundred operations per byte read'",
                     "9.58": "the Yocto README's perplexity, quoted to say it cannot be compared"},
    "06_srpe": {"45": "the lesson's time to read and do, an estimate (lesson 00 says how they are made)",
                "17": "an equation number in the table's 'equation' column", "18": "the same"},
    "08_gcla": {"21": "an equation number in the table's 'eq.' column"},
    "11_training": {"65,504": "float16's largest finite value, a property of the format (torch.finfo)"},
    "10_wiola_model": {"27": "how many configs exercise 1's check runs (lessons/exercises/lesson10.py)",
                       "68": "GPT-2's byte-to-character table, which exercise 2 builds and its check tests",
                       "127": "the same", "173": "the same",
                       "4,095": "the shipped tokenizer's tokens but the special one, which exercise 2's check runs"},
}


def numbers(text: str, scaled: bool = True) -> list[tuple[str, float, float]]:
    """(as written, value, half-width of its last digit) for each number in `text`, a suffix or unit applied
    (463K, 493 M, 19.4 MB; `scaled=False`: as the digits read). A whole number ending in zeros is taken as rounded
    to them ("about 145,000" is 144,500 to 145,500)."""
    found = []
    for match in NUMBER.finditer(text):
        raw = match.group()
        s = raw.replace("−", "-").rstrip("%x")
        unit = re.search(r" ?([KMGT]i?B|[KMB])$", s)
        scale = SUFFIX[unit.group(1)] if unit and scaled else 1.0
        s = s[:unit.start()] if unit else s
        s = s.replace(",", "")
        try:
            value = float(s)
        except ValueError:
            continue
        mantissa = s.lower().split("e")[0]
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        exponent = int(s.lower().split("e")[1]) if "e" in s.lower() else 0
        if decimals == 0 and exponent == 0 and abs(value) >= 100:
            exponent = len(mantissa) - len(mantissa.rstrip("0"))
        found.append((raw, value * scale, 0.5 * 10.0 ** (exponent - decimals) * scale))
    return found


def _walk(value, out: list[float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, dict):
        for key, item in value.items():
            out.extend(v for _, v, _ in numbers(str(key)))
            _walk(item, out)
    elif isinstance(value, list):
        for item in value:
            _walk(item, out)
    elif isinstance(value, str):
        out.extend(v for _, v, _ in numbers(value))


def evidence(nb: dict) -> list[float]:
    """Every number in the lesson's code, its stored outputs and the results files its code reads."""
    values: list[float] = []
    code = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        texts = ["".join(cell["source"])]
        code.append(texts[0])
        for out in cell.get("outputs", []):
            texts.append("".join(out.get("text", "")))
            texts += ["".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
        for text in texts:
            values.extend(v for scaled in (True, False) for _, v, _ in numbers(text, scaled))   # 477 M: both
    for name in sorted(set(re.findall(r'results"\s*/\s*"([\w.-]+\.json)"', "\n".join(code)))):
        path = ROOT / "results" / name
        if path.exists():
            _walk(json.loads(path.read_text()), values)
    return sorted(values + PRESET_NUMBERS)


def _preset_numbers() -> list[float]:
    from dataclasses import asdict

    from minwiola.budget import count_params
    from minwiola.model import PRESETS, preset
    out: list[float] = []
    for name in PRESETS:
        config = preset(name)
        _walk(asdict(config), out)
        out.append(float(count_params(config)))
    return out


PRESET_NUMBERS = _preset_numbers()


def stated(nb: dict) -> list[tuple[int, str, float, float]]:
    """(cell, as written, value, half-width) for each number the lesson's text states as a measurement."""
    out = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$|`[^`]*`|\]\([^)]*\)", " ", text, flags=re.S)   # math, code, links
        text = HEADING.sub(r"\1", REFERENCE.sub(" ", text))
        for raw, value, half in numbers(text):
            if (float(value).is_integer() and abs(value) <= 10 and "%" not in raw) or \
                    (1900 <= value <= 2030 and raw.isdigit()):
                continue
            out.append((i, raw, value, half))
    return out


def _found(value: float, half: float, percent: bool, values: list[float]) -> bool:
    import bisect
    targets = [(value, half)] + ([(value / 100, half / 100), (1 + value / 100, half / 100),
                                  (1 - value / 100, half / 100)] if percent else [])
    for target, width in targets:
        for t in (target, -target):
            lo = bisect.bisect_left(values, t - width - 1e-12)
            if lo < len(values) and values[lo] <= t + width + 1e-12:
                return True
    return False


def unbacked(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    values, allowed = evidence(nb), ALLOWED.get(path.stem, {})
    return [f"cell {i}: {raw}" for i, raw, value, half in stated(nb)
            if raw not in allowed and not _found(value, half, raw.endswith("%"), values)
            and not any(_found(v, h, False, values) for _, v, h in numbers(raw, scaled=False))]   # 19.4 (MB) printed


def test_the_reader_finds_numbers_as_written():
    assert [(r, v) for r, v, _ in numbers("0.315 nats, 10.7%, 463K, 2,316 stories, 1e-3, (1,2), 1.58x, "
                                          "wiola-360m, gpt2, U+0301, 2nd, 493 M, 19.4 MB")] == \
        [("0.315", 0.315), ("10.7%", 10.7), ("463K", 463e3), ("2,316", 2316.0), ("1e-3", 1e-3), ("1", 1.0),
         ("2", 2.0), ("1.58x", 1.58), ("493 M", 493e6), ("19.4 MB", 19.4e6)]
    assert [h for _, _, h in numbers("145,000 2,316 100 0.5")] == [500, 0.5, 50, 0.05]
    assert _found(0.315, 0.0005, False, [0.3152]) and not _found(0.315, 0.0005, False, [0.3156])
    assert _found(10.7, 0.05, True, [0.107]) and _found(463e3, 500, False, [463424.0])
    nb = {"cells": [{"cell_type": "markdown", "source": "## 7. Eqs. 11-19 of lesson 06, section 9.2: 0.315 and "
                                                         "$d = 4096$ and `lr=3e-3` in 2023"}]}
    assert [raw for _, raw, _, _ in stated(nb)] == ["0.315"]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_number_in_a_lessons_text_comes_from_a_cell(path):
    bad = unbacked(path)
    assert not bad, (f"{len(bad)} numbers in {path.name}'s text appear in none of its cells, outputs or the results "
                     f"it reads (print them from a cell, or add them to ALLOWED with the reason): {bad[:20]}")
