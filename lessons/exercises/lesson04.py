"""Self-checks for lesson 04's exercises: the cached greedy decoding loop (against the library's generation and
a full forward per step), top-p filtering (against `minwiola.generate.top_p_filter`), and the worst waste of a
paged cache; the share of distinct n-grams (against `minwiola.generate.story_statistics`). A function that still returns None is "not attempted yet". Solutions: `solutions/lesson04.py`."""
import math

import torch

from exercises import attempted, close, correct
from minwiola.generate import generate_ids, story_statistics, top_p_filter, words
from minwiola.model import LanguageModel, preset


def counting_forwards(model: LanguageModel) -> tuple[list[int], object]:
    """A list that records how many token positions each call of model(...) feeds in, and the hook's handle."""
    fed: list[int] = []

    def hook(module, args, kwargs):
        ids = args[0] if args else kwargs.get("idx")
        fed.append(int(ids.shape[1]))

    return fed, model.register_forward_pre_hook(hook, with_kwargs=True)


def check_1(my_decode) -> None:
    """my_decode(model, prompt_ids, n_new): greedy, with the KV cache, equal to generate_ids(temperature=0)."""
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama", init_std=0.5)).to(torch.float64).eval()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 64, (1, 4), generator=g)
    with torch.no_grad():
        first = my_decode(model, prompt, 3)
    if not attempted(first, 1):
        return
    for B, T0, n_new in ((1, 4, 3), (1, 1, 20), (3, 6, 25)):
        prompt = torch.randint(0, 64, (B, T0), generator=g)
        want = generate_ids(model, prompt, n_new, temperature=0)
        fed, handle = counting_forwards(model)
        try:
            with torch.no_grad():
                got = my_decode(model, prompt, n_new)
        finally:
            handle.remove()
        what = f"prompt of shape {(B, T0)}, {n_new} new tokens"
        assert isinstance(got, torch.Tensor), f"{what}: expected a tensor of ids, got {type(got).__name__}"
        assert tuple(got.shape) == (B, T0 + n_new), (f"{what}: ids of shape {tuple(got.shape)}, expected the prompt "
                                                    f"followed by the new tokens, {(B, T0 + n_new)}")
        differ = (got != want).nonzero()
        if len(differ):
            b, t = (int(i) for i in differ[0])
            raise AssertionError(f"{what}: row {b}, position {t} is token {int(got[b, t])}, expected "
                                 f"{int(want[b, t])} (the argmax of the logits at the last position"
                                 f"{'; the prompt must come back unchanged' if t < T0 else ''})"
                                 + ("; if you feed the whole ids again with the cache, it holds the earlier "
                                    "positions twice: after the prefill feed only the newest token, (B, 1)"
                                    if t >= T0 else ""))
        assert fed and fed[0] == T0, (f"{what}: the first call should feed the whole prompt ({T0} positions: the "
                                      f"prefill), it fed {fed[0] if fed else 'nothing'}")
        assert sum(fed) <= T0 + n_new and max(fed[1:], default=1) == 1, (
            f"{what}: the right tokens, but your calls fed {sum(fed)} positions in all ({fed[:6]}...): after the "
            f"prefill feed only the newest token, with the cache (model(nxt[:, None], cache)), "
            f"{T0 + n_new - 1} positions in all")
    correct("Exercise 1: correct (prefill once, then one token per step)", my_decode)


def check_3(my_top_p) -> None:
    """my_top_p(logits, p) against minwiola.generate.top_p_filter: the same tokens kept, their logits unchanged."""
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0]])
    if not attempted(my_top_p(logits.clone(), 0.6), 3):
        return
    g = torch.Generator().manual_seed(0)
    exact = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.1, 0.2, 0.3, 0.4]]).log()
    cases = [(logits, 0.6), (logits, 0.9), (exact, 0.75), (exact, 1e-9), (exact, 1.0),
             (torch.randn(4, 50, generator=g) * 2, 0.8), (torch.randn(2, 300, generator=g) * 3, 0.95)]
    for x, p in cases:
        want = top_p_filter(x, p)
        got = my_top_p(x.clone(), p)
        assert isinstance(got, torch.Tensor) and got.shape == x.shape, (
            f"p={p}, logits {tuple(x.shape)}: expected filtered logits of the same shape, got "
            f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        keep, kept = want.isfinite(), got.isfinite() & ~torch.isnan(got)
        bad = (keep != kept).nonzero()
        if len(bad):
            r, i = (int(j) for j in bad[0])
            probs = torch.softmax(x[r], -1)
            above = probs[probs > probs[i]].sum().item()
            raise AssertionError(
                f"p={p}, row {r}: token id {i} (probability {probs[i]:.4f}, rank {int((probs > probs[i]).sum()) + 1}) "
                f"should be {'kept' if keep[r, i] else 'set to -inf'}; the tokens more likely than it hold "
                f"{above:.4f} of the mass, {'below' if keep[r, i] else 'already at least'} p (the nucleus is the "
                f"smallest set reaching p)")
        assert torch.equal(got[keep], x[keep]), f"p={p}: the kept tokens' logits should come back unchanged"
    correct("Exercise 3: correct (the library's nucleus, token for token)", my_top_p)


def check_2(worst_paged_waste) -> None:
    """worst_paged_waste(b): the most positions a paged cache with blocks of b can leave empty for one sequence."""
    if not attempted(worst_paged_waste(2), 2):
        return
    for b in (1, 2, 16, 64):
        worst = max(math.ceil(n / b) * b - n for n in range(1, 5 * b))
        assert worst_paged_waste(b) == worst, (f"blocks of {b} position{'s' if b > 1 else ''}: you say {worst_paged_waste(b)}, but a "
                                               f"sequence can leave at most {worst} empty (try n = {b + 1} tokens)")
    correct("Exercise 2: correct", worst_paged_waste)


def check_4(my_distinct) -> None:
    """my_distinct(words, n): the share of distinct n-grams among a list of words' n-grams."""
    story = "the cat sat on the mat and the cat ran to the mat".split()
    if not attempted(my_distinct(story, 1), 4):
        return
    again = "the cat sat on the mat the cat sat on a hat the cat sat".split()    # repeated 2-, 3- and 4-grams
    for text in (story, again):
        for n in (1, 2, 3, 4):
            grams = list(zip(*(text[i:] for i in range(n))))
            close(my_distinct(text, n), len(set(grams)) / len(grams), f"n = {n} on {' '.join(text)!r} "
                  f"({len(grams)} {n}-grams, {len(set(grams))} distinct)")
    text = "Once upon a time, a dog and a cat played. The dog ran and the cat ran. The dog and the cat slept."
    w = words(text)
    stats = story_statistics([text], n_words=len(w))
    close(my_distinct(w, 1), stats["distinct_1"], "distinct-1 against minwiola.generate.story_statistics")
    close(my_distinct(w, 2), stats["distinct_2"], "distinct-2 against minwiola.generate.story_statistics")
    correct(f"Exercise 4: correct (2-gram repetition of that text: {1 - my_distinct(w, 2):.3f})", my_distinct)


EXERCISES = {1: "my_decode", 2: "worst_paged_waste", 3: "my_top_p", 4: "my_distinct"}
