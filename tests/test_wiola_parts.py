"""Wiola part I: WiolaRMSNorm (eqs. 8-10), SRPE (eqs. 11-19), DSFF (eqs. 34-37)."""
import math

import pytest
import torch

from minwiola.ffn import DSFF
from minwiola.model import LanguageModel, ModelConfig, preset
from minwiola.norm import RMSNorm, WiolaRMSNorm, WiolaRMSNormFunction, paper_eq10_delta_grad
from minwiola.attention import MultiHeadAttention
from minwiola.positions import MAX_EXPONENT, rope_coefficients, rotate, srpe_coefficients, srpe_helix


pytestmark = pytest.mark.usefixtures("float64")   # every test here runs in float64 (tests/conftest.py)


def plain_wiola(x, gamma, delta, eps=1e-6):
    """Eq. 9 written with ordinary autograd operations: the reference for the hand-written backward."""
    z = x + delta
    return gamma * z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps)


# ---------------------------------------------------------------------------------------------------- norm

def test_parameters_are_gamma_and_delta_and_zero_delta_is_rmsnorm():
    norm = WiolaRMSNorm(16)
    assert [n for n, _ in norm.named_parameters()] == ["gamma", "delta"]
    rms = RMSNorm(16)
    with torch.no_grad():
        norm.gamma.normal_()
        rms.weight.copy_(norm.gamma)
    x = torch.randn(3, 5, 16)
    assert torch.equal(norm(x), rms(x)) or torch.allclose(norm(x), rms(x), atol=1e-15)


def test_hand_written_backward_passes_gradcheck():
    x = torch.randn(2, 3, 8, requires_grad=True)
    gamma = (1 + 0.5 * torch.randn(8)).requires_grad_()
    delta = (0.3 * torch.randn(8)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c: WiolaRMSNormFunction.apply(a, b, c, 1e-6), (x, gamma, delta))


def test_backward_matches_autograd_of_the_formula():
    x = torch.randn(4, 7, 16)
    gamma, delta = 1 + 0.5 * torch.randn(16), 0.3 * torch.randn(16)
    g = torch.randn(4, 7, 16)
    ours = [t.clone().requires_grad_() for t in (x, gamma, delta)]
    (WiolaRMSNormFunction.apply(*ours, 1e-6) * g).sum().backward()
    ref = [t.clone().requires_grad_() for t in (x, gamma, delta)]
    (plain_wiola(*ref) * g).sum().backward()
    for a, b in zip(ours, ref):
        assert torch.allclose(a.grad, b.grad, atol=1e-12)
    assert torch.allclose(ours[2].grad, ours[0].grad.sum((0, 1)), atol=1e-12)   # delta's gradient: sum over tokens


def test_one_token_input_and_no_silent_second_derivatives():
    norm = WiolaRMSNorm(8)
    x = torch.randn(8, requires_grad=True)
    norm(x).sum().backward()                                               # a single (d,) vector works
    assert x.grad.shape == (8,) and norm.delta.grad.shape == (8,)
    x = torch.randn(3, 8, requires_grad=True)
    (grad,) = torch.autograd.grad(norm(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()                                              # refused, not silently zero


def test_paper_eq10_is_right_only_when_gamma_is_one():
    x, delta, g = torch.randn(37, 64), 0.3 * torch.randn(64), torch.randn(37, 64)
    for gamma, should_match in [(torch.ones(64), True), (1 + 0.5 * torch.randn(64), False),
                                (torch.full((64,), 2.0), False)]:
        d = delta.clone().requires_grad_()
        (plain_wiola(x, gamma, d) * g).sum().backward()
        paper = paper_eq10_delta_grad(x, gamma, delta, g)
        gap = (paper - d.grad).abs().max().item()
        assert (gap < 1e-12) == should_match, (gamma[:3], gap)
        if not should_match:
            assert gap > 0.05 * d.grad.abs().max().item()


def test_a_large_delta_makes_outputs_alike():
    x = torch.randn(256, 32)
    direction = torch.randn(32)

    def mean_cosine(y):
        y = torch.nn.functional.normalize(y, dim=-1)
        sim = y @ y.T
        return ((sim.sum() - sim.diagonal().sum()) / (len(y) * (len(y) - 1))).item()

    cosines = []
    for scale in (0.0, 1.0, 4.0, 16.0):
        norm = WiolaRMSNorm(32)
        with torch.no_grad():
            norm.delta.copy_(direction / direction.norm() * x.norm(dim=-1).mean() * scale)
        cosines.append(mean_cosine(norm(x)))
    assert abs(cosines[0]) < 0.02 and all(a < b for a, b in zip(cosines, cosines[1:])) and cosines[-1] > 0.99


# ---------------------------------------------------------------------------------------------------- SRPE

def test_srpe_shapes_and_rope_limit():
    p = torch.arange(100)
    c, s = srpe_coefficients(p, 16)
    assert c.shape == s.shape == (100, 8)
    c0, s0 = srpe_coefficients(p, 16, k_s=math.inf, a_s=0.0)
    rc, rs = rope_coefficients(p, 16)
    assert torch.equal(c0, rc) and torch.equal(s0, rs)                 # a_s = 0, no secondary winding: RoPE


def test_srpe_is_scaled_rope_times_a_radius():
    p, d_h, k_s, a_s, f_s = torch.arange(2048), 32, 8.0, 0.1, 1 / 16
    c, s = srpe_coefficients(p, d_h, k_s=k_s, a_s=a_s, f_s=f_s)
    rc, rs = rope_coefficients(p * (1 + 1 / k_s), d_h)               # RoPE at positions stretched by 1 + 1/k_s
    w = 10000.0 ** (-2 * torch.arange(d_h // 2) / d_h)
    r = 1 + a_s * torch.sin(p[:, None] * f_s * w)
    assert torch.allclose(c, r * rc, atol=1e-11) and torch.allclose(s, r * rs, atol=1e-11)
    x, y, z = srpe_helix(p, 0, d_h, k_s=k_s, a_s=a_s, f_s=f_s)
    assert torch.allclose(torch.sqrt(x**2 + y**2), r[:, 0]) and torch.equal(z, p.double())


def test_srpe_score_moves_with_absolute_position_and_norms_change():
    d_h = 32
    q, k = torch.randn(d_h), torch.randn(d_h)
    for a_s, should_move in [(0.0, False), (0.05, True)]:
        c, s = srpe_coefficients(torch.arange(600), d_h, a_s=a_s)
        rq, rk = rotate(q.expand(600, d_h), c, s), rotate(k.expand(600, d_h), c, s)
        scores = (rq[5:] * rk[:-5]).sum(-1)                            # fixed offset 5, moving start
        assert ((scores.max() - scores.min()) > 1e-3) == should_move
        norms = rq.norm(dim=-1) / q.norm()
        assert ((norms.max() - norms.min()) > 1e-3) == should_move


def test_srpe_settings_are_validated():
    for kwargs, match in [(dict(a_s=1.0), "a_s must be in"), (dict(a_s=-0.1), "a_s must be in"),
                          (dict(k_s=0.0), "k_s must be > 0"), (dict(f_s=-1.0), "f_s must be >= 0")]:
        with pytest.raises(ValueError, match=match):
            srpe_coefficients(torch.arange(3), 8, **kwargs)
    with pytest.raises(ValueError, match="a_s must be in"):
        ModelConfig(positions="srpe", srpe_a=1.5)


def pair_scores(q, k, pq, pk, **srpe):
    """The score of query q at positions pq against key k at positions pk (1-D tensors of equal length)."""
    cq, sq = srpe_coefficients(pq, len(q), side="query", **srpe)
    ck, sk = srpe_coefficients(pk, len(k), side="key", **srpe)
    return (rotate(q.expand(len(pq), -1), cq, sq) * rotate(k.expand(len(pk), -1), ck, sk)).sum(-1)


@pytest.mark.parametrize("a_s,f_s,n", [(0.05, 1 / 16, 480), (0.3, 1.0, 90)])
def test_offset_radius_keeps_the_score_relative_and_the_paper_radius_does_not(a_s, f_s, n):
    d_h, start = 32, torch.arange(0, n)
    q, k = torch.randn(d_h), torch.randn(d_h)
    for offset in (0, 1, 7, 30):
        scores = {radius: pair_scores(q, k, start + offset, start, a_s=a_s, f_s=f_s, radius=radius, centre=(n + 30) / 2)
                  for radius in ("paper", "offset")}
        assert (scores["offset"] - scores["offset"][0]).abs().max() < 1e-10      # the offset alone decides
        if offset:
            assert (scores["paper"] - scores["paper"][0]).abs().max() > 1e-3     # eq. 14: absolute position moves it
        # and it is stretched RoPE's pair scores, each damped by rho_j^offset, ln rho_j = -a_s f_s w_j
        w = 10000.0 ** (-2 * torch.arange(d_h // 2) / d_h)
        rc, rs = rope_coefficients(torch.tensor([offset * (1 + 1 / 8)]), d_h)
        h = d_h // 2
        pairs = (q[:h] * k[:h] + q[h:] * k[h:]) * rc[0] + (q[:h] * k[h:] - q[h:] * k[:h]) * rs[0]
        assert abs(scores["offset"][0] - (torch.exp(-a_s * f_s * w * offset) * pairs).sum()) < 1e-10


@pytest.mark.parametrize("radius", ["paper", "offset"])
def test_attention_output_under_shifted_positions_is_unchanged_only_with_the_offset_radius(radius):
    layer = MultiHeadAttention(24, 3, positions="srpe", max_len=64, srpe=(8.0, 0.3, 1.0), srpe_radius=radius)
    layer = layer.double()
    x = torch.randn(2, 12, 24)
    outs = [layer(x, positions=torch.arange(12).expand(2, 12) + shift) for shift in (0, 20, 50)]
    moved = max((o - outs[0]).abs().max() for o in outs[1:])
    assert (moved < 1e-10) if radius == "offset" else (moved > 1e-3)
    assert torch.allclose(layer(x), outs[0], atol=1e-12, rtol=0)                  # positions 0..T-1 by default


def test_offset_radius_model_is_causal_and_cached_decoding_equals_the_full_forward():
    torch.manual_seed(0)                                                 # GCLA (its context path) and GQA too
    model = LanguageModel(preset("wiola-tiny", srpe_radius="offset", srpe_a=0.3, srpe_f=1.0, init_std=0.3))
    model = model.double().eval()
    assert model.blocks[0].mixer.keys_differ
    x = torch.randint(0, 64, (2, 20))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 64
    with torch.no_grad():
        full = model(x)
        assert torch.equal(model(y)[:, :-1], full[:, :-1])
        cache = model.new_cache()
        steps = torch.cat([model(x[:, t:t + 1], cache) for t in range(20)], dim=1)
        cache = model.new_cache()
        chunks = torch.cat([model(x[:, :7], cache), model(x[:, 7:], cache)], dim=1)
    assert (steps - full).abs().max() < 1e-10 and (chunks - full).abs().max() < 1e-10


def test_offset_radius_tables_match_the_exact_coefficients_and_queries_differ_from_keys():
    torch.set_default_dtype(torch.float32)                               # tables as a float32 model holds them
    layer = MultiHeadAttention(24, 3, positions="srpe", max_len=512, srpe_radius="offset")
    torch.set_default_dtype(torch.float64)
    for side, (cos, sin) in [("query", (layer.cos, layer.sin)), ("key", (layer.key_cos, layer.key_sin))]:
        c, s = srpe_coefficients(torch.arange(512), 8, radius="offset", side=side, centre=255.5)
        assert torch.allclose(cos.double(), c, atol=1e-6) and torch.allclose(sin.double(), s, atol=1e-6)
    assert not torch.allclose(layer.cos, layer.key_cos)
    assert not hasattr(MultiHeadAttention(24, 3, positions="srpe", max_len=64), "key_cos")   # "paper": one table


def test_offset_radius_with_a_s_zero_is_the_paper_form_and_rope():
    p = torch.arange(300)
    for side in ("query", "key"):
        for kwargs in (dict(a_s=0.0), dict(a_s=0.3, f_s=0.0)):                   # rho_j = 1 either way
            c, s = srpe_coefficients(p, 16, radius="offset", side=side, centre=100.0, **kwargs)
            cp, sp = srpe_coefficients(p, 16, radius="paper", **{**kwargs, "a_s": 0.0})
            assert torch.equal(c, cp) and torch.equal(s, sp)
        c, s = srpe_coefficients(p, 16, k_s=math.inf, a_s=0.0, radius="offset", side=side)
        rc, rs = rope_coefficients(p, 16)
        assert torch.equal(c, rc) and torch.equal(s, rs)


def test_srpe_radius_values_are_validated():
    with pytest.raises(ValueError, match="srpe radius must be one of"):
        ModelConfig(positions="srpe", srpe_radius="spiral")
    with pytest.raises(ValueError, match="srpe radius must be one of"):
        srpe_coefficients(torch.arange(3), 8, radius="log")
    with pytest.raises(ValueError, match="srpe side must be one of"):
        srpe_coefficients(torch.arange(3), 8, radius="offset", side="value")
    with pytest.raises(ValueError, match=r"context of 4096 needs radii up to e\^\(a_s f_s"):
        ModelConfig(positions="srpe", srpe_radius="offset", srpe_a=0.9, srpe_f=1.0, context=4096)
    with pytest.raises(ValueError, match="context of 4096"):
        MultiHeadAttention(24, 3, positions="srpe", max_len=4096, srpe=(8.0, 0.9, 1.0), srpe_radius="offset")
    with pytest.raises(ValueError, match=r"\|ln radius\| reaches"):
        srpe_coefficients(torch.tensor([0, 100]), 8, a_s=0.5, f_s=1.0, radius="offset", side="key")
    top = MAX_EXPONENT / (0.05 / 16) * 2 + 1                             # the largest context the defaults allow
    ModelConfig(positions="srpe", srpe_radius="offset", context=int(top))
    ModelConfig(positions="rope", srpe_radius="offset", srpe_a=0.9, srpe_f=1.0, context=4096)   # SRPE unused


def test_a_config_json_written_before_srpe_radius_loads_with_the_paper_radius(tmp_path):
    import json
    model = LanguageModel(preset("wiola-tiny")).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config.pop("srpe_radius") == "paper"
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = LanguageModel.from_pretrained(tmp_path).eval()
    x = torch.randint(0, 64, (1, 10))
    assert loaded.config.srpe_radius == "paper" and torch.equal(loaded(x), model(x))


def test_a_run_written_before_srpe_radius_resumes_only_with_the_paper_radius(tmp_path):
    import dataclasses
    import json
    from minwiola import train
    from minwiola.tools import runs
    record = {"train": {"steps": 10}, "model": dataclasses.asdict(preset("wiola-tiny"))}
    older = {"train": record["train"], "model": {k: v for k, v in record["model"].items() if k != "srpe_radius"}}
    (tmp_path / "config.json").write_text(json.dumps(older))
    runs.check_same_run(tmp_path, record, train.added_later())                                # it was built with the paper's radius
    record["model"]["srpe_radius"] = "offset"
    with pytest.raises(runs.RunFolderError, match="model.srpe_radius: 'paper' there, 'offset' now"):
        runs.check_same_run(tmp_path, record, train.added_later())


# ---------------------------------------------------------------------------------------------------- DSFF

def test_dsff_starts_as_an_average_and_its_gate_can_learn():
    ffn = DSFF(16, 8, 32)
    ffn.reset_gate()
    x = torch.randn(2, 5, 16, requires_grad=True)
    out = ffn(x)
    assert torch.allclose(ffn.last_alpha, torch.full_like(ffn.last_alpha, 0.5))
    assert torch.allclose(out, (ffn.stream_a(x) + ffn.stream_b(x)) / 2, atol=1e-14)
    (out ** 2).sum().backward()
    assert ffn.fuse.weight.grad.abs().max() > 1e-3                      # W_f = 0 is not a dead point


def test_a_new_dsff_has_a_zero_gate():
    assert torch.equal(DSFF(8, 4, 12).fuse.weight, torch.zeros(8, 16))


def test_dsff_parameters():
    d, d_A, d_B = 16, 8, 32
    ffn = DSFF(d, d_A, d_B)
    assert sum(p.numel() for p in ffn.parameters()) == 3 * d * d_A + 2 * d * d_B + 2 * d * d


# ------------------------------------------------------------------------------------------- in a model

WIOLA_PART_ONE = dict(norm="wiola", positions="srpe", ffn="dsff", d_ff=48, d_ff_a=16)


def test_model_with_the_three_parts_is_causal_and_cacheable():
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama", init_std=0.3, **WIOLA_PART_ONE)).double().eval()
    with torch.no_grad():                                                # make the new parameters matter too
        for name, p in model.named_parameters():
            if name.endswith(("delta", "fuse.weight")):
                p.normal_(0, 0.3)
    x = torch.randint(0, 64, (2, 20))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 64
    full = model(x)
    assert torch.equal(model(y)[:, :-1], full[:, :-1])
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache) for t in range(20)], dim=1)
    assert (steps - full).abs().max() < 1e-10
    cache = model.new_cache()
    chunks = torch.cat([model(x[:, :7], cache), model(x[:, 7:], cache)], dim=1)
    assert (chunks - full).abs().max() < 1e-10


def test_dsff_mixes_with_alpha_and_one_minus_alpha():
    ffn = DSFF(16, 8, 32)
    with torch.no_grad():
        ffn.fuse.weight.normal_()
    x = torch.randn(3, 16)
    a, b = ffn.stream_a(x), ffn.stream_b(x)
    alpha = torch.sigmoid(ffn.fuse(torch.cat([a, b], -1)))
    assert not torch.allclose(alpha, torch.full_like(alpha, 0.5))
    assert torch.allclose(ffn(x), alpha * a + (1 - alpha) * b, atol=1e-14)


def test_model_starts_dsff_gates_at_one_half_and_uses_srpe():
    model = LanguageModel(preset("tiny-llama", **WIOLA_PART_ONE))
    assert all(torch.equal(b.ffn.fuse.weight, torch.zeros_like(b.ffn.fuse.weight)) for b in model.blocks)
    attn = model.blocks[0].mixer
    c, s = srpe_coefficients(torch.arange(model.config.context), attn.d_h)
    assert torch.allclose(attn.cos.double(), c) and torch.allclose(attn.sin.double(), s)
