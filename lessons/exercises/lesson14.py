"""Self-checks for lesson 14's exercises: top-k routing with weights renormalised over the chosen k (checked by
rebuilding a `minwiola.moe.MoE` layer's output from your routing), Switch's load-balancing loss by hand
(checked against `minwiola.moe.balancing_loss`), and which assignments an expert with a capacity serves, position by
position (checked by rebuilding a capacity-limited layer's output). A function that still returns None is "not
attempted yet". Every call of your function is wrapped: an error inside it, the first call included, comes back
as one AssertionError naming the case. Solutions: `exercises/solutions/lesson14.py` (look after trying)."""
import torch

from exercises import attempted, calling as _run, correct
from minwiola.moe import MoE, balancing_loss, capacity

F64 = torch.float64


def _probs(N: int, E: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, E, generator=g, dtype=F64).mul(2).softmax(-1)


def check_1(my_top_k) -> None:
    """my_top_k(probs (N, E), k) -> (chosen (N, k) expert indices, weights (N, k)): each token's k most probable
    experts and their probabilities renormalised to sum to 1 over those k (the order within a row is free)."""
    if not attempted(_run(my_top_k, "first call (N=3, E=4, k=2)", _probs(3, 4, 0), 2), 1):
        return
    for N, E, k, seed in ((3, 4, 2, 0), (10, 6, 2, 1), (7, 8, 1, 2), (5, 5, 5, 3), (9, 8, 3, 4)):
        case = f"N={N}, E={E}, k={k}"
        probs = _probs(N, E, seed)
        got = _run(my_top_k, case, probs, k)
        assert isinstance(got, tuple) and len(got) == 2, f"{case}: return (chosen, weights), got {type(got).__name__}"
        chosen, weights = (torch.as_tensor(t) for t in got)
        assert tuple(chosen.shape) == (N, k) and tuple(weights.shape) == (N, k), (
            f"{case}: shapes {tuple(chosen.shape)} and {tuple(weights.shape)}, expected ({N}, {k}) each")
        if chosen.is_floating_point() and not torch.equal(chosen, chosen.round()):   # first: are these indices?
            swapped = " (they look like your weights: return (chosen, weights), in that order)" if (
                not weights.is_floating_point() or torch.equal(weights, weights.round())) else ""
            raise AssertionError(f"{case}: chosen holds fractions {chosen[0].tolist()} for token 0; it must hold "
                                 f"expert indices, integers 0 .. {E - 1}{swapped}")
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
            if torch.allclose(w, top.softmax(-1).gather(-1, worder), atol=1e-9, rtol=0):
                raise AssertionError(f"{case}: your weights are a softmax of the chosen PROBABILITIES; divide them by "
                                     "their sum instead (a softmax over the chosen LOGITS would be right: "
                                     "p_ie / sum_S p_ie' = exp(l_ie) / sum_S exp(l_ie'))")
            if k < E and torch.allclose(w, (top / top.sum()).gather(-1, worder), atol=1e-9, rtol=0):
                raise AssertionError(f"{case}: your weights sum to 1 over the whole batch, not per token; divide each "
                                     "token's k probabilities by their own sum (sum over the last dimension)")
            raise AssertionError(f"{case}: weights {w[0].tolist()} for token 0, expected {expect[0].tolist()}")
    # the whole layer: your routing, the layer's experts, the layer's output
    torch.manual_seed(0)
    layer = MoE(8, 6, n_experts=5, k=2).double()
    x = torch.randn(3, 4, 8, dtype=F64)
    with torch.no_grad():
        want = layer(x)
        tokens = x.reshape(-1, 8)
        chosen, weights = _run(my_top_k, "the layer's own router", layer.router(tokens).softmax(-1), 2)
        y = torch.zeros_like(tokens)
        for i in range(len(tokens)):
            for e, w in zip(torch.as_tensor(chosen[i]).tolist(), torch.as_tensor(weights[i]).tolist()):
                y[i] += w * layer.experts[e](tokens[i:i + 1])[0]
    assert torch.allclose(y.reshape(x.shape), want, atol=1e-10), "your routing does not rebuild minwiola.moe.MoE's output"
    correct("Exercise 1: correct (top-k of the softmax, weights renormalised over the k: the layer's output rebuilt)", my_top_k)


def check_2(my_balancing_loss) -> None:
    """my_balancing_loss(probs (N, E), chosen (N, k), E) -> L_bal = E sum_e f_e P_e, f_e the fraction of the k N
    assignments that go to e, P_e the mean router probability of e."""
    probs = _probs(6, 4, 0)
    unchosen = "an expert that no token chose still has f_e = 0: count with torch.bincount(..., minlength=E)"
    flat = "(torch.bincount counts a 1-D tensor: count chosen.reshape(-1), the k N assignments, with minlength=E)"
    if not attempted(_run(my_balancing_loss, "first call (N=6, E=4, k=2)", probs, probs.topk(2, -1).indices, 4,
                          hint=flat), 2):
        return
    for N, E, k, seed in ((6, 4, 2, 0), (20, 8, 2, 1), (11, 5, 1, 2), (16, 6, 3, 3), (4, 6, 1, 4)):
        case = f"N={N}, E={E}, k={k}"
        probs = _probs(N, E, seed)
        chosen = probs.topk(k, -1).indices
        want, load = balancing_loss(probs, chosen, E)
        idle = sorted(set(range(E)) - set(chosen.reshape(-1).tolist()))
        missing = f"(experts {idle} are chosen by no token: {unchosen})"
        got = _run(my_balancing_loss, case, probs, chosen, E, hint=missing if (load == 0).any() else "")
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
        if abs(got - N * want.item()) < 1e-9 * N * want.item():
            raise AssertionError(f"{case}: got {got:.6g} = N x {want.item():.6g}: P_e is the MEAN router probability "
                                 "over the N tokens, not the sum")
        first = torch.bincount(chosen[:, 0], minlength=E).to(F64) / N
        if k > 1 and abs(got - E * (first * P).sum().item()) < 1e-9 * max(1, got):
            raise AssertionError(f"{case}: got {got:.6g}, what counting only each token's FIRST choice gives: f_e "
                                 "counts all k choices of every token (chosen.reshape(-1))")
        raise AssertionError(f"{case}: got {got:.6g}, expected {want.item():.6g} (f = {load.tolist()})")
    uniform = torch.full((8, 4), 0.25, dtype=F64)
    got = float(_run(my_balancing_loss, "uniform router, every token to experts 0 and 1", uniform,
                     torch.tensor([[0, 1]] * 8), 4, hint=f"(experts 2 and 3 are chosen by no token: {unchosen})"))
    assert abs(got - 1) < 1e-9, f"a uniform router gives L_bal = 1 whatever it chooses; got {got:.6g}"
    # what balances is the gradient (section 2): the loss must stay a tensor that backward() carries to the router
    logits = torch.randn(12, 5, generator=torch.Generator().manual_seed(5), dtype=F64).requires_grad_()
    probs = logits.softmax(-1)
    loss = _run(my_balancing_loss, "N=12, E=5, k=2, probabilities with a gradient", probs,
                probs.detach().topk(2, -1).indices, 5)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise AssertionError(f"N=12, E=5, k=2: your loss is {type(loss).__name__}"
                             f"{'' if not isinstance(loss, torch.Tensor) else ' with no gradient'}: a number with no "
                             "gradient cannot balance anything. Keep it a torch tensor built from probs (no float(), "
                             ".item() or .detach()), so that loss.backward() reaches the router's probabilities")
    loss.backward()
    f = balancing_loss(probs.detach(), probs.detach().topk(2, -1).indices, 5)[1]
    p = probs.detach()
    push = 5 / 12 * p * (f - (p * f).sum(-1, keepdim=True))          # section 2's dL_bal/d logits
    assert logits.grad is not None and torch.allclose(logits.grad, push, atol=1e-12), (
        "N=12, E=5, k=2: the gradient your loss sends to the router's logits is not (E/N) p_ie (f_e - f_bar_i): f_e "
        "counts choices and carries no gradient (compute it from chosen, a count); P_e, the mean of probs, carries it")
    correct("Exercise 2: correct (L_bal = E sum f_e P_e; 1 for a uniform router; its gradient reaches the router)",
            my_balancing_loss)


def _served(order: torch.Tensor, E: int, C: int) -> torch.Tensor:
    """For assignments listed in serving order (1-D), True while their expert has had fewer than C before them."""
    rank = torch.nn.functional.one_hot(order, E).cumsum(0).gather(1, order[:, None]).squeeze(1)
    return rank <= C


def _orders(chosen: torch.Tensor, E: int, C: int) -> dict:
    """The kept mask (B, T, k) under the layer's order and under two others a learner may write."""
    B, T, k = chosen.shape
    return {"position by position": _served(chosen.transpose(0, 1).reshape(-1), E, C).reshape(T, B, k).transpose(0, 1),
            "row by row": _served(chosen.reshape(-1), E, C).reshape(B, T, k),
            "first choices first": _served(chosen.transpose(0, 1).reshape(-1, k).T.reshape(-1), E, C)
            .reshape(k, T, B).permute(2, 1, 0)}


def check_3(my_kept) -> None:
    """my_kept(chosen (B, T, k) expert indices, E, C) -> a (B, T, k) boolean mask: True where the assignment is
    served. Each expert serves at most C assignments, first come first served, the tokens lined up position by
    position (all rows at position 0, then at position 1, ...), a token's k choices together."""
    g = torch.Generator().manual_seed(0)
    first = torch.rand(2, 3, 4, generator=g).topk(2, -1).indices
    if not attempted(_run(my_kept, "first call (B=2, T=3, k=2, E=4, C=2)", first, 4, 2), 3):
        return
    why = {"row by row": "you served row by row: a later position of row 0 took a slot before position 0 of row 1, "
                         "so the future of one sequence decides what its past keeps. Serve position by position "
                         "(transpose to (T, B, k) first)",
           "first choices first": "you served every token's first choice before any second choice (GShard's order): "
                                  "a later token's first choice then takes an earlier token's slot. Serve a token's "
                                  "k choices together, position by position"}
    for B, T, k, E, C, seed in ((2, 3, 2, 4, 2, 0), (3, 8, 2, 4, 3, 1), (4, 6, 1, 3, 5, 2), (2, 5, 3, 5, 4, 3)):
        case = f"B={B}, T={T}, k={k}, E={E}, C={C}"
        chosen = torch.rand(B, T, E, generator=torch.Generator().manual_seed(seed)).topk(k, -1).indices
        got = _run(my_kept, case, chosen, E, C)
        got = torch.as_tensor(got)
        assert tuple(got.shape) == (B, T, k), f"{case}: shape {tuple(got.shape)}, expected ({B}, {T}, {k})"
        got = got.bool()
        orders = _orders(chosen, E, C)
        want = orders["position by position"]
        if torch.equal(got, want):
            continue
        if got.all():
            raise AssertionError(f"{case}: you kept every assignment; an expert serves at most C = {C}, the rest are "
                                 "dropped")
        for name, mask in orders.items():
            if name in why and torch.equal(got, mask):
                raise AssertionError(f"{case}: {why[name]}")
        if torch.equal(got, want.transpose(0, 1).reshape(B, T, k)):        # (T, B, k) read as (B, T, k)
            raise AssertionError(f"{case}: your keep/drop decisions are right but in the wrong places: a mask built "
                                 "in serving order and not transposed back. Reshape it to (T, B, k), then "
                                 ".transpose(0, 1) to (B, T, k)")
        if torch.equal(got, ~want):
            raise AssertionError(f"{case}: your mask is True exactly where an assignment is dropped: an inverted mask "
                                 "(True = dropped). Return True where the assignment is SERVED")
        per_expert = [int(got[chosen == e].sum()) for e in range(E)]
        b, t, j = (int(i) for i in (got != want).nonzero()[0])
        raise AssertionError(f"{case}: row {b}, position {t}, choice {j} (expert {int(chosen[b, t, j])}): got "
                             f"{bool(got[b, t, j])}, expected {bool(want[b, t, j])}; you served "
                             f"{per_expert} assignments per expert (at most C = {C} each)")
    # the whole layer: your mask, the layer's routing and experts, the output of a layer with a capacity limit
    torch.manual_seed(1)
    layer = MoE(8, 6, n_experts=4, k=2, capacity_factor=1.0).double()
    x = torch.randn(3, 10, 8, dtype=F64)
    with torch.no_grad():
        want = layer(x)
        probs = layer.router(x).softmax(-1)
        top, chosen = probs.topk(2, -1)
        weights = top / top.sum(-1, keepdim=True)
        C = capacity(1.0, 2, 30, 4)
        kept = torch.as_tensor(_run(my_kept, "the layer's own routing", chosen, 4, C)).bool()
        y = torch.zeros_like(x)
        for b, t, j in kept.nonzero().tolist():
            e = int(chosen[b, t, j])
            y[b, t] += weights[b, t, j] * layer.experts[e](x[b, t][None])[0]
    assert torch.allclose(y, want, atol=1e-10), "your mask does not rebuild minwiola.moe.MoE's output with a capacity"
    correct(f"Exercise 3: correct (position by position, at most C per expert: {layer.dropped.item():.1%} of the "
          "layer's assignments dropped, its output rebuilt)", my_kept)


EXERCISES = {1: "my_top_k", 2: "my_balancing_loss", 3: "my_kept"}
