"""Solutions to lesson 08's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson08.py`."""
import torch


def prefix_mean_step(chunk, state):
    total, count = state if state is not None else (torch.zeros_like(chunk[:, 0]), 0)
    sums = total[:, None] + chunk.cumsum(1)                        # sum of every position up to each one
    counts = torch.arange(count + 1, count + chunk.shape[1] + 1, dtype=chunk.dtype)
    if chunk.shape[1]:
        total = sums[:, -1]
    return sums / counts[:, None], (total, count + chunk.shape[1])


def summary_state_size(cfg):
    return cfg.n_layers * cfg.d                                    # one running sum of d numbers per layer


def library_to_paper_heads(H, H_kv):
    group = H // H_kv
    # library head j shares key/value head j // group; the paper's heads sharing key/value head g are g, g + H_kv, ...
    return [(j // group) + H_kv * (j % group) for j in range(H)]


def forgets_the_past(chunk, state):        # each chunk averaged on its own: right for one chunk only
    counts = torch.arange(1, chunk.shape[1] + 1, dtype=chunk.dtype)
    return chunk.cumsum(1) / counts[:, None], state


def paper_to_library_heads(H, H_kv):       # the inverse map: p[h] = the library's head that plays paper head h
    paper_order = sorted(range(H), key=lambda h: h % H_kv)
    return [paper_order.index(j) for j in range(H)]


WRONG = {
    "prefix_mean_step": forgets_the_past,
    "summary_state_size": lambda cfg: 2 * cfg.n_layers * cfg.d,    # counted a sum and a mean per layer
    "library_to_paper_heads": paper_to_library_heads,
}


def projected_context_size(cfg):          # the context keys and values after W_K^ctx, W_V^ctx: not what is kept
    return 2 * cfg.n_layers * (cfg.n_kv_heads or cfg.n_heads) * (cfg.d // cfg.n_heads)


ALSO_WRONG = {"summary_state_size": [projected_context_size]}
