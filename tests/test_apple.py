"""Apple laptops: `make` finds a Python of at least 3.11 (a stock Mac's python3 is 3.9) or says in one line which to
install, and the device policy on Apple silicon (mps: fp32, one process, --device cpu forces the CPU), its code paths
taken on the CPU by making this machine look like a Mac with mps (docs/setup.md, "Apple laptops")."""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from minwiola.tools import launch

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")


def fake_pythons(folder: Path, versions: dict[str, tuple[int, int]]) -> Path:
    """Executables named like Pythons that answer the Makefile's version check as that version would."""
    folder.mkdir()
    for name, version in versions.items():
        ok = 0 if version >= (3, 11) else 1
        path = folder / name
        path.write_text(f"#!/bin/sh\nexit {ok}\n")
        path.chmod(0o755)
    return folder


def make(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MAKE, "-s", "-B", "-n", *args, "setup", f"VENV={folder / 'venv'}"], cwd=ROOT,
                          env={"PATH": str(folder)}, capture_output=True, text=True)


@pytest.mark.skipif(MAKE is None, reason="no make on this machine")
def test_make_takes_the_newest_python_of_at_least_3_11(tmp_path):
    mac = fake_pythons(tmp_path / "bin", {"python3": (3, 9), "python3.12": (3, 12), "python3.11": (3, 11)})
    done = make(mac)
    assert done.returncode == 0 and "python3.12 -m venv" in done.stdout
    assert "python3 -m venv" in make(mac, "PYTHON=python3").stdout                 # as named, then checked


@pytest.mark.skipif(MAKE is None, reason="no make on this machine")
def test_without_one_make_says_in_one_line_which_to_install(tmp_path):
    old = fake_pythons(tmp_path / "bin", {"python3": (3, 9)})
    done = subprocess.run([MAKE, "-s", "-B", "setup", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          env={"PATH": str(old)}, capture_output=True, text=True)
    assert done.returncode != 0 and not (tmp_path / "venv").exists()
    said = [line for line in done.stderr.splitlines() if line.startswith("make: minwiola")]
    assert len(said) == 1 and "Python 3.11 or newer" in said[0] and "make PYTHON=" in said[0]


@pytest.fixture
def a_mac(monkeypatch):
    """This machine as Apple silicon shows itself to torch: no CUDA, mps available."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


def test_on_apple_silicon_auto_picks_mps_in_fp32_without_autocast_or_fused_adamw(a_mac):
    device = launch.pick_device("auto")
    assert device == torch.device("mps")
    assert launch.resolve_precision("auto", device) == "fp32"
    assert launch.autocast("fp32", device)._enabled is False           # matrix products stay float32
    assert launch.fused_adamw(device) is False


def test_cuda_comes_before_mps_and_cpu_forces_the_cpu(a_mac, monkeypatch):
    assert launch.pick_device("cpu") == torch.device("cpu")                # --device cpu, whatever is there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert launch.pick_device("auto") == torch.device("cuda")


def test_mps_trains_in_one_process_only():
    assert launch.rank_device(torch.device("mps"), 0, 1) == torch.device("mps")
    with pytest.raises(ValueError, match="cannot train with several processes; use cuda or cpu"):
        launch.rank_device(torch.device("mps"), 0, 2)
