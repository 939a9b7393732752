"""The trainer's CUDA path end to end (issue 15): bf16 autocast, torch.compile, checkpoint and resume, generation.
Skipped without a GPU; run it on one with `python -m pytest tests/test_cuda.py`."""
import math

import pytest
import torch

from minwiola.generate import generate, load_model
from minwiola.train import Trainer, read_metrics

from test_train import killed_and_resumed, small_data, tiny  # noqa: F401 (the fixture, helpers)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("compile", [False, True])
def test_cuda_trains_resumes_and_writes(small_data, tmp_path, compile):  # noqa: F811
    cfg = tiny(device="cuda", compile=compile)
    whole = Trainer(cfg, tmp_path / "whole", progress=False, quiet=True)
    assert next(whole.model.parameters()).device.type == "cuda"
    last = whole.run()
    assert math.isfinite(last["nats_per_token"]) and last["nats_per_token"] < math.log(4096)
    resumed = killed_and_resumed(cfg, tmp_path / "part")
    steps = [r["step"] for r in read_metrics(tmp_path / "part") if "train_loss" in r]
    assert steps == list(range(1, 13))
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        # bf16 autocast kernels need not be bitwise deterministic on a GPU: equal to bf16 precision
        assert torch.allclose(a, b, atol=1e-2, rtol=1e-2), name
    model, tokenizer = load_model(tmp_path / "whole")
    model.to("cuda")
    assert generate(model, tokenizer, "Once upon a time", 20, seed=0).startswith("Once upon a time")
