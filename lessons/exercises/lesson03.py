"""Self-checks for lesson 03's exercises: RMSNorm, RoPE's rotation, SwiGLU, then the whole model's forward pass and
loss, each compared with the library; and a cross-entropy that cannot overflow, against F.cross_entropy. A function that still returns None is "not attempted yet". Solutions:
`solutions/lesson03.py` (look after trying).

When an answer is wrong, the check also computes the usual mistakes from the same inputs and weights (with the
library's pieces) and names the one your answer matches, if any."""
import math

import torch
import torch.nn.functional as F

from exercises import attempted, close, correct, same_tensor
from minwiola.ffn import SwiGLU
from minwiola.model import LanguageModel, next_token_loss, preset
from minwiola.norm import RMSNorm
from minwiola.positions import rope_coefficients, rotate

F64 = torch.float64


def call(fn, name: str, inputs: str, advice: str):
    """fn's result, or an AssertionError naming the inputs and the error, instead of a raw traceback from inside."""
    def run(*args):
        try:
            return fn(*args)
        except Exception as e:                             # the learner's code failed: say on what, and why likely
            raise AssertionError(f"{name} raised {type(e).__name__} ({e}) on {inputs}. "
                                 f"{advice[0].upper()}{advice[1:]}") from None
    return run


def diagnose(got, want, variants: dict[str, torch.Tensor], otherwise: str, tol: float = 1e-8) -> str:
    """A hint for a wrong tensor: its dtype if not float64, the named variant it equals (to tol), a rounding-size
    difference, or `otherwise`."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return otherwise[0].upper() + otherwise[1:]
    if got.dtype != F64:
        return (f"Your result is {got.dtype}, the check's inputs are float64: keep float64 throughout (no .float(), "
                f"no float32 intermediate), float32 is right to only about 7 digits")
    for name, value in variants.items():
        if value.shape == got.shape and torch.allclose(got, value, atol=tol, rtol=0):
            return f"Your result equals {name}"
    if (got - want).abs().max() < 1e-4:
        return ("The difference is rounding-sized: some intermediate is probably computed in float32; "
                "compute in float64")
    return otherwise[0].upper() + otherwise[1:]


def compare(fn, name: str, args: tuple, want, what: str, advice: str, variants: dict, otherwise: str) -> None:
    """Call the learner's fn(*args) (an error there named with `what` and `advice`), then compare with `want` to
    1e-10, the hint naming the variant the answer equals, if any."""
    got = call(fn, name, what, advice)(*args)
    same_tensor(got, want, what, atol=1e-10, hint=diagnose(got, want, variants, otherwise))


# ---------------------------------------------------------------------------------------------------- exercise 1

def rmsnorm_variants(x, w, eps) -> dict[str, torch.Tensor]:
    ms = x.pow(2).mean(-1, keepdim=True)
    return {"w x / (sqrt(mean(x^2)) + eps): eps belongs inside the square root, added to the mean of the squares "
            "(it matters most when RMS(x) is small)": w * x / (ms.sqrt() + eps),
            "w x / sqrt(sum(x^2) + eps): the mean of the squares is the sum divided by d": w * x / torch.sqrt(
                x.pow(2).sum(-1, keepdim=True) + eps),
            "LayerNorm's (x - mean(x)) / sqrt(var(x) + eps) times w: RMSNorm does not subtract the mean":
                w * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps),
            "x / sqrt(mean(x^2) + eps) without the weight: multiply by `weight` (one gain per dimension)":
                x / torch.sqrt(ms + eps),
            "w x * sqrt(mean(x^2) + eps): divide by the RMS, do not multiply": w * x * torch.sqrt(ms + eps)}


def check_1(my_rmsnorm) -> None:
    """my_rmsnorm(x, weight, eps) against minwiola.norm.RMSNorm."""
    g = torch.Generator().manual_seed(0)
    advice = ("x is (..., d): take the mean over the last dimension with keepdim=True, so the RMS (..., 1) "
              "broadcasts over x, and weight (d,) multiplies the last dimension")
    probe = call(my_rmsnorm, "my_rmsnorm", "x = ones(3), weight = ones(3), eps = 1e-6", advice)
    if not attempted(probe(torch.ones(3, dtype=F64), torch.ones(3, dtype=F64), 1e-6), 1):
        return
    for shape, scale, eps in (((8,), 1.0, 1e-6), ((2, 5, 16), 3.0, 1e-6), ((4, 16), 1e-3, 1e-6),
                              ((4, 16), 1e-3, 1e-5)):
        ref = RMSNorm(shape[-1], eps=eps).to(F64)
        with torch.no_grad():
            ref.weight.copy_(torch.randn(shape[-1], generator=g, dtype=F64))
        x = torch.randn(*shape, generator=g, dtype=F64) * scale + scale / 3
        w = ref.weight.detach()
        with torch.no_grad():
            want = ref(x)
        what = f"x of shape {shape} and RMS about {scale:g}, eps={eps:g}"
        compare(my_rmsnorm, "my_rmsnorm", (x, w, eps), want, what, advice, rmsnorm_variants(x, w, eps),
                "none of the usual mistakes (eps outside the root, sum for mean, mean subtracted, weight missing) "
                "matches: compare your formula with eq. 8 term by term")
    correct("Exercise 1: correct", my_rmsnorm)


# ---------------------------------------------------------------------------------------------------- exercise 2

def rope_variants(x, positions, theta0) -> dict[str, torch.Tensor]:
    d_h = x.shape[-1]
    def lib(p, t=theta0, d=d_h):                          # the library's rotation, w_j = t^(-2j/d)
        cos, sin = rope_coefficients(p, d, t)
        return rotate(x, cos[:, :d_h // 2], sin[:, :d_h // 2])

    halves = torch.cat([torch.arange(0, d_h, 2), torch.arange(1, d_h, 2)])   # adjacent pairs = ours, permuted
    adjacent = torch.empty_like(x)
    adjacent[..., halves] = rotate(x[..., halves], *rope_coefficients(positions, d_h, theta0))
    return {"the rotation of adjacent pairs (x_2j, x_(2j+1)) (Meta's and CS336's layout): here pair j is "
            "(x_j, x_(j + d_h/2)), the two halves": adjacent,
            "a rotation by -p w_j (the wrong way round): y_j = x_j cos - x_(j + d_h/2) sin, "
            "y_(j + d_h/2) = x_j sin + x_(j + d_h/2) cos": lib(-positions),
            "the rotation with w_j = theta0^(-j/d_h): the exponent is -2j/d_h": lib(positions, theta0, 2 * d_h),
            "the rotation with theta0 = 10000 whatever `theta0` says: use the argument": lib(positions, 1e4),
            "the rotation by positions 0, 1, ..., T-1: use the `positions` argument (they need not start at 0 or be "
            "consecutive)": lib(torch.arange(x.shape[-2])),
            "x unrotated": x}


def check_3(my_rope) -> None:
    """my_rope(x, positions, theta0) against minwiola.positions.rotate with rope_coefficients."""
    g = torch.Generator().manual_seed(0)
    advice = ("x is (..., T, d_h) with any number of leading dimensions (batch, heads): the last index is the "
              "dimension, the one before it the position; the angles (T, d_h/2) broadcast over the leading ones")
    x = torch.randn(3, 4, generator=g, dtype=F64)
    probe = call(my_rope, "my_rope", "x of shape (3, 4), positions [0, 1, 2], theta0=10000", advice)
    if not attempted(probe(x, torch.arange(3), 10000.0), 3):
        return
    for shape, positions, theta0 in (((5, 8), torch.arange(5), 10000.0),
                                     ((2, 4, 7, 16), torch.arange(10, 17), 10000.0),
                                     ((6, 32), torch.tensor([0, 3, 4, 100, 511, 7]), 500.0)):
        x = torch.randn(*shape, generator=g, dtype=F64)
        want = rotate(x, *rope_coefficients(positions, shape[-1], theta0))
        what = f"x {shape}, positions {positions.tolist()}, theta0={theta0:g}"
        compare(my_rope, "my_rope", (x, positions, theta0), want, what, advice, rope_variants(x, positions, theta0),
                "pair j is (x_j, x_(j + d_h/2)), rotated by positions[t] * theta0^(-2j/d_h); the last index is the "
                "dimension, the one before it the position")
    correct("Exercise 3: correct", my_rope)


# ---------------------------------------------------------------------------------------------------- exercise 3

def swiglu_variants(x, layer) -> dict[str, torch.Tensor]:
    a, b = layer.gate(x), layer.up(x)
    down = layer.down
    return {"W_down (x W_gate^T * SiLU(x W_up^T)): the SiLU acts on the gate, not on the up projection":
                down(a * F.silu(b)),
            "W_down (GELU(x W_gate^T) * (x W_up^T)): SwiGLU's switch is SiLU, z sigmoid(z)": down(F.gelu(a) * b),
            "W_down (sigmoid(x W_gate^T) * (x W_up^T)): SiLU(z) is z sigmoid(z), not sigmoid(z)":
                down(torch.sigmoid(a) * b),
            "W_down SiLU(x W_gate^T) without the up projection: multiply by x W_up^T": down(F.silu(a)),
            "W_down ((x W_gate^T) * (x W_up^T)) without the SiLU": down(a * b)}


def check_2(my_swiglu) -> None:
    """my_swiglu(x, w_gate, w_up, w_down) against minwiola.ffn.SwiGLU with those weights."""
    g = torch.Generator().manual_seed(0)
    advice = ("the weights are stored as nn.Linear stores them, (out, in): w_gate, w_up (h, d) and w_down (d, h), "
              "so a projection of x (..., d) is x @ w.T")
    probe = call(my_swiglu, "my_swiglu", "x (1, 2), w_gate (3, 2), w_up (3, 2), w_down (2, 3)", advice)
    if not attempted(probe(torch.ones(1, 2, dtype=F64), torch.ones(3, 2, dtype=F64), torch.ones(3, 2, dtype=F64),
                           torch.ones(2, 3, dtype=F64)), 2):
        return
    for shape, hidden in (((4, 8), 24), ((2, 5, 16), 48)):
        layer = SwiGLU(shape[-1], hidden).to(F64)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=F64) / p.shape[-1] ** 0.5)
        x = torch.randn(*shape, generator=g, dtype=F64)
        what = f"x {shape}, hidden width {hidden}"
        weights = [m.weight.detach() for m in (layer.gate, layer.up, layer.down)]
        with torch.no_grad():
            compare(my_swiglu, "my_swiglu", (x, *weights), layer(x), what, advice, swiglu_variants(x, layer),
                    "expected W_down (SiLU(x W_gate^T) * (x W_up^T)), i.e. (silu(x @ w_gate.T) * (x @ w_up.T)) "
                    "@ w_down.T")
    correct("Exercise 2: correct", my_swiglu)


# ---------------------------------------------------------------------------------------------------- exercise 4

def forward_variant(model, ids, mistake: str = "") -> torch.Tensor:
    """The model's logits built from the library's pieces, with one deliberate `mistake` (for the hints)."""
    cfg = model.config
    B, T = ids.shape
    H, d_h = cfg.n_heads, cfg.d_h
    cos, sin = rope_coefficients(torch.arange(T), d_h, cfg.rope_theta)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = model.embed(ids)
    for block in model.blocks:
        attn, h = block.attn, block.norm1(x)
        split = (lambda t: t.view(B, H, T, d_h)) if mistake == "split" else \
            (lambda t: t.view(B, T, H, d_h).transpose(1, 2))
        q, k, v = split(attn.q(h)), split(attn.k(h)), split(attn.v(h))
        if mistake != "no rope":
            q = rotate(q, cos, sin)
            k = k if mistake == "rope on q" else rotate(k, cos, sin)
        scores = q @ k.transpose(-2, -1) / (1 if mistake == "no scale" else math.sqrt(d_h))
        if mistake != "no mask":
            scores = scores.masked_fill(~mask, float("-inf"))
        o = torch.softmax(scores, -1) @ v
        o = o.reshape(B, T, H * d_h) if mistake == "merge" else o.transpose(1, 2).reshape(B, T, H * d_h)
        x = x + (o @ attn.out.weight if mistake == "W_O" else attn.out(o))
        x = x + block.ffn(block.norm2(x))
    h = x if mistake == "no final norm" else model.norm(x)
    return h @ model.embed.weight.T


FORWARD_MISTAKES = {
    "no scale": "scores without the 1/sqrt(d_h) scale (position 0 is still right: a single key gets weight 1 "
                "whatever the scale)",
    "no mask": "no causal mask (query t must see keys 0..t only; without the mask even position 0 sees the future)",
    "no rope": "no rotation of queries and keys (RoPE goes on q and k after the head split, before the scores)",
    "rope on q": "the rotation on the queries only: rotate the keys too",
    "split": "the heads split with .view(B, H, T, d_h): the projection is (B, T, H*d_h), so view it as "
             "(B, T, H, d_h) and then transpose to (B, H, T, d_h)",
    "merge": "the heads merged with .reshape(B, T, H*d_h) straight from (B, H, T, d_h): transpose back to "
             "(B, T, H, d_h) first",
    "W_O": "the output projection as o @ W_O: weights are stored (out, in), so it is o @ W_O.T",
    "no final norm": "no final norm before the tied head: logits = RMSNorm(x) E^T with model.norm.weight",
}


def check_4(my_forward) -> None:
    """my_forward(model, ids, targets) -> (logits, loss) against LanguageModel's forward and loss, to 1e-6."""
    torch.manual_seed(0)
    tiny = LanguageModel(preset("tiny-llama", n_kv_heads=None, init_std=0.3)).to(F64).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (1, 5), generator=g)
    advice = ("the shapes: ids (B, T) -> x = E[ids] (B, T, d); q, k, v (B, T, H*d_h) -> (B, H, T, d_h); "
              "scores (B, H, T, T); merged heads (B, T, H*d_h); logits (B, T, V); weights are (out, in), so "
              "a projection is x @ w.T. (If one of your exercise 1-3 functions, or lesson 02's my_softmax or "
              "my_causal_mask, still returns None, finish it first.)")
    with torch.no_grad():
        first = call(my_forward, "my_forward", "the first small case, ids of shape (1, 5)", advice)(
            tiny, ids, torch.roll(ids, -1, 1))
    if not attempted(first, 4):
        return
    cases = [(tiny, 1, 5), (tiny, 2, 32),
             (LanguageModel(preset("llama-style", vocab_size=300, context=64, n_layers=2, init_std=0.1)).to(F64).eval(),
              3, 40)]
    for model, B, T in cases:
        cfg = model.config
        ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        what = f"model d={cfg.d}, L={cfg.n_layers}, H={cfg.n_heads}, V={cfg.vocab_size}; ids of shape {(B, T)}"
        with torch.no_grad():
            want = model(ids)
            want_loss = next_token_loss(want, targets).item()
            got = call(my_forward, "my_forward", what, advice)(model, ids, targets)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            kind = (f"a tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else
                    f"a {type(got).__name__}" + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""))
            raise AssertionError(f"{what}: expected the pair (logits, loss), got {kind}")
        logits, loss = got
        assert isinstance(logits, torch.Tensor), (f"{what}: logits (the first of the pair) should be a tensor, got "
                                                  f"{type(logits).__name__}; return (logits, loss) in that order")
        assert tuple(logits.shape) == (B, T, cfg.vocab_size), (
            f"{what}: logits (the first of the pair) of shape {tuple(logits.shape)}, expected (B, T, V) = "
            f"{(B, T, cfg.vocab_size)}" + ("; return (logits, loss) in that order" if logits.dim() == 0 else ""))
        diff = (logits.detach().to(F64) - want).abs()
        bad = (diff > 1e-6).any(-1)
        if bad.any():
            b, t = (int(i) for i in bad.nonzero()[0])
            with torch.no_grad():
                variants = {f"the forward pass with {text}": forward_variant(model, ids, key)
                            for key, text in FORWARD_MISTAKES.items()}
            if t == 0:
                otherwise = ("position 0 is already wrong, and it sees only itself, so look at what does not depend "
                             "on other positions: the embedding, the norms (eps inside the root, the weights), the "
                             "head split and merge, W_O (o @ W_O.T), SwiGLU, the final norm and the tied head; and "
                             "the causal mask (without it position 0 sees later tokens)")
            else:
                otherwise = (f"positions before {t} are right: look at what only shows after position 0: the scale "
                             f"1/sqrt(d_h) (one key gets weight 1 whatever the scale), the rotation (pair j is "
                             f"(x_j, x_(j + d_h/2)), angle t * theta0^(-2j/d_h), on both q and k) and the causal mask "
                             f"(query t sees keys 0..t)")
            hint = diagnose(logits.detach(), want, variants, otherwise, tol=1e-6)
            raise AssertionError(f"{what}: logits at batch row {b}, position {t} (the first wrong position) are off "
                                 f"by up to {diff[b, t].max().item():.3g}; the largest difference anywhere is "
                                 f"{diff.max().item():.3g}. {hint}")
        flat, flat_targets = want.reshape(-1, cfg.vocab_size), targets.reshape(-1)
        loss_variants = {
            "the cross-entropy with the targets shifted once more: `targets` are already the next tokens "
            "(targets[b, t] is the token after ids[b, t]), so compare logits[b, t] with targets[b, t]":
                F.cross_entropy(want[:, :-1].reshape(-1, cfg.vocab_size), targets[:, 1:].reshape(-1)).item(),
            "the summed cross-entropy: the loss is the mean over the B*T positions":
                F.cross_entropy(flat, flat_targets, reduction="sum").item(),
            "the cross-entropy scored against `ids`: score against `targets`":
                F.cross_entropy(flat, ids.reshape(-1)).item()}
        try:
            got_loss = float(loss)
        except (TypeError, ValueError, RuntimeError):
            raise AssertionError(f"{what}: the loss (second of the pair) should be a number or a one-element "
                                 f"tensor, got {loss!r:.80}") from None
        named = [text for text, value in loss_variants.items() if abs(got_loss - value) < 1e-6 * max(1, abs(value))]
        close(got_loss, want_loss, f"{what}: the loss, mean cross-entropy of logits (B*T, V) against targets (B*T,)"
              + (f"; yours equals {named[0]}" if named else ""), 1e-6)
    # lesson 11 trains a model through this function: the loss must reach every weight (no detach, no .item(),
    # no torch.no_grad inside, no tensor rebuilt from numbers)
    model, B, T = cases[0]
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
    _, loss = call(my_forward, "my_forward", "the gradient case", advice)(model, ids, torch.roll(ids, -1, 1))
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise AssertionError("right values, but no gradient can flow back: the loss must be a tensor that "
                             "autograd can follow to the model's weights (no torch.no_grad, .detach(), .item() "
                             "or torch.tensor(...) of numbers inside my_forward); lesson 11 trains through it")
    loss.backward()
    dead = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    model.zero_grad(set_to_none=True)
    assert not dead, (f"right values, but the loss gives no gradient to {', '.join(dead[:4])}"
                      f"{' ...' if len(dead) > 4 else ''}: read the weights themselves (block.attn.q.weight, ...), "
                      "not copies (.detach(), .data, .clone() under no_grad); lesson 11 trains through my_forward")
    correct("Exercise 4: correct (your forward pass is the library's LanguageModel, to 1e-6, and gradients reach "
            "every weight)", my_forward)


# ------------------------------------------------------------------ exercise 5: a cross-entropy that cannot overflow

def _one_number(got, what: str) -> float:
    """A Python number or a one-element tensor as a float; otherwise say what came back."""
    if isinstance(got, torch.Tensor) and got.numel() != 1:
        raise AssertionError(f"{what}: got a tensor of shape {tuple(got.shape)}; the loss is one number, the mean "
                             "over the rows")
    try:
        return float(got)
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: expected a number, got {got!r}") from None


def _ce_hint(got: float, logits, targets) -> str:
    """What a wrong cross-entropy most likely did, judged from its value on one case."""
    n = len(targets)
    picked = logits.gather(-1, targets[:, None]).squeeze(-1)
    m = logits.max(-1, keepdim=True).values
    guesses = {"the mean over the rows, not their sum (divide by the number of rows)":
               F.cross_entropy(logits, targets, reduction="sum"),
               "the loss is minus the log-probability of the target: the sign is flipped":
               -F.cross_entropy(logits, targets),
               "after subtracting each row's max m, add it back: log sum exp(z) = m + log sum exp(z - m)":
               ((logits - m).exp().sum(-1).log() - picked).mean()}
    for hint, value in guesses.items():
        if abs(got - float(value)) <= 1e-6 * max(1.0, abs(float(value))):
            return hint
    if n and abs(got * n - float(F.cross_entropy(logits, targets))) < 1e-6:
        return "divide by the number of rows once, not twice"
    return "loss = mean over rows of (log sum_j exp z_j - z_target), with each row's max subtracted inside the exp"


def check_5(my_cross_entropy) -> None:
    """my_cross_entropy(logits, targets): the mean over rows of -log softmax(logits)[row, target], computed stably."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=g, dtype=torch.float64)
    targets = torch.tensor([0, 3, 6, 2, 2])
    first = my_cross_entropy(logits.clone(), targets.clone())
    if not attempted(first, 5):
        return
    cases = [("5 rows of 7 logits drawn from N(0, 1) (float64)", logits, targets)]
    big = torch.randn(4, 50, generator=g) * 1e4                      # float32, the training dtype
    cases.append(("4 rows of 50 float32 logits of size about 1e4", big, torch.tensor([1, 7, 30, 49])))
    mixed = torch.cat([torch.randn(1, 50, generator=g) * 1e4, torch.randn(2, 50, generator=g)])
    cases.append(("3 float32 rows, the first of size 1e4 and two of size 1", mixed, torch.tensor([4, 5, 6])))
    for what, z, y in cases:
        got = _one_number(my_cross_entropy(z.clone(), y.clone()), what)
        want = float(F.cross_entropy(z, y))
        if not math.isfinite(got):
            if got == -math.inf:
                hint = ("Some row's sum of exp came to 0 and log 0 = -inf: subtract each row's own max (dim=-1, "
                        "keepdim=True), not the largest logit of the whole tensor; rows far below that one have every "
                        "exp(z - max) underflow to 0")
            else:
                hint = ("A naive softmax overflows: exp(1e4) is inf in float32 (exp(89) already is) and inf / inf is "
                        "nan; or a probability underflowed to 0 before the log. Subtract each row's max before exp "
                        "and stay in log space: log p_y = z_y - max - log sum exp(z - max)")
            raise AssertionError(f"{what}: got {got!r}, expected F.cross_entropy's {want:.6g}. {hint}")
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (
            f"{what}: got {got:.8g}, expected F.cross_entropy's {want:.8g}. Likely: {_ce_hint(got, z, y)}")
    correct(f"Exercise 5: correct (stable at logits of 1e4, where exp overflows; first case {first:.4f} nats)", my_cross_entropy)


EXERCISES = {1: "my_rmsnorm", 2: "my_swiglu", 3: "my_rope", 4: "my_forward", 5: "my_cross_entropy"}
