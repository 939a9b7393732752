"""Self-checks for lesson 01's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which merge, which token, what came back, what was expected). A
function that still returns None is "not attempted yet". Solutions: `solutions/lesson01.py` (look after trying)."""
from exercises import attempted, close
from minwiola.corpus import builtin_stories
from minwiola.tokenizer import EOT, Tokenizer, bytes_per_token, default_tokenizer, train_bpe

SMALL = EOT.join(builtin_stories("train", 12))        # a small text, the same on every machine
ODD = "Caf\u0065\u0301 au lait costs 12345 coins! Don\u2019t   stop, OK?\n\nThe END."


def _show(token: bytes) -> str:
    return repr(token.decode("utf-8", "replace")) if token else "nothing"


def check_1(my_train_bpe) -> None:
    """my_train_bpe(text, vocab_size) -> list of bytes (index = id, the special token not included)."""
    if not attempted(my_train_bpe("aaabdaaabac", 256 + 3 + 1), 1):
        return
    for text, vocab_size in (("aaabdaaabac", 256 + 3 + 1), (SMALL, 256 + 60 + 1), (ODD + EOT + ODD, 256 + 25 + 1)):
        got, want = my_train_bpe(text, vocab_size), train_bpe(text, vocab_size)
        assert isinstance(got, list) and all(isinstance(t, bytes) for t in got), (
            f"expected a list of bytes (the vocabulary, index = id), got {type(got).__name__}")
        assert got[:256] == want[:256], "the first 256 tokens must be the single bytes 0..255, in order"
        for k, (g, w) in enumerate(zip(got[256:], want[256:])):
            assert g == w, (f"on {text[:30]!r}... merge {k} (id {256 + k}) differs: you learned {_show(g)}, the "
                            f"library learned {_show(w)}. Merges 0..{k - 1} agree. If both pairs occur equally often "
                            f"it is the tie rule: the pair with the smaller ids wins (first id, then second); did "
                            f"you count pairs inside pieces only (pre-tokenise, cut at {EOT}), with each piece's count?")
        assert len(got) == len(want), (f"on {text[:30]!r}...: {len(got) - 256} merges, expected {len(want) - 256} "
                                       f"(vocab_size {vocab_size} counts 256 bytes and 1 special token)")
    first = [t.decode() for t in train_bpe(SMALL, 256 + 6 + 1)[256:]]
    print(f"Exercise 1: correct (merge for merge with minwiola's train_bpe; the stories' first merges: {first})")


def check_2(my_encode) -> None:
    """my_encode(text, vocab) -> ids, by the rule of section 6."""
    vocab = train_bpe(SMALL, 256 + 120 + 1)
    if not attempted(my_encode("a cat", vocab), 2):
        return
    tok = Tokenizer(vocab)
    for text in ("Once upon a time, a little cat sat.", "aaabdaaabac", ODD, SMALL[:400], "🙂 世界  x", ""):
        got, want = my_encode(text, vocab), tok.encode(text)
        assert isinstance(got, list), f"my_encode({text[:30]!r}): expected a list of ids, got {type(got).__name__}"
        got = [int(i) for i in got]
        for n, (g, w) in enumerate(zip(got, want)):
            assert g == w, (f"my_encode({text[:40]!r}): token {n} is {g} ({_show(vocab[g] if 0 <= g < len(vocab) else b'')})"
                            f", expected {w} ({_show(vocab[w])}); tokens 0..{n - 1} agree. Rule: normalise to NFC, "
                            f"pre-tokenise, and inside a piece merge the adjacent pair whose bytes form the token "
                            f"of LOWEST id first")
        assert len(got) == len(want), f"my_encode({text[:40]!r}): {len(got)} tokens, expected {len(want)}"
    print("Exercise 2: correct (id for id with Tokenizer.encode)")


def check_3(my_bytes_per_token) -> None:
    """my_bytes_per_token(tokenizer, texts): total UTF-8 bytes over total tokens."""
    tok = default_tokenizer()
    if not attempted(my_bytes_per_token(tok, ["a"]), 3):
        return
    for texts in (["Once upon a time"], builtin_stories("valid", 20) + ["🙂"], [ODD, "cafe\u0301 " * 20]):
        close(my_bytes_per_token(tok, texts), bytes_per_token(tok, texts),
              f"bytes per token of {texts[0][:30]!r}... ({len(texts)} texts; count the bytes of the text as "
              f"encoded, after NFC)", 1e-9)
    print("Exercise 3: correct")


def check_4(answer_4) -> None:
    """answer_4() -> (tokens for ' Lily', tokens for ' Zorblax') with the shipped tokenizer."""
    if not attempted(answer_4(), 4):
        return
    got = answer_4()
    tok = default_tokenizer()
    want = (len(tok.encode(" Lily")), len(tok.encode(" Zorblax")))
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"answer with a pair of numbers (lily, zorblax), got {got!r}"
    assert tuple(got) == want, f"got {tuple(got)}; count with tok.encode(' Lily') and tok.encode(' Zorblax')"
    print("Exercise 4: correct. ' Lily' is frequent in the stories, so it became one token; the made-up word "
          "must be spelled from smaller pieces.")


EXERCISES = {1: "my_train_bpe", 2: "my_encode", 3: "my_bytes_per_token", 4: "answer_4"}
