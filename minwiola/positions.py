"""Where a token is: absolute positions (learned, sinusoidal), rotary positions, RoPE (lesson 03), and ALiBi's
linear bias on the scores (lesson 12).

Shapes: T tokens, model width d, head width d_h (the width of one attention head's query and key).

* Learned absolute positions are an embedding table (context x d) added to the token embeddings (in model.py).
* Sinusoidal absolute positions (the original Transformer): PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i)
  with w_i = 10000^(-2i/d). Every row has norm sqrt(d/2) (each pair is a point on the unit circle), so the model
  scales the table before adding it to token embeddings of a far smaller norm (model.py, `LanguageModel`).
* RoPE rotates each pair of a query or key by an angle proportional to its position, so the dot product of a
  query at p and a key at q depends only on p - q. With inverse frequencies w_j = theta0^(-2j/d_h) (Wiola eq. 11)
  and angle p w_j, pair j is (x_j, x_{j + d_h/2}), the layout of Wiola eqs. 17-18:

      y_j         = x_j cos(p w_j) - x_{j+d_h/2} sin(p w_j)
      y_{j+d_h/2} = x_j sin(p w_j) + x_{j+d_h/2} cos(p w_j)

* Read past the length L it was trained at, RoPE's slow pairs reach angles never trained. `rope_scaled` gives the
  inference-time remedies (position interpolation, NTK-aware base, YaRN): frequencies w'_j, and for YaRN a
  temperature, chosen for a factor s = (length read) / L; s = 1 is RoPE itself (lesson 12).
* SRPE (Wiola eqs. 12-18, lesson 06) keeps that rotation but changes its coefficients:

      Theta_j(p) = p w_j (1 + 1/k_s)            (eqs. 12-13: the two "windings" add into one angle)
      r_j(p)     = 1 + a_s sin(p f_s w_j)       (eq. 14: a radius that depends on absolute position)
      c_j(p) = r_j(p) cos Theta_j(p),  s_j(p) = r_j(p) sin Theta_j(p)     (eqs. 15-16)

  So SRPE is RoPE with every frequency scaled by (1 + 1/k_s), times a per-pair radius. With a_s = 0 and the
  secondary winding off (k_s = inf, i.e. 1/k_s = 0) it is RoPE exactly. a_s must be below 1, or the radius
  reaches zero (the pair is erased) or turns negative (the pair is flipped).

  Eq. 14's radius multiplies the query at p and the key at p', so the score carries r_j(p) r_j(p'): it moves with
  absolute position, and SRPE's score is not relative (lesson 06). radius="offset" is the fix: a logarithmic
  spiral (as in xPos) whose radius the query and the key take with opposite signs,

      ln rho_j = -a_s f_s w_j                   (the rate of eq. 14's radius at p = 0, a_s f_s w_j, as a decay)
      query at p:  rho_j^(p - c),    key at p':  rho_j^-(p' - c)

  so the score carries rho_j^(p - p'), which depends only on the offset (a decay with distance, fastest for the
  fast pairs; c cancels). c, the centre of the context, keeps the exponents within +-a_s f_s (context - 1) / 2;
  above MAX_EXPONENT it is refused. With a_s = 0 or f_s = 0 both radii are 1: RoPE with stretched frequencies.
"""
from __future__ import annotations

import math

import torch

POSITIONS = ("learned", "sinusoidal", "rope", "srpe", "alibi", "none")
RADII = ("paper", "offset")     # SRPE's radius: eq. 14 (absolute), or rho^(p - c) / rho^-(p' - c) (relative)
ROPE_SCALINGS = ("none", "interpolation", "ntk", "yarn")   # reading RoPE past its trained length (lesson 12)
SIDES = ("query", "key")        # which side of the score a coefficient table is for (they differ under "offset")
MAX_EXPONENT = 20.0             # "offset": the largest |ln radius| allowed, e^20 ~ 5e8 (float32 and bf16 hold it)


def sinusoidal(T: int, d: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """The (T, d) table of sinusoidal absolute positions (d even)."""
    if d % 2:
        raise ValueError(f"sinusoidal positions need an even width d, got {d}")
    p = torch.arange(T, dtype=torch.float64)[:, None]
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.zeros(T, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(p * w), torch.cos(p * w)
    return table.to(dtype)


def rope_frequencies(d_h: int, theta0: float = 10000.0, device=None) -> torch.Tensor:
    """Inverse frequencies w_j = theta0^(-2j/d_h), j = 0 .. d_h/2 - 1 (Wiola eq. 11), in float64."""
    if d_h % 2:
        raise ValueError(f"rotary positions need an even head width d_h, got {d_h}")
    return theta0 ** (-2.0 * torch.arange(d_h // 2, dtype=torch.float64, device=device) / d_h)


def rope_scaled(d_h: int, theta0: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                trained: float | None = None, alpha: float = 1.0, beta: float = 32.0, device=None
                ) -> tuple[torch.Tensor, float]:
    """RoPE read at `factor` = s times the length it was trained at (`trained`, L), with no training (lesson 12):
    (w', m), the inverse frequencies to use (d_h/2,) float64 and a number m that multiplies both cos and sin, so
    every score q.k is multiplied by m^2. s = 1 is plain RoPE for every method.

    "none":          w' = w, m = 1 (positions past L reach angles never trained: the unseen-angle argument).
    "interpolation": w' = w / s (Chen et al. 2023, "position interpolation"): position p is read as p / s, so the
                     positions 0 .. sL - 1 map into the trained range [0, L); every pair, fast ones too, turns s
                     times slower, so neighbours a token apart are s times closer than the model learned.
    "ntk":           the base theta0 s^(d_h / (d_h - 2)) ("NTK-aware" scaling): pair j's w_j is divided by
                     s^(2j / (d_h - 2)), so the fastest pair (j = 0) is unchanged and the slowest (j = d_h/2 - 1)
                     is interpolated exactly by s; in between, a geometric blend.
    "yarn":          per pair (Peng et al. 2023, "YaRN", its "by parts" rule): r_j = L w_j / (2 pi), the turns pair
                     j makes within L. gamma_j = clamp((r_j - alpha) / (beta - alpha), 0, 1), and
                     w'_j = (1 - gamma_j) w_j / s + gamma_j w_j: a pair that turns beta times or more within L (it
                     has seen every angle) is left alone, one that turns alpha times or fewer (it has not) is
                     interpolated, a ramp between. Plus YaRN's temperature: m = 0.1 ln s + 1 (the paper's
                     sqrt(1/t)), which sharpens the softmax that longer windows flatten. alpha = 1, beta = 32 are
                     the paper's values for Llama.
    """
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"rope scaling must be one of {ROPE_SCALINGS}, got {scaling!r}")
    if not factor >= 1:
        raise ValueError(f"rope scaling factor s (the length read over the length trained) must be >= 1, got {factor}")
    w = rope_frequencies(d_h, theta0, device)
    if scaling == "interpolation":
        return w / factor, 1.0
    if scaling == "ntk":
        return rope_frequencies(d_h, theta0 * factor ** (d_h / (d_h - 2)), device), 1.0
    if scaling == "yarn":
        if trained is None or not trained > 0:
            raise ValueError(f"yarn needs the trained length L (> 0), got {trained}")
        gamma = ((trained * w / (2 * math.pi) - alpha) / (beta - alpha)).clamp(0, 1)
        return (1 - gamma) * w / factor + gamma * w, 0.1 * math.log(factor) + 1
    return w, 1.0


def rope_coefficients(p: torch.Tensor, d_h: int, theta0: float = 10000.0, scaling: str = "none",
                      factor: float = 1.0, trained: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the angles p * w_j for positions p (1-D), each of shape (len(p), d_h // 2), float64; with a
    `scaling` other than "none", of the angles p * w'_j, both times m (`rope_scaled`)."""
    w, m = rope_scaled(d_h, theta0, scaling, factor, trained, device=p.device)
    angles = p.to(torch.float64)[:, None] * w
    return m * torch.cos(angles), m * torch.sin(angles)


def check_srpe(k_s: float, a_s: float, f_s: float, radius: str = "paper", context: int | None = None) -> None:
    """Raise ValueError unless k_s > 0 (inf switches the secondary winding off), 0 <= a_s < 1, f_s >= 0 and
    radius is one of RADII; with radius="offset" and a `context`, unless the exponents stay within MAX_EXPONENT."""
    if not k_s > 0:
        raise ValueError(f"srpe k_s must be > 0 (inf turns the secondary winding off), got {k_s}")
    if not 0 <= a_s < 1:
        raise ValueError(f"srpe a_s must be in [0, 1): at a_s >= 1 the radius 1 + a_s sin(.) reaches 0, got {a_s}")
    if not f_s >= 0:
        raise ValueError(f"srpe f_s must be >= 0, got {f_s}")
    if radius not in RADII:
        raise ValueError(f"srpe radius must be one of {RADII} (eq. 14, or the offset-only fix), got {radius!r}")
    if radius == "offset" and context is not None:
        top = a_s * f_s * (context - 1) / 2          # the fastest pair (w_0 = 1) at the ends of the context
        if top > MAX_EXPONENT:
            raise ValueError(f"srpe radius 'offset' over a context of {context} needs radii up to "
                             f"e^(a_s f_s (context - 1) / 2) = e^{top:.1f}, beyond e^{MAX_EXPONENT:g}: "
                             f"lower a_s ({a_s}), f_s ({f_s}) or the context")


def srpe_coefficients(p: torch.Tensor, d_h: int, theta0: float = 10000.0, k_s: float = 8.0, a_s: float = 0.05,
                      f_s: float = 1 / 16, radius: str = "paper", side: str = "query", centre: float = 0.0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, s) of Wiola eqs. 15-16 for positions p (1-D): each (len(p), d_h // 2), float64.

    radius="paper" is eq. 14, the same for queries and keys. radius="offset" is the relative fix: the radius is
    rho_j^(p - centre) for side="query" and rho_j^-(p - centre) for side="key", ln rho_j = -a_s f_s w_j, so a
    query at p and a key at p' carry rho_j^(p - p') together; |ln radius| above MAX_EXPONENT is refused."""
    check_srpe(k_s, a_s, f_s, radius)
    if side not in SIDES:
        raise ValueError(f"srpe side must be one of {SIDES}, got {side!r}")
    w = rope_frequencies(d_h, theta0, p.device)                     # eq. 11
    p = p.to(torch.float64)[:, None]
    theta = p * w * (1 + 1 / k_s)                                   # eqs. 12-13 (1 / inf = 0)
    if radius == "paper":
        r = 1 + a_s * torch.sin(p * f_s * w)                        # eq. 14
    else:
        log_r = -a_s * f_s * w * (p - centre)                       # ln rho_j^(p - c)
        log_r = log_r if side == "query" else -log_r                # the key's radius is the inverse
        if log_r.numel() and log_r.abs().max() > MAX_EXPONENT:
            raise ValueError(f"srpe radius 'offset': |ln radius| reaches {log_r.abs().max():.1f} > {MAX_EXPONENT:g} "
                             f"at positions {int(p.min())}..{int(p.max())} around the centre {centre:g}: lower "
                             f"a_s ({a_s}) or f_s ({f_s}), or centre the positions")
        r = torch.exp(log_r)
    return r * torch.cos(theta), r * torch.sin(theta)               # eqs. 15-16


def srpe_helix(p: torch.Tensor, j: int, d_h: int, theta0: float = 10000.0, k_s: float = 8.0, a_s: float = 0.05,
               f_s: float = 1 / 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The curve pair j traces: (c_j(p), s_j(p), p). Lifted along p it looks like a helix; seen from above
    it is a planar curve whose radius r_j(p) oscillates (lesson 06)."""
    c, s = srpe_coefficients(p, d_h, theta0, k_s, a_s, f_s)
    return c[:, j], s[:, j], p.to(torch.float64)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x_j, x_{j+d_h/2}) of x (..., T, d_h) by coefficients (T, d_h/2) (Wiola eqs. 17-18).

    Works for any coefficients: plain RoPE (a rotation) and SRPE (a rotation times a radius).
    """
    x1, x2 = x.chunk(2, -1)                   # the halves (x_j) and (x_{j+d_h/2})
    if cos.dtype != x.dtype:                  # float32 tables, x in bf16 (autocast): rotate in x's dtype
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def alibi_slopes(H: int) -> torch.Tensor:
    """ALiBi's slopes m_h for H heads, float64 (H,), the geometric sequence of the ALiBi paper.

    For H a power of two the slopes start at 2^(-8/H) and each is the previous one times that same ratio:

        m_h = 2^(-8/H) ^ (h + 1) = 2^(-8 (h + 1) / H),   h = 0 .. H-1,

    so they run from 2^(-8/H) down to 2^-8 whatever H is (H = 8: 1/2, 1/4, ..., 1/256). Head 0 looks mostly at
    the last few tokens (its penalty doubles its rate of decay per token), head H-1 nearly uniformly over hundreds.

    For other H, with n = 2^floor(log2 H) the power of two below: the n slopes of n heads, then every other slope
    of the sequence for 2n heads (its slopes h = 0, 2, 4, ..., i.e. 2^(-8 (2k + 1) / (2n)) = 2^(-4 (2k + 1) / n)),
    the first H - n of them. Those fall halfway (in the exponent) between the n slopes already taken, so the set
    stays spread over the same range. This is the paper's reference code (`get_slopes` in ofirpress/attention_with_
    linear_biases): H = 6 gives 1/4, 1/16, 1/64, 1/256, then 1/2, 1/8.
    """
    if not isinstance(H, int) or isinstance(H, bool) or H < 1:
        raise ValueError(f"alibi needs a positive number of heads, got {H!r}")

    def power_of_two(n: int) -> torch.Tensor:
        return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)

    n = 2 ** int(math.floor(math.log2(H)))
    if n == H:
        return power_of_two(H)
    return torch.cat([power_of_two(n), power_of_two(2 * n)[0::2][:H - n]])


def alibi_bias_at(slopes: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor
                  ) -> torch.Tensor:
    """ALiBi's score bias -m_h (i - j) for queries at positions i (..., T_q) and keys at positions j (..., T_k):
    (..., H, T_q, T_k), in the slopes' dtype and on their device. Positions with a batch dimension (B, T) give
    (B, H, T_q, T_k): token merging (ATM) keeps each slot's original position."""
    offset = query_positions[..., None, :, None] - key_positions[..., None, None, :]      # (..., 1, T_q, T_k)
    return -slopes[:, None, None] * offset.to(slopes.dtype)


def alibi_bias(slopes: torch.Tensor, T_q: int, T_k: int | None = None) -> torch.Tensor:
    """ALiBi's score bias (H, T_q, T_k) for the T_q queries that are the *last* T_q of T_k positions (None: T_q),
    as in the attention kernels: query row r sits at position i = T_k - T_q + r (a KV cache holds the earlier
    ones), key column j at j. Entry (h, r, j) is -m_h (i - j): 0 on the diagonal, more negative further back.
    Keys in a query's future get a positive bias, which the causal mask then removes."""
    T_k = T_q if T_k is None else T_k
    if not 0 <= T_q <= T_k:
        raise ValueError(f"the queries must be the last T_q of the T_k positions, got T_q={T_q}, T_k={T_k}")
    return alibi_bias_at(slopes, torch.arange(T_k - T_q, T_k, device=slopes.device),
                         torch.arange(T_k, device=slopes.device))
