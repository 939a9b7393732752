"""Solutions to lesson 15's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson15.py`."""
import torch


def my_add_noise(x0, t, mask, generator):
    coin = torch.rand(x0.shape, generator=generator)            # one uniform number per token
    masked = coin < t[:, None]                                   # True with probability t[b] in row b
    return x0.masked_fill(masked, mask), masked


def my_unmask_step(x, logits, k, mask):
    logits = logits.clone()
    logits[..., mask] = float("-inf")                            # the denoiser never predicts [MASK]
    best, predicted = logits.log_softmax(-1).max(-1)             # each position's pick and its log-probability
    best = best.masked_fill(x != mask, float("-inf"))            # only masked positions compete
    chosen = best.topk(k, dim=-1).indices                        # the k most confident of each row
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, chosen, True) & (x == mask)
    return torch.where(reveal, predicted, x)


def _fixed_count(x0, t, mask, generator):                       # exactly round(t T) masks in every row
    order = torch.rand(x0.shape, generator=generator).argsort(-1).argsort(-1)
    masked = order < (t * x0.shape[1]).round()[:, None]
    return x0.masked_fill(masked, mask), masked


def _least_confident(x, logits, k, mask):                        # reveals the k LEAST confident
    logits = logits.clone()
    logits[..., mask] = float("-inf")
    best, predicted = logits.log_softmax(-1).max(-1)
    best = best.masked_fill(x != mask, float("inf"))
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, (-best).topk(k, dim=-1).indices, True) & (x == mask)
    return torch.where(reveal, predicted, x)


def _predicts_everywhere(x, logits, k, mask):                    # overwrites visible tokens with predictions too
    logits = logits.clone()
    logits[..., mask] = float("-inf")
    best, predicted = logits.log_softmax(-1).max(-1)
    chosen = best.masked_fill(x != mask, float("-inf")).topk(k, dim=-1).indices
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, chosen, True) & (x == mask)
    return torch.where(reveal | (x != mask), predicted, x)


def _predicts_mask(x, logits, k, mask):                          # the [MASK] column left in the argmax
    best, predicted = logits.log_softmax(-1).max(-1)
    chosen = best.masked_fill(x != mask, float("-inf")).topk(k, dim=-1).indices
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, chosen, True) & (x == mask)
    return torch.where(reveal, predicted, x)


def _confidence_with_mask_column(x, logits, k, mask):           # ranks by a softmax that keeps the [MASK] column
    scores = logits.log_softmax(-1)                              # [MASK] still in the normalisation
    no_mask = logits.clone()
    no_mask[..., mask] = float("-inf")
    predicted = no_mask.argmax(-1)
    best = scores.gather(-1, predicted[..., None]).squeeze(-1).masked_fill(x != mask, float("-inf"))
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, best.topk(k, dim=-1).indices, True) & (x == mask)
    return torch.where(reveal, predicted, x)


def _k_over_the_batch(x, logits, k, mask):                       # k most confident in the whole batch, not per row
    logits = logits.clone()
    logits[..., mask] = float("-inf")
    best, predicted = logits.log_softmax(-1).max(-1)
    flat = best.masked_fill(x != mask, float("-inf")).flatten()
    reveal = torch.zeros_like(flat, dtype=torch.bool).scatter(0, flat.topk(k).indices, True).view_as(x)
    return torch.where(reveal & (x == mask), predicted, x)


def _fills_every_mask(x, logits, k, mask):                       # commits every prediction, not k of them
    logits = logits.clone()
    logits[..., mask] = float("-inf")
    return torch.where(x == mask, logits.argmax(-1), x)


def _t_without_a_column(x0, t, mask, generator):                  # u < t: (B, T) against (B,) does not broadcast
    masked = torch.rand(x0.shape, generator=generator) < t
    return x0.masked_fill(masked, mask), masked


def _one_uniform_per_column(x0, t, mask, generator):            # the same T uniforms reused by every row
    coin = torch.rand(x0.shape[1], generator=generator)
    masked = coin[None, :] < t[:, None]
    return x0.masked_fill(masked, mask), masked


def _visible_in_the_ranking(x, logits, k, mask):                # top k over every position, then restricted
    logits = logits.clone()
    logits[..., mask] = float("-inf")
    best, predicted = logits.log_softmax(-1).max(-1)
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, best.topk(k, dim=-1).indices, True) & (x == mask)
    return torch.where(reveal, predicted, x)


def _by_raw_logit(x, logits, k, mask):                           # ranked by the raw logit, not its probability
    logits = logits.clone()
    logits[..., mask] = float("-inf")
    best, predicted = logits.max(-1)
    chosen = best.masked_fill(x != mask, float("-inf")).topk(k, dim=-1).indices
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, chosen, True) & (x == mask)
    return torch.where(reveal, predicted, x)


def _softmax_over_positions(x, logits, k, mask):                 # log_softmax over dim 1 (positions), not the tokens
    logits = logits.clone()
    logits[..., mask] = float("-inf")
    best, predicted = logits.log_softmax(1).max(-1)
    chosen = best.masked_fill(x != mask, float("-inf")).topk(k, dim=-1).indices
    reveal = torch.zeros_like(x, dtype=torch.bool).scatter(-1, chosen, True) & (x == mask)
    return torch.where(reveal, predicted, x)


WRONG = {
    "my_add_noise": lambda x0, t, mask, generator: my_add_noise(x0, 1 - t, mask, generator),   # probability 1 - t
    "my_unmask_step": _least_confident,
}
# more plausible mistakes, each of which the check must also catch (tests/test_exercises.py runs them)
ALSO_WRONG = {
    "my_add_noise": [lambda x0, t, mask, generator: my_add_noise(x0, t[:1].expand(len(t)), mask, generator),
                     _fixed_count, _t_without_a_column,    # one t for the batch; a fixed count; no column axis
                     _one_uniform_per_column],             # the rows share their uniforms
    "my_unmask_step": [_predicts_everywhere, _predicts_mask, _confidence_with_mask_column, _k_over_the_batch,
                       _fills_every_mask, _visible_in_the_ranking, _softmax_over_positions, _by_raw_logit],
}
