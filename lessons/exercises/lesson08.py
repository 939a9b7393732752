"""Self-checks for lesson 08's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which input, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson08.py` (look after trying)."""
import torch

from exercises import attempted, correct
from minwiola.gcla import summarize
from minwiola.model import LanguageModel, preset

EXERCISES = {1: "prefix_mean_step", 2: "summary_state_size", 3: "library_to_paper_heads"}

CHUNKINGS = ([11], [1] * 11, [4, 7], [3, 1, 5, 2], [6, 0, 5])    # ways to feed 11 tokens, an empty chunk too


def run_chunks(step, x, sizes):
    """Feed x (B, T, d) to step(chunk, state) chunk by chunk; the summaries of all chunks, concatenated."""
    state, outputs, start = None, [], 0
    for n in sizes:
        got = step(x[:, start:start + n], state)
        assert isinstance(got, (tuple, list)) and len(got) == 2, (
            f"chunks {sizes}: expected (summaries, state) from the chunk at positions {start}..{start + n - 1}, "
            f"got {type(got).__name__}")
        means, state = got
        assert isinstance(means, torch.Tensor) and tuple(means.shape) == tuple(x[:, start:start + n].shape), (
            f"chunks {sizes}: the chunk at positions {start}..{start + n - 1} has shape "
            f"{tuple(x[:, start:start + n].shape)}; its summaries came back as "
            f"{tuple(means.shape) if isinstance(means, torch.Tensor) else type(means).__name__}")
        outputs.append(means)
        start += n
    return torch.cat(outputs, 1)


def check_1(prefix_mean_step) -> None:
    """prefix_mean_step(chunk (B, n, d), state) -> (summaries (B, n, d), new state); state None at the start."""
    x = torch.randn(2, 11, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    if not attempted(prefix_mean_step(x[:, :3], None), 1):
        return
    want = summarize(x, "causal")                                 # the library, on the whole sequence at once
    for sizes in CHUNKINGS:
        got = run_chunks(prefix_mean_step, x, sizes)
        bad = ~torch.isclose(got, want, atol=1e-9, rtol=0)
        if bad.any():
            t = int(bad.any(-1).any(0).nonzero()[0])
            ends = torch.tensor(sizes).cumsum(0)
            k = int((ends <= t).sum())
            offset = t - (int(ends[k - 1]) if k else 0)
            b, j = (int(i) for i in bad[:, t].nonzero()[0])
            raise AssertionError(
                f"chunks {sizes}: first wrong summary at position {t} (chunk {k}, offset {offset} in it), "
                f"sequence {b}, feature {j}: got {got[b, t, j].item():.6g}, expected the mean of positions 0..{t}, "
                f"{want[b, t, j].item():.6g}" + (" (the state must carry the sum AND the count of every earlier "
                                                   "position)" if k else ""))
    correct("Exercise 1: correct (every chunking gives summarize(x, 'causal'))", prefix_mean_step)


def check_2(summary_state_size) -> None:
    """summary_state_size(cfg): the numbers the causal GCLA adds to one sequence's decoding state."""
    cfg = preset("tiny-llama", gcla="causal")
    if not attempted(summary_state_size(cfg), 2):
        return
    # H_kv = H/2 (the first three), then H_kv = H, H_kv = 1 and H_kv = H/4: at H_kv = H/2 the projected context keys
    # and values, 2 H_kv d_h per layer, happen to be d numbers too, so only other groupings tell the two apart
    small = dict(n_layers=3, d=48, n_heads=4)
    for c in (cfg, preset("wiola-tiny"), preset("wiola-yocto", n_kv_heads=2, **small),
              preset("wiola-yocto", n_kv_heads=4, **small), preset("wiola-yocto", n_kv_heads=1, **small),
              preset("wiola-yocto", n_layers=2, d=64, n_heads=8, n_kv_heads=2)):
        model = LanguageModel(c).eval()
        cache = model.new_cache()
        with torch.no_grad():
            model(torch.zeros(1, 5, dtype=torch.long), cache)
        want = sum(layer.input_sum.numel() for layer in cache)
        got = summary_state_size(c)
        H_kv = c.n_kv_heads or c.n_heads
        projected = 2 * c.n_layers * H_kv * (c.d // c.n_heads)
        hint = ""
        if got == projected != want:
            hint = (f". You counted the projected context keys and values, 2 L H_kv d_h = {projected}: the cache "
                    "keeps the running sum of each layer's INPUT (d numbers) and projects it with W_K^ctx, W_V^ctx "
                    "afresh at every step (at H_kv = H/2 the two counts agree by chance)")
        assert got == want, (f"d = {c.d}, {c.n_layers} layers, H = {c.n_heads}, H_kv = {H_kv}: got {got!r}, a real "
                             f"cache holds {want} running-sum numbers (count the running sums only, not the KV "
                             f"cache){hint}")
    correct(f"Exercise 2: correct ({summary_state_size(preset('wiola-360m')):,} numbers for wiola-360m)", summary_state_size)


def check_3(library_to_paper_heads) -> None:
    """library_to_paper_heads(H, H_kv): list p with p[j] the paper's head that the library's head j plays."""
    if not attempted(library_to_paper_heads(8, 2), 3):
        return
    for H, H_kv in ((8, 2), (4, 2), (16, 4), (6, 3), (4, 4), (4, 1)):
        p = library_to_paper_heads(H, H_kv)
        assert sorted(p) == list(range(H)), f"H = {H}: {p!r} is not a permutation of the heads 0..{H - 1}"
        for j, h in enumerate(p):
            assert h % H_kv == j // (H // H_kv), (
                f"H = {H}, H_kv = {H_kv}: library head {j} shares key/value head {j // (H // H_kv)} "
                f"(j // (H / H_kv)), but the paper's head {h} that you map it to shares {h % H_kv} (h mod H_kv)")
    correct(f"Exercise 3: correct (H = 8, H_kv = 2: {library_to_paper_heads(8, 2)})", library_to_paper_heads)
