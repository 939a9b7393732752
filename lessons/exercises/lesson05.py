"""Self-checks for lesson 05's exercise: WiolaRMSNorm's backward pass by hand. The check compares the learner's
gradients with autograd through `minwiola.norm.WiolaRMSNorm` on several cases, names the gradient that is wrong and
where, then runs `torch.autograd.gradcheck` (float64) on the learner's backward wrapped as an autograd.Function.
Solutions: `solutions/lesson05.py` (look after trying)."""
import torch

from exercises import attempted, correct, same_tensor
from minwiola.norm import WiolaRMSNorm

EXERCISES = {1: "norm_backward"}


def as_function(norm_backward, eps: float = 1e-6):
    """Wrap `norm_backward(x, gamma, delta, g, eps) -> (dx, dgamma, ddelta)` as a torch.autograd.Function whose
    forward is WiolaRMSNorm's (eq. 9): `as_function(norm_backward).apply(x, gamma, delta)`."""

    class ByHand(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, gamma, delta):
            ctx.save_for_backward(x, gamma, delta)
            z = x + delta
            return gamma * z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps)

        @staticmethod
        def backward(ctx, g):
            x, gamma, delta = ctx.saved_tensors
            return tuple(norm_backward(x, gamma, delta, g, eps))

    return ByHand


def _library_grads(x, gamma, delta, g, eps):
    """dx, dgamma, ddelta of sum(g * WiolaRMSNorm(x)) by autograd through the library's layer."""
    norm = WiolaRMSNorm(x.shape[-1], eps).to(x.dtype)
    with torch.no_grad():
        norm.gamma.copy_(gamma); norm.delta.copy_(delta)
    x = x.clone().requires_grad_()
    (norm(x) * g).sum().backward()
    return x.grad, norm.gamma.grad, norm.delta.grad


def check_1(norm_backward) -> None:
    """norm_backward(x, gamma, delta, g, eps) -> (dx, dgamma, ddelta) for x and g of shape (..., d)."""
    one = torch.ones(1, 2, dtype=torch.float64)
    if not attempted(norm_backward(one, torch.ones(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64),
                                   one, 1e-6), 1):
        return
    gen = torch.Generator().manual_seed(5)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    cases = {"gamma = 1, delta = 0, x of shape (4, 8)": (randn(4, 8), torch.ones(8, dtype=torch.float64),
                                                          torch.zeros(8, dtype=torch.float64), randn(4, 8)),
             "random gamma and delta, x of shape (4, 8)": (randn(4, 8), 1 + 0.5 * randn(8), 0.3 * randn(8),
                                                           randn(4, 8)),
             "random gamma and delta, x of shape (2, 3, 8) (sum gamma's and delta's over ALL tokens)":
                 (randn(2, 3, 8), 1 + 0.5 * randn(8), 0.3 * randn(8), randn(2, 3, 8))}
    for case, (x, gamma, delta, g) in cases.items():
        got = norm_backward(x, gamma, delta, g, 1e-6)
        assert isinstance(got, (tuple, list)) and len(got) == 3, (f"{case}: expected a triple (dx, dgamma, "
                                                                  f"ddelta), got {type(got).__name__}")
        for name, mine, want in zip(("dx", "dgamma", "ddelta"), got, _library_grads(x, gamma, delta, g, 1e-6)):
            same_tensor(mine, want, f"{case}: {name} (compare with the boxed formula of section 2)", atol=1e-10)
    x, gamma, delta, _ = cases["random gamma and delta, x of shape (2, 3, 8) (sum gamma's and delta's over ALL tokens)"]
    inputs = tuple(t.clone().requires_grad_() for t in (x, gamma, delta))
    assert torch.autograd.gradcheck(as_function(norm_backward).apply, inputs, raise_exception=False), \
        "gradcheck (finite differences of the forward, float64) disagrees with your backward"
    correct("Exercise 1: correct (your backward passes gradcheck and matches minwiola.norm.WiolaRMSNorm)", norm_backward)
