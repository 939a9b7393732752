"""Byte-level BPE: training, reference vs tiktoken encoders, round trips, save/load, bad input."""
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from minwiola import data
from minwiola.tokenizer import (EOT, SHIPPED, Tokenizer, TokenizerFileError, default_tokenizer, train_bpe)

ADVERSARIAL = [
    "", " ", "a", "\n", "🙂", "🙂🙂🙂 family: 👨‍👩‍👧", "世界你好，小猫。", "한국어 텍스트", "Ελληνικά",
    "\x00\x01\x02\x1b[31mred\x1b[0m\x7f", "a" * 5000, " " * 300 + "x", "\t\t\n\r\n  \u00a0\u2003word",
    "hi<|endoftext|>there", "<|endoftext|><|endoftext|>", "<|endoftext", "don't DON'T don’t we'll",
    "1234567890 3.14159 -42", "e\u0301 vs \u00e9", "\ufeffBOM", "\U0010ffff\ue000", "ﬁ ligature",
    "Once upon a time, there was a little girl named Lily.",
]


@pytest.fixture(scope="module")
def shipped():
    return default_tokenizer()


def test_toy_training_merges_by_hand():
    # One piece, 'aaabdaaabac'. Pair counts: aa 4, ab 2, the rest 1 -> merge 'aa' (scanning left to right,
    # 'aaa' becomes aa+a). Now aa+a 2 and a+b 2 tie: the smaller ids (97, 98) win -> 'ab'. Then aa+ab 2 -> 'aaab'.
    vocab = train_bpe("aaabdaaabac", 256 + 3 + 1)
    assert vocab[256:] == [b"aa", b"ab", b"aaab"]


def test_training_reports_every_piece_as_it_left_it_and_the_encoder_agrees():
    text = data.EOT.join(data.load_stories("valid")[:200])
    pieces = {}
    tok = Tokenizer(train_bpe(text, 400, pieces=pieces))
    assert len(pieces) > 100 and all(bytes(b"".join(tok.vocab[i] for i in ids)) == p for p, ids in pieces.items())
    assert all(tok.encode_reference(p.decode()) == ids for p, ids in pieces.items())   # encoding replays training
    toy = {}
    train_bpe("aaabdaaabac", 256 + 3 + 1, pieces=toy)
    assert toy == {b"aaabdaaabac": [258, 100, 258, 97, 99]}


def test_training_is_deterministic_and_prefix_consistent():
    text = data.EOT.join(data.load_stories("valid")[:200])
    small, big = Tokenizer.train(text, 300), Tokenizer.train(text, 400)
    assert Tokenizer.train(text, 300).vocab == small.vocab
    assert big.truncated(300).vocab == small.vocab  # a smaller vocabulary is a prefix of a larger one


def test_special_token_is_never_merged():
    text = ("the end" + EOT) * 200
    tok = Tokenizer.train(text, 300)
    assert all(b"<|" not in t and b"|>" not in t for t in tok.vocab[256:])
    ids = tok.encode("the end" + EOT + "the", allowed_special=True)
    assert ids.count(tok.eot_id) == 1
    assert tok.eot_id not in tok.encode("the end" + EOT)  # by default the string is plain text
    assert tok.decode(tok.encode(EOT)) == EOT


def test_shipped_tokenizer(shipped):
    assert shipped.vocab_size == 4096 and shipped.eot_id == 4095
    assert shipped.encode("Once upon a time") == shipped.encode_reference("Once upon a time")
    assert len(shipped.encode(" once")) == 1  # a frequent word with its space is one token


def test_reference_equals_tiktoken_on_adversarial_text(shipped):
    for text in ADVERSARIAL:
        for allowed in (False, True):
            assert shipped.encode(text, allowed) == shipped.encode_reference(text, allowed), repr(text)
        assert shipped.decode(shipped.encode(text)) == unicodedata.normalize("NFC", text)


def test_reference_equals_tiktoken_on_stories(shipped):
    stories = data.load_stories("valid")[:300]
    text = "\n".join(stories)
    assert shipped.encode(text) == shipped.encode_reference(text)
    assert shipped.encode_batch(stories) == [shipped.encode_reference(s) for s in stories]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))))
def test_round_trip_any_unicode(text):
    tok = default_tokenizer()
    ids = tok.encode(text)
    assert ids == tok.encode_reference(text)
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)
    nfc = unicodedata.normalize("NFC", text)
    assert tok.decode(tok.encode(nfc)) == nfc  # exact for text already in NFC


def test_nfc_makes_equivalent_strings_equal(shipped):
    assert shipped.encode("caf\u00e9") == shipped.encode("cafe\u0301")


def test_save_load_round_trip(tmp_path, shipped):
    path = tmp_path / "tok.bpe"
    shipped.save(path)
    again = Tokenizer.load(path)
    assert again.vocab == shipped.vocab and again.specials == shipped.specials
    assert again.hash() == shipped.hash() and again.pattern == shipped.pattern


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.replace(s.splitlines()[10], "ff", 1), "checksum mismatch"),
    (lambda s: s[: len(s) // 2], "sha256"),
    (lambda s: "", "sha256"),
    (lambda s: s.replace("minwiola-bpe 1", "minwiola-bpe 9"), "checksum mismatch"),
])
def test_corrupt_file_is_refused(tmp_path, shipped, damage, message):
    path = tmp_path / "bad.bpe"
    path.write_text(damage(shipped.dumps()))
    with pytest.raises(TokenizerFileError, match=message):
        Tokenizer.load(path)


def test_wrong_header_with_valid_checksum_is_refused(shipped):
    import hashlib
    body = shipped.dumps().rpartition("sha256 ")[0].replace("minwiola-bpe 1", "something else")
    with pytest.raises(TokenizerFileError, match="first line"):
        Tokenizer.loads(body + "sha256 " + hashlib.sha256(body.encode()).hexdigest() + "\n")


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        Tokenizer.load(tmp_path / "nope.bpe")
    (tmp_path / "bin.bpe").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TokenizerFileError, match="not UTF-8"):
        Tokenizer.load(tmp_path / "bin.bpe")


def test_bad_input(shipped):
    with pytest.raises(TypeError, match="must be a str"):
        shipped.encode(b"bytes")
    with pytest.raises(TypeError, match="must be a str"):
        Tokenizer.train(["a list"], 300)
    with pytest.raises(ValueError, match="vocab_size must be at least .* = 257"):
        Tokenizer.train("abc", 100)
    with pytest.raises(ValueError, match="lone surrogate"):
        shipped.encode("\ud800")
    with pytest.raises(ValueError, match=r"token ids must be ints in \[0, 4096\)"):
        shipped.decode([1, 4096])
    with pytest.raises(ValueError, match=r"vocab_size must be in"):
        shipped.truncated(100)


def test_shipped_file_is_the_one_the_cli_writes():
    assert SHIPPED.is_file()
    assert SHIPPED.read_text().startswith("minwiola-bpe 1\n")


def test_negative_and_foreign_ids_are_refused(shipped):
    import numpy as np
    with pytest.raises(ValueError, match="token ids must be ints"):
        shipped.decode([-1])
    with pytest.raises(ValueError, match="token ids must be ints"):
        shipped.decode(iter([5, "x"]))
    assert shipped.decode(np.array([430, 458], dtype=np.uint16)) == shipped.decode([430, 458])


def test_no_specials_and_bad_specials():
    vocab = Tokenizer.train("hello world " * 50, 300).vocab
    plain = Tokenizer(vocab, specials=())
    assert plain.encode("hello world", allowed_special=True) == plain.encode_reference("hello world", True)
    with pytest.raises(ValueError, match="specials must be distinct non-empty strings"):
        Tokenizer(vocab, specials=["<a>", "<a>"])
    with pytest.raises(ValueError, match="specials must be distinct non-empty strings"):
        Tokenizer(vocab, specials=[""])


def test_running_out_of_pairs_warns():
    with pytest.warns(UserWarning, match="ran out of pairs after 2 merges"):
        tok = Tokenizer.train("abc", 400)
    assert tok.vocab_size == 256 + 2 + 1


SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories"


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the TinyStories sample is not beside this checkout")
@pytest.mark.once          # the sample named here, pure Python: CI runs it in its first pass only
def test_shipped_tokenizer_is_reproducible(monkeypatch, shipped):
    monkeypatch.setenv("MINWIOLA_DATA", str(SAMPLE))
    retrained = Tokenizer.train(data.EOT.join(data.load_stories("train")), 4096)
    assert retrained.vocab == shipped.vocab and retrained.hash() == shipped.hash()


def test_running_out_of_pairs_warns_at_the_callers_line():
    from minwiola.tokenizer import train_bpe
    with pytest.warns(UserWarning, match="ran out of pairs after 2 merges") as through_train:
        tok = Tokenizer.train("abc", 400)
    assert tok.vocab_size == 256 + 2 + 1
    with pytest.warns(UserWarning, match="ran out of pairs") as direct:
        train_bpe("abc", 400)
    # the warning names the caller's line, whether it used Tokenizer.train or train_bpe
    assert [w.filename for w in through_train] == [w.filename for w in direct] == [__file__]
