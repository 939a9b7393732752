"""Solutions to lesson 10's exercises (try them first). Load one into the notebook with
`%load exercises/solutions/lesson10.py`."""
from minwiola import data
from minwiola.budget import count_params
from minwiola.model import preset


def count(cfg):
    d, L, V, H = cfg.d, cfg.n_layers, cfg.vocab_size, cfg.n_heads
    H_kv = cfg.n_kv_heads or H
    ab, fb = int(cfg.attn_bias), int(cfg.ffn_bias)               # a bias adds one number per output

    def linear(n_in, n_out, bias):
        return n_in * n_out + bias * n_out

    norm = {"layernorm": 2 * d, "rmsnorm": d, "wiola": 2 * d}[cfg.norm]   # weight (+ bias, or gamma and delta)
    if cfg.qkv == "unified":                                     # Yocto: one d -> d projection, thirds are q, k, v
        attention = linear(d, d, ab) + linear(d // 3, d, ab)
    else:
        d_h = d // H
        attention = linear(d, H * d_h, ab) + 2 * linear(d, H_kv * d_h, ab) + linear(H * d_h, d, ab)
    if cfg.gcla != "off":                                        # W_gate, W_K^ctx, W_V^ctx, phi
        attention += linear(d, H * d_h, ab) + 2 * linear(d, H_kv * d_h, ab) + 1
    if cfg.ffn == "swiglu":
        h = cfg.d_ff if cfg.d_ff is not None else -(-(8 * d) // 24) * 8      # 8d/3 rounded up to a multiple of 8
        ffn = 2 * linear(d, h, fb) + linear(h, d, fb)
    elif cfg.ffn == "dsff":
        a, b = cfg.d_ff_a or d, cfg.d_ff or 4 * d
        ffn = 2 * linear(d, a, fb) + linear(a, d, fb) + linear(d, b, fb) + linear(b, d, fb) + linear(2 * d, d, fb)
    else:                                                        # a GELU / ReLU / SiLU MLP
        h = cfg.d_ff or 4 * d
        ffn = linear(d, h, fb) + linear(h, d, fb)
    total = V * d + L * (attention + ffn + 2 * norm)             # embedding, L layers with two norms each
    total += 0 if cfg.tie_head else V * d                        # an untied head is a second V x d matrix
    total += cfg.context * d if cfg.positions == "learned" else 0
    total += norm if cfg.norm_position == "pre" else 0           # the final norm (post-norm blocks end in one)
    return total


def mistral_kv_bytes():
    return 2 * 32 * 8 * 128 * 8192 * 2        # keys and values, L = 32, H_kv = 8, d_h = 128, T = 8192, 2 bytes


def chinchilla_epochs():
    return 20 * count_params(preset("wiola-cs336")) / len(data.tokens("train"))


def render_chat(messages, add_generation_prompt=False):
    text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
    return text + ("<|assistant|>" if add_generation_prompt else "")


PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
             *range(ord("\u00ae"), ord("\u00ff") + 1)]


def byte_level(token):
    others = [b for b in range(256) if b not in PRINTABLE]          # the 68 bytes that print badly or not at all
    table = {b: chr(b) for b in PRINTABLE} | {b: chr(256 + i) for i, b in enumerate(others)}
    return "".join(table[b] for b in token)


def count_always_tied(cfg):
    """A real mistake: the head is taken to be the embedding even when tie_head is False."""
    return count(cfg) - (0 if cfg.tie_head else cfg.vocab_size * cfg.d)


WRONG = {
    "count": count_always_tied,
    "mistral_kv_bytes": lambda: 32 * 8 * 128 * 8192 * 2,                  # the keys only: forgot the values
    "chinchilla_epochs": lambda: 20 * count_params(preset("wiola-cs336")) / len(data.load_stories("train")),
                                                                           # stories, not tokens
    "render_chat": lambda messages, add_generation_prompt=False:          # only the user's turns close
        "".join(f"<|{m['role']}|>{m['content']}" + ("<|end|>" if m["role"] == "user" else "") for m in messages)
        + ("<|assistant|>" if add_generation_prompt else ""),
    "byte_level": lambda token: token.decode("latin-1"),                 # latin-1: unprintables stay as they are
}


ALSO_WRONG = {
    "render_chat": [lambda messages, add_generation_prompt=False:          # ChatML's habit: a newline per turn
                    "\n".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
                    + ("\n<|assistant|>" if add_generation_prompt else "")],
    "byte_level": [lambda token: "".join(chr(b) if b in PRINTABLE else chr(256 + b) for b in token)],
                                                                           # U+0100 + the byte, not + its place
}
