"""`python -m minwiola.data sample`: the TinyStories sample rebuilt from a full download, offline.

The "full download" here is made in a temporary folder from the sample's own stories, written the way the official
files are (a leading space, trailing spaces, blank lines between some stories, one story with Windows line ends), with
duplicates inside and more stories after, under the official names. No TinyStories text is committed.
"""
import gzip
import hashlib
import re
from pathlib import Path

import pytest

from minwiola import data
from minwiola.tools import data_cli, sample

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories"
needs_sample = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason="the shared TinyStories sample is not beside this checkout")


def sample_stories(split: str) -> list[str]:
    return data.split_stories(gzip.open(SHARED / sample.SAMPLE[split].name, "rt", encoding="utf-8").read())


def official_style(stories: list[str]) -> str:
    """`stories` laid out as in the official files: what the sample's cleaning undoes."""
    out = []
    for i, story in enumerate(stories):
        if i % 7 == 3:
            story = story.replace("\n", " \n")          # trailing spaces
        if i % 11 == 5:
            story = story.replace("\n", "\r\n")         # Windows line ends
        if i % 13 == 6:
            story = story.replace("\n", "\n\n", 1)      # a blank line inside
        between = ("\n \n", "\n", "\n\n")[i % 3]          # a lone space, nothing, a blank line
        out.append((between if i else " ") + story + "\n<|endoftext|>")   # the official valid file starts with " "
    return "".join(out) + "\n"


def full_download(folder: Path, drop: int = 0, change: str | None = None) -> Path:
    """Both splits under the official names: the sample's stories with duplicates put in and extra stories after
    (`drop`: that many of the sample's last valid stories left out; `change`: a word replaced in valid story 500)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, official in (("valid", "TinyStories-valid.txt"), ("train", "TinyStories-train.txt")):
        stories = sample_stories(split)
        if split == "valid":
            stories = stories[:len(stories) - drop]
            if change:
                stories[500] = re.sub(r"\b\w+\b", change, stories[500], count=1)
        dups = [stories[2].upper().replace(".", "!"), stories[0]]    # the same story once case and punctuation go
        stories = stories[:10] + dups[:1] + stories[10:20] + dups[1:] + stories[20:]
        if not drop:
            stories += [f"An extra story, number {i}, that the sample does not hold." for i in range(3)]
        (folder / official).write_text(official_style(stories), encoding="utf-8", newline="")
    return folder


def run(args, capsys) -> tuple[int, list[str]]:
    code = data_cli.main(["sample", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


@needs_sample
def test_the_sample_is_rebuilt_from_a_full_download_and_the_loader_reads_it(env, monkeypatch, capsys):
    full = full_download(env / "full")
    raw = data.split_stories((full / "TinyStories-valid.txt").read_text(encoding="utf-8"))
    assert raw[:1000] != sample_stories("valid")          # the cleaning and the dedup are needed, not decoration
    out = env / "repo_data" / "tinystories-sample"
    assert run(["--source", full], capsys) == (0, [])     # the default --dest
    for split, part in sample.SAMPLE.items():
        body = (out / part.name).read_bytes()
        assert hashlib.sha256(gzip.decompress(body)).hexdigest() == part.text_sha256
        assert (out / part.name).read_bytes() == (SHARED / part.name).read_bytes()    # the very files
    assert sorted(p.name for p in out.iterdir()) == sorted([sample.MARKER, "train-000.txt.gz", "valid.txt.gz"])
    monkeypatch.setenv("MINWIOLA_DATA", str(out))
    assert data.load_stories("valid") == sample_stories("valid") and len(data.load_stories("train")) == 2316
    assert data.describe_source().startswith("TinyStories sample (")
    assert run(["--source", full], capsys) == (0, [])     # again: the folder is its own, nothing changes
    assert data.load_stories("valid", limit=3) == sample_stories("valid")[:3]


@needs_sample
def test_the_source_defaults_to_where_the_lessons_read(env, monkeypatch, capsys):
    monkeypatch.setenv("MINWIOLA_DATA", str(full_download(env / "full")))
    assert run(["--dest", env / "s"], capsys) == (0, [])
    assert (env / "s" / "valid.txt.gz").read_bytes() == (SHARED / "valid.txt.gz").read_bytes()


@needs_sample
@pytest.mark.parametrize("damage, says", [({"drop": 1}, "holds only 999 valid stories, the sample needs 1,000"),
                                          ({"change": "Zebra"}, "valid stories of")])
def test_a_short_or_different_download_is_one_line_and_writes_nothing(env, capsys, damage, says):
    full = full_download(env / "full", **damage)
    code, err = run(["--source", full, "--dest", env / "s"], capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith("error: ") and says in err[0], err
    assert not (env / "s").exists()
    if "change" in damage:
        assert "are not the sample's (sha256" in err[0] and "TinyStories v1" in err[0]


@needs_sample
def test_a_folder_it_did_not_make_is_refused_and_untouched(env, capsys):
    full = full_download(env / "full")
    mine = env / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    code, err = run(["--source", full, "--dest", mine], capsys)
    assert code == 1 and len(err) == 1 and "not made by this command" in err[0], err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"
    (env / "afile").write_text("mine")
    code, err = run(["--source", full, "--dest", env / "afile"], capsys)
    assert code == 1 and "is not a folder" in err[0] and (env / "afile").read_text() == "mine"


@needs_sample
def test_a_failed_write_deletes_only_what_it_wrote(env, monkeypatch, capsys):
    full = full_download(env / "full")
    real = Path.write_bytes

    def full_disk(self, body):
        if self.name.startswith("train-000"):
            raise OSError(28, "No space left on device")
        return real(self, body)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    code, err = run(["--source", full, "--dest", env / "s"], capsys)
    assert code == 1 and len(err) == 1 and "No space left on device" in err[0], err
    assert not (env / "s").exists()                             # it made the folder: all of it goes
    (env / "empty").mkdir()                                     # an empty folder of the user's: it stays
    assert run(["--source", full, "--dest", env / "empty"], capsys)[0] == 1
    assert (env / "empty").is_dir() and not any((env / "empty").iterdir())
    monkeypatch.setattr(Path, "write_bytes", real)
    monkeypatch.setitem(data.KNOWN_SHA256, "valid.txt.gz", "0" * 64)    # as if another zlib made other bytes
    code, err = run(["--source", full, "--dest", env / "s"], capsys)
    assert code == 1 and len(err) == 1 and "zlib" in err[0] and not (env / "s").exists(), err


def test_no_download_and_help(env, capsys):
    code, err = run(["--dest", env / "s"], capsys)
    assert code == 1 and len(err) == 1 and "python -m minwiola.data download" in err[0], err
    code, err = run(["--source", env / "nowhere", "--dest", env / "s"], capsys)
    assert code == 1 and len(err) == 1 and "is not a folder" in err[0], err
    with pytest.raises(SystemExit) as stop:
        data_cli.main(["sample", "--help"])
    assert stop.value.code == 0 and "--source" in capsys.readouterr().out


def test_cleaning_and_the_dedup_rule():
    assert sample.clean(" a \r\n\r\n b\t\n \n") == "a\nb"
    assert sample.dedup_key("Tom said: “Hi!”\nThe END.") == sample.dedup_key("tom said hi the end")


def test_the_constants_agree_with_the_sample_readme():
    readme = SHARED / "README.md"
    if not readme.is_file():
        pytest.skip("the shared TinyStories sample is not beside this checkout")
    text = " ".join(readme.read_text(encoding="utf-8").split())
    for split, part in sample.SAMPLE.items():
        name = part.name.removesuffix(".txt.gz")
        assert f"{name} `{part.text_sha256}`" in text, f"sha256 of the {split} text differs from the README"
        rows = readme.read_text(encoding="utf-8").splitlines()
        row = next(line for line in rows if line.startswith(f"| `{part.name}`"))
        assert f"first {part.stories:,} stories" in row and f"`{data.KNOWN_SHA256[part.name]}`" in row, row
    assert set(data.KNOWN_SHA256) == {p.name for p in sample.SAMPLE.values()}


@needs_sample
def test_the_constants_are_the_files_own():
    for part in sample.SAMPLE.values():
        body = (SHARED / part.name).read_bytes()
        assert hashlib.sha256(body).hexdigest() == data.KNOWN_SHA256[part.name]
        assert hashlib.sha256(gzip.decompress(body)).hexdigest() == part.text_sha256
        assert len(data.split_stories(gzip.decompress(body).decode())) == part.stories
