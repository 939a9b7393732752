"""Self-checks for lesson 10's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which config, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson10.py` (look after trying)."""
from exercises import attempted, close
from minwiola import data
from minwiola.budget import count_params, kv_cache_bytes, param_breakdown
from minwiola.model import preset

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
    print(f"Exercise 1: correct on all {len(COUNT_CASES)} configs (wiola-360m: {count(preset('wiola-360m')):,})")


def check_2(mistral_kv_bytes) -> None:
    """mistral_kv_bytes(): Mistral 7B's KV cache for one sequence of 8,192 tokens in bf16."""
    if not attempted(mistral_kv_bytes(), 2):
        return
    c = preset("mistral-7b")
    want = kv_cache_bytes(c, 8192)
    close(mistral_kv_bytes(), want, f"Mistral 7B at 8,192 tokens, bf16 (L = {c.n_layers}, H_kv = {c.H_kv}, "
                                    f"d_h = {c.d_h}: keys AND values, 2 bytes each)", 0)
    print(f"Exercise 2: correct ({want / 2**30:.2f} GiB)")


def check_3(chinchilla_epochs) -> None:
    """chinchilla_epochs(): how many passes over this course's training tokens 20 N tokens would take for
    wiola-cs336."""
    if not attempted(chinchilla_epochs(), 3):
        return
    n, tokens = count_params(preset("wiola-cs336")), len(data.tokens("train"))
    close(chinchilla_epochs(), 20 * n / tokens, f"20 N / tokens with N = {n:,} and {tokens:,} training tokens "
                                                f"({data.describe_source()})", 1e-6)
    print(f"Exercise 3: correct ({20 * n / tokens:.0f} epochs of {data.describe_source()})")


EXERCISES = {1: "count", 2: "mistral_kv_bytes", 3: "chinchilla_epochs"}   # check -> the learner's function
