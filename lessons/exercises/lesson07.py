"""Self-checks for lesson 07's exercises: DSFF's forward from its weights, and the gradient of its gate W_f.
Each check compares the learner's function with `minwiola.ffn.DSFF` (its forward, or autograd through it) on
several cases and names the first wrong entry. Solutions: `solutions/lesson07.py` (look after trying)."""
import torch

from exercises import attempted, correct, same_tensor
from minwiola.ffn import DSFF

EXERCISES = {1: "dsff_forward", 2: "gate_grad"}


def dsff_weights(layer: DSFF) -> dict:
    """DSFF's matrices in the lesson's row-vector form (x @ W): G_A, U_A (d, d_A), D_A (d_A, d), U_B (d, d_B),
    D_B (d_B, d), W_f (2d, d). nn.Linear stores each one transposed."""
    return {"G_A": layer.stream_a.gate.weight.T, "U_A": layer.stream_a.up.weight.T,
            "D_A": layer.stream_a.down.weight.T, "U_B": layer.stream_b.up.weight.T,
            "D_B": layer.stream_b.down.weight.T, "W_f": layer.fuse.weight.T}


def random_dsff(d: int, d_A: int, d_B: int, seed: int, gate_scale: float) -> DSFF:
    """A float64 DSFF with random weights; its gate W_f is random too (scale gate_scale; 0 is the paper's init)."""
    torch.manual_seed(seed)
    layer = DSFF(d, d_A, d_B).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, d ** -0.5)
        layer.fuse.weight.mul_(gate_scale / d ** -0.5 * (2 * d) ** -0.5)
    return layer


def check_1(dsff_forward) -> None:
    """dsff_forward(x, weights) -> DSFF(x) for x of shape (..., d) and the weights of `dsff_weights`."""
    small = random_dsff(2, 1, 2, 0, 1.0)
    if not attempted(dsff_forward(torch.ones(1, 2, dtype=torch.float64), dsff_weights(small)), 1):
        return
    gen = torch.Generator().manual_seed(1)
    for (d, d_A, d_B), shape, scale in (((8, 4, 12), (5,), 1.0), ((16, 8, 32), (2, 3), 3.0),
                                        ((16, 16, 24), (4,), 0.0)):
        layer = random_dsff(d, d_A, d_B, d, scale)
        x = torch.randn(*shape, d, generator=gen, dtype=torch.float64)
        with torch.no_grad():
            want = layer(x)
            got = dsff_forward(x, {k: w.detach() for k, w in dsff_weights(layer).items()})
        same_tensor(got, want, f"DSFF(d={d}, d_A={d_A}, d_B={d_B}) on x of shape {tuple(x.shape)}"
                    f"{', W_f = 0 (alpha = 1/2)' if scale == 0 else ''}: output", atol=1e-10)
    correct("Exercise 1: correct (your forward is minwiola.ffn.DSFF's)", dsff_forward)


def check_2(gate_grad) -> None:
    """gate_grad(a, b, g, W_f) -> dL/dW_f (2d, d) for stream outputs a, b and incoming gradient g, each (N, d)."""
    z = torch.zeros(1, 2, dtype=torch.float64)
    if not attempted(gate_grad(z, z, z, torch.zeros(4, 2, dtype=torch.float64)), 2):
        return
    gen = torch.Generator().manual_seed(2)
    for (d, d_A, d_B), n, scale in (((8, 4, 12), 6, 0.0), ((8, 4, 12), 6, 2.0), ((16, 8, 32), 10, 3.0)):
        layer = random_dsff(d, d_A, d_B, 100 + d, scale)
        x, g = (torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(2))
        (layer(x) * g).sum().backward()
        with torch.no_grad():
            a, b = layer.stream_a(x), layer.stream_b(x)
            got = gate_grad(a, b, g, layer.fuse.weight.T.clone())
        same_tensor(got, layer.fuse.weight.grad.T, f"dL/dW_f (row-vector form, shape (2d, d)), d={d}, {n} tokens, "
                    f"{'W_f = 0' if scale == 0 else 'a random W_f != 0 (is alpha(1 - alpha) still 1/4 there?)'}",
                    atol=1e-10)
    correct("Exercise 2: correct (your gate gradient is autograd's through minwiola.ffn.DSFF)", gate_grad)
