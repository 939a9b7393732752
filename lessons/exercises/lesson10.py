"""Self-checks for lesson 10's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which config, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson10.py` (look after trying)."""
from exercises import attempted, close, correct
from minwiola import data
from minwiola.budget import count_params, kv_cache_bytes, param_breakdown
from minwiola.model import preset
from minwiola.tokenizer import default_tokenizer

# From plain to every option: the first config your count gets wrong names the feature you have not handled yet.
COUNT_CASES = [
    ("llama-style (RMSNorm, SwiGLU of 8d/3, RoPE, tied head, no biases)", "llama-style", {}),
    ("llama-style with d_ff=200 (SwiGLU of a given width)", "llama-style", dict(d_ff=200)),
    ("tiny-llama (GQA: H_kv = 2 of H = 4)", "tiny-llama", {}),
    ("llama-style with a GELU MLP (d_ff None: 4d)", "llama-style", dict(ffn="gelu")),
    ("llama-style with a ReLU MLP of width 100", "llama-style", dict(ffn="relu", d_ff=100)),
    ("llama-style with LayerNorm (a weight and a bias)", "llama-style", dict(norm="layernorm")),
    ("llama-style, post-norm (no final norm)", "llama-style", dict(norm_position="post")),
    ("llama-style, untied head", "llama-style", dict(tie_head=False)),
    ("llama2-7b (untied)", "llama2-7b", {}),
    ("mistral-7b (GQA, untied)", "mistral-7b", {}),
    ("llama-style with attention biases", "llama-style", dict(attn_bias=True)),
    ("llama-style with feed-forward biases", "llama-style", dict(ffn_bias=True)),
    ("gpt2-style (LayerNorm, GELU MLP, biases, learned positions)", "gpt2-style", {}),
    ("gpt2-124m", "gpt2-124m", {}),
    ("gpt2-style with sinusoidal positions (a table, no parameters)", "gpt2-style", dict(positions="sinusoidal")),
    ("llama-style with WiolaRMSNorm (gamma and delta)", "llama-style", dict(norm="wiola")),
    ("llama-style with DSFF (d_A None: d, d_B None: 4d)", "llama-style", dict(ffn="dsff")),
    ("llama-style with DSFF d_A=48, d_B=144", "llama-style", dict(ffn="dsff", d_ff_a=48, d_ff=144)),
    ("llama-style with causal GCLA (W_gate, W_K^ctx, W_V^ctx, phi)", "llama-style", dict(gcla="causal")),
    ("tiny-llama with GCLA (GQA: the context keys have H_kv heads too)", "tiny-llama", dict(gcla="causal")),
    ("wiola-tiny", "wiola-tiny", {}),
    ("wiola-yocto", "wiola-yocto", {}),
    ("wiola-360m", "wiola-360m", {}),
    ("wiola-tiny with biases everywhere (DSFF and GCLA biases)", "wiola-tiny", dict(attn_bias=True, ffn_bias=True)),
    ("wiola-tiny with a SiLU MLP and LayerNorm, untied", "wiola-tiny", dict(ffn="silu", norm="layernorm",
                                                                          tie_head=False)),
    ("yocto (Yocto's unified QKV: one d -> d projection, W_O: d/3 -> d)", "yocto", {}),
    ("tiny-yocto (unified QKV, GELU biases)", "tiny-yocto", {}),
]


def check_1(count) -> None:
    """count(cfg): the parameters of any ModelConfig, checked against minwiola.budget.count_params."""
    if not attempted(count(preset("llama-style")), 1):
        return
    for what, name, overrides in COUNT_CASES:
        cfg = preset(name, **overrides)
        got, want = count(cfg), count_params(cfg)
        try:
            got = int(got)
        except (TypeError, ValueError):
            raise AssertionError(f"{what}: expected an int, got {got!r}") from None
        if got != want:
            diff = got - want
            parts = ", ".join(f"{k} {v:,}" for k, v in param_breakdown(cfg).items())
            raise AssertionError(
                f"first config that differs: {what}: got {got:,}, expected {want:,}, off by {diff:+,} "
                f"= {diff / cfg.d:+g} d = {diff / (cfg.n_layers * cfg.d):+g} L d. "
                f"Config: {overrides or 'the preset as it is'}. The library's breakdown: {parts}")
    correct(f"Exercise 1: correct on all {len(COUNT_CASES)} configs (wiola-360m: {count(preset('wiola-360m')):,})", count)


def check_2(mistral_kv_bytes) -> None:
    """mistral_kv_bytes(): Mistral 7B's KV cache for one sequence of 8,192 tokens in bf16."""
    if not attempted(mistral_kv_bytes(), 2):
        return
    c = preset("mistral-7b")
    want = kv_cache_bytes(c, 8192)
    close(mistral_kv_bytes(), want, f"Mistral 7B at 8,192 tokens, bf16 (L = {c.n_layers}, H_kv = {c.H_kv}, "
                                    f"d_h = {c.d_h}: keys AND values, 2 bytes each)", 0)
    correct(f"Exercise 2: correct ({want / 2**30:.2f} GiB)", mistral_kv_bytes)


def check_3(chinchilla_epochs) -> None:
    """chinchilla_epochs(): how many passes over this course's training tokens 20 N tokens would take for
    wiola-cs336."""
    if not attempted(chinchilla_epochs(), 3):
        return
    n, tokens = count_params(preset("wiola-cs336")), len(data.tokens("train"))
    close(chinchilla_epochs(), 20 * n / tokens, f"20 N / tokens with N = {n:,} and {tokens:,} training tokens "
                                                f"({data.describe_source()})", 1e-6)
    correct(f"Exercise 3: correct ({20 * n / tokens:.0f} epochs of {data.describe_source()})", chinchilla_epochs)


CONVERSATIONS = [
    ("one user turn", [{"role": "user", "content": "Tell me a story."}]),
    ("a user turn, an answer, a user turn", [{"role": "user", "content": "Hi!"},
                                             {"role": "assistant", "content": "Hello. Once upon a time..."},
                                             {"role": "user", "content": " two\nlines "}]),
    ("an empty user turn", [{"role": "user", "content": ""}]),
]


def check_5(render_chat) -> None:
    """render_chat(messages, add_generation_prompt): the paper's chat format as text, checked against the chat
    template of minwiola.hf (what apply_chat_template renders) on three conversations, with and without the
    generation prompt."""
    if not attempted(render_chat(CONVERSATIONS[0][1], False), 5):
        return
    from minwiola.hf import hf_tokenizer
    tokenizer = hf_tokenizer(default_tokenizer())
    for what, messages in CONVERSATIONS:
        for prompt in (False, True):
            got = render_chat(messages, prompt)
            want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            if got == want:
                continue
            hint = ""
            if not isinstance(got, str):
                hint = f"return a str, not {type(got).__name__}"
            elif got.replace(" ", "") == want.replace(" ", ""):
                hint = "spaces differ: the markers touch the text, and the text is kept exactly as given"
            elif prompt and got + "<|assistant|>" == want:
                hint = "add_generation_prompt=True ends the text with <|assistant|>, where the model's answer goes"
            elif not prompt and got.endswith("<|assistant|>"):
                hint = "without add_generation_prompt the text ends after the last turn's <|end|>"
            elif got.replace("\n", "") == want:
                hint = "no newlines between turns: each marker follows the previous <|end|> directly"
            elif got.count("<|end|>") != want.count("<|end|>"):
                hint = "every turn, the assistant's too, closes with <|end|>"
            raise AssertionError(f"{what}, add_generation_prompt={prompt}: got {got!r}, expected {want!r}"
                                 + (f". {hint}" if hint else ""))
    correct("Exercise 5: correct (the same text as the chat template on every conversation)", render_chat)


def check_4(byte_level) -> None:
    """byte_level(token): a token's bytes as tokenizer.json writes them (GPT-2's printable stand-ins), checked on
    every token of the shipped tokenizer against the vocabulary of minwiola.hf's tokenizer."""
    if not attempted(byte_level(b" a"), 4):
        return
    from minwiola.hf import byte_to_unicode, hf_tokenizer
    written = {i: s for s, i in hf_tokenizer(default_tokenizer()).get_vocab().items()}
    printable = {b for b, c in byte_to_unicode().items() if c == chr(b)}          # the bytes that stand for themselves
    for i, token in enumerate(default_tokenizer().vocab):
        got = byte_level(token)
        if got != written[i]:
            hint = ""
            if not isinstance(got, str):
                hint = f"return a str, not {type(got).__name__}"
            elif got == token.decode("latin-1") or got == token.decode("utf-8", "replace"):
                hint = ("that is latin-1 (or UTF-8), where the 68 unprintable bytes (space, control characters, "
                        "127-160, 173) stand for themselves; GPT-2 moves them to U+0100, U+0101, ... in byte order")
            elif got == "".join(chr(b) if b in printable else chr(256 + b) for b in token):
                hint = ("an unprintable byte takes U+0100 plus its place among the 68 (0 for byte 0, 32 for the "
                        "space, 33 for byte 127), not U+0100 plus the byte itself")
            raise AssertionError(f"token {i}, bytes {token!r}: got {got!r}, expected {written[i]!r}"
                                 + (f". {hint}" if hint else ""))
    correct(f"Exercise 4: correct on all {len(default_tokenizer().vocab):,} tokens", byte_level)


EXERCISES = {1: "count", 2: "mistral_kv_bytes", 3: "chinchilla_epochs", 4: "byte_level",
             5: "render_chat"}   # check -> the learner's function
