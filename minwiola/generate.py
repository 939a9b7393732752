"""Writing text: pick the next token from the model's logits, append it, repeat (lesson 04).

Sampling rules, applied to the logits z of the last position:
* greedy (temperature 0): the most likely token;
* temperature t > 0: sample from softmax(z / t); t < 1 sharpens the distribution, t > 1 flattens it;
* top-k: keep only the k most likely tokens, renormalise;
* top-p (nucleus): keep the smallest set of most likely tokens whose probabilities add up to at least p.

Logits no token can honestly be picked from (NaN, +inf, a row of -inf only), and a temperature so small that
z / t overflows, raise ValueError instead of quietly picking a wrong token.

With the KV cache each step feeds only the newest token; without it, each step re-reads the whole sequence.
Both give the same tokens (tested); the cache is faster (benchmarks/generation_bench.py).

A model without the causal mask (causal=False, a masked-diffusion denoiser, lesson 15) cannot continue a prompt
token by token. For it, `generate` and `sample_stories` put max_new_tokens [MASK] ids after the prompt and fill them
with `diffusion.sample`: lowest-confidence-last unmasking, blocks of 32 positions left to right, one step (one
forward pass) per new token, and the same temperature. top-k and top-p filter a next-token distribution and do not
apply there (they are not used; the command line says so).

`story_statistics` measures what Yocto reports of its stories (vocabulary diversity, 2-gram repetition), with the
definitions written down; `STORY_MODEL` is the small trained model that ships with the package (lesson 11).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

from . import diffusion
from .budget import count_params
from .model import LanguageModel, ModelConfig, evaluating
from .tools import load_json
from .tools.runs import SUMS, build_model, verify_folder
from .tokenizer import Tokenizer, default_tokenizer


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature >= 0:                       # also refuses NaN
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def check_seed(seed: int, name: str = "seed") -> None:
    """Raise ValueError (naming `name`, e.g. the option "--seed") unless `seed` is one of the 2**64 seeds torch's
    random generators have, 0 to 2**64 - 1. A larger one fails deep inside torch with "Overflow when unpacking long
    long", which does not say what to fix; a negative one would be read modulo 2**64 (-1 is 2**64 - 1), so it
    names no seed of its own."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        raise ValueError(f"{name} must be an integer from 0 to 2**64 - 1 (the seeds torch's random generators "
                         f"have), got {seed!r}")


def check_logits(logits: torch.Tensor) -> None:
    """Raise ValueError on logits no token can honestly be picked from: NaN or +inf anywhere (argmax would return
    the NaN's index as if it were the best token, and softmax turns either into NaN), or a row of -inf only (every
    token ruled out)."""
    top = logits.amax(-1)                      # each row's largest logit; NaN if the row holds one (amax keeps it)
    if torch.isfinite(top).all():              # the usual case, one check
        return
    if torch.isnan(top).any():
        raise ValueError("the logits contain NaN: the model's output is broken (diverged weights? an overflow in "
                         "float16?), so no token can be picked from it")
    if torch.isposinf(top).any():
        raise ValueError("the logits contain +inf: the model's output overflowed, so no token can be picked from it")
    raise ValueError("every logit of a row is -inf: all tokens are ruled out, none can be picked")


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits (..., V) with every token outside the nucleus set to -inf (top-p, Holtzman et al. 2020). The nucleus
    is the smallest set of most likely tokens whose probabilities (softmax of the logits) add up to at least top_p:
    a token is kept when the mass of the tokens more likely than it is still below top_p, so the most likely token
    is always kept. Kept logits are returned unchanged; sampling then draws from their softmax."""
    probs, order = torch.softmax(logits, -1).sort(-1, descending=True)
    before = probs.cumsum(-1) - probs             # probability mass strictly above each token
    drop = before >= top_p                        # the first token is always kept (before = 0)
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V)."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        check_logits(logits)
        return logits.argmax(-1)
    scaled = logits.float() if temperature == 1 else logits.float() / temperature    # z / 1 = z: no division
    if top_k is not None and top_k < scaled.shape[-1]:
        keep = torch.zeros_like(scaled, dtype=torch.bool).scatter(-1, scaled.topk(top_k, dim=-1).indices, True)
        scaled = scaled.masked_fill(~keep, float("-inf"))   # exactly k survive, even when scores tie
    if top_p is not None and top_p < 1:
        scaled = top_p_filter(scaled, top_p)
    probs = torch.softmax(scaled, -1)
    try:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    except RuntimeError:
        # multinomial checks its input anyway and refuses NaN, which softmax(z / t) holds when z has NaN or +inf, a
        # row of -inf only, or t is so small (1e-45) that z / t overflows: check_logits names z's faults, else t's
        check_logits(logits)
        raise ValueError(f"temperature={temperature} is too small for these logits: logits / temperature overflows "
                         "float32, so no distribution is left to sample from; use temperature=0 for greedy decoding")


def generate_ids(model: LanguageModel, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0, use_cache: bool = True,
                 stop_id: int | None = None, n_ids: int | None = None) -> torch.Tensor:
    """Extend idx (B, T) by up to `max_new_tokens` sampled tokens; stops early when every row has made `stop_id`
    (rows that finish earlier keep sampling until then: cut them at their first `stop_id`).

    `n_ids`: only ids below it are ever produced. A model's vocabulary may be padded beyond its tokenizer's (a
    multiple of 64 runs faster on GPUs); the padding ids stand for no text, so they are ruled out here."""
    check_sampling(temperature, top_k, top_p)
    check_seed(seed)
    if n_ids is not None and not 1 <= n_ids <= model.config.vocab_size:
        raise ValueError(f"n_ids must be in [1, vocab_size={model.config.vocab_size}], got {n_ids}")
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"the prompt idx must be (B, T) with T >= 1, got shape {tuple(idx.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    total = idx.shape[1] + max_new_tokens
    if total > model.config.context:
        raise ValueError(f"prompt ({idx.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) = {total} exceeds "
                         f"context={model.config.context}")
    # inference mode: no gradients, and no autograd bookkeeping on any tensor (no_grad still keeps version
    # counters and view records): 12% of a yocto decode step (benchmarks/generation_bench.py)
    with torch.inference_mode(), evaluating(model):
        generator = torch.Generator(device=idx.device).manual_seed(seed)
        cache = model.new_cache() if use_cache else None
        logits = model(idx, cache)[:, -1, :n_ids]          # with max_new_tokens=0 still run: it checks the prompt
        done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
        new = []                               # each step's ids (B,), joined to idx once at the end
        for step in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, top_p, generator)
            new.append(nxt)
            if stop_id is not None:
                done |= nxt == stop_id
                if done.all():
                    break
            if step + 1 < max_new_tokens:      # ids it sampled (below n_ids) need no check of their values
                seen = nxt.unsqueeze(1) if use_cache else torch.cat([idx, torch.stack(new, 1)], 1)
                logits = model(seen, cache, ids_checked=True)[:, -1, :n_ids]
    # out here, a plain tensor: one made in inference mode could not enter autograd
    return torch.cat([idx, torch.stack(new, 1)], 1) if new else idx.clone()


def generate(model: LanguageModel, tokenizer, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
             top_k: int | None = None, top_p: float | None = 0.95, seed: int = 0, use_cache: bool = True) -> str:
    """Continue `prompt` as the start of a story; returns prompt + continuation, ending at `<|endoftext|>`.

    The prompt is preceded by `<|endoftext|>`, as every story in the training data is.
    """
    return sample_stories(model, tokenizer, prompt, 1, max_new_tokens, temperature, top_k, top_p, seed,
                          use_cache)[0]


def sample_stories(model: LanguageModel, tokenizer, prompt: str, n: int, max_new_tokens: int = 200,
                   temperature: float = 0.8, top_k: int | None = None, top_p: float | None = 0.95, seed: int = 0,
                   use_cache: bool = True) -> list[str]:
    """`n` continuations of one prompt (as `generate`), drawn together as one batch of n rows; each ends at its
    first `<|endoftext|>`. A causal=False model fills masks instead (`fill_stories`; top_k, top_p, use_cache
    unused)."""
    start = [tokenizer.eot_id] + tokenizer.encode(prompt)
    if len(start) > model.config.context:
        raise ValueError(f"the prompt is {len(start)} tokens (with the leading <|endoftext|>), longer than the "
                         f"model's context={model.config.context}; shorten it")
    device = next(model.parameters()).device
    idx = torch.tensor([start] * n, dtype=torch.long, device=device)
    room = model.config.context - len(start)
    if not model.config.causal:
        out = fill_stories(model, tokenizer, idx, min(max_new_tokens, room), temperature, seed)
    else:
        out = generate_ids(model, idx, min(max_new_tokens, room), temperature, top_k, top_p, seed, use_cache,
                           stop_id=tokenizer.eot_id, n_ids=min(tokenizer.vocab_size, model.config.vocab_size))
    stories = []
    for row in out[:, len(start):].tolist():
        if tokenizer.eot_id in row:
            row = row[:row.index(tokenizer.eot_id)]
        stories.append(prompt + tokenizer.decode(row))
    return stories


def fill_stories(model: LanguageModel, tokenizer, idx: torch.Tensor, new_tokens: int, temperature: float = 0.8,
                 seed: int = 0, block: int = 32) -> torch.Tensor:
    """A diffusion model's continuation of idx (B, T): `new_tokens` [MASK] ids appended and filled by
    `diffusion.sample` (rule "confidence", blocks of `block` left to right, one step per new token). Ids the
    tokenizer does not have (the mask, and any padding of the vocabulary) are never produced."""
    check_seed(seed)
    mask = diffusion.mask_id(model.config)
    if mask < tokenizer.vocab_size:
        raise ValueError(f"the model's [MASK] id {mask} is a token of the tokenizer ({tokenizer.vocab_size} ids): "
                         f"a diffusion model needs vocab_size > {tokenizer.vocab_size}")
    if new_tokens == 0:
        return idx
    x = torch.cat([idx, idx.new_full((idx.shape[0], new_tokens), mask)], 1)
    beyond = torch.arange(tokenizer.vocab_size, model.config.vocab_size, device=idx.device)

    def known_ids_only(ids):                            # padding ids stand for no text: rule them out
        return model(ids).index_fill(-1, beyond, float("-inf"))
    with evaluating(model):
        out, _ = diffusion.sample(known_ids_only, x, new_tokens, mask, "confidence", block, temperature,
                                  torch.Generator().manual_seed(seed))
    return out


STORY_MODEL = Path(__file__).parent / "assets" / "story-model"   # chosen in lesson 11 section 7; made.json: how


def words(text: str) -> list[str]:
    """The words of a text for `story_statistics`: lower-cased runs of letters (an apostrophe inside a word
    keeps it whole: "didn't" is one word); digits and punctuation are not words."""
    return re.findall(r"[a-z]+(?:'[a-z]+)*", text.lower())


def story_statistics(texts: list[str], n_words: int = 100) -> dict:
    """Diversity of a set of stories, each cut to its first `n_words` words (texts shorter are left out, so
    every ratio is taken over the same length: the ratios fall as texts grow longer).

    Per story, with w its words and b its word 2-grams (n_words - 1 of them):
    * distinct-1 ("vocabulary diversity") = |set(w)| / |w|;
    * distinct-2 = |set(b)| / |b|;
    * 2-gram repetition = the share of 2-grams that repeat one seen earlier in the same story = 1 - distinct-2.
    Each is the mean over stories. Returns those three, and `stories` (how many were long enough) and `n_words`.
    """
    if not isinstance(n_words, int) or n_words < 2:
        raise ValueError(f"n_words must be an int >= 2 (a 2-gram needs two words), got {n_words!r}")
    cut = [w[:n_words] for w in map(words, texts) if len(w) >= n_words]
    if not cut:
        raise ValueError(f"none of the {len(texts)} texts has {n_words} words; generate longer ones or lower "
                         f"n_words")
    distinct_1 = [len(set(w)) / len(w) for w in cut]
    distinct_2 = [len(set(zip(w, w[1:]))) / (len(w) - 1) for w in cut]
    return {"stories": len(cut), "n_words": n_words, "distinct_1": statistics.mean(distinct_1),
            "distinct_2": statistics.mean(distinct_2), "repetition_2": 1 - statistics.mean(distinct_2)}


def saved_config(folder: Path) -> ModelConfig | None:
    """The model config in folder/config.json, to size the model before it is built; None if the file does not
    hold one (`LanguageModel.from_pretrained` then says what is wrong with it)."""
    try:
        return ModelConfig(**load_json(folder / "config.json"))
    except (OSError, ValueError, TypeError):          # missing, not JSON, not a dict, unknown or bad fields
        return None


def load_model(folder: str | Path) -> tuple[LanguageModel, "Tokenizer"]:
    """A trained model and its tokenizer from a run folder (its best/ weights, else checkpoint/) or a folder
    written by `save_pretrained`. A run folder's files are checked against their SHA256SUMS first. The tokenizer
    is the one saved with the model (`tokenizer.bpe`), else the shipped one; refused if its size does not fit."""
    folder = Path(folder)
    for inner in ("best", "checkpoint"):
        if (folder / inner / "model.safetensors").is_file():
            folder = folder / inner
            break
    if (folder / SUMS).is_file():
        verify_folder(folder)
    config = saved_config(folder)
    model = build_model(lambda: LanguageModel.from_pretrained(folder), config and count_params(config),
                        f"from {folder / 'config.json'}")
    saved = folder / "tokenizer.bpe"
    tokenizer = Tokenizer.load(saved) if saved.is_file() else default_tokenizer()
    if not 0 <= model.config.vocab_size - tokenizer.vocab_size < 128:   # padding (to a multiple of 64), [MASK]
        raise ValueError(f"the tokenizer ({tokenizer.vocab_size} ids) does not fit the model in {folder} (vocab_size="
                         f"{model.config.vocab_size}): its tokenizer.bpe must be the one the model learnt")
    return model, tokenizer


def main(argv: list[str] | None = None) -> int:
    """`python -m minwiola.generate [RUN_DIR ["Once upon a time"]]`: write a story with a trained model
    (`load_model`; without RUN_DIR, the shipped one)."""
    parser = argparse.ArgumentParser(prog="python -m minwiola.generate", description="Write a story with a trained model.")
    parser.add_argument("run", nargs="?", default=str(STORY_MODEL),
                        help="a run folder (its best/ weights, else checkpoint/) or a save_pretrained folder "
                             "(default: the small trained model shipped in minwiola/assets/story-model)")
    parser.add_argument("prompt", nargs="?", default="Once upon a time", help="the story's first words")
    parser.add_argument("--tokens", type=int, default=200, help="at most this many new tokens (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default 0.8)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens only")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same story")
    args = parser.parse_args(argv)
    try:
        check_seed(args.seed, "--seed")                  # before the model is read: a mistake costs nothing
        model, tokenizer = load_model(args.run)
        if not model.config.causal:
            print(f"(a diffusion model, causal=False: {args.tokens} masks filled by unmasking, one forward pass "
                  "each, in blocks of 32; --top-k and --top-p do not apply)", file=sys.stderr)
        print(generate(model, tokenizer, args.prompt, args.tokens, args.temperature, args.top_k, args.top_p,
                       args.seed))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
