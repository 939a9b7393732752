"""Not the course's subject: the Hugging Face Transformers bridge (Wiola paper section XIV; lesson 10, section 10).

The paper registers `model_type = "wiola"` with three Auto classes and defines a chat template. This file does that
for every minwiola model (any preset, Wiola or not):

* `WiolaConfig`: a `PretrainedConfig` holding exactly the fields of `model.ModelConfig`;
* `WiolaForCausalLM`: a `PreTrainedModel` around a `model.LanguageModel`. It *wraps* the course's model (the same
  module, so the same weights: nothing is copied) and speaks the Transformers calling convention, so
  `model.generate()` works (greedy, sampling, top-k, top-p) on the course's own decoding state (`new_cache`);
* `hf_tokenizer`: the course's byte-level BPE as a `PreTrainedTokenizerFast`, built from our ranks, giving the same
  ids for the same text, plus the chat tokens and the chat template;
* `to_hf` / `from_hf`: conversion both ways between the course's folder (`LanguageModel.save_pretrained`, a run
  folder) and the Hugging Face folder, also from the command line: `python -m minwiola.hf to-hf SRC DST`.

Registration, not remote code. Importing this module registers "wiola" with `AutoConfig`, `AutoModelForCausalLM`
and `AutoTokenizer`, so `AutoModelForCausalLM.from_pretrained(folder)` works with `trust_remote_code=False` (the
default). The other way, `trust_remote_code=True`, would copy a modeling file into every folder and execute it on
load: code from a folder a learner may have downloaded from anywhere. Here a folder holds only data (config,
weights, tokenizer); the code is the installed library the lessons built. The price: `import minwiola.hf` first.

Optional: needs the `hf` extra (`pip install -e ".[hf]"`). The core library never imports this file.
Nothing here reaches a hub: every load is from a local folder.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys
from pathlib import Path
from types import MappingProxyType

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationMixin, PretrainedConfig,
                          PreTrainedModel, PreTrainedTokenizerFast)
from transformers.modeling_outputs import CausalLMOutputWithPast

from .. import first_line
from ..budget import count_params
from ..model import LanguageModel, ModelConfig, load_weights, next_token_loss
from ..tokenizer import EOT, Tokenizer
from . import load_json
from .runs import build_model

MODEL_TYPE = "wiola"

# The paper's chat format: <|user|>U<|end|><|assistant|>A<|end|>. The three markers are special tokens: each one id,
# never merged with text. A message whose text contains a marker is refused (it would forge a turn).
USER, END, ASSISTANT = "<|user|>", "<|end|>", "<|assistant|>"
CHAT_TOKENS = (USER, END, ASSISTANT)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('the Wiola chat format has only user and assistant turns, got ' + message['role']) }}"
    "{% endif %}"
    "{% for marker in ['<|user|>', '<|end|>', '<|assistant|>', '<|endoftext|>'] %}"
    "{% if marker in message['content'] %}"
    "{{ raise_exception('a message may not contain the special token ' + marker) }}"
    "{% endif %}{% endfor %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]
HF_NAMES = {"rope_scaling": "rope_stretch"}     # transformers owns `rope_scaling` (its own dict): ours is stored apart


# ----------------------------------------------------------------------------------------------------
# The config and the model
# ----------------------------------------------------------------------------------------------------

class WiolaConfig(PretrainedConfig):
    """Every field of `ModelConfig`, under its own name, plus what Transformers keeps about a model (token ids of
    eos/bos, the dtype). `hidden_size` and friends are aliases Transformers' utilities look for."""

    model_type = MODEL_TYPE
    attribute_map = {"hidden_size": "d", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "max_position_embeddings": "context"}

    def __init__(self, **kwargs):
        defaults = dataclasses.asdict(ModelConfig())
        for name in FIELDS:
            hf = HF_NAMES.get(name, name)
            value = kwargs.pop(hf, defaults[name])
            if hf != name and isinstance(kwargs.get(name), str):     # the course's own name (from_model_config)
                value = kwargs.pop(name)
            setattr(self, hf, value)
        kwargs.setdefault("tie_word_embeddings", self.tie_head)
        super().__init__(**kwargs)
        self.tie_word_embeddings = self.tie_head     # the tying is done inside LanguageModel (eq. 7), never by HF

    @classmethod
    def from_model_config(cls, config: ModelConfig, **kwargs) -> "WiolaConfig":
        return cls(**dataclasses.asdict(config), **kwargs)

    def model_config(self) -> ModelConfig:
        """The course's config (the same checks as any config: a bad field raises ValueError naming it)."""
        return ModelConfig(**{name: getattr(self, HF_NAMES.get(name, name)) for name in FIELDS})


class MinwiolaCache:
    """The course's decoding state (one per layer: a KV cache, GCLA's running sums, an SSM's state) in the one
    shape `generate` needs: an object it hands back to the model, which knows how many tokens it holds."""

    def __init__(self, layers: list):
        self.layers = layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[0].length


# The field of the output that carries the cache back to `generate`: "cache" in Transformers 5.x, formerly
# "past_key_values". Read from the output class, so either version works.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class WiolaForCausalLM(PreTrainedModel, GenerationMixin):
    """A minwiola `LanguageModel` as a Transformers causal LM. `self.model` is the course's module itself."""

    config_class = WiolaConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: WiolaConfig, model: LanguageModel | None = None):
        super().__init__(config)
        self.model = model if model is not None else LanguageModel(config.model_config())
        self.post_init()

    @classmethod
    def from_minwiola(cls, model: LanguageModel, tokenizer: Tokenizer | None = None) -> "WiolaForCausalLM":
        """Wrap `model` without copying it (`wrapper.model is model`); with its tokenizer, the end-of-story id
        becomes the config's eos (where `generate` stops) and bos."""
        ids = {"eos_token_id": tokenizer.eot_id, "bos_token_id": tokenizer.eot_id} if tokenizer else {}
        wrapper = cls(WiolaConfig.from_model_config(model.config, **ids), model=model)
        return wrapper.train(model.training)

    @classmethod
    def from_pretrained(cls, folder: str | Path, *args, config: WiolaConfig | None = None, dtype=None,
                        **kwargs) -> "WiolaForCausalLM":
        """The model in a local folder `save_pretrained` wrote, in eval mode. Our own loader, not Transformers':
        the model is built as the course builds it (its position tables computed, not left empty) and the weights
        loaded with `model.load_weights`' checks. Local folders only: nothing is downloaded. `dtype` (or
        `torch_dtype`) casts the weights; other loading options (device maps, quantisation) are refused."""
        dtype = dtype if dtype is not None else kwargs.pop("torch_dtype", None)
        ignored = {"trust_remote_code", "local_files_only", "_from_auto", "_commit_hash", "revision", "cache_dir",
                   "force_download", "proxies", "token", "subfolder", "code_revision", "adapter_kwargs"}
        unsupported = sorted(k for k, v in kwargs.items() if k not in ignored and v not in (None, False, ""))
        if args or unsupported:
            raise ValueError(f"WiolaForCausalLM.from_pretrained takes a folder (and dtype) only; not supported here: "
                             f"{unsupported or args}")
        folder = Path(folder)
        if not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(f"{folder / 'model.safetensors'} not found: minwiola.hf loads a local folder "
                                    "that to_hf or save_pretrained wrote (nothing is downloaded)")
        config = config if config is not None else WiolaConfig.from_pretrained(folder)
        model = build_model(lambda: cls(config), count_params(config.model_config()), f"from {folder / 'config.json'}")
        load_weights(model.model, folder / "model.safetensors", prefix=cls.base_model_prefix + ".")
        if dtype not in (None, "auto"):
            model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        return model.eval()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False                 # the model keeps its own decoding state (`new_cache`): no DynamicCache for it

    def _init_weights(self, module) -> None:
        pass                         # LanguageModel initialises itself (init_weights); loaded weights overwrite it

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return None                  # tied inside LanguageModel (logits = h E^T): nothing for Transformers to tie

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, use_cache: bool | None = None, **kwargs):
        """Logits (B, T, V) for `input_ids` (B, T), continuing the decoding state passed as `cache` (or by its old
        name `past_key_values`). `labels` give the next-token loss in nats per token (-100: ignored)."""
        cache = kwargs.pop("cache", None) or kwargs.pop("past_key_values", None)
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("attention_mask has zeros (padding): minwiola's model has no padding mask; "
                             "generate prompts of equal length, or one at a time")
        if use_cache and not self.model.config.causal:
            raise ValueError("a model with causal=False is no next-token predictor: it has logits but no generate "
                             "(a masked-diffusion denoiser samples with minwiola.diffusion.sample)")
        if not isinstance(cache, MinwiolaCache) or cache.get_seq_length() == 0:
            cache = None             # an empty cache of another kind (Transformers' own): start ours instead
        if cache is None and use_cache:
            cache = MinwiolaCache(self.model.new_cache())
        logits = self.model(input_ids, cache.layers if cache is not None else None)
        loss = next_token_loss(logits[:, :-1], labels[:, 1:]) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs) -> dict:
        """What `generate` feeds the next forward: with a filled cache, only the tokens it has not seen."""
        cache = kwargs.get("cache") or kwargs.get("past_key_values")
        if isinstance(cache, MinwiolaCache) and cache.get_seq_length() > 0:
            input_ids = input_ids[:, cache.get_seq_length():]
        else:
            cache = None
        return {"input_ids": input_ids, CACHE_FIELD: cache, "attention_mask": kwargs.get("attention_mask"),
                "use_cache": kwargs.get("use_cache", True)}

    def resize_token_embeddings(self, new_num_tokens: int | None = None, *args, **kwargs) -> torch.nn.Embedding:
        """Grow the vocabulary to `new_num_tokens` (for new special tokens, such as the chat markers). Each new row
        starts at the mean of the old rows, so a new token starts out as an average token rather than a random
        direction; the old tokens' logits do not change. The rows still need training."""
        lm = self.model
        old = lm.config.vocab_size
        if new_num_tokens is None or new_num_tokens == old:
            return lm.embed
        if new_num_tokens < old:
            raise ValueError(f"resize_token_embeddings only grows the vocabulary: {new_num_tokens} < {old}")

        def grown(weight: torch.Tensor) -> torch.nn.Parameter:
            extra = weight.detach().mean(0, keepdim=True).expand(new_num_tokens - old, -1)
            return torch.nn.Parameter(torch.cat([weight.detach(), extra]))

        lm.embed.weight = grown(lm.embed.weight)
        lm.embed.num_embeddings = new_num_tokens
        if lm.head is not None:
            lm.head.weight = grown(lm.head.weight)
            lm.head.out_features = new_num_tokens
        lm.config = dataclasses.replace(lm.config, vocab_size=new_num_tokens)
        self.config.vocab_size = new_num_tokens
        return lm.embed


AutoConfig.register(MODEL_TYPE, WiolaConfig, exist_ok=True)
AutoModelForCausalLM.register(WiolaConfig, WiolaForCausalLM, exist_ok=True)
AutoTokenizer.register(WiolaConfig, fast_tokenizer_class=PreTrainedTokenizerFast, exist_ok=True)


# ----------------------------------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------------------------------

@functools.cache          # hf_text asks for it once per token and per rule (some 14,000 times a tokenizer): built once
def byte_to_unicode() -> MappingProxyType[int, str]:
    """GPT-2's printable stand-in for each byte, the alphabet of byte-level vocabularies in `tokenizer.json`:
    printable bytes stand for themselves, the other 68 take the characters from U+0100 on, in byte order. One
    table shared by every caller, so read-only."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(others)})
    return MappingProxyType(table)


def hf_text(token: bytes) -> str:
    """A token's bytes as tokenizer.json spells them, one `byte_to_unicode` character a byte."""
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def hf_merges(tokenizer: Tokenizer) -> list[tuple[bytes, bytes]]:
    """Merges in the Hugging Face sense, (left, right) pairs in priority order, for our ranks.

    Ours is "merge the adjacent pair whose joined bytes form the lowest-rank token"; Hugging Face's BPE is "merge
    the adjacent pair whose rule comes first". With a rule for *every* split of token r into two lower-rank tokens,
    ranked as r, the two are the same procedure: the same pairs may merge and the lowest rank goes first. One rule
    per token is also enough when it is the split our encoder reaches on the token's own bytes (lesson 10 checks
    that on the stories), but a wrong choice of split silently changes ids; every split needs no such argument."""
    ranks, merges = tokenizer.ranks, []
    for r, token in enumerate(tokenizer.vocab[256:], 256):
        splits = [(ranks[token[:k]], ranks[token[k:]]) for k in range(1, len(token))
                  if ranks.get(token[:k], r) < r and ranks.get(token[k:], r) < r]
        merges += [(tokenizer.vocab[a], tokenizer.vocab[b]) for a, b in sorted(splits)]
    return merges


def hf_tokenizer(tokenizer: Tokenizer, chat: bool = True, merges: list[tuple[bytes, bytes]] | None = None
                 ) -> PreTrainedTokenizerFast:
    """Our tokenizer as a `PreTrainedTokenizerFast`: the same four steps (NFC, our pre-tokenising regex, byte-level
    BPE with our ranks, special tokens cut out first) in the `tokenizers` library, so the same text gets the same
    ids. With `chat`, the chat markers are appended as special tokens (ids after ours) with the chat template.
    `merges` replaces `hf_merges(tokenizer)` (lesson 10 and the tests try other rule lists).

    One difference by design: Hugging Face tokenizers always read special-token strings in the text as the special
    token; our `encode` reads them as text unless `allowed_special=True` (equal ids then)."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer
    bpe = models.BPE(vocab={hf_text(b): i for i, b in enumerate(tokenizer.vocab)},
                     merges=[(hf_text(a), hf_text(b)) for a, b in (hf_merges(tokenizer) if merges is None else merges)],
                     ignore_merges=True)                   # a piece that is itself a token is that token (as ours)
    rust = RustTokenizer(bpe)
    rust.normalizer = normalizers.NFC()
    rust.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tokenizer.pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    rust.decoder = decoders.ByteLevel()
    specials = list(tokenizer.specials) + [t for t in (CHAT_TOKENS if chat else ()) if t not in tokenizer.specials]
    rust.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    fast = PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=EOT, bos_token=EOT,
                                   clean_up_tokenization_spaces=False)
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def course_tokenizer(fast: PreTrainedTokenizerFast, n_ids: int | None = None) -> Tokenizer:
    """The inverse of `hf_tokenizer`: our tokenizer from a Hugging Face one, read from its tokenizer.json (the
    vocabulary in id order, the regex, the special tokens). Special tokens from id `n_ids` on (the chat markers a
    model has no rows for) are left out."""
    data = json.loads(fast.backend_tokenizer.to_str())
    from_unicode = {c: b for b, c in byte_to_unicode().items()}
    by_id = sorted((i, s) for s, i in data["model"]["vocab"].items())
    if [i for i, _ in by_id] != list(range(len(by_id))):
        raise ValueError("tokenizer.json's vocabulary has gaps in its ids: not one written by minwiola.hf")
    outside = next((f"{s!r} (id {i})" for i, s in by_id if not set(s) <= from_unicode.keys()), None)
    if outside:
        raise ValueError(f"the vocabulary entry {outside} has characters outside the byte-level alphabet")
    vocab = [bytes(from_unicode[c] for c in s) for _, s in by_id]
    split = data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    specials = [t["content"] for t in sorted(data["added_tokens"], key=lambda t: t["id"])
                if n_ids is None or t["id"] < n_ids]
    return Tokenizer(vocab, specials, split)


def tokenizer_difference(fast: PreTrainedTokenizerFast, tokenizer: Tokenizer) -> str | None:
    """Where `fast` (a folder's tokenizer) and `tokenizer` (what `course_tokenizer` read from it) could give
    different ids, or None. `course_tokenizer` keeps only the vocabulary, the regex and the special tokens, and
    takes the rest, the merge rules above all, to be what `hf_tokenizer` writes for that vocabulary. A file whose
    rules were changed (say, its last 600 merges dropped) is still a valid tokenizer, so only comparing them finds
    it: the first merge rule that differs, else every other part that does."""
    theirs = json.loads(fast.backend_tokenizer.to_str())
    ours = json.loads(hf_tokenizer(tokenizer, chat=False).backend_tokenizer.to_str())
    pairs = itertools.zip_longest(theirs["model"].pop("merges"), ours["model"].pop("merges"))
    for i, (rule, want) in enumerate(pairs):
        if rule != want:
            return (f"merge rule {i} is {tuple(rule) if rule else '(none)'} there, but "
                    f"{tuple(want) if want else '(none)'} for its vocabulary")
    model = theirs["model"], ours["model"]
    parts = [f"model.{key}" for key in sorted(model[0].keys() | model[1].keys())
             if model[0].get(key) != model[1].get(key)]
    parts += [part for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder")
              if theirs.get(part) != ours.get(part)]
    return f"it differs from what minwiola.hf writes in {', '.join(parts)}" if parts else None


def parse_chat(text: str) -> list[dict]:
    """The inverse of the chat template: [{"role", "content"}, ...] from a rendered conversation (a trailing
    generation prompt `<|assistant|>` is left out). Raises ValueError on text that is not in the format."""
    messages, rest = [], text
    while rest:
        role = next((r for r, marker in (("user", USER), ("assistant", ASSISTANT)) if rest.startswith(marker)), None)
        if role is None:
            raise ValueError(f"expected {USER} or {ASSISTANT} at {rest[:20]!r}")
        rest = rest[len(USER if role == "user" else ASSISTANT):]
        if not rest and role == "assistant":
            break                                   # the generation prompt
        content, sep, rest = rest.partition(END)
        if not sep:
            raise ValueError(f"a {role} turn has no closing {END}")
        messages.append({"role": role, "content": content})
    return messages


# ----------------------------------------------------------------------------------------------------
# Folders, both ways
# ----------------------------------------------------------------------------------------------------

def _fresh_folder(path: Path) -> Path:
    """Refuse to write into a folder that holds anything: these tools never overwrite a user's files."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path} exists and is not an empty folder: choose a new one")
    path.mkdir(parents=True, exist_ok=True)
    return path


def to_hf(source: str | Path, target: str | Path) -> Path:
    """Write the Hugging Face folder (config.json with model_type "wiola", model.safetensors, tokenizer files with
    the chat template) for a course folder: a `save_pretrained` folder or a run folder (its best/ weights, checked
    against its SHA256SUMS), or `minwiola.generate.STORY_MODEL`. `target` must be new or empty."""
    from ..generate import load_model
    model, tokenizer = load_model(source)
    target = Path(target)
    _fresh_folder(target)
    WiolaForCausalLM.from_minwiola(model, tokenizer).save_pretrained(target)
    hf_tokenizer(tokenizer).save_pretrained(target)
    return target


def _needs(path: Path) -> None:
    """FileNotFoundError naming `path` if the folder lacks it."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {path.parent} a Hugging Face model folder that to_hf wrote?")


def from_hf(source: str | Path, target: str | Path) -> Path:
    """The inverse of `to_hf`: the course folder (`LanguageModel.save_pretrained` with its `tokenizer.bpe`) from a
    Hugging Face folder of model_type "wiola". `target` must be new or empty. A folder to_hf could not have written
    (a file missing, a config.json that is no JSON object, a model too big for this machine's memory, a
    tokenizer.json that cannot be read or whose rules differ from those its vocabulary gives) is refused with one
    error naming the file, before anything is written."""
    source, target = Path(source), Path(target)
    config_file = source / "config.json"
    _needs(config_file)
    fields = load_json(config_file)                  # a ValueError naming the file if it holds no JSON
    if not isinstance(fields, dict):
        raise ValueError(f"{config_file} holds a {type(fields).__name__}, not a model config")
    if fields.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{source} holds a model of type {fields.get('model_type')!r}, not {MODEL_TYPE!r}")
    _needs(source / "tokenizer.json")            # else transformers says only that it found no tokenizer it can use
    wrapper = WiolaForCausalLM.from_pretrained(source)
    tokenizer = read_tokenizer(source, n_ids=wrapper.model.config.vocab_size)
    _fresh_folder(target)
    return wrapper.model.save_pretrained(target, tokenizer=tokenizer)


def read_tokenizer(folder: Path, n_ids: int) -> Tokenizer:
    """The course's tokenizer from folder/tokenizer.json (`course_tokenizer`), or a ValueError naming the file when
    it cannot be read as one or would give other ids than the folder's own tokenizer (`tokenizer_difference`)."""
    path = folder / "tokenizer.json"
    try:
        fast = AutoTokenizer.from_pretrained(folder)
        tokenizer = course_tokenizer(fast, n_ids)
    except Exception as e:       # the tokenizers library raises a plain Exception ("Token `qq` out of vocabulary")
        raise ValueError(f"{path} is not a tokenizer minwiola.hf can convert ({first_line(e)})") from None
    difference = tokenizer_difference(fast, tokenizer)
    if difference:
        raise ValueError(f"{path}: {difference}; converted, it would give other ids than the folder's own "
                         "tokenizer, so nothing is written")
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    """`python -m minwiola.hf to-hf SRC DST` / `from-hf SRC DST`: convert a model folder. Errors are one line."""
    parser = argparse.ArgumentParser(prog="python -m minwiola.hf",
                                     description="Convert between the course's model folder and Hugging Face's.")
    parser.add_argument("direction", choices=["to-hf", "from-hf"])
    parser.add_argument("source")
    parser.add_argument("target")
    args = parser.parse_args(argv)
    try:
        out = (to_hf if args.direction == "to-hf" else from_hf)(args.source, args.target)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
