"""Activation checkpointing (`model.activation_checkpointing = True`; the trainer's `--activation-checkpointing`).

Checkpointing keeps only each block's input during the forward pass and recomputes the block's activations in the
backward pass, trading time for memory (benchmarks/checkpointing_bench.py measures both). It must not change the
numbers: in float64 the loss and every gradient equal the plain model's, also where the forward is random
(dropout: torch's checkpoint restores the random state before it recomputes) or data-dependent (ATM's merge plan,
recomputed from the same activations). And it applies only where it can save anything: in training, with
gradients on.
"""
import pytest
import torch
import torch.utils.checkpoint

from minwiola import atm
from minwiola.corpus import builtin_stories
from minwiola.model import LanguageModel, preset
from minwiola.train import TrainConfig, Trainer

CASES = [("tiny-llama", {}), ("tiny-gpt2", {}), ("tiny-yocto", {}),
         ("wiola-tiny", {}),                                     # ATM at its tau merges a little...
         ("wiola-tiny", {"atm_tau": 0.0}),                       # ... and at tau = 0, many more
         ("wiola-tiny", {"gcla": "literal", "atm": "literal"})]  # the paper's literal forms too


def loss_and_grads(model: LanguageModel, checkpointing: bool, seed: int = 0) -> tuple[float, dict]:
    """One training forward + backward on fixed ids, with the random state set to `seed` first."""
    model.train()
    model.activation_checkpointing = checkpointing
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, model.config.vocab_size, (2, 25), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed)                                      # dropout's masks come from here
    loss = model.loss(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same(a: tuple[float, dict], b: tuple[float, dict], tol: float = 1e-12) -> None:
    """Equal losses and gradients to `tol` (on CPU they come out bitwise equal; the margin is for other kernels)."""
    assert abs(a[0] - b[0]) <= tol
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        assert (a[1][name] - b[1][name]).abs().max().item() <= tol, name


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("name, overrides", CASES)
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_checkpointed_loss_and_gradients_equal_the_plain_ones(name, overrides, dropout):
    model = LanguageModel(preset(name, dropout=dropout, **overrides))
    plain = loss_and_grads(model, checkpointing=False)
    checkpointed = loss_and_grads(model, checkpointing=True)
    assert_same(plain, checkpointed)
    if model.config.atm != "off":                                # the merging path really ran
        assert any(b.last_slot is not None and atm.merge_ratio(b.last_slot) > 0 for b in model.blocks)
    if dropout:                                                  # and dropout really drew masks: another seed differs
        other = loss_and_grads(model, checkpointing=True, seed=1)
        assert max((other[1][k] - plain[1][k]).abs().max().item() for k in plain[1]) > 1e-6


def count_checkpoints(monkeypatch) -> list:
    """Make every call of torch.utils.checkpoint.checkpoint (the one the model makes) append to the list returned."""
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.usefixtures("float64")
def test_checkpointing_recomputes_each_block_once_in_training_only(monkeypatch):
    """Each block runs twice per training step with checkpointing (forward, then again in backward), once without;
    in evaluation or under no_grad there is nothing to save for backward, so the plain path runs."""
    calls = count_checkpoints(monkeypatch)
    model = LanguageModel(preset("wiola-tiny", dropout=0.1))
    runs = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda module, args: runs.append(1))
    ids = torch.randint(0, 64, (2, 16))
    L = len(model.blocks)

    def step(checkpointing: bool, training: bool, grad: bool) -> tuple[int, int]:
        calls.clear(); runs.clear()
        model.train(training)
        model.activation_checkpointing = checkpointing
        with torch.set_grad_enabled(grad):
            logits = model(ids)
            if grad:
                logits.sum().backward()
        return len(calls), len(runs)

    assert step(checkpointing=True, training=True, grad=True) == (L, 2 * L)
    assert step(checkpointing=False, training=True, grad=True) == (0, L)
    assert step(checkpointing=True, training=False, grad=True) == (0, L)      # evaluation
    assert step(checkpointing=True, training=True, grad=False) == (0, L)      # no gradients wanted
    model.eval()
    with torch.no_grad():                                        # and where it does not apply, nothing changes
        model.activation_checkpointing = True
        on = model(ids)
        model.activation_checkpointing = False
        assert torch.equal(on, model(ids))


def test_the_trainer_setting_turns_it_on(tmp_path, monkeypatch):
    """TrainConfig.activation_checkpointing (the CLI's --activation-checkpointing) reaches the model's steps."""
    stories = builtin_stories("train", 60)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("\n<|endoftext|>\n".join(stories[:50]))
    (tmp_path / "data" / "valid.txt").write_text("\n<|endoftext|>\n".join(stories[50:]))
    monkeypatch.setenv("MINWIOLA_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MINWIOLA_CACHE", str(tmp_path / "cache"))
    small = dict(d=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff_a=16, d_ff=48, context=32)
    for on in (False, True):
        cfg = TrainConfig(preset="wiola-yocto", overrides=small, steps=1, batch_size=2, block_size=16,
                          activation_checkpointing=on)
        trainer = Trainer(cfg, tmp_path / f"run-{on}", progress=False, quiet=True)
        calls = count_checkpoints(monkeypatch)
        trainer.train_step()
        assert trainer.model.activation_checkpointing is on and len(calls) == (2 if on else 0)
