"""data/ commits nothing but its README."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
             "data/cache/train-0123456789abcdef0123.npy", "data/train-000.txt.gz", "data/README.md"]
    ignored = subprocess.run([git, "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == paths[:-1]                   # every data file, and never the README
