"""Shared test fixtures."""
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch

# The exercises keep what passes in a workspace (lessons/exercises/__init__.py); tests and the lessons they execute
# use a fresh one, so they never read a learner's work or write into it. Each test gets its own (a folder made only
# when something is kept): what one test's solutions keep must not change what a lesson run by another prints.
SCRATCH = Path(tempfile.mkdtemp(prefix="minwiola-mine-"))
os.environ["MINWIOLA_MINE"] = str(SCRATCH)


@pytest.fixture(autouse=True)
def fresh_workspace(request, monkeypatch):
    monkeypatch.setenv("MINWIOLA_MINE", str(SCRATCH / re.sub(r"\W", "_", request.node.nodeid)[-120:]))


def pytest_collection_modifyitems(items):
    """CI runs the suite twice, with the built-in stories and with the TinyStories sample at one thread (.ci/run);
    a test marked `once` brings its own data and threads, so the second pass has nothing new to learn from it."""
    if os.environ.get("MINWIOLA_SECOND_PASS") == "1":
        for item in items:
            if item.get_closest_marker("once"):
                item.add_marker(pytest.mark.skip(reason="marked once: CI ran it in its first pass"))


@pytest.fixture
def float64():
    """Run a test in float64 with a fixed seed; the default dtype is restored afterwards."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)


@pytest.fixture
def small_data(tmp_path, monkeypatch):
    """A private data folder with a few hundred generated stories, and a private token cache."""
    from helpers import write_small_stories
    folder = write_small_stories(tmp_path / "stories")
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    monkeypatch.setenv("MINWIOLA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MINWIOLA_QUICK", raising=False)
    return folder


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An isolated world for the data: no MINWIOLA_DATA, an empty repository data/ folder, a private cache."""
    from minwiola import data
    monkeypatch.delenv("MINWIOLA_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path / "repo_data")
    monkeypatch.setenv("MINWIOLA_CACHE", str(tmp_path / "cache"))
    return tmp_path
