"""A training step's host synchronisations and ATM's shapes (issue 52; lesson 09, section 8).

On a GPU every read of a device value makes the host wait; `analysis.HostReads` counts them on the CPU too. A
training step of a plain decoder needs none, a Wiola step one per merging layer (its merged length), and ATM's
padded lengths take a few values only, so compiled code and per-shape caches warm up once."""
import pytest
import torch

from analysis import HostReads, model_step
from minwiola import atm
from minwiola.gcla import GCLA, cross_layer_context
from minwiola.model import LanguageModel, preset
from minwiola.tools import launch
from minwiola.train import Trainer
from helpers import tiny

pytestmark = pytest.mark.once       # its own models, ids and data: the same whatever the data source and threads


def one_step_reads(name: str, **changes) -> tuple[int, int]:
    torch.manual_seed(0)
    model = LanguageModel(preset(name, **changes))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (3, model.config.context + 1))
    model_step(model, opt, ids)
    with HostReads() as seen:
        model_step(model, opt, ids)
    merging = len(atm.atm_layers(model.config.n_layers)) if model.config.atm != "off" else 0
    return seen.total(), merging


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-yocto", "tiny-gpt2", "tiny-ssm"])
def test_a_plain_decoders_training_step_never_makes_the_host_wait(name):
    assert one_step_reads(name) == (0, 0)


@pytest.mark.parametrize("changes", [{}, {"n_layers": 6}, {"atm": "literal"}, {"atm_tau": -1.0}])
def test_a_wiola_training_step_reads_the_device_once_per_merging_layer(changes):
    reads, merging = one_step_reads("wiola-tiny", **changes)
    assert merging >= 1 and reads == merging


def test_the_counter_sees_each_kind_of_read():
    x = torch.arange(6.0)
    with HostReads() as seen:
        x.sum().item(), x.tolist(), bool(x[0] > 1), int(x.max()), x[x > 2], x.nonzero()
        torch._assert_async(x.max() > 0)                 # checked on the device: the host goes on
    assert seen.reads == {"item": 1, "tolist": 1, "__bool__": 1, "__int__": 1, "aten::index": 1, "aten::nonzero": 1}


def test_the_trainers_step_reads_the_device_once_plus_once_per_merging_layer(small_data, tmp_path, monkeypatch):
    """As on a GPU: AdamW fused (the unfused one reads its step counters, which live on the host there), the
    batches drawn beforehand (the trainer draws them on the host, with a CPU generator, by design)."""
    monkeypatch.setattr(launch, "fused_adamw", lambda device: True)
    cfg = tiny(overrides={**tiny().overrides, "n_layers": 3, "atm_tau": 0.0}, grad_accum=2)   # 1 merging layer of 3
    trainer = Trainer(cfg, tmp_path / "run", progress=False, quiet=True)
    trainer.train_step()
    batches = iter([trainer.next_batch() for _ in range(cfg.grad_accum)])
    trainer.next_batch = lambda: next(batches)
    with HostReads() as seen:
        trainer.train_step()
    # the losses and the gradient norm read together, then the merged length once per micro-batch
    assert seen.reads == {"tolist": 1 + cfg.grad_accum}, seen.reads


def test_padded_lengths_are_few_and_never_shorter():
    for T in (8, 32, 100, 256, 1024):
        lengths = {atm.padded_length(n, T) for n in range(T // 2, T + 1)}
        assert all(atm.padded_length(n, T) >= n for n in range(1, T + 1)) and max(lengths) == T
        assert len(lengths) <= 5
    assert sorted({atm.padded_length(n, 256) for n in range(128, 257)}) == [128, 160, 192, 224, 256]


@pytest.mark.parametrize("kind", atm.KINDS)
def test_padding_the_merged_length_changes_nothing_in_float64(kind):
    """GCLA with a per-position context, on a plan whose rows merge differently: padded to a fixed length and
    unpadded give the same output and the same gradients to 1e-10."""
    torch.manual_seed(0)
    layer = GCLA(16, 4, 2, max_len=64).double()
    h = torch.randn(3, 40, 16, dtype=torch.float64)
    h[0, 10:30] = h[0, 10]                                  # row 0 merges a lot, the others little
    context, _ = cross_layer_context(torch.randn(3, 40, 16, dtype=torch.float64), None, "causal")
    outs = {}
    for pad in (True, False):
        x = h.clone().requires_grad_()
        out, slot, mu = atm.merged_attention(layer, x, 0.5, kind, context, pad=pad)
        out.square().sum().backward()
        outs[pad] = (out, x.grad, [p.grad.clone() for p in layer.parameters()])
        layer.zero_grad()
    assert atm.plan_size(slot)[0] > int(slot.max()) + 1          # the padded plan really ran longer
    torch.testing.assert_close(outs[True][0], outs[False][0], atol=1e-10, rtol=0)
    torch.testing.assert_close(outs[True][1], outs[False][1], atol=1e-10, rtol=0)
    for a, b in zip(outs[True][2], outs[False][2]):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_a_padded_wiola_model_trains_then_decodes_with_the_cache_as_its_full_forward(monkeypatch):
    torch.manual_seed(0)
    model = LanguageModel(preset("wiola-tiny", atm_tau=0.0, dropout=0.0)).double()
    ids = torch.randint(0, model.config.vocab_size, (2, 25))
    padded = model(ids)
    monkeypatch.setattr(atm, "padded_length", lambda longest, T: longest)   # the merge as it was: no padding
    torch.testing.assert_close(model(ids), padded, atol=1e-10, rtol=0)
    model.eval()
    full, cache = model(ids), model.new_cache()
    stepwise = torch.cat([model(ids[:, t:t + 1], cache) for t in range(ids.shape[1])], dim=1)
    torch.testing.assert_close(stepwise, full, atol=1e-10, rtol=0)


def test_a_compiled_wiola_step_does_not_recompile_after_warm_up():
    """torch.compile (dynamo's tracing; the eager backend, as the guards are dynamo's whatever compiles the graphs)
    of a Wiola training step: once each padded length has been met, new batches with new merged lengths compile
    nothing."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LanguageModel(preset("wiola-tiny", dropout=0.0))
    forward = torch.compile(model, backend="eager")
    merging = model.blocks[atm.atm_layers(model.config.n_layers)[0]]
    generator = torch.Generator().manual_seed(0)

    def step(tau: float) -> int:
        merging.tau = tau
        ids = torch.randint(0, model.config.vocab_size, (4, model.config.context), generator=generator)
        forward(ids, ids_checked=True).square().mean().backward()
        return atm.padded_length(int(merging.last_slot[:, -1].max()) + 1, model.config.context)

    seen = {step(tau) for tau in (1.0, -1.0, 0.0, 0.3, -0.3)}       # warm-up: none, all, some merged
    assert len(seen) >= 3
    frames = counters["stats"]["unique_graphs"]
    later = {step(tau) for tau in torch.linspace(-0.5, 0.5, 6).tolist()}
    assert later - seen == set() and counters["stats"]["unique_graphs"] == frames
