"""The trainer's CUDA path end to end: autocast in the run's precision (auto: bf16 where the GPU has
it, else fp16; fp16 with its gradient scaler), TF32, the fused AdamW, torch.compile, the first batch's forward and
backward, checkpoint and resume, generation. Skipped without a GPU; run it on one with
`python -m pytest tests/test_cuda.py` (add `-o addopts=` where nbval, which the project's pytest options name, is
not installed); it passed on an NVIDIA H200 (docs/training.md). The CPU runs every one of these branches too
(tests/test_train.py)."""
import math

import pytest
import torch

from minwiola.tools import train_cli
from minwiola.generate import generate, load_model
from minwiola.train import Trainer, read_metrics

from helpers import killed_and_resumed, oom_above, tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("compile, precision", [(False, "auto"), (True, "auto"), (False, "fp16")])
def test_cuda_trains_resumes_and_writes(small_data, tmp_path, compile, precision):  # noqa: F811
    cfg = tiny(device="cuda", compile=compile, precision=precision)
    whole = Trainer(cfg, tmp_path / "whole", progress=False, quiet=True)
    assert next(whole.model.parameters()).device.type == "cuda"
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert whole.precision == ("fp16" if precision == "fp16" or not native else "bf16")
    assert whole.opt.defaults["fused"] is True
    step, matmuls = whole.train_step, set()
    whole.train_step = lambda: (matmuls.add(torch.get_float32_matmul_precision()), step())[1]
    before = torch.get_float32_matmul_precision()
    last = whole.run()
    assert matmuls == {"high"} and torch.get_float32_matmul_precision() == before      # TF32 in the run only
    assert math.isfinite(last["nats_per_token"]) and last["nats_per_token"] < math.log(4096)
    resumed = killed_and_resumed(cfg, tmp_path / "part")
    steps = [r["step"] for r in read_metrics(tmp_path / "part") if "train_loss" in r]
    assert steps == list(range(1, 13))
    assert {r["precision"] for r in read_metrics(tmp_path / "part") if "valid_tokens" in r} == {whole.precision}
    if whole.precision == "fp16":                        # the scaler's state went through the checkpoint
        assert resumed.scaler.is_enabled() and resumed.scaler.get_scale() == whole.scaler.get_scale()
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        # autocast kernels need not be bitwise deterministic on a GPU: equal to bf16 / fp16 precision
        assert torch.allclose(a, b, atol=1e-2, rtol=1e-2), name
    model, tokenizer = load_model(tmp_path / "whole")
    model.to("cuda")
    assert generate(model, tokenizer, "Once upon a time", 20, seed=0).startswith("Once upon a time")


def test_out_of_memory_on_cuda_names_a_batch_that_fits(small_data, tmp_path, capsys, monkeypatch):  # noqa: F811
    oom_above(monkeypatch, 2)
    args = ["--out", str(tmp_path / "run"), "--device", "cuda", "--steps", "2", "--batch-size", "8", "--block-size",
            "16", "--sample-tokens", "4", "--set", "d=32", "n_layers=2", "n_heads=2", "n_kv_heads=1", "d_ff_a=16",
            "d_ff=48"]
    assert train_cli.main(args) == 1                     # found in Trainer(): the folder is not made
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("error: out of memory on cuda at --batch-size 8 x "
                                                                "--block-size 16: try --batch-size 2 --grad-accum 4 "
                                                                "(the same tokens per step)")
    assert not (tmp_path / "run").exists()
