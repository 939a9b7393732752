"""Byte-level BPE, trained from scratch (lesson 01; Wiola paper section XIV).

The pipeline that turns a string into token ids has four steps:

1. **Normalise** the text to Unicode NFC, so that "é" typed as one code point and "é" typed as "e" plus a
   combining accent become the same bytes (the Wiola paper asks for NFC).
2. **Pre-tokenise** with the regular expression `PATTERN`: cut the text into pieces (a word with its leading
   space, a run of digits, a run of punctuation, a run of white space). Merges never cross a piece boundary,
   so " dog" and " dog." share the token " dog".
3. **Merge**: each piece starts as its UTF-8 bytes (ids 0..255, so no input is ever unknown) and adjacent
   tokens are merged following the learned ranks.
4. **Special tokens** such as `<|endoftext|>` are cut out before all of this and get ids of their own; they
   are never merged with text.

Ids are ranks: bytes are 0..255, the i-th learned merge is 256 + i, special tokens come last. A token's
bytes are unique, which is what lets `tiktoken` run the very same tokenizer (the fast path) from our ranks.

Encoding rule (shared by the reference encoder here and by tiktoken): a piece that is itself a token is that
token; otherwise, repeatedly merge the adjacent pair whose concatenated bytes form the token of lowest rank
(leftmost first on ties) until no adjacent pair forms a token.
"""
from __future__ import annotations

import functools
import hashlib
import json
import unicodedata
import warnings
from pathlib import Path

import regex
import tiktoken

# Pieces, in order of preference: an English contraction ('s 't 're 've 'm 'll 'd, straight or curly
# apostrophe); letters with an optional leading space; one to three digits with an optional leading space
# (so long numbers split into short groups); punctuation and symbols with an optional leading space; white
# space that is not followed by a non-space (so the last space before a word stays with that word); any
# other white space.
PATTERN = (
    r"""['\u2019](?:s|t|re|ve|m|ll|d)"""
    r"""| ?\p{L}+"""
    r"""| ?\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+"""
    r"""|\s+(?!\S)"""
    r"""|\s+"""
)
EOT = "<|endoftext|>"
DEFAULT_SPECIALS = (EOT,)
FORMAT = "minwiola-bpe 1"
SHIPPED = Path(__file__).parent / "assets" / "tokenizer-4096.bpe"


class TokenizerFileError(ValueError):
    """A tokenizer file that cannot be read: wrong format, truncated, or edited after it was written."""


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return text


def normalize(text: str) -> str:
    """Unicode NFC normalisation (step 1). Raises ValueError on text that is not valid Unicode."""
    text = unicodedata.normalize("NFC", _check_text(text))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text is not valid Unicode (lone surrogate at index {e.start})") from None
    return text


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------

def _pairs(word: tuple[int, ...]):
    return zip(word, word[1:])


def _merge_word(word: tuple[int, ...], pair: tuple[int, int], new_id: int) -> tuple[int, ...]:
    """Replace every occurrence of `pair` in `word` by `new_id`, scanning left to right."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def train_bpe(text: str, vocab_size: int, specials=DEFAULT_SPECIALS, pattern: str = PATTERN,
              verbose: bool = False, stacklevel: int = 2, pieces: dict | None = None) -> list[bytes]:
    """Learn BPE merges on `text`; return the vocabulary as a list of byte strings (index = id). A warning (the
    text ran out of pairs) names the line `stacklevel` frames up: the caller's.

    The reference trainer. Every distinct piece is stored once with its count, and the count of every
    adjacent pair is kept up to date incrementally: a merge only touches the words that contain the merged
    pair. The most frequent pair wins; ties go to the pair with the smaller ids, so training is deterministic.
    Special tokens are cut out of the text first, so they never take part in a merge.

    `pieces`, if a dict is given, receives every distinct piece's bytes -> the ids training left it as, so a
    caller can check that the encoder replays training on every piece (lesson 01 does).
    """
    text = normalize(text)
    n_merges = vocab_size - 256 - len(specials)
    if n_merges < 0:
        raise ValueError(f"vocab_size must be at least 256 + {len(specials)} special tokens = "
                         f"{256 + len(specials)}, got {vocab_size}")
    counts: dict[tuple[int, ...], int] = {}
    for chunk in _split_specials(text, specials):
        for piece in regex.findall(pattern, chunk):
            key = tuple(piece.encode("utf-8"))
            counts[key] = counts.get(key, 0) + 1
    words = list(counts)
    freq = [counts[w] for w in words]

    pair_count: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}      # pair -> indices of words that may contain it
    for i, w in enumerate(words):
        for p in _pairs(w):
            pair_count[p] = pair_count.get(p, 0) + freq[i]
            where.setdefault(p, set()).add(i)

    vocab = [bytes([b]) for b in range(256)]
    ids = {b: i for i, b in enumerate(vocab)}        # bytes -> id, to keep token bytes unique
    while len(vocab) < 256 + n_merges and pair_count:
        pair = max(pair_count, key=lambda p: (pair_count[p], -p[0], -p[1]))
        spelled = vocab[pair[0]] + vocab[pair[1]]
        if spelled in ids:  # a safeguard (never seen to fire): these bytes are a token already; reuse its id
            new_id = ids[spelled]
        else:
            new_id = len(vocab)
            vocab.append(spelled)
            ids[spelled] = new_id
        for i in where.pop(pair):
            old = words[i]
            new = _merge_word(old, pair, new_id)
            if new == old:
                continue
            for p in _pairs(old):
                pair_count[p] -= freq[i]
                if pair_count[p] == 0:
                    del pair_count[p]
            for p in _pairs(new):
                pair_count[p] = pair_count.get(p, 0) + freq[i]
                where.setdefault(p, set()).add(i)
            words[i] = new
        pair_count.pop(pair, None)
        if verbose and (len(vocab) - 256) % 500 == 0:
            print(f"merge {len(vocab) - 256}: {spelled!r}")
    if pieces is not None:
        pieces.update((bytes(w), list(words[i])) for i, w in enumerate(counts))
    if len(vocab) < 256 + n_merges:
        warnings.warn(f"the text ran out of pairs after {len(vocab) - 256} merges: vocab_size is "
                      f"{len(vocab) + len(specials)}, not {vocab_size}", stacklevel=stacklevel)
    return vocab


def _specials_pattern(specials) -> str:
    """A regex matching any special-token string, the longest first: the regex takes the first alternative that
    matches, so with `<|endoftext|>` listed before `<|endoftext|><|endoftext|>` the long one would be cut in two."""
    return "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))


def _split_specials(text: str, specials) -> list[str]:
    """Cut `text` at every special-token string (the strings themselves are dropped)."""
    if not specials:
        return [text]
    return regex.split(_specials_pattern(specials), text)


# ----------------------------------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------------------------------

class Tokenizer:
    """A byte-level BPE tokenizer: `vocab[i]` holds the bytes of token i; special tokens come last.

    `encode(text)` and `decode(ids)` use the fast path (a `tiktoken.Encoding` built from our own ranks);
    `encode_reference` is the readable Python encoder and gives identical ids. Where one special token starts
    another (`<|endoftext|>` and `<|endoftext|><|endoftext|>`), both take the longest one that matches.
    """

    def __init__(self, vocab: list[bytes], specials=DEFAULT_SPECIALS, pattern: str = PATTERN):
        if len(vocab) < 256 or any(vocab[b] != bytes([b]) for b in range(256)):
            raise ValueError("vocab must start with the 256 single bytes in order")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab must not hold the same bytes twice")
        specials = list(specials)
        if len(set(specials)) != len(specials) or not all(isinstance(s, str) and s for s in specials):
            raise ValueError(f"specials must be distinct non-empty strings, got {specials}")
        self.vocab = list(vocab)
        self.specials = {s: len(vocab) + i for i, s in enumerate(specials)}
        self._special_bytes = {i: s.encode("utf-8") for s, i in self.specials.items()}
        self.pattern = pattern
        self.ranks = {b: i for i, b in enumerate(self.vocab)}
        self._compiled = regex.compile(pattern)
        self._fast = None

    # --- construction -------------------------------------------------------------------------------
    @classmethod
    def train(cls, text: str, vocab_size: int, specials=DEFAULT_SPECIALS, verbose: bool = False) -> "Tokenizer":
        """Train on `text` (a str) up to `vocab_size` ids, special tokens included."""
        _check_text(text)
        return cls(train_bpe(text, vocab_size, specials, verbose=verbose, stacklevel=3), specials)  # warn at our caller

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + len(self.specials)

    @property
    def eot_id(self) -> int:
        """Id of `<|endoftext|>`, the separator between stories."""
        return self.specials[EOT]

    def truncated(self, vocab_size: int) -> "Tokenizer":
        """The tokenizer training would have produced with a smaller `vocab_size` (the first merges only)."""
        n = vocab_size - len(self.specials)
        if not 256 <= n <= len(self.vocab):
            raise ValueError(f"vocab_size must be in [{256 + len(self.specials)}, {self.vocab_size}], got {vocab_size}")
        return Tokenizer(self.vocab[:n], list(self.specials), self.pattern)

    # --- the reference encoder ----------------------------------------------------------------------
    def pretokenize(self, text: str) -> list[str]:
        """Step 2: the pieces the merges work inside."""
        return self._compiled.findall(text)

    def _encode_piece(self, piece: bytes) -> list[int]:
        if piece in self.ranks:
            return [self.ranks[piece]]
        parts = [bytes([b]) for b in piece]
        while True:
            # (rank, position) of every adjacent pair whose bytes together form a token
            candidates = [(self.ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:]))
                          if a + b in self.ranks]
            if not candidates:
                break
            _, i = min(candidates)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ranks[p] for p in parts]

    def encode_reference(self, text: str, allowed_special: bool = False) -> list[int]:
        """The readable encoder: normalise, cut out specials (if allowed), pre-tokenise, merge."""
        text = normalize(text)
        ids: list[int] = []
        chunks = [text]
        if allowed_special and self.specials:
            chunks = regex.split("(" + _specials_pattern(self.specials) + ")", text)   # keep the specials
        for chunk in chunks:
            if allowed_special and chunk in self.specials:
                ids.append(self.specials[chunk])
                continue
            for piece in self.pretokenize(chunk):
                ids.extend(self._encode_piece(piece.encode("utf-8")))
        return ids

    # --- the fast path ------------------------------------------------------------------------------
    @property
    def fast(self) -> tiktoken.Encoding:
        """The same tokenizer as a `tiktoken.Encoding`, built from our ranks (nothing is downloaded)."""
        if self._fast is None:
            self._fast = tiktoken.Encoding(
                name=f"minwiola-{self.hash()[:12]}", pat_str=self.pattern,
                mergeable_ranks=dict(self.ranks), special_tokens=dict(self.specials))
        return self._fast

    def encode(self, text: str, allowed_special: bool = False) -> list[int]:
        """Text to ids. By default a special-token string inside `text` is encoded as ordinary text, so
        user text can never inject an `<|endoftext|>`; pass `allowed_special=True` to map it to its id."""
        text = normalize(text)
        if not (allowed_special and self.specials):
            return self.fast.encode_ordinary(text)
        # We cut out the specials ourselves, longest first, as `encode_reference` does: tiktoken tries them in the
        # order of its internal hash map, so which of two overlapping specials it takes depends on their spelling.
        ids: list[int] = []
        for chunk in regex.split("(" + _specials_pattern(self.specials) + ")", text):
            ids.extend([self.specials[chunk]] if chunk in self.specials else self.fast.encode_ordinary(chunk))
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` over many texts, in parallel threads."""
        return self.fast.encode_ordinary_batch([normalize(t) for t in texts])

    def decode_bytes(self, ids) -> bytes:
        """Ids to the exact bytes they stand for."""
        ids = [int(i) if hasattr(i, "__index__") else i for i in ids]  # also numpy and torch integers
        bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < self.vocab_size)]
        if bad:
            raise ValueError(f"token ids must be ints in [0, {self.vocab_size}), got {bad[:5]}")
        n = len(self.vocab)
        return b"".join(self.vocab[i] if i < n else self._special_bytes[i] for i in ids)

    def decode(self, ids) -> str:
        """Ids to text. A cut through a multi-byte character shows as U+FFFD instead of failing."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # --- saving and loading -------------------------------------------------------------------------
    def dumps(self) -> str:
        """The tokenizer as text: a header, the pattern, the special tokens, one merged token per line
        (its bytes in hex), and a sha256 over everything above it, so any edit or truncation is caught."""
        lines = [FORMAT, "pattern " + json.dumps(self.pattern), f"specials {len(self.specials)}"]
        lines += [json.dumps(s) for s in self.specials]
        lines.append(f"merges {len(self.vocab) - 256}")
        lines += [tok.hex() for tok in self.vocab[256:]]
        body = "\n".join(lines) + "\n"
        return body + "sha256 " + hashlib.sha256(body.encode()).hexdigest() + "\n"

    def __reduce__(self):
        """Pickled as its saved form (the fast encoder inside cannot be pickled): how a tokenizer reaches the
        worker processes that tokenise a split."""
        return Tokenizer.loads, (self.dumps(),)

    def hash(self) -> str:
        """sha256 of the saved form: names this exact tokenizer (used to key token caches)."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()

    def save(self, path) -> None:
        Path(path).write_text(self.dumps(), encoding="utf-8")

    @classmethod
    def loads(cls, text: str, source: str = "<string>") -> "Tokenizer":
        def bad(why: str):
            return TokenizerFileError(f"{source}: not a valid minwiola tokenizer file: {why}")
        body, sep, tail = text.rpartition("sha256 ")
        if not sep or not body.endswith("\n"):
            raise bad("the final 'sha256' line is missing (file truncated?)")
        if hashlib.sha256(body.encode()).hexdigest() != tail.strip():
            raise bad("checksum mismatch (file edited or corrupted)")
        lines = body.splitlines()
        try:
            if lines[0] != FORMAT:
                raise bad(f"first line must be {FORMAT!r}, got {lines[0]!r}")
            pattern = json.loads(lines[1].removeprefix("pattern "))
            n_special = int(lines[2].removeprefix("specials "))
            specials = [json.loads(s) for s in lines[3:3 + n_special]]
            n_merges = int(lines[3 + n_special].removeprefix("merges "))
            merges = [bytes.fromhex(h) for h in lines[4 + n_special:]]
        except (IndexError, ValueError) as e:
            if isinstance(e, TokenizerFileError):
                raise
            raise bad(f"unreadable header or token line ({e})") from None
        if len(merges) != n_merges:
            raise bad(f"header says {n_merges} merges, file holds {len(merges)}")
        try:
            return cls([bytes([b]) for b in range(256)] + merges, specials, pattern)
        except ValueError as e:
            raise bad(str(e)) from None

    @classmethod
    def load(cls, path) -> "Tokenizer":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise TokenizerFileError(f"{path.name}: not a valid minwiola tokenizer file: not UTF-8 text") from None
        return cls.loads(text, source=path.name)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.vocab) - 256}, specials={list(self.specials)})"


@functools.lru_cache(maxsize=1)
def default_tokenizer() -> Tokenizer:
    """The project's own tokenizer (one shared instance): 4,096 ids, trained on the TinyStories sample's
    training split (`MINWIOLA_DATA=... python -m minwiola.data tokenizer --out minwiola/assets/tokenizer-4096.bpe`
    rebuilds it)."""
    return Tokenizer.load(SHIPPED)


# ----------------------------------------------------------------------------------------------------
# Measuring a tokenizer: how much it compresses a text, and where it cuts it
# ----------------------------------------------------------------------------------------------------

def bytes_per_token(tokenizer: Tokenizer, texts: list[str]) -> float:
    """Compression: UTF-8 bytes of `texts` divided by the number of tokens they encode to."""
    n_bytes = sum(len(normalize(t).encode("utf-8")) for t in texts)
    n_tokens = sum(len(ids) for ids in tokenizer.encode_batch(texts))
    return n_bytes / max(n_tokens, 1)


def show_tokens(tokenizer: Tokenizer, text: str) -> str:
    """`text` with a `|` between tokens, e.g. 'Once| upon| a| time'."""
    return "|".join(tokenizer.decode([i]) for i in tokenizer.encode(text))
