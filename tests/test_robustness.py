"""Edge cases a careless or unlucky user meets: dtypes of the stored tables, a refused cache call, empty batches,
sampling from broken logits, and overlapping special tokens. Each test names the promise it keeps."""
import pytest
import torch

from minwiola import atm
from minwiola.generate import generate_ids, sample_next
from minwiola.model import PRESETS, LanguageModel, preset
from minwiola.positions import rope_coefficients, srpe_coefficients
from minwiola.tokenizer import EOT, Tokenizer, train_bpe

TINY = sorted(name for name in PRESETS if "tiny" in name)
DECODERS = [name for name in TINY if PRESETS[name].get("causal", True)]   # those with a KV cache


def build(name: str) -> LanguageModel:
    """The preset in the default dtype (float32); paper-sized ones on the meta device (shapes and dtypes, no data)."""
    with torch.device("meta"):
        small = LanguageModel(preset(name)).n_params() < 2_000_000
    if small:
        return LanguageModel(preset(name))
    with torch.device("meta"):
        return LanguageModel(preset(name))


# ------------------------------------------------------------------------------------------ dtypes (Apple MPS)

@pytest.mark.parametrize("name", sorted(PRESETS))
def test_no_preset_holds_a_float64_tensor(name):
    """MPS has no float64, so `model.to("mps")` fails on any float64 parameter or buffer, saved or not."""
    model = build(name)
    tensors = [*model.named_parameters(), *model.named_buffers()]     # named_buffers includes non-persistent ones
    assert tensors
    wide = [n for n, t in tensors if t.dtype == torch.float64]
    assert not wide, f"{name}: float64 tensors {wide[:4]}"


@pytest.mark.parametrize("name", ["tiny-llama", "wiola-tiny"])
def test_a_float64_model_rotates_with_exact_coefficients(name):
    """Tables stored in float32 and upcast by `.double()` would be ~1e-8 off; float64 must stay exact."""
    model = LanguageModel(preset(name)).double()
    attn = model.blocks[0].mixer
    reference = srpe_coefficients if name.startswith("wiola") else rope_coefficients
    p = torch.arange(model.config.context)
    c, s = reference(p, attn.d_h)
    cos, sin = attn.coefficients(0, len(p))
    assert cos.dtype == torch.float64 and (cos - c).abs().max() < 1e-15 and (sin - s).abs().max() < 1e-15
    positions = torch.tensor([[0, 3, 5], [31, 2, 2]])                  # ATM's explicit positions, (B, T')
    cos, sin = attn.coefficients(0, 3, positions)
    assert cos.shape == (2, 1, 3, attn.d_h // 2)
    assert (cos[:, 0] - c[positions]).abs().max() < 1e-15 and (sin[:, 0] - s[positions]).abs().max() < 1e-15


@pytest.mark.parametrize("name", TINY)
def test_bfloat16_models_still_run(name):
    torch.manual_seed(0)
    model = LanguageModel(preset(name)).to(torch.bfloat16).eval()
    assert all(t.dtype == torch.bfloat16 for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())
    logits = model(torch.randint(0, 64, (2, 9)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


# ------------------------------------------------------------------------------------ a refused cache call

def test_a_refused_cache_call_leaves_the_cache_as_it_was():
    """A batch-2 call into a batch-1 cache raises; the cache (GCLA's running sums included) must be untouched, so
    decoding goes on exactly as if the bad call had never been made."""
    torch.manual_seed(0)
    model = LanguageModel(preset("wiola-tiny", init_std=0.3)).double().eval()
    idx = torch.randint(0, 64, (1, 12))
    cache = model.new_cache()
    with torch.no_grad():
        first = model(idx[:, :7], cache)
        before = [(c.length, c.k.clone(), c.v.clone(), c.input_sum.clone()) for c in cache]
        with pytest.raises(ValueError, match="batch|do not match"):
            model(torch.randint(0, 64, (2, 3)), cache)
        for c, (length, k, v, input_sum) in zip(cache, before):
            assert c.length == length and torch.equal(c.k, k) and torch.equal(c.v, v)
            assert torch.equal(c.input_sum, input_sum)
        rest = model(idx[:, 7:], cache)
        full = model(idx)
    assert (torch.cat([first, rest], dim=1) - full).abs().max() < 1e-10


# ------------------------------------------------------------------------------------------- empty batches

@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("train", [True, False])
def test_empty_batches_give_empty_logits_in_every_mode(name, train):
    """No tokens (T = 0) or no sequences (B = 0) give logits of shape (B, T, V), as plain presets always did;
    Wiola's token merging (training only) must agree."""
    model = LanguageModel(preset(name)).train(train)
    for B, T in [(2, 0), (0, 5), (0, 0)]:
        logits = model(torch.zeros(B, T, dtype=torch.long))
        assert logits.shape == (B, T, model.config.vocab_size), (name, train, B, T)
    for block in model.blocks:
        if block.last_slot is not None:                                 # a merging layer ran on the empty batch
            assert atm.merge_ratio(block.last_slot) == 0.0


@pytest.mark.parametrize("name", DECODERS)
def test_an_empty_continuation_of_a_cache_changes_nothing(name):
    """Feeding no new tokens to a cache gives (B, 0, V) logits and leaves decoding exactly where it was."""
    torch.manual_seed(0)
    model = LanguageModel(preset(name, init_std=0.3)).double().eval()
    idx = torch.randint(0, 64, (2, 10))
    cache = model.new_cache()
    with torch.no_grad():
        parts = [model(idx[:, a:b], cache) for a, b in [(0, 0), (0, 4), (4, 4), (4, 10)]]
        full = model(idx)
    assert parts[0].shape == parts[2].shape == (2, 0, model.config.vocab_size)
    assert (torch.cat(parts, dim=1) - full).abs().max() < 1e-10


# ---------------------------------------------------------------------------------------------- sampling

LOGITS = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).log_softmax(-1)        # all negative, as log-probabilities are


def test_a_temperature_too_small_for_the_logits_is_refused():
    """1e-45 makes logits / t overflow to -inf (or +inf), and softmax of that is NaN: say so, suggest greedy."""
    for logits in (LOGITS, -LOGITS, LOGITS * 1e6):
        with pytest.raises(ValueError, match="temperature=1e-45.*temperature=0"):
            sample_next(logits, temperature=1e-45)
    # a small but workable temperature is still sampled, and it is (nearly) greedy
    g = torch.Generator().manual_seed(0)
    assert sample_next(LOGITS.repeat(50, 1), temperature=1e-3, generator=g).tolist() == [3] * 50
    # -inf logits (tokens ruled out) are allowed as long as some token is possible
    masked = torch.tensor([[0.0, float("-inf"), 1.0]])
    assert sample_next(masked.repeat(200, 1), temperature=1e-30, generator=g).tolist() == [2] * 200


def test_broken_logits_are_refused_greedy_or_sampled():
    """argmax would return a NaN's index as if it were the best token; multinomial fails with a cryptic message."""
    nan = LOGITS.clone()
    nan[0, 1] = float("nan")
    inf = LOGITS.clone()
    inf[0, 0] = float("inf")
    impossible = torch.full((1, 4), float("-inf"))
    for logits, match in [(nan, "NaN"), (inf, r"\+inf"), (impossible, "-inf")]:
        for kwargs in [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.7, top_k=2, top_p=0.9)]:
            with pytest.raises(ValueError, match=match):
                sample_next(logits, **kwargs)


def test_generate_refuses_a_model_that_outputs_nan():
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama"))
    with torch.no_grad():
        model.embed.weight[5] = float("nan")                             # token 5 poisons everything after it
    for temperature in (0, 0.8):
        with pytest.raises(ValueError, match="NaN"):
            generate_ids(model, torch.tensor([[1, 5]]), 3, temperature=temperature)



def test_the_decoding_loop_checks_once_and_still_refuses_what_goes_wrong_later():
    """generate_ids checks the prompt and the settings before its loop, not at each token; a fault that appears
    only in the loop (logits turning NaN after a sampled token) is still refused with its own message."""
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama"))
    prompt = torch.tensor([[0]])
    for bad, match in [(dict(idx=torch.tensor([[0, 64]])), r"token ids must be in \[0, vocab_size=64\)"),
                       (dict(idx=torch.tensor([[-1]])), "token ids must be in"),
                       (dict(temperature=-1.0), "temperature must be >= 0"), (dict(top_k=0), "top_k"),
                       (dict(top_p=1.5), "top_p")]:
        with pytest.raises(ValueError, match=match):
            generate_ids(model, **{"idx": prompt, "max_new_tokens": 3, **bad})
    with torch.no_grad():
        model.embed.weight[1:] = float("nan")          # the prompt's token is sound, every other one poisons
    for temperature in (0.8, 1.0):
        with pytest.raises(ValueError, match="the logits contain NaN"):
            generate_ids(model, prompt, 8, temperature=temperature, seed=1)


# ------------------------------------------------------------------------------------ overlapping specials

def longest_first(text: str, specials) -> list[str]:
    """The special tokens in text, scanning left to right and taking the longest one that starts at each place."""
    found, i = [], 0
    while i < len(text):
        match = max((s for s in specials if text.startswith(s, i)), key=len, default=None)
        if match:
            found.append(match)
        i += len(match) if match else 1
    return found


PAIRS = [(EOT, EOT + EOT), ("<|a|>", "<|a|>b")]                      # (short, long): the short one is a prefix
TEXTS = ["{L}", "{S}{S}", "{S}{S}{S}", "x{S}y{L}z", "{S}b{S}", "{L}{L}c{S}", "<|endoftext|{S}>", "{S}<{S}", ""]


@pytest.mark.parametrize("short, long", PAIRS)
@pytest.mark.parametrize("reverse", [False, True])
def test_both_encoders_take_the_longest_special_token_first(short, long, reverse):
    """Registered in either order, a special that another special starts with never steals the longer match;
    the tiktoken path (`encode`) and `encode_reference` give the same ids."""
    specials = [long, short] if reverse else [short, long]
    tok = Tokenizer([bytes([b]) for b in range(256)], specials)
    for template in TEXTS:
        text = template.format(S=short, L=long)
        fast, reference = tok.encode(text, allowed_special=True), tok.encode_reference(text, allowed_special=True)
        assert fast == reference, (specials, text)
        assert [tok.decode([i]) for i in fast if i >= 256] == longest_first(text, specials), (specials, text)
        assert tok.decode(fast) == text


def test_a_longer_special_never_lends_its_bytes_to_a_merge():
    """Training cuts specials out of the text, longest first: the 'b' of '<|a|>b' must not merge with what follows."""
    with pytest.warns(UserWarning, match="ran out of pairs"):
        vocab = train_bpe("<|a|>bc" * 20, 256 + 2 + 1, specials=["<|a|>", "<|a|>b"])
    assert vocab[256:] == []                                            # only 'c' pieces are left: no pair to merge
