"""Solutions to lesson 00's exercises (try them first). Load one into the notebook with
`%load exercises/solutions/lesson00.py`."""
import numpy as np
import torch

from minwiola.data import load_stories


def valid_stats():
    stories = load_stories("valid")
    return len(stories), max(len(s) for s in stories)


def my_get_batch(data, batch_size, block_size, generator):
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)   # the last start still
    windows = [np.asarray(data[i:i + block_size + 1], dtype=np.int64) for i in starts.tolist()]  # has a target
    window = torch.from_numpy(np.stack(windows))                                           # (B, T + 1)
    return window[:, :-1], window[:, 1:]                     # inputs, and the token after each of them


def bigram_logprobs(ids, vocab_size, alpha):
    counts = torch.full((vocab_size, vocab_size), float(alpha), dtype=torch.float64)
    for a, b in zip(ids[:-1].tolist(), ids[1:].tolist()):      # row: the previous token, column: the next
        counts[a, b] += 1
    return (counts / counts.sum(1, keepdim=True)).log()


def my_get_batch_unshifted(data, batch_size, block_size, generator):
    """A real mistake: the targets are the inputs themselves, not the next tokens."""
    x, _ = my_get_batch(data, batch_size, block_size, generator)
    return x, x.clone()


WRONG = {
    "valid_stats": lambda: (len(load_stories("valid")), max(len(s.split()) for s in load_stories("valid"))),  # words
    "my_get_batch": my_get_batch_unshifted,
    "bigram_logprobs": lambda ids, V, alpha: bigram_logprobs(ids, V, alpha).T.contiguous(),   # rows and columns swapped
}
