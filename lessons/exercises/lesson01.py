"""Self-checks for lesson 01's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which merge, which token, what came back, what was expected). A
function that still returns None is "not attempted yet". Solutions: `solutions/lesson01.py` (look after trying).

When an answer is wrong, the check also looks for the usual mistakes and names the one your answer matches: for
the trainer it shows the pair counts at the first merge that differs and reruns the library's trainer without NFC,
without pre-tokenisation and without cutting at <|endoftext|>; for the encoder it replays the piece where you
differ with other merge orders; for bytes per token it computes the usual miscounts."""
import collections
import math
import unicodedata
import warnings
from unittest import mock

import numpy as np
import regex

import minwiola.tokenizer as library
from exercises import attempted, close, correct
from minwiola.corpus import builtin_stories
from minwiola.tokenizer import EOT, PATTERN, Tokenizer, bytes_per_token, default_tokenizer, normalize, train_bpe

SMALL = EOT.join(builtin_stories("train", 12))        # a small text, the same on every machine
ODD = "Caf\u0065\u0301 au lait costs 12345 coins! Don\u2019t   stop, OK?\n\nThe END."
RUNS_OUT = "ab ab"     # two merges (b'ab', then b' ab'), then no pair is left: training must stop there


def _call(fn, name: str, inputs: str, advice: str = ""):
    """fn, but an error inside it becomes an AssertionError naming the inputs (and `advice`), not a raw traceback."""
    def run(*args):
        try:
            return fn(*args)
        except Exception as e:
            raise AssertionError(f"{name} raised {type(e).__name__} ({e}) on {inputs}"
                                 + (f". {advice}" if advice else "")) from None
    return run


def _quiet_train(text: str, vocab_size: int, **options) -> list[bytes]:
    """The library's train_bpe, without its warning when the text runs out of pairs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train_bpe(text, vocab_size, **options)


# ---------------------------------------------------------------------------------------------------- exercise 1

def check_1(answer_1) -> None:
    """answer_1() -> (tokens for ' Lily', tokens for ' Zorblax') with the shipped tokenizer."""
    if not attempted(answer_1(), 1):
        return
    got = answer_1()
    tok = default_tokenizer()
    want = (len(tok.encode(" Lily")), len(tok.encode(" Zorblax")))
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"answer with a pair of numbers (lily, zorblax), got {got!r}"
    assert tuple(got) == want, f"got {tuple(got)}; count with tok.encode(' Lily') and tok.encode(' Zorblax')"
    correct("Exercise 1: correct. ' Lily' is frequent in the stories, so it became one token; the made-up word "
          "must be spelled from smaller pieces.", answer_1)


# ---------------------------------------------------------------------------------------------------- exercise 2

def _pieces_after(text: str, k: int) -> list[tuple[bytes, tuple[int, ...], int]]:
    """(piece, its ids after the library's first k merges, how often it occurs) for every distinct piece."""
    left: dict = {}
    _quiet_train(text, 256 + k + 1, pieces=left)
    counts = collections.Counter(piece.encode("utf-8") for chunk in normalize(text).split(EOT)
                                 for piece in regex.findall(PATTERN, chunk))
    return [(piece, tuple(left[piece]), n) for piece, n in counts.items()]


def _pair_counts(words, weighted: bool = True) -> collections.Counter:
    counts = collections.Counter()
    for _, ids, n in words:
        for pair in zip(ids, ids[1:]):
            counts[pair] += n if weighted else 1
    return counts


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _best(counts):
    """The pair training takes: the most frequent, ties to the smaller ids."""
    return max(counts, key=lambda p: (counts[p], -p[0], -p[1])) if counts else None


def _right_to_left(words, vocab: list[bytes], k: int):
    """The same pieces after the first k merges applied scanning right to left (a classic slip), or None."""
    pairs = [tuple(Tokenizer(vocab[:256 + j], specials=())._encode_piece(vocab[256 + j])) for j in range(k)]
    if any(len(p) != 2 for p in pairs):
        return None
    out = []
    for piece, _, n in words:
        ids = tuple(piece)
        for j, (a, b) in enumerate(pairs):
            ids = library._merge_word(ids[::-1], (b, a), 256 + j)[::-1]
        out.append((piece, ids, n))
    return out


def _why_merge(text: str, got: list[bytes], want: list[bytes], k: int, first_case: bool) -> str:
    """Why merge k differs: the pair counts there, and the known mistake (if any) that learns what you learned."""
    words = _pieces_after(text, k)
    vocab = want[:256 + k]
    spell = lambda p: vocab[p[0]] + vocab[p[1]]                                          # noqa: E731
    counts, mine = _pair_counts(words), got[256 + k]
    top = sorted(counts, key=lambda p: (-counts[p], p))[:5]
    mine_pairs = [p for p in counts if spell(p) == mine]
    shown = ", ".join(f"{vocab[a]!r}+{vocab[b]!r} {counts[a, b]}" for a, b in top)
    state = {0: "before any merge", 1: "after its first merge"}.get(k, f"after its first {k} merges")
    report = [f"Pair counts here (the library's pieces {state}, each weighted by how often the piece occurs): "
              f"{shown}"]
    if mine_pairs:
        p = max(mine_pairs, key=lambda q: counts[q])
        report.append(f"your {mine!r} is {vocab[p[0]]!r}+{vocab[p[1]]!r} {p}, counted {_times(counts[p])}")
    else:
        report.append(f"your {mine!r} is not an adjacent pair inside any piece at this point")
    hints = []
    variants = {
        "Your merges are the library's run WITHOUT NFC: normalise the text to NFC first "
        "(unicodedata.normalize('NFC', text)), so 'e' + combining accent becomes the single character 'é'":
            lambda: _no_nfc_train(text, 256 + k + 2),
        "Your merges are what counting pairs across piece boundaries learns: pre-tokenise each part with "
        "regex.findall(PATTERN, part) and count pairs only inside a piece":
            lambda: _quiet_train(text, 256 + k + 2, pattern=r"[\s\S]+"),
        f"Your merges are what training without cutting at {EOT} learns: split the text at {EOT} first, so no "
        f"pair spans two stories and the marker's characters are never counted":
            lambda: _quiet_train(text, 256 + k + 1, specials=()),
    }
    for hint, run in variants.items():
        if run()[256:257 + k] == got[256:257 + k]:
            hints.append(hint)
    unweighted = _pair_counts(words, weighted=False)
    if unweighted and spell(_best(unweighted)) == mine:
        hints.append(f"You seem to count each distinct piece once: weight its pairs by how often the piece occurs "
                     f"(unweighted, {mine!r} would win)")
    rtl = _right_to_left(words, vocab, k) if first_case and k > 0 else None
    if rtl is not None and _best(_pair_counts(rtl)) and spell(_best(_pair_counts(rtl))) == mine:
        piece, ltr, r = next((w, i, r) for (w, i, _), (_, r, _) in zip(words, rtl) if i != r)
        hints.append(f"You seem to merge right to left: where a pair overlaps itself (b'aaa' holds 'aa' twice) scan "
                     f"left to right and merge the first, as section 2's merge() does: the library has {piece!r} as "
                     f"{[vocab[i] for i in ltr]}, right to left gives {[vocab[i] for i in r]}")
    if mine_pairs and counts[max(mine_pairs, key=lambda q: counts[q])] == counts[_best(counts)]:
        a = _best(counts)
        hints.append(f"It is a tie ({counts[a]} each): ties go to the pair with the smaller ids, first id then "
                     f"second, so the library takes {a} = {vocab[a[0]]!r}+{vocab[a[1]]!r}")
    elif not hints:
        hints.append("Recount the pairs: inside pieces only, each distinct piece weighted by how often it occurs, "
                     "with the merges so far applied left to right")
    return "; ".join(report) + ". " + " Or: ".join(hints)


def _no_nfc_train(text: str, vocab_size: int) -> list[bytes]:
    """The library's trainer with its NFC step switched off (what forgetting NFC learns)."""
    with mock.patch.object(library, "normalize", library._check_text):
        return _quiet_train(text, vocab_size)


def check_2(my_train_bpe) -> None:
    """my_train_bpe(text, vocab_size) -> list of bytes (index = id, the special token not included)."""
    advice = ("Start from the 256 single bytes, merge while fewer than vocab_size - 1 tokens, and stop early when no "
              "pair is left")
    if not attempted(_call(my_train_bpe, "my_train_bpe", "('aaabdaaabac', 260)", advice)("aaabdaaabac", 260), 2):
        return
    cases = (("see seee", 256 + 2 + 1), ("aaabdaaabac", 256 + 3 + 1), (SMALL, 256 + 60 + 1),
             (ODD + EOT + ODD, 256 + 25 + 1), (RUNS_OUT, 256 + 10 + 1))
    for case, (text, vocab_size) in enumerate(cases):
        name = f"{text[:30]!r}{'...' if len(text) > 30 else ''}, vocab_size {vocab_size}"
        got, want = _call(my_train_bpe, "my_train_bpe", name, advice)(text, vocab_size), _quiet_train(text, vocab_size)
        if not (isinstance(got, list) and all(isinstance(t, bytes) for t in got)):
            kinds = sorted({type(t).__name__ for t in got}) if isinstance(got, (list, tuple)) else []
            raise AssertionError(f"my_train_bpe({name}): expected a list of bytes (the vocabulary, index = id), got "
                                 f"a {type(got).__name__}" + (f" of {'/'.join(kinds)}" if kinds else "")
                                 + (": keep tokens as bytes, a token may hold part of a character" if "str" in kinds
                                    else ""))
        if got[:256] != want[:256]:
            raise AssertionError(f"my_train_bpe({name}): the first 256 tokens must be the single bytes 0..255 in "
                                 f"order (you returned {len(got)} tokens starting {got[:3]!r}); then the merges")
        for k, (g, w) in enumerate(zip(got[256:], want[256:])):
            if g != w:
                where = "The first merge already differs" if k == 0 else f"Merges 0..{k - 1} agree"
                raise AssertionError(f"my_train_bpe({name}): merge {k} (id {256 + k}) differs: you learned {g!r}, "
                                     f"the library learned {w!r}. {where}. "
                                     + _why_merge(text, got, want, k, case == 0))
        if len(got) != len(want):
            n, m = len(got) - 256, len(want) - 256
            if len(want) < vocab_size - 1:
                why = (f"the text runs out of pairs after {m} merges: stop there, as the library does (it warns "
                       f"and returns the shorter vocabulary)")
            elif len(got) == len(want) + 1 and got[-1] == EOT.encode():
                why = "do not include the special token: vocab_size counts it, but it is not a merge"
            else:
                why = (f"vocab_size counts 256 bytes, the merges and 1 special token: {vocab_size} - 256 - 1 = {m} "
                       f"merges")
            raise AssertionError(f"my_train_bpe({name}): {n} merge{'s' * (n != 1)}, expected {m} (those you "
                                 f"have agree): {why}")
    first = [t.decode() for t in train_bpe(SMALL, 256 + 6 + 1)[256:]]
    correct(f"Exercise 2: correct (merge for merge with minwiola's train_bpe, stopping when pairs run out; the "
          f"stories' first merges: {first})", my_train_bpe)


# ---------------------------------------------------------------------------------------------------- exercise 3

def _replay(piece: bytes, ranks: dict, pick) -> list[bytes]:
    """A piece merged with another choice of pair (`pick` takes [(id, position)]): the usual wrong orders."""
    if piece in ranks:
        return [piece]
    parts = [bytes([b]) for b in piece]
    while True:
        found = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
        if not found:
            return parts
        _, i = pick(found)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def _longest_first(piece: bytes, ranks: dict) -> list[bytes]:
    parts, i = [], 0
    while i < len(piece):
        j = max(j for j in range(i + 1, len(piece) + 1) if piece[i:j] in ranks)
        parts.append(piece[i:j])
        i = j
    return parts


WRONG_ORDERS = {
    "on a tie (the same id at two positions) you merge the rightmost first; the rule is lowest id, leftmost first":
        lambda piece, ranks: _replay(piece, ranks, lambda f: min(f, key=lambda c: (c[0], -c[1]))),
    "you merge the leftmost pair that forms a token; merge the pair whose token has the LOWEST id (it was "
    "learned first), wherever it is in the piece":
        lambda piece, ranks: _replay(piece, ranks, lambda f: min(f, key=lambda c: c[1])),
    "you merge the highest id first; the lowest id (the earliest merge) goes first":
        lambda piece, ranks: _replay(piece, ranks, lambda f: max(f, key=lambda c: (c[0], -c[1]))),
    "you take the longest token that matches from the left (greedy longest match); BPE replays the merges, "
    "lowest id first, which can end with different tokens":
        _longest_first,
}


def _why_token(text: str, got: list[int], want: list[int], n: int, vocab: list[bytes]) -> str:
    """Why token n differs: the piece it is in, the library's tokens there and yours, and the order you used."""
    offset = sum(len(vocab[i]) for i in want[:n])
    start = 0
    for piece in regex.findall(PATTERN, normalize(text)):
        raw = piece.encode("utf-8")
        if start <= offset < start + len(raw):
            break
        start += len(raw)
    k, pos = 0, 0
    while pos < start:                                       # the piece's first token (tokens before n agree)
        pos += len(vocab[want[k]])
        k += 1
    mine, at = [], start
    for i in got[k:]:
        if at >= start + len(raw):
            break
        mine.append(vocab[i])
        at += len(vocab[i])
    if at > start + len(raw):
        return (f"Your token {mine[-1]!r} runs past the end of the piece {raw!r} into the next one: pre-tokenise "
                f"first (regex.findall(PATTERN, text)) and merge only inside a piece")
    ranks = {t: i for i, t in enumerate(vocab)}
    theirs = [vocab[i] for i in Tokenizer(vocab).encode(piece)]
    said = f"In the piece {raw!r} the library gives {theirs}, you gave {mine}"
    matches = [why for why, order in WRONG_ORDERS.items() if order(raw, ranks) == mine]
    if matches:
        return f"{said}: " + "; or ".join(matches)
    return (f"{said}. Rule: inside a piece, merge the adjacent pair whose bytes form the token of LOWEST id, the "
            f"leftmost of equal ids first, until no pair forms a token")


def check_3(my_encode) -> None:
    """my_encode(text, vocab) -> ids, by the rule of section 6."""
    vocab = _quiet_train(SMALL, 256 + 120 + 1)
    if not attempted(_call(my_encode, "my_encode", "('a cat', vocab)")("a cat", vocab), 3):
        return
    tok = Tokenizer(vocab)
    for text in ("Once upon a time, a little cat sat.", "aaabdaaabac", ODD, "lll", "oo ooo", "'very good,' said Mia.",
                 SMALL[:400], "🙂 世界  x", ""):
        name = f"my_encode({text[:40]!r})"
        got, want = _call(my_encode, "my_encode", f"{text[:40]!r}")(text, vocab), tok.encode(text)
        assert isinstance(got, list), f"{name}: expected a list of ids, got {type(got).__name__}"
        got = [int(i) for i in got]
        bad = [i for i in got if not 0 <= i < len(vocab)]
        if bad:
            if bad[0] == len(vocab) and EOT in text:
                raise AssertionError(f"{name}: id {bad[0]} is the special token's: by default encode treats "
                                     f"{EOT} inside the text as plain text (its {len(EOT)} characters), as "
                                     f"Tokenizer.encode does unless allowed_special=True, so a user cannot end a "
                                     f"document by typing it")
            raise AssertionError(f"{name}: id {bad[0]} is not in the vocabulary (ids 0..{len(vocab) - 1})")
        spelled, nfc = b"".join(vocab[i] for i in got), normalize(text).encode("utf-8")
        if spelled != nfc:
            if spelled == text.encode("utf-8"):
                raise AssertionError(f"{name}: your ids spell the text as given, not its NFC form: normalise to NFC "
                                     f"first (unicodedata.normalize('NFC', text)), as the tokenizer does")
            raise AssertionError(f"{name}: your ids spell {spelled[:60]!r}, not the text's bytes {nfc[:60]!r}")
        for n, (g, w) in enumerate(zip(got, want)):
            if g != w:
                raise AssertionError(f"{name}: token {n} is {g} ({vocab[g]!r}), expected {w} ({vocab[w]!r}); "
                                     + ("the first token already differs" if n == 0 else f"tokens 0..{n - 1} agree")
                                     + ". " + _why_token(text, got, want, n, vocab))
        assert len(got) == len(want), f"{name}: {len(got)} tokens, expected {len(want)}"
    correct("Exercise 3: correct (id for id with Tokenizer.encode)", my_encode)


# ---------------------------------------------------------------------------------------------------- exercise 4

def check_4(my_bytes_per_token) -> None:
    """my_bytes_per_token(tokenizer, texts): total UTF-8 bytes (of the NFC text) over total tokens."""
    tok = default_tokenizer()
    if not attempted(_call(my_bytes_per_token, "my_bytes_per_token", "(tok, ['a'])")(tok, ["a"]), 4):
        return
    for texts in (["Once upon a time"], builtin_stories("valid", 20) + ["🙂"], [ODD, "cafe\u0301 " * 20]):
        name = f"bytes per token of {texts[0][:30]!r}" + (f"... ({len(texts)} texts)" if len(texts) > 1 else "")
        got = _call(my_bytes_per_token, "my_bytes_per_token", name)(tok, texts)
        tokens = [len(tok.encode(t)) for t in texts]
        nfc = [len(normalize(t).encode("utf-8")) for t in texts]
        miscounts = {
            "you counted the bytes of the text as given; count the bytes of its NFC form, which is what the "
            "tokenizer encodes (a decomposed 'é' is 3 bytes before NFC, 2 after)":
                sum(len(t.encode("utf-8")) for t in texts) / sum(tokens),
            "you counted characters; count UTF-8 bytes (len(text.encode('utf-8')))":
                sum(len(normalize(t)) for t in texts) / sum(tokens),
            "you took the mean of each text's ratio, which weighs a short text as much as a long one; divide the "
            "total bytes by the total tokens":
                float(np.mean([b / max(t, 1) for b, t in zip(nfc, tokens)])),
            "you computed tokens per byte; it is bytes over tokens": sum(tokens) / sum(nfc),
        }
        want = bytes_per_token(tok, texts)
        hint = next((why for why, value in miscounts.items() if isinstance(got, (int, float)) and value != want
                     and abs(got - value) <= 1e-9 * max(1.0, abs(value))), "total UTF-8 bytes of the NFC texts over "
                                                                            "the total number of tokens")
        close(got, want, f"{name}; {hint}", 1e-9)
    correct("Exercise 4: correct", my_bytes_per_token)


# ---------------------------------------------------------------------------------------------------- exercise 5

def _bpb_hint(got, nats: float, nbytes: float) -> str:
    """The usual slip that gives `got` for (nats per token, bytes per token), if any."""
    slips = {"the nats were not turned into bits: divide by ln 2": nats / nbytes,
             "multiplied by the bytes per token; bits per byte divides by them": nats / math.log(2) * nbytes,
             "multiplied by ln 2; nats to bits divides by ln 2 (1 bit = ln 2 nats)": nats * math.log(2) / nbytes,
             "that is bits per token: divide by the bytes per token": nats / math.log(2)}
    return next((f"; {why}" for why, value in slips.items() if abs(float(got) - value) < 1e-9 * max(1, value)), "")


def check_5(my_bits_per_byte) -> None:
    """my_bits_per_byte(nats_per_token, bytes_per_token), section 7's formula."""
    if not attempted(_call(my_bits_per_byte, "my_bits_per_byte", "(1.0, 1.0)")(1.0, 1.0), 5):
        return
    for nats, nbytes, what in ((math.log(2), 1.0, "ln 2 nats per token, 1 byte per token (one bit per byte)"),
                               (math.log(2), 4.0, "ln 2 nats per token, 4 bytes per token"),
                               (3.0, 4.2, "3 nats per token, 4.2 bytes per token")):
        got = _call(my_bits_per_byte, "my_bits_per_byte", f"({nats:.4g}, {nbytes})")(nats, nbytes)
        want = nats / (math.log(2) * nbytes)
        try:
            hint = _bpb_hint(got, nats, nbytes)
        except (TypeError, ValueError):
            hint = ""
        close(got, want, what + hint)
    correct("Exercise 5: correct", my_bits_per_byte)


EXERCISES = {1: "answer_1", 2: "my_train_bpe", 3: "my_encode", 4: "my_bytes_per_token", 5: "my_bits_per_byte"}
