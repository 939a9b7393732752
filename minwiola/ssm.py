"""State-space models: one system, three views (lesson 13; the slides' "State Space LLMs").

**The continuous view.** A state x(t) of N numbers (N is the *state size*) follows a linear ODE driven by one
input signal u(t), and is read out as one output y(t):

    x'(t) = A x(t) + B u(t),        y(t) = C x(t) + D u(t)

A (N x N) says how the state decays and turns on its own, B (N) how the input enters it, C (N) how the output
reads it, and D (a number) is a direct path from input to output (a skip connection).

**The recurrent view.** A sequence u_0, u_1, ... is the signal sampled every Delta (the step size, `dt` in code).
Integrating the ODE over one step gives a recurrence with new matrices A_bar, B_bar (`discretize`: three rules,
ZOH, bilinear, Euler, each derived there):

    x_k = A_bar x_{k-1} + B_bar u_k,    y_k = C x_k + D u_k         (x_{-1} = 0)

`scan` runs it: one step per token, a state of N numbers carried along. Memory O(N) whatever T is; that is how a
state-space model decodes (`step`), in place of attention's KV cache which grows with T.

**The convolutional view.** Unroll the recurrence: x_k = sum_{j <= k} A_bar^(k-j) B_bar u_j, so

    y_k = sum_{j <= k} K_{k-j} u_j + D u_k,     K = (C B_bar, C A_bar B_bar, C A_bar^2 B_bar, ...)

a causal convolution of u with the kernel K (`kernel`). Training sees the whole sequence at once, so it computes
K once and convolves by FFT in O(T log T) (`causal_conv_fft`), with no sequential loop.

**Diagonal A.** If A = V Lambda V^-1, the state x~ = V^-1 x follows the same system with A~ = Lambda, B~ = V^-1 B,
C~ = C V, and the output is unchanged. So a diagonalisable A loses nothing when taken diagonal, and then everything
is elementwise: N independent one-number systems x_n' = a_n x_n + b_n u. A real A has complex eigenvalues in
conjugate pairs (a, conj(a)) whose states and contributions to y are conjugate too; keeping one of each pair and
taking y = 2 Re(sum_n c_n x_n) + D u, N/2 complex numbers hold the N real states (S4D's trick).

Shapes, for the diagonal functions: A, B, C, A_bar, B_bar are (..., N), the diagonal entries, one row per channel;
a signal u or y is (..., T), time last; leading dimensions broadcast (the layer uses (batch, d, T) signals with
(d, N) systems: d channels, each its own one-input, one-output system).

**The layer** (`SSM`, a token mixer like attention): S4D (Gu et al. 2022, "On the parameterization and
initialization of diagonal state space models") with Mamba's gate:

    u, z = split(x W_in)           (B, T, d) -> two (B, T, d)
    y    = SSM_c(u_c) per channel c, each with its own diagonal A, C, D and step size Delta_c
    out  = (y * SiLU(z)) W_out     (B, T, d)

kind="selective" (Mamba, Gu & Dao 2023) makes Delta, B and C functions of the current token; then A_bar and B_bar
change at every step, no single kernel K exists, and it runs the scan (see `SSM`). Both are kept simple on purpose:
no short convolution before the SSM, no parallel (associative) scan, no hardware-aware kernel; the math is the
papers', the speed is not.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import DecodingState

METHODS = ("zoh", "bilinear", "euler")
KINDS = ("s4d", "selective")
DT_MIN, DT_MAX = 1e-3, 1e-1          # the range the layer's step sizes start in (S4D's defaults)


# ------------------------------------------------------------------------------------------------ discretisation

def phi1(z: torch.Tensor) -> torch.Tensor:
    """(e^z - 1) / z, with its limit 1 at z = 0. expm1 keeps the digits that e^z - 1 would lose for small z (by
    cancellation); the division by a z that may be 0 is done on a safe copy, so no NaN reaches the gradient."""
    zero = z == 0
    safe = torch.where(zero, torch.ones_like(z), z)
    return torch.where(zero, torch.ones_like(z), torch.expm1(safe) / safe)


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def check_dt(dt) -> None:
    """A step given as a number must be > 0. (A tensor of steps is the layer's, positive by construction: checking
    its values would make a GPU wait for the answer at every forward.)"""
    if isinstance(dt, (int, float)) and not dt > 0:
        raise ValueError(f"the step size dt must be > 0, got {dt}")


def discretize(A: torch.Tensor, B: torch.Tensor, dt, method: str = "zoh") -> tuple[torch.Tensor, torch.Tensor]:
    """(A_bar, B_bar) of the diagonal system x' = A x + B u (A, B: (..., N), real or complex) for steps of dt (a
    number, or a tensor that broadcasts against A, e.g. (d, 1) for one step per channel).

    Over one step of length dt, starting from x(t_{k-1}) = x_{k-1}, the ODE's exact solution is

        x(t_k) = e^(dt A) x_{k-1} + integral_0^dt e^(s A) B u(t_k - s) ds

    The three rules differ in how they treat that integral and the decay:

    * "zoh", zero-order hold: u is held at u_k for the whole step, so the integral is (e^(dt A) - I) A^-1 B u_k:
        A_bar = e^(dt A),   B_bar = (e^(dt A) - 1) / A * B   (elementwise; = dt B in the limit A -> 0).
      Exact for an input that is constant over each step; |A_bar| = e^(dt Re A) < 1 whenever Re A < 0.
    * "bilinear" (Tustin; the trapezoid rule): x_k - x_{k-1} = dt/2 A (x_k + x_{k-1}) + dt B u_k; solve for x_k:
        A_bar = (1 + dt A / 2) / (1 - dt A / 2),   B_bar = dt B / (1 - dt A / 2).
      Second order; |A_bar| < 1 whenever Re A < 0, for every dt (the left half-plane maps into the unit disc).
    * "euler" (forward Euler): x_k = x_{k-1} + dt (A x_{k-1} + B u_k):
        A_bar = 1 + dt A,   B_bar = dt B.
      First order, and stable only while |1 + dt A| < 1, i.e. dt < 2 |Re A| / |A|^2: a fast-turning mode (large
      |Im A|) needs a tiny step. That is why the layer uses ZOH.
    """
    check_method(method)
    check_dt(dt)
    try:
        torch.broadcast_shapes(A.shape, B.shape, torch.as_tensor(dt).shape)
    except RuntimeError:
        raise ValueError(f"A {tuple(A.shape)}, B {tuple(B.shape)} and dt {tuple(torch.as_tensor(dt).shape)} must "
                         "broadcast: the diagonal entries (..., N), and dt a number or e.g. (d, 1)") from None
    z = dt * A
    if method == "zoh":
        return torch.exp(z), dt * phi1(z) * B                  # (e^z - 1)/A = dt (e^z - 1)/z
    if method == "bilinear":
        return (1 + z / 2) / (1 - z / 2), dt * B / (1 - z / 2)
    return 1 + z, dt * B


def discretize_dense(A: torch.Tensor, B: torch.Tensor, dt: float, method: str = "zoh"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """`discretize` for a full matrix A (N, N) and B (N,) or (N, M), by the same three rules, with matrix exponent
    and inverses: zoh A_bar = e^(dt A), B_bar = A^-1 (e^(dt A) - I) B; bilinear A_bar = (I - dt/2 A)^-1 (I + dt/2 A),
    B_bar = (I - dt/2 A)^-1 dt B; euler A_bar = I + dt A, B_bar = dt B.

    ZOH without inverting A (which may be singular): the exponent of the block matrix dt [[A, B], [0, 0]] is
    [[A_bar, B_bar], [0, I]], since its series sums dt^k [[A^k, A^(k-1) B], [0, 0]] / k!."""
    check_method(method)
    check_dt(dt)
    N = A.shape[-1]
    if A.dim() != 2 or A.shape[0] != N or B.dim() not in (1, 2) or B.shape[0] != N:
        raise ValueError(f"discretize_dense needs A (N, N) and B (N,) or (N, M), got {tuple(A.shape)} and "
                         f"{tuple(B.shape)}")
    column = B.dim() == 1
    B = B[:, None] if column else B
    I = torch.eye(N, dtype=A.dtype, device=A.device)
    if method == "zoh":
        block = torch.zeros(N + B.shape[1], N + B.shape[1], dtype=torch.promote_types(A.dtype, B.dtype),
                            device=A.device)
        block[:N, :N], block[:N, N:] = A, B
        E = torch.linalg.matrix_exp(dt * block)
        A_bar, B_bar = E[:N, :N], E[:N, N:]
    elif method == "bilinear":
        A_bar = torch.linalg.solve(I - dt / 2 * A, I + dt / 2 * A)
        B_bar = torch.linalg.solve(I - dt / 2 * A, dt * B)
    else:
        A_bar, B_bar = I + dt * A, dt * B
    return A_bar, B_bar[:, 0] if column else B_bar


def along_time(D):
    """D per channel (...) as (..., 1), to scale signals (..., T); a plain number stays as it is (exact)."""
    return D[..., None] if torch.is_tensor(D) else D


def step_response(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D, t: torch.Tensor) -> torch.Tensor:
    """The continuous system's exact output y(t) for the input u = 1 from x(0) = 0 (diagonal A, B, C: (..., N);
    times t (T,)): x_n(t) = (e^(a_n t) - 1) / a_n * b_n = t phi1(a_n t) b_n, y(t) = sum_n c_n x_n(t) + D. The
    reference the discretisations converge to (lesson 13 measures how fast)."""
    x = t * phi1(A[..., None] * t) * B[..., None]               # (..., N, T)
    return (C[..., None] * x).sum(-2) + along_time(D)


# ------------------------------------------------------------------------------------- the recurrent view

def step(A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor, D, x: torch.Tensor, u: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the recurrence, for a state x (..., N) and one input u (...): returns the new state
    x' = A_bar x + B_bar u and its output y = C x' + D u (...). What decoding does per token."""
    x = A_bar * x + B_bar * u[..., None]
    return x, (C * x).sum(-1) + D * u


def scan(A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor, D, u: torch.Tensor,
         x: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent view: `step` over the inputs u (..., T) in order, from the state x (None: zeros). Returns the
    outputs y (..., T) and the last state, (..., N), from which a later call continues. A plain loop: T
    sequential steps, the reference the convolution must match, and what a cached decoder runs on new tokens."""
    if u.dim() < 1:
        raise ValueError(f"u must be a signal (..., T), got a tensor of shape {tuple(u.shape)}")
    if x is None:
        shape = torch.broadcast_shapes(A_bar.shape, B_bar.shape, (*u.shape[:-1], 1))
        x = torch.zeros(shape, dtype=torch.promote_types(torch.promote_types(A_bar.dtype, B_bar.dtype), u.dtype),
                        device=u.device)
    ys = []
    for k in range(u.shape[-1]):
        x, y = step(A_bar, B_bar, C, D, x, u[..., k])
        ys.append(y)
    if not ys:                                                   # T = 0: no outputs, the state as it was
        return torch.zeros((*x.shape[:-1], 0), dtype=(C * x).dtype, device=u.device), x
    return torch.stack(ys, -1), x


def chunked_scan(log_a: torch.Tensor, bu: torch.Tensor, x: torch.Tensor, chunk: int = 16
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every state of the recurrence x_k = a_k x_(k-1) + bu_k (elementwise), for real decays a_k = exp(log_a_k)
    that change from step to step (the selective layer's): log_a, bu (B, T, ...), x (B, ...) the state before
    the first step. Returns all states (B, T, ...) and the last one.

    `scan` takes T small sequential steps. Unrolled, the state at step k of a chunk that starts from x is

        x_k = exp(S_k) x + sum_(j <= k) exp(S_k - S_j) bu_j,      S_k = log a_1 + ... + log a_k,

    so within a chunk of L steps every state is one masked (L x L) weighted sum: no loop. Only the chunks run in
    order, each starting from the last state of the one before: T / L sequential steps instead of T, for L times
    the arithmetic per step (L x L weights instead of L). The decay from j to k is formed as exp(S_k - S_j), a
    difference of sums that is <= 0, never as a ratio of products, which would underflow to 0 / 0 within a
    few hundred strongly decaying steps. Mamba-2's chunked "SSD" algorithm is this idea made fast on a GPU. On
    a CPU the extra arithmetic costs more than the loop's overhead saves (benchmarks/scan_bench.py)."""
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of steps, got {chunk}")
    states = []
    for log_a_c, bu_c in zip(log_a.split(chunk, 1), bu.split(chunk, 1)):        # split: one backward, not T/L
        S = log_a_c.cumsum(1)                                                     # (B, L, ...)
        L = S.shape[1]
        later = torch.ones(L, L, dtype=torch.bool, device=S.device).tril()          # j <= k
        later = later.view(1, L, L, *[1] * (S.dim() - 2))
        gaps = (S[:, :, None] - S[:, None, :]).masked_fill(~later, float("-inf"))    # (B, L_k, L_j, ...)
        inside = (gaps.exp() * bu_c[:, None]).sum(2)                               # what this chunk's inputs add
        chunk_states = S.exp() * x[:, None] + inside
        x = chunk_states[:, -1]
        states.append(chunk_states)
    if not states:                                                                # T = 0
        return bu.new_zeros((bu.shape[0], 0, *x.shape[1:])), x
    return torch.cat(states, 1), x


# -------------------------------------------------------------------------------- the convolutional view

def kernel(A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor, T: int) -> torch.Tensor:
    """K_k = C A_bar^k B_bar = sum_n c_n a_bar_n^k b_bar_n for k = 0 .. T-1: (..., T).

    For diagonal A_bar the powers form a Vandermonde matrix (N, T), each entry computed directly as a_bar^k rather
    than by T - 1 repeated products, so the error does not pile up step after step. A complex a_bar^k is taken in
    polar form, |a_bar|^k at the angle k arg(a_bar): real powers, a product and a cosine and sine, about ten times
    faster on a CPU than PyTorch's complex power (which builds it from complex logarithms and exponentials; it
    dominated the whole convolutional view, FFT included), and exact at a_bar = 0 (0^0 = 1). Cost: N T products
    per channel, once per sequence (not per token)."""
    if not isinstance(T, int) or T < 0:
        raise ValueError(f"T must be an int >= 0, got {T!r}")
    k = torch.arange(T, device=A_bar.device, dtype=A_bar.real.dtype)
    if A_bar.is_complex():                                       # (..., N, T): the Vandermonde matrix
        powers = torch.polar(A_bar.abs()[..., None] ** k, A_bar.angle()[..., None] * k)
    else:
        powers = A_bar[..., None] ** k
    return ((C * B_bar)[..., None] * powers).sum(-2)


def causal_conv_fft(u: torch.Tensor, K: torch.Tensor, D=0.0) -> torch.Tensor:
    """y_k = sum_{j <= k} K_{k-j} u_j + D u_k for u (..., T) and K (..., T) (leading dimensions broadcast; D a
    number or per channel, (...)), in O(T log T) by the FFT.

    The FFT multiplies *circular* convolutions: with length n, the sum wraps around, so output k would also collect
    K_{k-j+n} u_j for j > k, the future. Padding both to n = 2T leaves zeros where the wrap lands (k - j + n >= T+1
    for every j <= T-1, where K is padded with zeros), so the first T outputs are exactly the causal convolution."""
    T = u.shape[-1]
    if K.shape[-1] != T:
        raise ValueError(f"the kernel K must have one entry per time step: K {tuple(K.shape)} for u {tuple(u.shape)}")
    skip = along_time(D) * u
    if u.numel() == 0:                                           # no steps, or no sequences (the FFT refuses)
        return skip
    n = 2 * T
    if u.is_complex() or K.is_complex():
        y = torch.fft.ifft(torch.fft.fft(u, n) * torch.fft.fft(K, n), n)[..., :T]
    else:
        y = torch.fft.irfft(torch.fft.rfft(u, n) * torch.fft.rfft(K, n), n)[..., :T]
    return y + skip


# --------------------------------------------------------------------------------------------- the layer

class SSMState(DecodingState):
    """One SSM layer's decoding state: the state x, (B, d, N/2) complex for kind="s4d" or (B, d, N) real for
    "selective" (allocated on first use), and `length`, the tokens seen (the model starts positions there). Its
    size is fixed: a thousand tokens later it holds the same d N numbers, where a KV cache holds 2 T H_kv d_h."""

    def __init__(self, max_len: int | None = None):
        # max_len is taken for the mixers' common `new_cache(max_len)`; nothing here grows with it (the model's
        # context still limits the sequence), so the state has no max_len of its own
        super().__init__(None)
        self.x: torch.Tensor | None = None

    def batch(self) -> int | None:
        """How many sequences the state holds (None while empty)."""
        return None if self.x is None else self.x.shape[0]

    def nbytes(self) -> int:
        """Memory held by the state, in bytes: constant in T."""
        return 0 if self.x is None else self.x.nelement() * self.x.element_size()


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """The x with softplus(x) = log(1 + e^x) = y > 0: x = y + log(1 - e^-y)."""
    return y + torch.log(-torch.expm1(-y))


class SSM(nn.Module):
    """The state-space token mixer: (B, T, d) -> (B, T, d), every channel its own diagonal SSM of state size N.

    kind="s4d" (S4D-Lin). Per channel c: N/2 complex modes a_n = -exp(log_neg_real) + i imag, so Re a < 0 for any
    value of the parameters (a stable system can never be trained into an unstable one); step size
    Delta_c = exp(log_dt_c), log_dt drawn uniformly in [log 1e-3, log 1e-1] so the channels start with memories
    from ~20 to ~2000 steps (1 / (Delta |Re a|)); ZOH; C complex (d, N/2), drawn with unit variance; B = 1 (only the
    products c_n b_n reach y in a diagonal system, so a learned B would be redundant with C); D = 1. Init: S4D-Lin,
    a_n = -1/2 + i pi n. HiPPO-LegS's matrix (the one that makes the state an optimal running summary of the past)
    is a normal matrix plus a low-rank one; the normal part's eigenvalues all have real part -1/2, and S4D-Lin keeps
    that and replaces their imaginary parts by pi n, evenly spread like Fourier frequencies (no eigenvalues to
    compute, as good as LegS's in S4D's experiments): the N/2 modes are damped oscillators from slow to fast.
    Training and a forward without a cache use the kernel and the FFT; with a cache (`new_cache`) the scan carries
    the state.

    kind="selective" (Mamba's S6, simplified: no short convolution, full-rank Delta projection). Real A (d, N) =
    -exp(A_log) with S4D-Real's init a_n = -(n + 1) (HiPPO-LegS's diagonal); per token, from u:
    Delta = softplus(u W_Delta + bias) (d,), B = u W_B (N,), C = u W_C (N,); ZOH per token. Since A_bar and B_bar now
    differ at every step, y is no longer a convolution with one kernel (K_{k-j} would depend on k and j, not on
    k - j alone), so it runs the scan, in training too.

    Both end with Mamba's gate and projections (`forward`). The A, Delta parameters are marked
    `_no_weight_decay` (the trainer does not decay them: decay would pull Re a and the frequencies toward 0).
    """

    def __init__(self, d: int, state: int = 16, kind: str = "s4d", bias: bool = False):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"ssm_kind must be one of {KINDS}, got {kind!r}")
        if kind == "s4d" and state % 2:
            raise ValueError(f"ssm_state={state} must be even for ssm_kind='s4d' (N/2 complex conjugate pairs)")
        self.kind, self.d, self.N = kind, d, state
        self.chunk: int | None = None      # kind="selective": None, a step per token; k, `chunked_scan` by k
        self.in_proj = nn.Linear(d, 2 * d, bias=bias)           # u and the gate z
        self.out_proj = nn.Linear(d, d, bias=bias)
        self.D = nn.Parameter(torch.ones(d))
        log_dt = torch.empty(d).uniform_(math.log(DT_MIN), math.log(DT_MAX))
        n = torch.arange(state, dtype=log_dt.dtype)                 # 0 .. N-1 (the default dtype)
        if kind == "s4d":
            modes = state // 2
            self.log_dt = nn.Parameter(log_dt)
            self.log_neg_real = nn.Parameter(torch.full((d, modes), math.log(0.5)))
            self.imag = nn.Parameter(math.pi * n[:modes].expand(d, modes).clone())
            self.C = nn.Parameter(torch.randn(d, modes, 2) * math.sqrt(0.5))   # (re, im): complex, variance 1
            slow = (self.log_dt, self.log_neg_real, self.imag)
        else:
            self.x_proj = nn.Linear(d, d + 2 * state, bias=False)   # Delta (before softplus), B, C from u
            self.dt_bias = nn.Parameter(inverse_softplus(log_dt.exp()))
            self.A_log = nn.Parameter(torch.log(n + 1).expand(d, state).clone())
            slow = (self.dt_bias, self.A_log)
        for p in slow:
            p._no_weight_decay = True

    def new_cache(self, max_len: int) -> SSMState:
        """An empty decoding state for this layer (it does not grow with max_len)."""
        return SSMState(max_len)

    def system(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """kind="s4d": (A_bar, B_bar, 2C), each (d, N/2) complex of `dtype`'s precision; the 2 of 2 Re(C x)."""
        real = lambda p: p.to(dtype)
        A = torch.complex(-real(self.log_neg_real).exp(), real(self.imag))
        C = torch.complex(real(self.C[..., 0]), real(self.C[..., 1]))
        A_bar, B_bar = discretize(A, torch.ones_like(A), real(self.log_dt).exp()[:, None], "zoh")
        return A_bar, B_bar, 2 * C

    def mix(self, u: torch.Tensor, cache: SSMState | None) -> torch.Tensor:
        """The SSM of every channel over u (B, T, d) -> y (B, T, d)."""
        if self.kind == "selective":
            return self.selective(u, cache)
        A_bar, B_bar, C2 = self.system(u.dtype)
        D = self.D.to(u.dtype)
        signal = u.transpose(1, 2)                                   # (B, d, T): time last
        if cache is None:                                            # the convolutional view
            K = kernel(A_bar, B_bar, C2, u.shape[1]).real            # 2 Re(sum_n c_n a_bar_n^k b_bar_n): (d, T)
            return causal_conv_fft(signal, K, D).transpose(1, 2)
        y, cache.x = scan(A_bar, B_bar, C2, D, signal, cache.x)      # the recurrent view
        return y.real.transpose(1, 2)

    def selective(self, u: torch.Tensor, cache: SSMState | None) -> torch.Tensor:
        """kind="selective": Delta, B, C computed from each token, then the scan (with or without a cache): a step
        per token, or `chunked_scan` when `self.chunk` is set (equal results; on a CPU the steps are faster)."""
        dt, B, C = self.x_proj(u).split([self.d, self.N, self.N], -1)   # (B, T, d), (B, T, N), (B, T, N)
        dt = F.softplus(dt + self.dt_bias.to(u.dtype))
        A = -self.A_log.to(u.dtype).exp()                                # (d, N)
        A_bar, B_bar = discretize(A, B[:, :, None, :], dt[..., None], "zoh")   # (B, T, d, N)
        D = self.D.to(u.dtype)
        x = cache.x if cache is not None and cache.x is not None else u.new_zeros(u.shape[0], self.d, self.N)
        if self.chunk is None:                                           # one `step` per token
            # unbind, not A_bar[:, k]: the backward of each such index writes a zero tensor as large as all T
            # steps, T^2 work in all, which made this loop ~3x slower at T = 128 (benchmarks/scan_bench.py)
            ys = []
            for a, b, c, u_k in zip(A_bar.unbind(1), B_bar.unbind(1), C[:, :, None, :].unbind(1), u.unbind(1)):
                x, y = step(a, b, c, D, x, u_k)
                ys.append(y)
            y = torch.stack(ys, 1) if ys else u.clone()
        else:
            # log A_bar = dt A exactly (ZOH): the chunks form the decay between any two tokens without dividing
            states, x = chunked_scan(dt[..., None] * A, B_bar * u[..., None], x, self.chunk)   # (B, T, d, N)
            y = (C[:, :, None, :] * states).sum(-1) + D * u
        if cache is not None:
            cache.x = x
        return y

    def forward(self, x: torch.Tensor, *, context: torch.Tensor | None = None, cache: SSMState | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d) -> (B, T, d): u, z = x W_in; y = SSM(u); (y * SiLU(z)) W_out. The gate lets each token
        choose, by its own content, how much of the sequence's memory y to pass on (H3, Mamba). The SSM itself runs
        in float32 or wider (bf16 has no FFT or complex numbers, and its 8 bits of mantissa would blur a decay
        of 1 - 1e-3 per step). Keywords as every mixer's; `context` (GCLA) and `positions` (ATM) do not apply."""
        if context is not None or positions is not None:
            raise ValueError("the SSM mixer reads neither a GCLA context nor explicit positions: the scan itself "
                             "carries the order of the tokens")
        if cache is not None:
            cache.check(x.shape[0], x.shape[1])
        u, z = self.in_proj(x).chunk(2, -1)
        wide = torch.promote_types(u.dtype, torch.float32)
        y = self.mix(u.to(wide), cache).to(z.dtype)
        if cache is not None:
            cache.length += x.shape[1]
        return self.out_proj(y * F.silu(z))
