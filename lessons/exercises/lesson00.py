"""Self-checks for lesson 00's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which input, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson00.py` (look after trying)."""
import math

import numpy as np
import torch

from exercises import attempted, correct, same_tensor
from minwiola.data import get_batch, load_stories
from minwiola.model import initial_loss, next_token_loss


def check_1(valid_stats) -> None:
    """valid_stats(): (number of validation stories, characters in the longest one)."""
    if not attempted(valid_stats(), 1):
        return
    stories = load_stories("valid")
    got = valid_stats()
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"answer with a pair (stories, longest length), got {got!r}"
    assert got[0] == len(stories), f"{got[0]} is not the number of validation stories (load_stories('valid'))"
    longest = max(stories, key=len)
    assert got[1] == len(longest), (f"{got[1]} is not the length of the longest story in characters "
                                    f"(it has {len(longest.split())} words; len() of the string counts characters)")
    correct(f"Exercise 1: correct ({got[0]:,} stories, the longest {got[1]:,} characters)", valid_stats)


def check_2(my_get_batch) -> None:
    """my_get_batch(data, batch_size, block_size, generator) -> (x, y), both (B, T) int64: minwiola.data.get_batch."""
    data = np.arange(1000, 1100, dtype=np.uint16)            # values are not positions, so an off-by-one shows
    if not attempted(my_get_batch(data, 2, 4, torch.Generator().manual_seed(0)), 2):
        return
    rng = np.random.default_rng(0)
    cases = [(data, 2, 4, 0), (data, 5, 9, 1), (data, 1, 99, 2),     # block_size 99: only start 0 fits
             (rng.integers(0, 4096, 5000).astype(np.uint16), 8, 64, 3)]
    for values, B, T, seed in cases:
        got = my_get_batch(values, B, T, torch.Generator().manual_seed(seed))
        want = get_batch(values, B, T, torch.Generator().manual_seed(seed))
        assert isinstance(got, tuple) and len(got) == 2, f"return a pair (x, y), got {type(got).__name__}"
        where = f"data of {len(values)} tokens, batch_size={B}, block_size={T}, seed {seed}"
        for name, g, w in (("x", got[0], want[0]), ("y", got[1], want[1])):
            assert isinstance(g, torch.Tensor) and g.dtype == torch.int64, (
                f"{name} ({where}): expected an int64 tensor, got {getattr(g, 'dtype', type(g).__name__)}")
            same_tensor(g, w, f"{name} ({where}); hint: draw the starts with torch.randint(len(data) - block_size, "
                              f"(batch_size,), generator=generator), y is x shifted one token on", atol=0)
    correct("Exercise 2: correct (the same batches as minwiola.data.get_batch, seed for seed)", my_get_batch)


def check_3(bigram_logprobs) -> None:
    """bigram_logprobs(ids, vocab_size, alpha) -> (V, V): log P(next = b | previous = a) with add-alpha counts."""
    ids = torch.tensor([0, 1, 2, 1, 2, 0, 0, 1])
    if not attempted(bigram_logprobs(ids, 3, 1.0), 3):
        return
    g = torch.Generator().manual_seed(0)
    cases = [(ids, 3, 1.0), (torch.randint(0, 17, (500,), generator=g), 17, 0.5), (torch.tensor([4, 4, 4]), 5, 0.1)]
    for ids, V, alpha in cases:
        got = bigram_logprobs(ids, V, alpha)
        counts = torch.bincount(ids[:-1] * V + ids[1:], minlength=V * V).reshape(V, V).double() + alpha
        want = (counts / counts.sum(1, keepdim=True)).log()
        what = f"{len(ids)} ids, V = {V}, alpha = {alpha}"
        if isinstance(got, torch.Tensor) and got.shape == (V, V):
            sums = got.double().exp().sum(1)
            bad = (sums - 1).abs() > 1e-6
            assert not bad.any(), (f"{what}: row {int(bad.nonzero()[0])} of exp(table) sums to "
                                   f"{sums[bad][0].item():.4f}, not 1: each row is P(. | previous token)")
        same_tensor(got, want, f"{what}: entry [a, b] is log P(next = b | previous = a)", atol=1e-6)
    # The same on real text: bytes of the stories (V = 256), trained on train, scored on valid with the library's loss
    train = torch.tensor(list("\n".join(load_stories("train")[:300]).encode()))
    valid = torch.tensor(list("\n".join(load_stories("valid")[:100]).encode()))
    table = bigram_logprobs(train, 256, 0.1).double()
    loss = next_token_loss(table[valid[:-1]][None], valid[1:][None]).item()
    assert loss < initial_loss(256), f"your bigram scores {loss:.3f} nats per byte, no better than uniform"
    correct(f"Exercise 3: correct (a byte bigram: {loss:.2f} nats per byte on held-out stories, {loss / math.log(2):.2f} "
          f"bits; a uniform guess: ln 256 = {initial_loss(256):.2f})", bigram_logprobs)


EXERCISES = {1: "valid_stats", 2: "my_get_batch", 3: "bigram_logprobs"}   # check -> the learner's function
