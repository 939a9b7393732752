"""Solutions to lesson 04's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson04.py`."""
import torch


@torch.no_grad()
def my_decode(model, prompt_ids, n_new):
    cache = model.new_cache()
    logits = model(prompt_ids, cache)                      # prefill: the whole prompt at once, filling the cache
    ids = prompt_ids
    for step in range(n_new):
        nxt = logits[:, -1].argmax(-1)                     # greedy: the most likely next token, (B,)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if step + 1 < n_new:
            logits = model(nxt[:, None], cache)            # decode: one new position, the rest is in the cache
    return ids


def my_top_p(logits, p):
    probs, order = torch.softmax(logits, -1).sort(-1, descending=True)
    above = probs.cumsum(-1) - probs                       # mass of the tokens more likely than each one
    drop_sorted = above >= p                               # the nucleus already reached p without it
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def worst_paged_waste(b):
    return b - 1        # one position used in the last block, b - 1 left empty


def my_distinct(words, n):
    grams = list(zip(*(words[i:] for i in range(n))))            # the n-grams: n shifted copies side by side
    return len(set(grams)) / len(grams)


@torch.no_grad()
def decode_without_cache(model, prompt_ids, n_new):
    ids = prompt_ids
    for _ in range(n_new):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)   # re-reads everything
    return ids


def top_p_including_the_crossing(logits, p):
    probs, order = torch.softmax(logits, -1).sort(-1, descending=True)
    drop_sorted = probs.cumsum(-1) >= p                    # drops the token that reaches p: too small a set
    return logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {
    "my_decode": decode_without_cache,
    "my_top_p": top_p_including_the_crossing,
    "worst_paged_waste": lambda b: b,
    "my_distinct": lambda words, n: len(set(words)) / len(words),                # ignores n
}
