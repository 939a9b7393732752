"""Self-checks for lesson 03's exercises: RMSNorm, RoPE's rotation, SwiGLU, then the whole model's forward pass and
loss, each compared with the library. A function that still returns None is "not attempted yet". Solutions:
`solutions/lesson03.py` (look after trying)."""
import torch

from exercises import attempted, close, same_tensor
from minwiola.ffn import SwiGLU
from minwiola.model import LanguageModel, next_token_loss, preset
from minwiola.norm import RMSNorm
from minwiola.positions import rope_coefficients, rotate

F64 = torch.float64


def check_1(my_rmsnorm) -> None:
    """my_rmsnorm(x, weight, eps) against minwiola.norm.RMSNorm."""
    g = torch.Generator().manual_seed(0)
    if not attempted(my_rmsnorm(torch.ones(3, dtype=F64), torch.ones(3, dtype=F64), 1e-6), 1):
        return
    for shape, scale, eps in (((8,), 1.0, 1e-6), ((2, 5, 16), 3.0, 1e-6), ((4, 16), 1e-3, 1e-6),
                              ((4, 16), 1e-3, 1e-5)):
        ref = RMSNorm(shape[-1], eps=eps).to(F64)
        with torch.no_grad():
            ref.weight.copy_(torch.randn(shape[-1], generator=g, dtype=F64))
        x = torch.randn(*shape, generator=g, dtype=F64) * scale + scale / 3
        with torch.no_grad():
            want = ref(x)
        same_tensor(my_rmsnorm(x, ref.weight.detach(), eps), want,
                    f"x of shape {shape} and RMS about {scale:g}, eps={eps:g} (is eps inside the square root, "
                    f"added to the mean of the squares?)", atol=1e-10)
    print("Exercise 1: correct")


def check_2(my_rope) -> None:
    """my_rope(x, positions, theta0) against minwiola.positions.rotate with rope_coefficients."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g, dtype=F64)
    if not attempted(my_rope(x, torch.arange(3), 10000.0), 2):
        return
    for shape, positions, theta0 in (((5, 8), torch.arange(5), 10000.0),
                                     ((2, 4, 7, 16), torch.arange(10, 17), 10000.0),
                                     ((6, 32), torch.tensor([0, 3, 4, 100, 511, 7]), 500.0)):
        x = torch.randn(*shape, generator=g, dtype=F64)
        want = rotate(x, *rope_coefficients(positions, shape[-1], theta0))
        got = my_rope(x, positions, theta0)
        try:
            same_tensor(got, want, f"x {shape}, positions {positions.tolist()}, theta0={theta0:g}", atol=1e-10)
        except AssertionError as e:
            raise AssertionError(f"{e}. Pair j is (x_j, x_(j + d_h/2)) rotated by positions[t] * "
                                 f"theta0^(-2j/d_h); the last index is the dimension, the one before it the "
                                 f"position") from None
    print("Exercise 2: correct")


def check_3(my_swiglu) -> None:
    """my_swiglu(x, w_gate, w_up, w_down) against minwiola.ffn.SwiGLU with those weights."""
    g = torch.Generator().manual_seed(0)
    if not attempted(my_swiglu(torch.ones(1, 2, dtype=F64), torch.ones(3, 2, dtype=F64), torch.ones(3, 2, dtype=F64),
                               torch.ones(2, 3, dtype=F64)), 3):
        return
    for shape, hidden in (((4, 8), 24), ((2, 5, 16), 48)):
        layer = SwiGLU(shape[-1], hidden).to(F64)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=F64) / p.shape[-1] ** 0.5)
        x = torch.randn(*shape, generator=g, dtype=F64)
        with torch.no_grad():
            want = layer(x)
        same_tensor(my_swiglu(x, layer.gate.weight.detach(), layer.up.weight.detach(), layer.down.weight.detach()),
                    want, f"x {shape}, hidden width {hidden}: W_down (SiLU(x W_gate^T) * (x W_up^T)) expected "
                    f"(the SiLU acts on the gate, not on the up projection)", atol=1e-10)
    print("Exercise 3: correct")


def first_wrong_position(got: torch.Tensor, want: torch.Tensor, atol: float) -> tuple[int, int] | None:
    """(batch row, position) of the first position whose logits differ from want's by more than atol."""
    bad = ((got - want).abs() > atol).any(-1)
    if not bad.any():
        return None
    b, t = (int(i) for i in bad.nonzero()[0])
    return b, t


def check_4(my_forward) -> None:
    """my_forward(model, ids, targets) -> (logits, loss) against LanguageModel's forward and loss, to 1e-6."""
    torch.manual_seed(0)
    tiny = LanguageModel(preset("tiny-llama", n_kv_heads=None, init_std=0.3)).to(F64).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (1, 5), generator=g)
    with torch.no_grad():
        first = my_forward(tiny, ids, torch.roll(ids, -1, 1))
    if not attempted(first, 4):
        return
    cases = [(tiny, 1, 5), (tiny, 2, 32),
             (LanguageModel(preset("llama-style", vocab_size=300, context=64, n_layers=2, init_std=0.1)).to(F64).eval(),
              3, 40)]
    for model, B, T in cases:
        cfg = model.config
        ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
        with torch.no_grad():
            want = model(ids)
            want_loss = next_token_loss(want, targets).item()
            got = my_forward(model, ids, targets)
        what = f"model d={cfg.d}, L={cfg.n_layers}, H={cfg.n_heads}, V={cfg.vocab_size}; ids of shape {(B, T)}"
        assert isinstance(got, (tuple, list)) and len(got) == 2, f"{what}: expected (logits, loss), got {got!r:.80}"
        logits, loss = got
        assert isinstance(logits, torch.Tensor), f"{what}: logits should be a tensor, got {type(logits).__name__}"
        assert tuple(logits.shape) == (B, T, cfg.vocab_size), (f"{what}: logits of shape {tuple(logits.shape)}, "
                                                               f"expected (B, T, V) = {(B, T, cfg.vocab_size)}")
        wrong = first_wrong_position(logits.to(F64), want, 1e-6)
        if wrong is not None:
            b, t = wrong
            err = (logits[b, t].to(F64) - want[b, t]).abs().max().item()
            hint = ("position 0 is already wrong, so the error does not depend on position: check the embedding, "
                    "the norms (eps, weight), the head scale 1/sqrt(d_h), SwiGLU, the final norm and the tied head"
                    if t == 0 else
                    f"positions before {t} are right: look at what depends on position, the rotation (pair j is "
                    f"(x_j, x_(j + d_h/2)), angle t * theta0^(-2j/d_h)) and the causal mask (query t sees keys 0..t)")
            raise AssertionError(f"{what}: logits at batch row {b}, position {t} are off by up to {err:.3g} "
                                 f"(first wrong position); {hint}")
        close(loss, want_loss, f"{what}: the loss (mean cross-entropy of logits (B*T, V) against targets (B*T,))",
              1e-6)
    print("Exercise 4: correct (your forward pass is the library's LanguageModel, to 1e-6)")


EXERCISES = {1: "my_rmsnorm", 2: "my_rope", 3: "my_swiglu", 4: "my_forward"}
