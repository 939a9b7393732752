"""The README and the pages under docs/ point at what exists, and data/ commits nothing but its README."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")                     # [text](target), images too


def _prose(path: Path) -> str:
    """The page without its fenced code blocks (a link written inside code is not a link)."""
    return re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)


def anchors(path: Path) -> set[str]:
    """The #anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces turned into
    hyphens; a heading seen before gets -1, -2, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+\s+(.+?)\s*$", _prose(path), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path)) if not re.match(r"[a-z]+:", t)]   # not http:, mailto:


def test_the_pages_exist_and_link_somewhere():
    assert all(p.is_file() for p in PAGES) and len(PAGES) >= 9
    assert sum(len(links(p)) for p in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page):
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
        if anchor:
            assert dest.suffix == ".md", f"{page.relative_to(ROOT)}: #{anchor} in a file that is not Markdown"
            assert anchor in set(anchors(dest)), f"{page.relative_to(ROOT)} links to {target}: no such heading"


def test_the_anchor_rule_and_the_link_check_catch_what_they_should(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# One GPU, and several\n## How `make test` checks\n## Notes\n## Notes\n"
                    "[a](gone.md) [b](page.md#nowhere) [c](https://example.org)\n```\n[d](in-code.md)\n```\n")
    assert list(anchors(page)) == ["one-gpu-and-several", "how-make-test-checks", "notes", "notes-1"]
    assert links(page) == ["gone.md", "page.md#nowhere"]


def test_data_folder_ignores_everything_but_its_readme():
    rules = (ROOT / ".gitignore").read_text().splitlines()
    assert "data/*" in rules and "!data/README.md" in rules
    git = shutil.which("git")
    inside = git and subprocess.run([git, "rev-parse", "--is-inside-work-tree"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip() == "true"
    if not inside:
        pytest.skip("not a git checkout: the .gitignore rules above are all that can be checked")
    tracked = subprocess.run([git, "ls-files", "data"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert tracked.stdout.split() == ["data/README.md"], "only data/README.md may be committed in data/"
    paths = ["data/tinystories/TinyStories-train.txt", "data/tinystories/TinyStories-train.txt.sha256",
             "data/cache/train-0123456789abcdef0123.npy", "data/train-000.txt.gz",
             "data/tinystories-sample/valid.txt.gz", "data/README.md"]
    ignored = subprocess.run([git, "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == paths[:-1]                   # every data file, and never the README
