"""Self-checks for lesson 14's exercises: top-k routing with weights renormalised over the chosen k (checked by
rebuilding a `minwiola.moe.MoE` layer's output from your routing), and Switch's load-balancing loss by hand
(checked against `minwiola.moe.balancing_loss`). A function that still returns None is "not attempted yet".
Solutions: `solutions/lesson14.py` (look after trying)."""
import torch

from exercises import attempted
from minwiola.moe import MoE, balancing_loss

F64 = torch.float64


def _probs(N: int, E: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, E, generator=g, dtype=F64).mul(2).softmax(-1)


def check_1(my_top_k) -> None:
    """my_top_k(probs (N, E), k) -> (chosen (N, k) expert indices, weights (N, k)): each token's k most probable
    experts and their probabilities renormalised to sum to 1 over those k (the order within a row is free)."""
    if not attempted(my_top_k(_probs(3, 4, 0), 2), 1):
        return
    for N, E, k, seed in ((3, 4, 2, 0), (10, 6, 2, 1), (7, 8, 1, 2), (5, 5, 5, 3), (9, 8, 3, 4)):
        case = f"N={N}, E={E}, k={k}"
        probs = _probs(N, E, seed)
        got = my_top_k(probs, k)
        assert isinstance(got, tuple) and len(got) == 2, f"{case}: return (chosen, weights), got {type(got).__name__}"
        chosen, weights = (torch.as_tensor(t) for t in got)
        assert tuple(chosen.shape) == (N, k) and tuple(weights.shape) == (N, k), (
            f"{case}: shapes {tuple(chosen.shape)} and {tuple(weights.shape)}, expected ({N}, {k}) each")
        top, want = probs.topk(k, dim=-1)
        order = chosen.long().argsort(-1)                                 # compare rows as sets of experts
        c, w = chosen.long().gather(-1, order), weights.to(F64).gather(-1, order)
        worder = want.argsort(-1)
        if not torch.equal(c, want.gather(-1, worder)):
            i = int((c != want.gather(-1, worder)).any(-1).nonzero()[0])
            raise AssertionError(f"{case}: token {i} chose experts {sorted(c[i].tolist())}, its {k} most probable are "
                                 f"{sorted(want[i].tolist())}: pick the LARGEST probabilities (topk)")
        expect = (top / top.sum(-1, keepdim=True)).gather(-1, worder)
        if not torch.allclose(w, expect, atol=1e-9, rtol=0):
            if torch.allclose(w, top.gather(-1, worder), atol=1e-9, rtol=0):
                raise AssertionError(f"{case}: your weights are the raw probabilities p_ie (row sums "
                                     f"{w.sum(-1)[:3].tolist()} ...); renormalise them to sum to 1 over the chosen k")
            raise AssertionError(f"{case}: weights {w[0].tolist()} for token 0, expected {expect[0].tolist()}")
    # the whole layer: your routing, the layer's experts, the layer's output
    torch.manual_seed(0)
    layer = MoE(8, 6, n_experts=5, k=2).double()
    x = torch.randn(3, 4, 8, dtype=F64)
    with torch.no_grad():
        want = layer(x)
        tokens = x.reshape(-1, 8)
        chosen, weights = my_top_k(layer.router(tokens).softmax(-1), 2)
        y = torch.zeros_like(tokens)
        for i in range(len(tokens)):
            for e, w in zip(torch.as_tensor(chosen[i]).tolist(), torch.as_tensor(weights[i]).tolist()):
                y[i] += w * layer.experts[e](tokens[i:i + 1])[0]
    assert torch.allclose(y.reshape(x.shape), want, atol=1e-10), "your routing does not rebuild minwiola.moe.MoE's output"
    print("Exercise 1: correct (top-k of the softmax, weights renormalised over the k: the layer's output rebuilt)")


def check_2(my_balancing_loss) -> None:
    """my_balancing_loss(probs (N, E), chosen (N, k), E) -> L_bal = E sum_e f_e P_e, f_e the fraction of the k N
    assignments that go to e, P_e the mean router probability of e."""
    probs = _probs(6, 4, 0)
    if not attempted(my_balancing_loss(probs, probs.topk(2, -1).indices, 4), 2):
        return
    for N, E, k, seed in ((6, 4, 2, 0), (20, 8, 2, 1), (11, 5, 1, 2), (16, 6, 3, 3)):
        case = f"N={N}, E={E}, k={k}"
        probs = _probs(N, E, seed)
        chosen = probs.topk(k, -1).indices
        want, load = balancing_loss(probs, chosen, E)
        got = my_balancing_loss(probs, chosen, E)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise AssertionError(f"{case}: expected a number, got {got!r}") from None
        if abs(got - want.item()) <= 1e-9 * max(1, want.item()):
            continue
        P = probs.mean(0)
        if abs(got - k * want.item()) < 1e-9 * k * want.item() and k > 1:
            raise AssertionError(f"{case}: got {got:.6g} = k x {want.item():.6g}: f_e is a fraction of the k N "
                                 "assignments, not of the N tokens")
        if abs(got - want.item() / E) < 1e-9:
            raise AssertionError(f"{case}: got {got:.6g} = L_bal / E: the loss is E sum f_e P_e (1 at uniform load)")
        if abs(got - E * (P * P).sum().item()) < 1e-9:
            raise AssertionError(f"{case}: got E sum P_e^2 = {got:.6g}: f_e counts the CHOSEN experts, not the mean "
                                 "probability")
        raise AssertionError(f"{case}: got {got:.6g}, expected {want.item():.6g} (f = {load.tolist()})")
    uniform = torch.full((8, 4), 0.25, dtype=F64)
    got = float(my_balancing_loss(uniform, torch.tensor([[0, 1]] * 8), 4))
    assert abs(got - 1) < 1e-9, f"a uniform router gives L_bal = 1 whatever it chooses; got {got:.6g}"
    print("Exercise 2: correct (L_bal = E sum f_e P_e; 1 for a uniform router)")


EXERCISES = {1: "my_top_k", 2: "my_balancing_loss"}
