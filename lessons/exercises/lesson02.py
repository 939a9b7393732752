"""Self-checks for lesson 02's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which position, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson02.py` (look after trying)."""
import math

import torch

from exercises import attempted, calling, correct, same_tensor
from minwiola.attention import MultiHeadAttention, causal_mask


def _case(d: int, H: int, T: int, B: int = 2, seed: int = 0):
    """A float64 MultiHeadAttention with random (not tiny) weights, its input and its output."""
    g = torch.Generator().manual_seed(seed)
    mha = MultiHeadAttention(d, H, positions="none").double()
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[-1]))
    x = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    with torch.no_grad():
        want = mha(x)
    return (x, mha.q.weight, mha.k.weight, mha.v.weight, mha.out.weight, H), want


def _variant(args, transpose_qkv=True, transpose_o=True, scale="d_h", hide="future", dim=-1, split=True,
             merge=True, w_o=True):
    """Multi-head attention from the weights with one step changed, to recognise a learner's mistake."""
    x, W_q, W_k, W_v, W_o, H = args
    B, T, d = x.shape
    d_h = d // H
    heads = (lambda t: t.view(B, T, H, d_h).transpose(1, 2)) if split else (lambda t: t.reshape(B, H, T, d_h))
    q, k, v = (heads(x @ (W.T if transpose_qkv else W)) for W in (W_q, W_k, W_v))
    scores = q @ k.transpose(-2, -1) / {"d_h": math.sqrt(d_h), "d": math.sqrt(d), "none": 1.0}[scale]
    allowed = causal_mask(T, T)
    hidden = {"future": ~allowed, "past": ~allowed.T, "future and self": ~allowed | torch.eye(T, dtype=torch.bool),
              "nothing": torch.zeros(T, T, dtype=torch.bool)}[hide]
    o = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim) @ v                    # (B, H, T, d_h)
    o = o.transpose(1, 2).reshape(B, T, d) if merge else o.reshape(B, T, d)
    return o @ (W_o.T if transpose_o else W_o) if w_o else o


def _mistakes(d: int, d_h: int):
    """(what the learner did, how _variant computes it), the common mistakes that keep the shape right."""
    return (
        ("you projected with x @ W; nn.Linear stores W as (out, in), so a projection is x @ W.T",
         dict(transpose_qkv=False)),
        ("you projected with x @ W, W_O included; nn.Linear stores W as (out, in), so a projection is x @ W.T",
         dict(transpose_qkv=False, transpose_o=False)),
        ("you applied W_O as o @ W_o; it is stored as (out, in) too: o @ W_o.T", dict(transpose_o=False)),
        (f"you divided the scores by sqrt(d) = sqrt({d}); each head divides by the square root of its OWN width, "
         f"sqrt(d_h) = sqrt({d_h})", dict(scale="d")),
        ("you did not divide the scores by sqrt(d_h)", dict(scale="none")),
        ("you took the softmax over the queries (dim=-2); each query's row of scores, over the keys (dim=-1), "
         "must sum to 1", dict(dim=-2)),
        ("you forgot W_O: the merged heads (B, T, d) still go through o @ W_o.T", dict(w_o=False)),
        ("you masked the diagonal too, so row 0 (position 0) has every key masked and softmax of all -inf is NaN; "
         "a position may read itself: mask only j > i, torch.triu(..., diagonal=1)", dict(hide="future and self")),
        ("you did not mask the future (position t must not see t+1..T-1)", dict(hide="nothing")),
        ("your mask points the wrong way: position t reads t..T-1, the future, instead of 0..t",
         dict(hide="past")),
        ("you reshaped (B, T, d) straight to (B, H, T, d_h), which mixes positions into heads: view it as "
         "(B, T, H, d_h), then swap T and H with .transpose(1, 2)", dict(split=False)),
        ("you merged the heads with a plain reshape of (B, H, T, d_h); transpose back to (B, T, H, d_h) first, "
         "then reshape to (B, T, d)", dict(merge=False)),
    )


_SHAPES = ("print the shapes after each step: (B, T, d) -> (B, H, T, d_h) for q, k, v (view as (B, T, H, d_h), "
           "then swap T and H), scores (B, H, T, T), weights @ v (B, H, T, d_h), back to (B, T, d) with the heads "
           "side by side, then W_o")


def _diagnose(args, got, want) -> str:
    """What is wrong with an output of the right shape: the largest difference, its dtype, NaNs and, when the
    output matches a common mistake computed from the same weights, that mistake."""
    got64 = got.detach().to(torch.float64)
    nan = torch.isnan(got64)
    diff = (got64 - want).abs().nan_to_num(0.0).max().item()
    say = [f"largest absolute difference {diff:.3g}" + (" (NaNs left out)" if nan.any() else "")]
    if got.dtype != torch.float64:
        say.append(f"your result is {got.dtype}; the inputs are float64 and the check compares to 1e-8")
    if nan.any():
        ts = sorted({int(t) for t in nan.any(-1).nonzero()[:, 1]})
        say.append(f"NaN at positions t = {ts}: a row of scores with every key masked gives NaN")
    tol = 1e-8 if got.dtype == torch.float64 else 1e-4       # float32 rounding would hide a mistake's match
    if torch.allclose(got64, want, atol=tol, rtol=0):
        return "; ".join(say) + ". Hint: only the precision is off: keep float64 (no .float(), no float32 tensors)."
    B, T, d = args[0].shape
    for why, change in _mistakes(d, d // args[5]):
        if torch.allclose(got64, _variant(args, **change), atol=tol, rtol=0, equal_nan=True):
            return "; ".join(say) + ". Hint: it matches the output when " + why + "."
    return "; ".join(say) + ". Hint: it matches none of the common mistakes the check knows; " + _SHAPES + "."


def _first_wrong_position(got, want) -> str:
    bad = ~torch.isclose(got.detach().to(want.dtype), want, atol=1e-8, rtol=0).all(-1)       # (B, T)
    if not bad.any():
        return ""
    b, t = (int(i) for i in bad.nonzero()[0])
    return f"the first wrong position is t = {t} (batch {b}); "


def check_1(my_softmax) -> None:
    """my_softmax(s): a softmax along the last dimension that does not overflow."""
    if not attempted(my_softmax(torch.zeros(3)), 1):
        return
    g = torch.Generator().manual_seed(0)
    for s in (torch.randn(10, generator=g), torch.tensor([1000.0, 1001.0, 999.0]), torch.tensor([-1e4, 0.0]),
              torch.tensor([88.0, 90.0])):
        got = my_softmax(s)
        what = f"my_softmax({[round(v, 4) for v in s.tolist()]})"
        assert isinstance(got, torch.Tensor), f"{what}: expected a tensor, got {type(got).__name__}"
        assert torch.isfinite(got).all(), (f"{what} = {got.tolist()} is not finite: exp overflows; subtract the "
                                           "largest score first")
        if got.shape == s.shape:
            assert (got >= 0).all(), (f"{what} has negative entries (smallest {got.min().item():.4g}); softmax "
                                      "weights are e^(s_i - c) / sum_k e^(s_k - c), all positive (a log-softmax "
                                      "is not it)")
            total = got.sum().item()
            assert abs(total - 1) < 1e-6, (f"{what} sums to {total:.6g}; the outputs must sum to 1: divide the "
                                           "exponentials by their sum")
        same_tensor(got, torch.softmax(s, 0), what, atol=1e-6)
    # rows of scores, as attention has them: each row on its own (the last dimension), rows far apart in size
    rows = torch.tensor([[1000.0, 1001.0, 999.0], [0.0, 1.0, 2.0], [-500.0, -501.0, -499.0]])
    got = my_softmax(rows)
    hint = ("softmax each row on its own, along the last dimension: subtract each row's own largest score "
            "(s.amax(-1, keepdim=True)) and divide by each row's own sum (.sum(-1, keepdim=True)); with one "
            "maximum for the whole tensor, the rows far below it underflow to 0")
    if isinstance(got, torch.Tensor) and got.shape == rows.shape and not torch.isfinite(got).all():
        raise AssertionError(f"my_softmax of a (3, 3) tensor of rows has non-finite entries: {hint}")
    same_tensor(got, torch.softmax(rows, -1), "my_softmax of a (3, 3) tensor, rows [1000, 1001, 999], [0, 1, 2], "
                "[-500, -501, -499]", atol=1e-6, hint=hint)
    correct("Exercise 1: correct (stable, and row by row along the last dimension)", my_softmax)


def check_2(my_causal_mask) -> None:
    """my_causal_mask(T_q, T_k): True where query i (the last T_q of T_k positions) may read key j."""
    if not attempted(my_causal_mask(1, 1), 2):
        return
    for T_q, T_k in ((4, 4), (1, 5), (3, 7), (2, 2)):
        got = my_causal_mask(T_q, T_k)
        what = f"my_causal_mask({T_q}, {T_k})"
        assert isinstance(got, torch.Tensor), (f"{what}: expected a boolean torch tensor, got "
                                               f"{type(got).__module__}.{type(got).__name__}")
        if got.dtype != torch.bool:
            additive = got.is_floating_point() and torch.isinf(got).any()
            raise AssertionError(f"{what}: expected a boolean tensor (dtype torch.bool), got {got.dtype}" + (
                "; it looks like an additive mask (0 where allowed, -inf where masked): return True where query i "
                "may read key j instead" if additive else "; a comparison such as j <= i gives booleans"))
        want = causal_mask(T_q, T_k)
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        bad = got != want
        if bad.any():
            i, j = (int(n) for n in bad.nonzero()[0])
            raise AssertionError(f"{what}: query {i} (absolute position {i + T_k - T_q}) and key {j}: got "
                                 f"{bool(got[i, j])}, expected {bool(want[i, j])} (the queries are the LAST {T_q} of "
                                 f"{T_k} positions)")
    correct("Exercise 2: correct", my_causal_mask)


def check_3(my_multi_head_attention) -> None:
    """my_multi_head_attention(x, W_q, W_k, W_v, W_o, H) against minwiola.attention.MultiHeadAttention."""
    args, want = _case(8, 2, 5, B=1)
    if not attempted(my_multi_head_attention(*args), 3):
        return
    for d, H, T, B in ((8, 2, 5, 1), (12, 3, 7, 2), (16, 4, 9, 2), (16, 1, 4, 1)):
        args, want = _case(d, H, T, B, seed=d + H + T)
        got = my_multi_head_attention(*args)
        what = f"d={d}, H={H} heads of d_h={d // H}, T={T}, B={B}"
        if isinstance(got, tuple):
            raise AssertionError(f"{what}: expected a tensor (B, T, d), got a tuple of {len(got)}; return only "
                                 "the output, not the attention weights")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            try:
                same_tensor(got, want, what)
            except AssertionError as e:
                raise AssertionError(f"{e}. Hint: {_SHAPES}.") from None
        try:
            same_tensor(got, want, what, atol=1e-8)
        except AssertionError as e:
            raise AssertionError(_first_wrong_position(got, want) + f"{e}; " + _diagnose(args, got, want)) from None
    correct("Exercise 3: correct (your heads agree with MultiHeadAttention to 1e-8 on four shapes, H = 1 to 4)", my_multi_head_attention)


def _online(scores, values, block, rescale_acc=True, rescale_l=True, sign=1, running_max=True, shift=True,
            divide=True, m0=float("-inf")):
    """The online softmax over blocks of `block` scores with one step changed, to recognise a learner's mistake."""
    m, l, acc = m0, 0.0, torch.zeros(values.shape[1], dtype=torch.float64)
    for start in range(0, len(scores), block):
        s, v = scores[start:start + block], values[start:start + block]
        m_new = max(m, s.max().item()) if running_max else s.max().item()
        factor = math.exp(sign * (m - m_new)) if m > float("-inf") or sign == 1 else 0.0
        c = m_new if shift else 0.0
        with torch.no_grad():
            e = torch.exp(s - c)
        l = (l * factor if rescale_l else l) + e.sum().item()
        acc = (acc * factor if rescale_acc else acc) + e @ v
        m = m_new
    return acc / l if divide else acc


_ONLINE_MISTAKES = (
    ("you rescaled the running sum l but not the accumulator acc: when a new block raises the maximum from m to m', "
     "acc must be multiplied by exp(m - m') too", dict(rescale_acc=False)),
    ("you rescaled acc but not the running sum l: both were computed relative to the old maximum, both get "
     "exp(m - m')", dict(rescale_l=False)),
    ("you rescaled neither l nor acc when the maximum rose: everything summed so far is relative to the old m and "
     "must be multiplied by exp(m - m')", dict(rescale_acc=False, rescale_l=False)),
    ("you rescaled by exp(m' - m); the old terms e^(s - m) become e^(s - m') by multiplying with exp(m - m'), "
     "which is at most 1", dict(sign=-1)),
    ("you returned acc without dividing by the running sum l", dict(divide=False)),
)


def check_4(my_online_softmax) -> None:
    """my_online_softmax(scores, values, block): softmax(scores) @ values, one block of scores at a time."""
    if not attempted(my_online_softmax(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64), 1), 4):
        return
    g = torch.Generator().manual_seed(0)
    rising = torch.arange(12, dtype=torch.float64) * 0.7                   # every block raises the maximum
    falling = rising.flip(0)                                               # the first block holds it
    cases = [("scores rising block after block", rising, 4), ("scores falling", falling, 4),
             ("random scores, blocks of 3 (the last block shorter)", torch.randn(20, generator=g, dtype=torch.float64) * 3, 3),
             ("random scores, one block holds them all", torch.randn(7, generator=g, dtype=torch.float64), 7),
             ("random scores, blocks of 1", torch.randn(9, generator=g, dtype=torch.float64) * 2, 1),
             ("large scores (around 1000)", 1000 + torch.randn(10, generator=g, dtype=torch.float64), 4),
             ("very negative scores (around -1000)", -1000 + torch.randn(10, generator=g, dtype=torch.float64), 4),
             ("a block around 1000, then one around -1000",
              torch.cat([1000 + torch.randn(4, generator=g, dtype=torch.float64),
                         -1000 + torch.randn(4, generator=g, dtype=torch.float64)]), 4)]
    for what, scores, block in cases:
        values = torch.randn(len(scores), 3, generator=g, dtype=torch.float64)
        got = calling(my_online_softmax, f"my_online_softmax({what}, values (n, 3), block={block})", scores, values,
                      block, hint="(An OverflowError from math.exp means an exponent above 709: the rescaling factor "
                      "is exp(m - m') with the RUNNING maximum m' = max(m, block's max), so it is never above 1.)")
        want = torch.softmax(scores, 0) @ values
        where = f"{what}, n = {len(scores)}, block = {block}"
        assert isinstance(got, torch.Tensor), f"{where}: expected a tensor of shape (3,), got {type(got).__name__}"
        if got.shape == want.shape and not torch.isfinite(got).all():
            big = scores.abs().max().item() > 100
            if scores.max() - scores.min() > 1000 and torch.isfinite(_online(scores, values, block)).all():
                raise AssertionError(f"{where}: your result {got.tolist()} is not finite. Keep the RUNNING maximum, "
                                     "m' = max(m, block's max): if m follows each block's own maximum it goes down "
                                     "here, and the rescaling exp(m - m') = exp(2000) overflows")
            raise AssertionError(f"{where}: your result {got.tolist()} is not finite. " + (
                "Start from m = -inf (not 0) and work relative to the running maximum m: exp(s - m), never exp(s) "
                "alone, which overflows at 1000 and gives 0 / 0 at -1000" if big else
                "If you start from m = -inf, the first rescaling is exp(-inf - m') = 0, which is right; but "
                "-inf - (-inf) is NaN, so compute m' = max(m, block's max) before you rescale"))
        hint = ""
        if got.shape == want.shape:
            for said, variant in _ONLINE_MISTAKES:
                if torch.allclose(got.double(), _online(scores, values, block, **variant), atol=1e-9):
                    hint = said
                    break
        same_tensor(got, want, f"my_online_softmax: {where}", atol=1e-9, hint=hint)
    correct("Exercise 4: correct (softmax(scores) @ values, block by block, with the running maximum)",
            my_online_softmax)


EXERCISES = {1: "my_softmax", 2: "my_causal_mask", 3: "my_multi_head_attention", 4: "my_online_softmax"}
