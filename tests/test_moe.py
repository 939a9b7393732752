"""Mixture of experts (lesson 14): the layer reduces to a dense FFN where it should, the router learns, the
balancing loss is minimal at uniform load, capacity drops exactly the later tokens, the model stays causal and
decodes, the trainer adds the auxiliary loss and logs the load, the budget counts total and active parameters."""
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from minwiola import train
from minwiola.budget import (active_params, count_params, ffn_flops, forward_flops, layer_flops,
                             param_breakdown)
from minwiola.ffn import SwiGLU
from minwiola.model import LanguageModel, ModelConfig, preset
from minwiola.moe import MoE, balancing_loss, capacity, moe_layers, moe_stats
from helpers import big_model, ids


def moe(E=4, k=2, d=6, hidden=10, capacity_factor=None, seed=0) -> MoE:
    """A float64 MoE layer with weights of std 0.5."""
    torch.manual_seed(seed)
    layer = MoE(d, hidden, E, k, capacity_factor).double()
    for p in layer.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5)
    return layer


def tokens(B=3, T=7, d=6, seed=1) -> torch.Tensor:
    return torch.randn(B, T, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------- it is an FFN, routed

def test_one_expert_is_the_dense_swiglu_exactly():
    layer = moe(E=1, k=1)
    dense = SwiGLU(6, 10).double()
    dense.load_state_dict(layer.experts[0].state_dict())
    x = tokens(B=1)
    assert torch.equal(layer(x), dense(x))                    # weight 1, every token, nothing dropped
    x = tokens(B=3)                                           # rows served position by position: same numbers
    assert (layer(x) - dense(x)).abs().max() < 1e-15
    assert layer.load.tolist() == [1.0] and layer.dropped.item() == 0.0 and layer.aux_loss.item() == 1.0
    # and a whole model: ffn="moe" with one expert is ffn="swiglu" with the same weights
    torch.manual_seed(0)
    routed = LanguageModel(preset("tiny-moe", moe_experts=1, moe_k=1, init_std=0.3)).double().eval()
    plain = LanguageModel(preset("tiny-llama", d_ff=32, init_std=0.3)).double().eval()
    weights = {k.replace("ffn.experts.0.", "ffn."): v for k, v in routed.state_dict().items() if "router" not in k}
    plain.load_state_dict(weights)
    x = ids(plain, B=1)
    assert torch.equal(routed(x), plain(x))


def test_a_zero_router_with_k_equal_to_e_is_the_mean_of_the_experts():
    layer = moe(E=4, k=4)
    torch.nn.init.zeros_(layer.router.weight)                 # p = 1/E for every token, all experts chosen
    x = tokens()
    mean = sum(expert(x) for expert in layer.experts) / 4
    assert (layer(x) - mean).abs().max() < 1e-14
    assert layer.load.tolist() == [0.25] * 4


def test_top_k_weights_are_the_renormalised_probabilities():
    layer, x = moe(E=5, k=2), tokens(B=1, T=1)
    p = (x[0, 0] @ layer.router.weight.T).softmax(-1)
    top = p.topk(2)
    w = top.values / top.values.sum()
    want = sum(w[j] * layer.experts[int(e)](x[0, 0]) for j, e in enumerate(top.indices))
    assert (layer(x)[0, 0] - want).abs().max() < 1e-14


def test_gradients_reach_the_router_and_every_expert():
    layer, x = moe(E=4, k=2), tokens(B=4, T=8)
    layer(x).pow(2).sum().backward()                          # the output alone: through the renormalised weights
    assert layer.router.weight.grad.abs().max() > 1e-6
    assert min(layer.load.tolist()) > 0                        # every expert took tokens ...
    for expert in layer.experts:                               # ... and learns from them
        assert all(p.grad.abs().max() > 1e-6 for p in expert.parameters())
    # k = 1: the renormalised weight p / p is 1, so the router learns only from the balancing loss (the docstring's
    # warning, and why moe-llama-style routes top-2)
    layer = moe(E=4, k=1)
    layer(x).pow(2).sum().backward()
    assert layer.router.weight.grad.abs().max() < 1e-14           # d(p/p)/dp: zero but for rounding
    layer.zero_grad()
    layer(x)
    layer.aux_loss.backward()
    assert layer.router.weight.grad.abs().max() > 1e-6


# ------------------------------------------------------------------------------------------- the balancing loss

def test_the_balancing_loss_is_one_for_a_uniform_router_and_grows_with_imbalance():
    layer, x = moe(E=4, k=2), tokens(B=4, T=16)
    torch.nn.init.zeros_(layer.router.weight)
    layer(x)
    assert layer.aux_loss.item() == pytest.approx(1.0, abs=1e-15)      # E sum f_e / E = 1, whatever f is
    x[..., 0] = 1.0                                                    # a feature every token has ...
    losses, loads = [], []
    for skew in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0):                         # ... that the router reads as "expert 0"
        layer.router.weight.data[:, 0] = torch.tensor([skew, 0.0, 0.0, 0.0])
        layer(x)
        probs = (x.reshape(-1, 6) @ layer.router.weight.T).softmax(-1)
        by_hand = 4 * (layer.load * probs.mean(0)).sum()                # E sum_e f_e P_e
        assert layer.aux_loss.item() == pytest.approx(by_hand.item(), rel=1e-14)
        losses.append(layer.aux_loss.item())
        loads.append(layer.load[0].item())
    assert losses == sorted(losses) and losses[-1] > 1.9               # top-2 of 4, all on expert 0: E (1/2) 1 = 2
    assert loads[0] < loads[-1] == 0.5                                 # expert 0 in every token's pair
    # the minimum over loads with f = P is 1, at P = 1/E (Cauchy-Schwarz): E sum P^2 for random P
    P = torch.rand(1000, 4, dtype=torch.float64).softmax(-1)
    assert (4 * (P ** 2).sum(-1) >= 1 - 1e-15).all()


def test_the_balancing_loss_has_its_gradient_through_p_not_f():
    probs = torch.rand(12, 4, dtype=torch.float64).softmax(-1).requires_grad_()
    chosen = probs.topk(2).indices
    loss, f = balancing_loss(probs, chosen, 4)
    (grad,) = torch.autograd.grad(loss, probs)
    assert (grad - 4 * f / 12).abs().max() < 1e-15                     # dL/dp_ie = E f_e / N, the same for every i
    assert f.sum().item() == pytest.approx(1.0) and not f.requires_grad


def test_the_balancing_loss_is_at_most_e_over_k_and_can_fall_below_one_when_choices_do_not_follow_p():
    for seed, (E, k) in enumerate([(6, 2), (4, 1), (8, 3), (5, 5)]):       # f_e <= 1/k, so L_bal <= E/k
        g = torch.Generator().manual_seed(seed)
        p = (4 * torch.randn(50, E, generator=g, dtype=torch.float64)).softmax(-1)
        assert balancing_loss(p, p.topk(k, -1).indices, E)[0].item() <= E / k + 1e-12
    # the docstring's counter-example: 90% of the load on one expert, and L_bal below its "minimum" of 1
    probs = torch.tensor([[0.34, 0.33, 0.33]] * 9 + [[0.0, 0.0, 1.0]], dtype=torch.float64)
    loss, load = balancing_loss(probs, probs.argmax(-1, keepdim=True), 3)
    assert load.tolist() == pytest.approx([0.9, 0.0, 0.1]) and loss.item() == pytest.approx(0.9453, abs=1e-12)


def test_the_balancing_loss_pushes_each_logit_by_its_experts_load_above_the_tokens_average():
    g = torch.Generator().manual_seed(0)
    for even in (False, True):
        logits = torch.randn(30, 6, generator=g, dtype=torch.float64).requires_grad_()
        p = logits.softmax(-1)
        chosen = torch.arange(60).reshape(30, 2) % 6 if even else p.topk(2, -1).indices
        loss, f = balancing_loss(p, chosen, 6)
        (grad,) = torch.autograd.grad(loss, logits)
        p = p.detach()
        assert torch.allclose(grad, 6 / 30 * p * (f - (p * f).sum(-1, keepdim=True)), atol=1e-15)
        assert (grad.abs().max().item() < 1e-15) == even                # zero exactly at uniform load


def test_the_z_loss_is_the_mean_squared_logsumexp():
    layer, x = moe(E=3, k=1), tokens()
    layer(x)
    logits = x.reshape(-1, 6) @ layer.router.weight.T
    assert layer.z_loss.item() == pytest.approx(torch.logsumexp(logits, -1).pow(2).mean().item(), rel=1e-14)


# --------------------------------------------------------------------------------------------------- capacity

def test_capacity_drops_exactly_the_later_tokens():
    """Two experts, k = 1, every token routed to expert 0: the first C tokens, lined up position by position
    (row 0 then row 1 at position 0, then position 1, ...), are kept, the rest dropped (output 0). Kept tokens
    match the expert to rounding: a product over fewer rows may round differently."""
    layer = moe(E=2, k=1, d=4, hidden=5)
    layer.router.weight.data = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    x = tokens(B=2, T=3, d=4).abs() + 0.1                                 # positive: expert 0 wins everywhere
    alone = layer.experts[0](x)                                            # weight 1 (k = 1)
    assert capacity(0.5, 1, 6, 2) == 2 and capacity(None, 1, 6, 2) is None and capacity(0.0, 1, 6, 2) is None
    layer.capacity_factor = 0.5                                            # C = ceil(0.5 * 1 * 6 / 2) = 2
    out = layer(x)
    assert (out[:, 0] - alone[:, 0]).abs().max() < 1e-15                  # both rows' position 0 served first
    assert torch.equal(out[:, 1:], torch.zeros_like(out[:, 1:]))           # later positions dropped: 0 (the
    assert layer.dropped.item() == pytest.approx(4 / 6)                    # residual carries them)
    assert layer.load.tolist() == [1.0, 0.0]                               # the load counts routing, not serving
    layer.capacity_factor = 1 / 3                                          # C = 1: only row 0, position 0
    out = layer(x)
    assert (out[0, 0] - alone[0, 0]).abs().max() < 1e-15 and out.reshape(-1, 4)[1:].abs().max() == 0
    assert layer.dropped.item() == pytest.approx(5 / 6)
    layer.capacity_factor = 1.0                                            # C = 3: position 1 of row 0 too
    out = layer(x)
    assert (out[:, 0] - alone[:, 0]).abs().max() < 1e-15 and (out[0, 1] - alone[0, 1]).abs().max() < 1e-15
    assert out[1, 1].abs().max() == 0 and out[:, 2].abs().max() == 0
    layer.capacity_factor = None                                           # no limit: every token served
    assert (layer(x) - alone).abs().max() < 1e-15 and layer.dropped.item() == 0


def test_with_k_2_a_dropped_choice_leaves_the_other():
    layer = moe(E=3, k=2, d=4, hidden=5)
    layer.router.weight.data = torch.tensor([[2.0] * 4, [1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    x = tokens(B=1, T=4, d=4).abs() + 0.1                                  # every token picks experts 0 and 1
    layer.capacity_factor = 3 / 8                                          # C = ceil(3/8 * 2 * 4 / 3) = 1
    out = layer(x)
    p = (x @ layer.router.weight.T).softmax(-1)[0, :, :2]
    w = p / p.sum(-1, keepdim=True)
    assert (out[0, 0] - w[0, 0] * layer.experts[0](x[0, 0]) - w[0, 1] * layer.experts[1](x[0, 0])).abs().max() < 1e-15
    assert out[0, 1:].abs().max() == 0 and layer.dropped.item() == pytest.approx(6 / 8)


# -------------------------------------------------------------------------------------- the model: causal, decodes

@pytest.mark.parametrize("factor", [0.0, 0.5])
def test_the_model_is_causal_with_and_without_a_capacity_limit(factor):
    """Changing a sequence's future never changes its past: with a limit too, since earlier positions are served
    first. (Rounding: a product over a different number of rows rounds differently, hence 1e-12, not equality.)"""
    model = big_model("tiny-moe", moe_capacity=factor)
    x = ids(model, B=3, T=20)
    y = x.clone()
    y[:, 12:] = (y[:, 12:] + 1) % model.config.vocab_size
    a, b = model(x), model(y)
    assert (a[:, :12] - b[:, :12]).abs().max() < 1e-12
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3
    assert all((layer.dropped > 0) == (factor > 0) for layer in moe_layers(model))


def test_with_a_capacity_limit_the_rows_of_a_batch_are_coupled():
    """What the limit does cost: one row's tokens take slots another row's later tokens then miss. Row 1's past
    (positions < 12) is untouched when row 0 changes from position 12 on, but its later positions move."""
    model = big_model("tiny-moe", moe_capacity=0.5)
    x = ids(model, B=3, T=20)
    y = x.clone()
    y[0, 12:] = (y[0, 12:] + 1) % model.config.vocab_size
    a, b = model(x), model(y)
    assert (a[1:, :12] - b[1:, :12]).abs().max() < 1e-12
    assert (a[1:, 12:] - b[1:, 12:]).abs().max() > 1e-3                      # coupled through the dropping
    free = big_model("tiny-moe")                                             # without a limit rows are independent
    assert (free(x)[1:] - free(y)[1:]).abs().max() < 1e-12


def test_cached_decoding_equals_the_full_forward():
    model = big_model("tiny-moe", moe_k=1)
    x = ids(model, T=20)
    full = model(x)
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache) for t in range(20)], dim=1)
    assert (steps - full).abs().max() < 1e-10
    # with a capacity limit, one token at a time never drops (each expert gets at most one assignment of a
    # one-token sequence, and C >= 1), so decoding differs from a full forward that drops: the docstring says so
    model = big_model("tiny-moe", moe_capacity=0.5)
    cache = model.new_cache()
    for t in range(20):
        model(x[:1, t:t + 1], cache)
        assert all(layer.dropped == 0 for layer in moe_layers(model))
    model(x[:1])
    assert all(layer.dropped > 0 for layer in moe_layers(model))


def test_bf16_autocast_and_activation_checkpointing():
    layer = MoE(8, 16, 4, 2, 1.0)
    x = torch.randn(2, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.float32 and torch.isfinite(out).all() and layer.aux_loss.dtype == torch.float32
    (out.sum() + layer.aux_loss).backward()
    assert torch.isfinite(layer.router.weight.grad).all()
    # recomputing the blocks in backward gives the gradient of the loss and the aux loss as before
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-moe", moe_z=0.01)).double()
    x = ids(model)
    grads = []
    for checkpointing in (False, True):
        model.activation_checkpointing = checkpointing
        model.zero_grad()
        (model.loss(x[:, :-1], x[:, 1:]) + model.aux_loss()).backward()
        grads.append(model.blocks[0].ffn.router.weight.grad.clone())
    assert (grads[0] - grads[1]).abs().max() < 1e-12 and grads[0].abs().max() > 0


# ------------------------------------------------------------------------------------------------- the trainer

def test_the_trainer_adds_the_aux_loss_and_logs_load_and_drops(small_data, tmp_path):
    def run(name, **overrides):
        cfg = train.TrainConfig(preset="tiny-moe", overrides=dict(vocab_size=4096, context=64, **overrides),
                                steps=5, batch_size=4, block_size=32, eval_every=5, sample_tokens=4)
        train.Trainer(cfg, tmp_path / name, progress=False, quiet=True).run()
        return train.read_metrics(tmp_path / name)

    records = run("moe", moe_capacity=1.0, moe_z=0.001)
    steps = [r for r in records if "train_loss" in r]
    assert len(steps) == 5
    for r in steps:
        assert r["aux_loss"] > 0.01 * 2 * 0.99                        # two layers, each L_bal >= 1 (about), weight 0.01
        assert len(r["moe_load"]) == 2 and all(sum(layer) == pytest.approx(1, abs=1e-3) and len(layer) == 4
                                                for layer in r["moe_load"])
        assert len(r["moe_dropped"]) == 2 and all(0 <= f < 1 for f in r["moe_dropped"])
    assert any(f > 0 for r in steps for f in r["moe_dropped"])         # factor 1: some tokens overflow
    (evaluation,) = [r for r in records if "valid_nats_per_token" in r]
    assert "aux_loss" not in evaluation
    # the aux loss is trained on but not reported: without it the first step reports the same loss, then differs
    plain = [r for r in run("no-aux", moe_capacity=1.0, moe_aux=0.0) if "train_loss" in r]
    assert plain[0]["aux_loss"] == 0 and plain[0]["train_loss"] == steps[0]["train_loss"]
    # (Adam's first update is about lr * sign(g), which the small aux gradient seldom flips; later ones differ)
    assert all(a["train_loss"] != b["train_loss"] for a, b in zip(plain[2:], steps[2:]))


# ------------------------------------------------------------------------------------------------- the budget

def test_budget_counts_total_and_active_parameters_and_flops():
    cfg = preset("tiny-moe")                                   # V 64, d 24, 2 layers, E 4, k 2, experts of 32
    assert count_params(cfg) == LanguageModel(cfg).n_params() == 23_736
    for overrides in (dict(ffn_bias=True), dict(moe_experts=3, moe_k=1, d_ff=None), dict(mixer="ssm",
                                                                                           positions="none")):
        assert count_params(preset("tiny-moe", **overrides)) == LanguageModel(preset("tiny-moe", **overrides)).n_params()
    attention = 24 * 24 + 2 * 24 * 12 + 24 * 24                # W_Q, W_K and W_V (2 KV heads of 6), W_O
    expert, router, norms = 3 * 24 * 32, 24 * 4, 2 * 24
    assert active_params(cfg) == 64 * 24 + 2 * (attention + router + 2 * expert + norms) + 24 == 14_520
    assert count_params(cfg) - active_params(cfg) == 2 * 2 * expert   # two idle experts a layer
    assert param_breakdown(cfg)["MoE experts"] == 2 * 4 * expert and param_breakdown(cfg)["MoE router W_r"] == 2 * 96
    assert active_params(preset("tiny-llama")) == count_params(preset("tiny-llama"))
    # moe-llama-style: as many active parameters and FLOPs per token as llama-style, three times its FFN in total
    moe_cfg, dense = preset("moe-llama-style"), preset("llama-style")
    assert active_params(moe_cfg) == count_params(dense) == 463_424
    assert count_params(moe_cfg) == count_params(preset("llama-style", d_ff=524)) == 730_688
    assert forward_flops(moe_cfg, 512) == forward_flops(dense, 512)
    # FLOPs: the router and k experts, not E; measured products of a forward without drops agree
    assert ffn_flops(cfg) == {"MoE router W_r": 2 * 24 * 4, "feed-forward (k active experts)": 2 * 2 * 3 * 24 * 32}
    assert forward_flops(preset("tiny-moe", moe_experts=8), 32) - forward_flops(cfg, 32) == 2 * 2 * 24 * 4
    model, T = LanguageModel(cfg).eval(), 16
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, T, dtype=torch.long))
    assert all(layer.dropped == 0 for layer in moe_layers(model))
    products = {k: v for k, v in layer_flops(cfg, T).items() if "core" not in k}     # the fused core is not counted
    assert counter.get_total_flops() == T * (cfg.n_layers * sum(products.values()) + 2 * cfg.d * cfg.vocab_size)


# ------------------------------------------------------------------------------------------ configs, old and bad

def test_bad_configs_are_refused_clearly():
    for overrides, match in [(dict(moe_k=5), "moe_k=5 must be at most moe_experts=4"),
                             (dict(moe_k=0), "moe_k must be a positive int"),
                             (dict(moe_experts=0, moe_k=1), "moe_experts must be a positive int"),
                             (dict(moe_k=1.5), "moe_k must be a positive int"),
                             (dict(moe_capacity=-1.0), r"moe_capacity must be >= 0 \(0: no capacity limit\)"),
                             (dict(moe_capacity=float("inf")), "moe_capacity must be a finite number"),
                             (dict(moe_aux=-0.01), "moe_aux must be >= 0"),
                             (dict(moe_z=-1.0), "moe_z must be >= 0"),
                             (dict(ffn="mixture"), "ffn must be one of .*'moe'")]:
        with pytest.raises(ValueError, match=match):
            preset("tiny-moe", **overrides)
    with pytest.raises(ValueError, match="need 1 <= k <= n_experts, got k=3 with n_experts=2"):
        MoE(4, 8, n_experts=2, k=3)


def test_a_moe_saves_and_loads_and_old_configs_still_load(tmp_path):
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-moe", moe_capacity=1.25)).eval()
    model.save_pretrained(tmp_path / "moe")
    loaded = LanguageModel.from_pretrained(tmp_path / "moe")
    x = ids(model)
    assert loaded.config.moe_capacity == 1.25 and torch.equal(loaded(x), model(x))
    assert LanguageModel(preset("tiny-llama")).aux_loss().item() == 0 and model.aux_loss().item() > 0
    LanguageModel(preset("tiny-llama")).save_pretrained(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    for name in ("moe_experts", "moe_k", "moe_capacity", "moe_aux", "moe_z"):    # saved before MoE existed
        del config[name]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    assert LanguageModel.from_pretrained(tmp_path / "old").config == preset("tiny-llama")
    assert isinstance(ModelConfig(ffn="moe").hidden, int) and ModelConfig(ffn="moe").hidden == ModelConfig().hidden


def test_the_model_gathers_what_its_layers_report_without_knowing_them():
    """The layer protocol: any layer with `stats()` or `added_loss(config)` is collected, in layer order."""
    model = LanguageModel(preset("tiny-moe", vocab_size=64, context=16))
    assert model.stats() == {} and model.aux_loss().item() == 0                 # before a forward: nothing
    model(torch.randint(0, 64, (2, 8)))
    stats, layers = model.stats(), moe_layers(model)
    assert stats["moe_load"] == [[round(f, 4) for f in layer.load.tolist()] for layer in layers]
    assert stats["moe_dropped"] == [round(layer.dropped.item(), 4) for layer in layers]
    stacked = moe_stats(model)                          # the same as tensors, (layers, E) and (layers,)
    assert torch.equal(stacked["moe_load"], torch.stack([layer.load for layer in layers]))
    assert stacked["moe_dropped"].shape == (2,) and moe_stats(LanguageModel(preset("tiny-llama"))) == {}
    assert (LanguageModel.moe_layers, LanguageModel.moe_stats) == (moe_layers, moe_stats)   # aliases (benchmarks)
    cfg = model.config
    by_hand = sum(cfg.moe_aux * layer.aux_loss + cfg.moe_z * layer.z_loss for layer in layers)
    assert torch.allclose(model.aux_loss(), by_hand, rtol=1e-6, atol=0)

    class Counter(torch.nn.Module):                     # a new kind of layer: the model needs no change
        def forward(self, x):
            self.seen = x.shape[1]
            return x

        def stats(self):
            return {"tokens_seen": self.seen}

        def added_loss(self, config):
            return torch.tensor(0.5)

    model.blocks[1].ffn = torch.nn.Sequential(model.blocks[1].ffn, Counter())
    model(torch.randint(0, 64, (2, 8)))
    assert model.stats()["tokens_seen"] == [8] and len(model.stats()["moe_load"]) == 2
    assert torch.allclose(model.aux_loss(), sum(cfg.moe_aux * layer.aux_loss + cfg.moe_z * layer.z_loss
                                                for layer in layers) + 0.5, rtol=1e-6, atol=0)
