"""Solutions to lesson 01's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson01.py`."""
import math
import unicodedata

import regex

from minwiola.tokenizer import EOT, PATTERN, default_tokenizer
from minwiola.tokenizer import _merge_word as _merge   # section 2's merge, as the library writes it


def _pieces(text):
    """NFC, cut at the special token, pre-tokenise: each distinct piece (as a tuple of byte ids), kept once with
    how often it occurs."""
    counts = {}
    for chunk in unicodedata.normalize("NFC", text).split(EOT):
        for piece in regex.findall(PATTERN, chunk):
            key = tuple(piece.encode("utf-8"))
            counts[key] = counts.get(key, 0) + 1
    return counts


def _train(text, vocab_size, tie_key):
    words = _pieces(text)
    vocab = [bytes([b]) for b in range(256)]
    while len(vocab) < vocab_size - 1:                          # 256 bytes + merges + 1 special token
        pairs = {}
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] = pairs.get(pair, 0) + n
        if not pairs:                                           # the text ran out of pairs: stop, as train_bpe
            break
        best = max(pairs, key=lambda p: (pairs[p], tie_key(p, vocab)))
        vocab.append(vocab[best[0]] + vocab[best[1]])
        words = {_merge(w, best, len(vocab) - 1): n for w, n in words.items()}
    return vocab


def my_train_bpe(text, vocab_size):
    return _train(text, vocab_size, lambda p, vocab: (-p[0], -p[1]))     # ties: the smaller ids win


def my_encode(text, vocab):
    rank = {token: i for i, token in enumerate(vocab)}
    ids = []
    for piece in regex.findall(PATTERN, unicodedata.normalize("NFC", text)):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while True:
            found = [(rank[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in rank]
            if not found:
                break
            _, i = min(found)                                   # the lowest id, leftmost on ties
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [rank[p] for p in parts]
    return ids


def my_bytes_per_token(tokenizer, texts):
    texts = [unicodedata.normalize("NFC", t) for t in texts]   # count the bytes that are actually encoded
    return sum(len(t.encode("utf-8")) for t in texts) / sum(len(tokenizer.encode(t)) for t in texts)


def answer_1():
    tok = default_tokenizer()
    return (len(tok.encode(" Lily")), len(tok.encode(" Zorblax")))      # (1, 5): frequent word, made-up word


def _encode_left_to_right(text, vocab):
    """A real mistake: merge the leftmost pair that forms a token, not the one learned first."""
    rank = {token: i for i, token in enumerate(vocab)}
    ids = []
    for piece in regex.findall(PATTERN, unicodedata.normalize("NFC", text)):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        i = 0
        while i < len(parts) - 1:
            if parts[i] + parts[i + 1] in rank:
                parts[i:i + 2] = [parts[i] + parts[i + 1]]
                i = 0
            else:
                i += 1
        ids += [rank[p] for p in parts]
    return ids


def my_bits_per_byte(nats_per_token, bytes_per_token):
    return nats_per_token / math.log(2) / bytes_per_token          # nats -> bits, per token -> per byte


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {
    # CS336's tie rule (the lexicographically greater pair of byte strings), a real trap for who compares notes
    "my_train_bpe": lambda text, vocab_size: _train(text, vocab_size, lambda p, vocab: (vocab[p[0]], vocab[p[1]])),
    "my_encode": _encode_left_to_right,
    "my_bytes_per_token": lambda tok, texts: sum(len(t.encode()) for t in texts) / sum(len(tok.encode(t)) for t in texts),
    "answer_1": lambda: (1, 1),
    "my_bits_per_byte": lambda nats, nbytes: nats / nbytes,                    # forgot nats -> bits
}
