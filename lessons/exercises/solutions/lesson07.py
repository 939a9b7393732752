"""Solutions to lesson 07's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson07.py`."""
import torch
import torch.nn.functional as F


def dsff_forward(x, w):
    a = (F.silu(x @ w["G_A"]) * (x @ w["U_A"])) @ w["D_A"]          # stream A, eq. 34: a narrow SwiGLU
    b = F.gelu(x @ w["U_B"]) @ w["D_B"]                              # stream B, eq. 35: a wide GELU MLP
    alpha = torch.sigmoid(torch.cat([a, b], -1) @ w["W_f"])          # eq. 36: the gate reads both outputs
    return alpha * a + (1 - alpha) * b                               # eq. 37


def gate_grad(a, b, g, W_f):
    alpha = torch.sigmoid(torch.cat([a, b], -1) @ W_f)
    # out = b + alpha (a - b): dL/du = g (a - b) alpha (1 - alpha), and u = [a; b] W_f
    return torch.cat([a, b], -1).T @ (g * (a - b) * alpha * (1 - alpha))


def gate_grad_at_init(a, b, g, W_f):
    """Right only at W_f = 0, where alpha (1 - alpha) = 1/4."""
    return torch.cat([a, b], -1).T @ (0.25 * g * (a - b))


def mixed_the_wrong_way_round(x, w):
    a = (F.silu(x @ w["G_A"]) * (x @ w["U_A"])) @ w["D_A"]
    b = F.gelu(x @ w["U_B"]) @ w["D_B"]
    alpha = torch.sigmoid(torch.cat([a, b], -1) @ w["W_f"])
    return (1 - alpha) * a + alpha * b                               # alpha weights stream B: swapped


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {"dsff_forward": mixed_the_wrong_way_round, "gate_grad": gate_grad_at_init}
