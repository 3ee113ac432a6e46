"""Reference sampler of docs/model.md §Sampler: the tangent schedule, the time grids,
the ten solvers and ldlm's NormalGenerator, over the reference Denoiser; and the
conditioned sampler of §Conditioning (known latents, the x0 and x replacements,
from_t, RePaint's resampling), with the known latents encoded by the reference's
feature model and encoder.

Written from the formulas, independently of include/ldlm/sampling, so that the C++
parity test (tests/parity/test_sampler_parity.cpp) compares two implementations and not one
twice. Schedule values and steps are float64; the state x, the noise and every x0
prediction are float32, as the model sees them: each step reads float32 x and x0,
computes in float64 per element and rounds to float32 once.

The dumps (tests/data/sampling/<sampler>_<grid>.safetensors and
condition_<name>.safetensors) are written by
`generate.py --only sampling`, which calls write_dumps below.
"""
from __future__ import annotations

import json
import math
import os

import torch

from . import ldlm_torch as L
from .safetensors_io import read_safetensors, write_safetensors

# ------------------------------------------------------------------ NormalGenerator
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(z: int) -> int:
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _rotl(x: int, k: int) -> int:
    return ((x << k) | (x >> (64 - k))) & _M64


class NormalGenerator:
    """xoshiro256** seeded through splitmix64, Box-Muller in double (docs/model.md
    §Seeds and noise). Python's math module calls the same C library as ldlm's
    std::log/sqrt/cos/sin, which is what makes the values agree bit for bit."""

    def __init__(self, seed: int):
        self.s = [splitmix64(seed + (k + 1) * _GOLDEN) for k in range(4)]
        self.spare = None

    def next_bits(self) -> int:
        s = self.s
        result = (_rotl((s[1] * 5) & _M64, 7) * 9) & _M64
        t = (s[1] << 17) & _M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def uniform(self) -> float:
        return (self.next_bits() >> 11) * 2.0 ** -53

    def next(self) -> float:
        if self.spare is not None:
            value, self.spare = self.spare, None
            return value
        u1 = 1.0 - self.uniform()  # (0, 1], so the log is finite
        u2 = self.uniform()
        r = math.sqrt(-2.0 * math.log(u1))
        angle = 2.0 * math.pi * u2
        self.spare = r * math.sin(angle)
        return r * math.cos(angle)

    def normals(self, shape, dtype=torch.float32) -> torch.Tensor:
        """The next prod(shape) values, row-major, rounded to dtype once (as stored)."""
        n = math.prod(shape)
        return torch.tensor([self.next() for _ in range(n)], dtype=torch.float64).to(dtype).reshape(shape)


# The values docs/model.md gives reimplementers.
DOC_NORMALS = {
    0: [-0.01896499060631051, -1.3559302271143727, -0.40372109705088766, 0.23335097938940202],
    1: [-1.5452228371402943, -0.19951530557849143, -1.0136476397283942, 0.82440683748826737],
}


def check_normal_generator():
    for seed, want in DOC_NORMALS.items():
        g = NormalGenerator(seed)
        got = [g.next() for _ in want]
        assert got == want, (seed, got, want)


# ------------------------------------------------------------------ the schedule
class Schedule:
    """The VP tangent schedule with D = schedule_d. At t = 1 the closed forms are
    evaluated at their limits (tan(pi/2) is finite in floating point): alpha = 0,
    sigma = 1, sigma/alpha = inf, lambda = -inf."""

    def __init__(self, d=3.0, beta_t_clip=0.95):
        self.d, self.beta_t_clip = d, beta_t_clip

    def _dtan(self, t):
        return self.d * math.tan(math.pi * t / 2)

    def alpha(self, t):
        if t >= 1.0:
            return 0.0
        return (1.0 + self._dtan(t) ** 2) ** -0.5

    def sigma(self, t):
        if t >= 1.0:
            return 1.0
        dt = abs(self._dtan(t))
        return dt / math.sqrt(1.0 + dt * dt)

    def noise_ratio(self, t):
        return math.inf if t >= 1.0 else self._dtan(t)

    def lam(self, t):
        return -math.inf if t >= 1.0 else -math.log(self._dtan(t))

    def time_of_noise_ratio(self, r):
        return 2.0 / math.pi * math.atan(r / self.d)

    def beta(self, t):
        tan = math.tan(math.pi * min(t, self.beta_t_clip) / 2)
        d2 = self.d * self.d
        return math.pi * d2 * tan * (1.0 + tan * tan) / (1.0 + d2 * tan * tan)


# ------------------------------------------------------------------ time grids
def uniform_grid(steps, t_min):
    t = [1.0 - i * (1.0 - t_min) / steps for i in range(steps + 1)]
    t[0], t[-1] = 1.0, t_min
    return t


def lambda_grid(steps, t_min, sch: Schedule, sigma_max):
    l1, l_min = -math.log(sigma_max), -math.log(sch.noise_ratio(t_min))
    inner = [sch.time_of_noise_ratio(math.exp(-(l1 + (i - 1) / (steps - 1) * (l_min - l1)))) for i in range(1, steps)]
    return [1.0] + inner + [t_min]


def karras_grid(steps, t_min, sch: Schedule, sigma_max, rho):
    a, b = sigma_max ** (1.0 / rho), sch.noise_ratio(t_min) ** (1.0 / rho)
    inner = [sch.time_of_noise_ratio((a + (i - 1) / (steps - 1) * (b - a)) ** rho) for i in range(1, steps)]
    return [1.0] + inner + [t_min]


def time_grid(grid, steps, t_min, sch: Schedule, sigma_max=20.0, rho=7.0):
    if steps == 1:
        return [1.0, t_min]
    if grid == "uniform":
        return uniform_grid(steps, t_min)
    if grid == "lambda":
        return lambda_grid(steps, t_min, sch, sigma_max)
    if grid == "karras":
        return karras_grid(steps, t_min, sch, sigma_max, rho)
    raise ValueError(f"unknown grid {grid}")


# ------------------------------------------------------------------ solver steps
# Every step function takes float64 tensors and returns float64; sample() rounds.
# `t`, `tn` are t_i and t_{i+1}; `hist` holds the earlier steps' (h, D) pairs, newest last.

class Step:
    """The scalars of one step from t to tn."""

    def __init__(self, sch: Schedule, t, tn):
        self.t, self.tn = t, tn
        self.a, self.s = sch.alpha(t), sch.sigma(t)
        self.an, self.sn = sch.alpha(tn), sch.sigma(tn)
        self.h = sch.lam(tn) - sch.lam(t)  # +inf from t = 1
        self.e = math.exp(-self.h)         # 0 from t = 1


def score(x, D, a, s):
    eps = (x - a * D) / s
    return -eps / s


def euler_drift(kind, x, D, sch: Schedule, st: Step):
    beta = sch.beta(st.t)
    sc = score(x, D, st.a, st.s)
    weight = 1.0 if kind == "sde" else 0.5  # the reverse SDE vs. the probability-flow ODE
    return -0.5 * beta * x - weight * beta * sc


def euler_step(kind, x, D, xi, sch: Schedule, st: Step):
    dt = st.tn - st.t
    x_next = x + euler_drift(kind, x, D, sch, st) * dt
    if kind == "sde" and xi is not None:
        x_next = x_next + math.sqrt(sch.beta(st.t)) * math.sqrt(-dt) * xi
    return x_next


def exponential_update(x, Dbar, st: Step):
    """x' = (s'/s) x + a'(1 - e^-h) Dbar: the linear part exact, x0 held at Dbar."""
    return (st.sn / st.s) * x + st.an * (1.0 - st.e) * Dbar


def dpmpp_2m_estimate(D, st: Step, hist):
    """x0 extrapolated to the step's midpoint in lambda, when a usable history step exists."""
    if hist and math.isfinite(hist[-1][0]):
        h_prev, D_prev = hist[-1]
        return D + (st.h / (2.0 * h_prev)) * (D - D_prev)
    return D


def heun_corrector_weight(st: Step):
    """a'(1 - (1 - e^-h)/h), the weight of D' - D; (1 - e^-h)/h -> 0 as h -> inf."""
    ratio = 0.0 if math.isinf(st.h) else (1.0 - st.e) / st.h
    return st.an * (1.0 - ratio)


def sde_base(x, D, xi, st: Step):
    """The eta = 1 terms shared by both multistep SDE solvers (noise omitted if xi is None)."""
    E = math.exp(-2.0 * st.h)
    out = (st.sn / st.s) * st.e * x + st.an * (1.0 - E) * D
    if xi is not None:
        out = out + st.sn * math.sqrt(1.0 - E) * xi
    return out


def dpmpp_2m_sde_history(D, st: Step, hist):
    """The midpoint correction a' (1 - e^-2h)/2 (D - D_prev)/r, r = h_prev/h; none
    without a previous step of finite h (the step from t = 1 never is one)."""
    if hist and math.isfinite(hist[-1][0]):
        h_prev, D_prev = hist[-1]
        E = math.exp(-2.0 * st.h)
        return st.an * 0.5 * (1.0 - E) * (st.h / h_prev) * (D - D_prev)
    return 0.0


def multistep_history(D, st: Step, hist, h_eta, d2_weight=1.0):
    """The history term of the 3M solvers, x0 quadratic in lambda through D_{i-2},
    D_{i-1}, D_i when both previous steps have finite h; linear (k-diffusion's
    fallback) when only the last one has. h_eta = (1 + eta) h: 2h for 3M SDE, h for 3M.
    d2_weight scales the term in d2 (1 as documented; the self-test's 2 shows the order
    that weight would give)."""
    phi2, phi3 = (1.0, -0.5) if math.isinf(h_eta) else (1.0 - (1.0 - math.exp(-h_eta)) / h_eta, None)
    if phi3 is None:
        phi3 = phi2 / h_eta - 0.5
    usable1 = len(hist) >= 1 and math.isfinite(hist[-1][0])
    usable2 = usable1 and len(hist) >= 2 and math.isfinite(hist[-2][0])
    if usable2:
        (h_prev2, D_prev2), (h_prev, D_prev) = hist[-2], hist[-1]
        r0, r1 = h_prev / st.h, h_prev2 / st.h
        d1_0 = (D - D_prev) / r0
        d1_1 = (D_prev - D_prev2) / r1
        d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)
        d2 = (d1_0 - d1_1) / (r0 + r1)
        return st.an * (phi2 * d1 - d2_weight * phi3 * d2)
    if usable1:
        h_prev, D_prev = hist[-1]
        return st.an * phi2 * (D - D_prev) / (h_prev / st.h)
    return 0.0


def dpmpp_3m_sde_history(D, st: Step, hist):
    return multistep_history(D, st, hist, 2.0 * st.h)


# The weight on d2 in dpmpp-3m's history term: 1, as docs/model.md §Solvers writes it
# (and DPM-Solver++'s and k-diffusion's code). The self-test sets 2 to show the order.
DPMPP_3M_D2_WEIGHT = 1.0


def dpmpp_3m_history(D, st: Step, hist):
    """DPM-Solver++(3M), the eta = 0 member: the same fit with h in place of 2h."""
    return multistep_history(D, st, hist, st.h, DPMPP_3M_D2_WEIGHT)


# ------------------------------------------------------------------ UniPC
def unipc_phi(k, h):
    """phi_k of docs/model.md §Solvers (UniPC): phi_1 = (e^-h - 1)/(-h) - 1 and
    phi_{k+1} = phi_k/(-h) - 1/(k+1)!, i.e. phi_k = sum_{j>=1} (-h)^j / (j+k)!. The
    series for h < 1, where the recursion cancels; the recursion above."""
    if h < 1.0:
        return math.fsum((-h) ** j / math.factorial(j + k) for j in range(1, 40))
    phi = math.expm1(-h) / (-h) - 1.0
    for j in range(1, k):
        phi = phi / (-h) - 1.0 / math.factorial(j + 1)
    return phi


def unipc_b(h, n):
    """b_1 ... b_n, b_k = k! phi_k / (e^-h - 1); each is 1 at h = inf (the step from t = 1)."""
    if math.isinf(h):
        return [1.0] * n
    return [math.factorial(k) * unipc_phi(k, h) / math.expm1(-h) for k in range(1, n + 1)]


def solve_order_conditions(r, b):
    """rho with sum_k rho_k r_k^m = b_{m+1}, m = 0 ... len(r) - 1 (a Vandermonde system)."""
    n = len(r)
    A = torch.tensor([[rk ** m for rk in r] for m in range(n)], dtype=torch.float64)
    return torch.linalg.solve(A, torch.tensor(b[:n], dtype=torch.float64)).tolist()


class UniPCStep:
    """One UniPC step from t_i (x, D_i) with up to max_k usable earlier x0's: the
    predicted x' and what the corrector needs once D_{i+1} is known."""

    def __init__(self, x, D, st: Step, hist, max_k):
        K = 0
        while K < max_k and len(hist) > K and math.isfinite(hist[-1 - K][0]):
            K += 1
        lam_back = 0.0  # lambda(t_{i-k}) - lambda(t_i)
        r, D1 = [], []
        for k in range(1, K + 1):
            lam_back -= hist[-k][0]
            r.append(lam_back / st.h)
            D1.append((hist[-k][1] - D) / r[-1])
        self.c = st.an * (1.0 - st.e)
        self.base = (st.sn / st.s) * x + self.c * D
        b = unipc_b(st.h, K + 1)
        rho_p = [0.5] if K == 1 else solve_order_conditions(r, b) if K == 2 else []
        self.predicted = self.base + self.c * sum((p * d for p, d in zip(rho_p, D1)), torch.zeros_like(x))
        # The corrector: the K + 1 conditions with r_{K+1} = 1 (D_{i+1} at lambda(t_{i+1})).
        self.rho_c = solve_order_conditions(r + [1.0], b)
        self.D1, self.D = D1, D

    def corrected(self, D_next):
        terms = [p * d for p, d in zip(self.rho_c, self.D1 + [D_next - self.D])]
        return self.base + self.c * sum(terms, torch.zeros_like(self.base))


SAMPLERS = ("sde", "ode", "ddim", "heun", "dpmpp-2m", "dpmpp-2m-sde", "dpmpp-3m", "dpmpp-3m-sde", "unipc",
            "unipc-3m")
STOCHASTIC = {"sde", "dpmpp-2m-sde", "dpmpp-3m-sde"}
UNIPC_HISTORY = {"unipc": 1, "unipc-3m": 2}


# ------------------------------------------------------------------ conditioning
class Condition:
    """Known latent rows of docs/model.md §Conditioning: `rows` index the [B*T, d]
    latent matrix (b*T + t, ascending), `z` [len(rows), d] their clean latents."""

    METHODS = ("x0", "x", "both")

    def __init__(self, rows, z, method="x0", from_t=1.0, resample=0):
        assert method in self.METHODS and 0 < from_t <= 1 and resample >= 0
        assert list(rows) == sorted(set(rows)) and z.shape[0] == len(rows)
        self.rows, self.z = torch.tensor(list(rows), dtype=torch.long), z
        self.method, self.from_t, self.resample = method, from_t, resample
        self.eps = None  # the start noise at the known rows, set by sample()

    def in_x0(self, t):
        return self.method in ("x0", "both") and t <= self.from_t

    def in_x(self, t):
        return self.method in ("x", "both") and t <= self.from_t


def replace_x0(cond, D, t):
    """x0[K] <- z_known after a call at t."""
    if cond is None or not cond.in_x0(t):
        return D
    flat = D.reshape(-1, D.shape[-1]).clone()
    flat[cond.rows] = cond.z.to(D.dtype)
    return flat.reshape(D.shape)


def replace_x(cond, x, t, sch: Schedule):
    """x[K] <- alpha(t) z + sigma(t) eps at t, eps the start noise at K, in float64 rounded once."""
    if cond is None or not cond.in_x(t):
        return x
    flat = x.reshape(-1, x.shape[-1]).clone()
    flat[cond.rows] = (sch.alpha(t) * cond.z.double() + sch.sigma(t) * cond.eps.double()).to(x.dtype)
    return flat.reshape(x.shape)


# ------------------------------------------------------------------ the sampler
def sample(denoiser, sampler, times, seed, B, T, d, sch: Schedule, dtype=torch.float32, condition=None, start=None):
    """Runs the loop of docs/model.md §Self-conditioning and the result with the model
    type `dtype` (float64 only for the self-test, to see past float32's rounding),
    conditioned on `condition` (a Condition) if given. Returns, all [B, T, d] in dtype:
      "x" [x after step i], "x0" [D_i], "x0_corrector" [D'_i] (heun), "x_corrected" [x at
      t_{i+1} after UniPC's corrector], for the last attempt of each step;
      "calls" (every x0 in call order) and "states" (x after every step, and after every
      corrector, in order), which also hold resampling's every attempt;
      "sample", "denoised".
    `start`, if given, replaces the seed's first normals as x at times[0] (the self-test's
    exact x(t_0) for t_0 < 1)."""
    assert sampler in SAMPLERS, sampler
    rng = NormalGenerator(seed)
    x = rng.normals((B, T, d), dtype)
    if start is not None:
        x = start.to(dtype)
    cond = condition
    if cond is not None:
        cond.eps = x.reshape(B * T, d)[cond.rows].clone()
    recent = torch.zeros(B, T, d, dtype=dtype)
    out = {"x": [], "x0": [], "x0_corrector": [], "x_corrected": [], "calls": [], "states": []}

    def denoise(at, t, self_cond):
        tb = torch.full((B,), t, dtype=torch.float64).to(dtype)
        D = denoiser(at, tb, self_cond)
        assert D.dtype == dtype and torch.isfinite(D).all()
        D = replace_x0(cond, D, t)
        out["calls"].append(D)
        return D

    def arrive(x_new, t):
        """x reaches t after a step or a corrector: the x-space replacement, then recorded."""
        x_new = replace_x(cond, x_new.to(dtype), t, sch)
        out["states"].append(x_new)
        return x_new

    steps = len(times) - 1
    hist = []  # (h, D as float64) of the steps done
    pending = None  # UniPC's corrector of the x the last step predicted
    for i in range(steps):
        st = Step(sch, times[i], times[i + 1])
        last = i == steps - 1
        # RePaint: the step is taken 1 + R times, except from t = 1 (alpha = 0).
        attempts = 1 + (cond.resample if cond is not None and st.a > 0 else 0)
        for attempt in range(attempts):
            D32 = denoise(x, times[i], recent)
            recent = D32
            if pending is not None:
                # UniC: x_i again with D_i, the call at the predicted x_i; D_i is kept.
                x = arrive(pending.corrected(D32.double()), times[i])
                out["x_corrected"].append(x)
                pending = None
            # ξ is drawn after the step's denoiser call, and never for the final step.
            xi = rng.normals((B, T, d), dtype).double() if sampler in STOCHASTIC and not last else None
            xd, D = x.double(), D32.double()
            if sampler in ("sde", "ode"):
                xn = euler_step(sampler, xd, D, xi, sch, st)
            elif sampler == "ddim":
                xn = exponential_update(xd, D, st)
            elif sampler == "dpmpp-2m":
                xn = exponential_update(xd, dpmpp_2m_estimate(D, st, hist), st)
            elif sampler == "heun":
                x_pred = exponential_update(xd, D, st).to(dtype)
                Dc32 = denoise(x_pred, times[i + 1], D32)
                xn = exponential_update(xd, D, st) + heun_corrector_weight(st) * (Dc32.double() - D)
                recent = Dc32
                out["x0_corrector"].append(Dc32)
            elif sampler == "dpmpp-2m-sde":
                xn = sde_base(xd, D, xi, st) + dpmpp_2m_sde_history(D, st, hist)
            elif sampler == "dpmpp-3m-sde":
                xn = sde_base(xd, D, xi, st) + dpmpp_3m_sde_history(D, st, hist)
            elif sampler == "dpmpp-3m":
                xn = exponential_update(xd, D, st) + dpmpp_3m_history(D, st, hist)
            else:
                u = UniPCStep(xd, D, st, hist, UNIPC_HISTORY[sampler])
                xn = u.predicted
                pending = None if last else u  # the final x has no call after it
            x = arrive(xn, times[i + 1])
            if attempt + 1 < attempts:
                # Back from t_{i+1} to t_i with fresh noise; the corrector pending for the
                # x just left behind no longer applies.
                a, s, an, sn = st.a, st.s, st.an, st.sn
                xi_back = rng.normals((B, T, d), dtype).double()
                spread = math.sqrt(max(0.0, s * s - (a * sn / an) ** 2))
                x = ((a / an) * x.double() + spread * xi_back).to(dtype)
                pending = None
        hist.append((st.h, D))
        out["x"].append(x)
        out["x0"].append(D32)
    out["sample"], out["denoised"] = x, recent
    return out


# ------------------------------------------------------------------ dumps
# (sampler, grid, steps): every sampler on the uniform grid, the second-order
# multistep solver on the two other grids, a first-order one on Karras', and the
# third-order ones (dpmpp-3m, unipc, unipc-3m) on Karras'.
CASES = [(s, "uniform", 4 if s == "heun" else 6) for s in SAMPLERS] + [
    ("dpmpp-2m", "lambda", 6), ("dpmpp-2m", "karras", 6), ("ddim", "karras", 6),
    ("dpmpp-3m", "karras", 6), ("unipc", "karras", 6), ("unipc-3m", "karras", 6)]
SEED, B, T = 11, 2, 8
SIGMA_MAX, RHO = 20.0, 7.0

# The conditioned sampler (docs/model.md §Conditioning): (name, sampler, grid, steps,
# method, fill, resample, from_t). Every method, every KnownFill, resampling with a
# one-call and a two-call solver, UniPC's corrector under the x replacement, and from_t.
CONDITION_CASES = [
    ("x0_dpmpp-2m", "dpmpp-2m", "uniform", 4, "x0", "mask", 0, 1.0),
    ("x_unipc", "unipc", "karras", 4, "x", "pad", 0, 1.0),
    ("both_dpmpp-3m-sde", "dpmpp-3m-sde", "uniform", 4, "both", "separate", 0, 1.0),
    ("resample2_ddim", "ddim", "uniform", 3, "x", "mask", 2, 1.0),
    ("resample2_heun", "heun", "uniform", 3, "x0", "separate", 2, 1.0),
    ("from0.6_x0", "dpmpp-2m", "karras", 4, "x0", "pad", 0, 0.6),
]
# Known ids [B, T] with the mask id (V - 1 = 100 in model_small) at the free positions:
# sequence 0 a prompt and a suffix, sequence 1 three runs, one of them at no end.
MASK = -1  # replaced by the model's mask id
CONDITION_IDS = [[17, 42, 5, MASK, MASK, MASK, 63, 8],
                 [MASK, 91, MASK, MASK, 30, 74, MASK, MASK]]


def load_small_model(data_dir):
    """model_small's LDLM with its committed weights (all five modules)."""
    with open(os.path.join(data_dir, "model_small", "config.json")) as f:
        cfg = L.Config.from_json(f.read())
    weights, _ = read_safetensors(os.path.join(data_dir, "model_small", "weights.safetensors"))
    model = L.LDLM(cfg)
    model.load_state_dict({k: v.clone() for k, v in weights.items()}, strict=True)
    model.eval()
    return cfg, model


def load_small_denoiser(data_dir):
    cfg, model = load_small_model(data_dir)
    return cfg, model.denoiser


def case_name(sampler, grid):
    return f"{sampler}_{grid}"


def known_latents(model, ids, mask, pad, fill):
    """(rows, z) of docs/model.md §Conditioning, Known latents: every position whose id is
    not the mask id, rows b*T + t ascending; z encoded by the feature model and the
    encoder with the mask id (`mask`) or the pad id (`pad`) at the free positions, or
    (`separate`) each maximal run of known positions encoded alone as a sequence."""
    Bq, Tq = ids.shape
    known = ids != mask
    rows = [b * Tq + t for b in range(Bq) for t in range(Tq) if known[b, t]]
    if fill in ("mask", "pad"):
        filled = torch.where(known, ids, torch.full_like(ids, mask if fill == "mask" else pad))
        z = model.encoder(model.feature_model(filled)).reshape(Bq * Tq, -1)[rows]
        return rows, z
    pieces = []
    for b in range(Bq):
        t = 0
        while t < Tq:
            if not known[b, t]:
                t += 1
                continue
            end = t
            while end < Tq and known[b, end]:
                end += 1
            pieces.append(model.encoder(model.feature_model(ids[b:b + 1, t:end]))[0])
            t = end
    return rows, torch.cat(pieces)


def decode_tokens(model, latents, ids, mask):
    """Argmax of the decoded logits, then every known position gets its given id back;
    and each position's margin, the top logit minus the runner-up. model_small's
    untrained decoder has near ties (margins down to 3e-4), where float32 rounding may
    pick either id: a test compares the ids where the margin is clear."""
    logits = model.token_decoder(model.latent_decoder(latents))
    top = logits.topk(2, dim=-1).values
    tokens = torch.where(ids != mask, ids, logits.argmax(dim=-1))
    return tokens, (top[..., 0] - top[..., 1]).float()


def write_dump(data_dir, case, tensors, config):
    for k, v in tensors.items():
        assert torch.isfinite(v.double()).all(), (case, k)
    meta = {"case": f"sampling/{case}", "config": json.dumps(config, sort_keys=True),
            **{k: str(v) if not isinstance(v, float) else repr(v) for k, v in config.items()}}
    write_safetensors(os.path.join(data_dir, "sampling", case + ".safetensors"), tensors, meta)


def grid_times(grid, steps, sd, sch):
    times = time_grid(grid, steps, sd["t_min"], sch, SIGMA_MAX, RHO)
    assert times[0] == 1.0 and times[-1] == sd["t_min"]
    assert all(b < a for a, b in zip(times, times[1:])), times
    return times


def write_dumps(data_dir, want=lambda case: True):
    """tests/data/sampling/<sampler>_<grid>.safetensors and condition_<name>.safetensors
    (tests/data/README.md)."""
    check_normal_generator()
    cfg, model = load_small_model(data_dir)
    denoiser = model.denoiser
    sd = L.SAMPLING_DEFAULTS
    sch = Schedule(sd["schedule_d"], sd["beta_t_clip"])
    for sampler, grid, steps in CASES:
        case = case_name(sampler, grid)
        if not want(case):
            continue
        times = grid_times(grid, steps, sd, sch)
        with torch.no_grad():
            r = sample(denoiser, sampler, times, SEED, B, T, cfg.d_model, sch)
        tensors = {"times": torch.tensor(times, dtype=torch.float64),
                   "latents.sample": r["sample"], "latents.denoised": r["denoised"]}
        for key in ("x", "x0", "x0_corrector", "x_corrected"):
            for i, v in enumerate(r[key]):
                tensors[f"{key}.{i}"] = v
        config = {"sampler": sampler, "grid": grid, "steps": steps, "seed": SEED, "B": B, "T": T,
                  "sigma_max": SIGMA_MAX, "rho": RHO, **sd}
        write_dump(data_dir, case, tensors, config)

    mask, pad = cfg.vocab_size - 1, cfg.vocab_size - 2
    ids = torch.tensor([[mask if v == MASK else v for v in row] for row in CONDITION_IDS], dtype=torch.int64)
    assert ids.shape == (B, T) and int(ids.max()) < cfg.vocab_size
    for name, sampler, grid, steps, method, fill, resample, from_t in CONDITION_CASES:
        case = "condition_" + name
        if not want(case):
            continue
        times = grid_times(grid, steps, sd, sch)
        with torch.no_grad():
            rows, z = known_latents(model, ids, mask, pad, fill)
            cond = Condition(rows, z, method, from_t, resample)
            r = sample(denoiser, sampler, times, SEED, B, T, cfg.d_model, sch, condition=cond)
            tokens, margin = decode_tokens(model, r["sample"], ids, mask)
        tensors = {"times": torch.tensor(times, dtype=torch.float64), "ids": ids,
                   "known.rows": torch.tensor(rows, dtype=torch.int64), "known.z": z,
                   "latents.sample": r["sample"], "latents.denoised": r["denoised"], "tokens": tokens,
                   "tokens.margin": margin}
        # Flat, in order: x0.<c> after every call c, x.<e> after every step or corrector e.
        for i, v in enumerate(r["calls"]):
            tensors[f"x0.{i}"] = v
        for i, v in enumerate(r["states"]):
            tensors[f"x.{i}"] = v
        config = {"sampler": sampler, "grid": grid, "steps": steps, "seed": SEED, "B": B, "T": T,
                  "sigma_max": SIGMA_MAX, "rho": RHO, "method": method, "fill": fill, "resample": resample,
                  "from_t": from_t, "calls": len(r["calls"]), "states": len(r["states"]), **sd}
        write_dump(data_dir, case, tensors, config)


# ------------------------------------------------------------------ self-test
def gaussian_denoiser(sch: Schedule, c):
    """The exact x0 prediction E[x0 | x_t] for data x0 ~ N(0, c^2) per element."""
    def denoise(x, t, self_cond):
        tt = float(t[0])
        a, s = sch.alpha(tt), sch.sigma(tt)
        return (x.double() * (a * c * c / (a * a * c * c + s * s))).to(x.dtype)
    return denoise


def self_test():
    """Checks of the formulas that do not lean on the C++ side: the generator against
    the documented values, and on Gaussian data (where the exact marginals are known)
    the deterministic solvers converge to the probability-flow ODE's exact solution
    x(t_min) = x(1) sqrt(a^2 c^2 + s^2) at their order, and the stochastic ones
    reproduce the marginal variance a^2 c^2 + s^2.

        PYTHONPATH=tools /usr/bin/python3 -m reference.sampling    (the interpreter generate.py runs under)
    """
    check_normal_generator()
    sch, c, t_min = Schedule(), 0.5, 0.05
    den = gaussian_denoiser(sch, c)
    scale = math.sqrt(sch.alpha(t_min) ** 2 * c * c + sch.sigma(t_min) ** 2)
    x1 = NormalGenerator(3).normals((1, 1, 256), torch.float64)
    # The orders show only from several hundred steps (2M's error changes sign near 100
    # on these grids), where float32's rounding would hide them: float64 throughout.
    # The first step, from t = 1 to sigma/alpha = sigma_max, is refined by no grid; its
    # error (about c^2 / (2 sigma_max^2) relative) vanishes at sigma_max = 1e4.
    for sampler, order in (("ddim", 1), ("dpmpp-2m", 2), ("heun", 2)):
        for grid in ("uniform", "lambda", "karras"):
            errs = []
            for steps in (1280, 2560):
                times = time_grid(grid, steps, t_min, sch, sigma_max=1e4)
                r = sample(den, sampler, times, 3, 1, 1, 256, sch, torch.float64)
                errs.append(float((r["sample"] - x1 * scale).abs().max() / scale))
            rate = math.log2(errs[0] / errs[1])
            print(f"{sampler:>12} {grid:>8}: error {errs[0]:.2e} -> {errs[1]:.2e}, order {rate:.2f}")
            assert abs(rate - order) < 0.15, (sampler, grid, errs)
    # The higher orders, from t_0 < 1 with the exact x(t_0) on a uniform grid in t: from
    # t = 1 the first, unrefinable step's error (~ c^2 / (2 (sigma/alpha)(t_1)^2), i.e.
    # O(1/N^2) on the uniform grid) would mask them.
    def error_from(sampler, t0, steps):
        spread = lambda t: math.sqrt(sch.alpha(t) ** 2 * c * c + sch.sigma(t) ** 2)
        times = [t0 - (t0 - t_min) * i / steps for i in range(steps + 1)]
        times[-1] = t_min
        r = sample(den, sampler, times, 3, 1, 1, 256, sch, torch.float64, start=x1 * spread(t0))
        return float((r["sample"] - x1 * spread(t_min)).abs().max() / spread(t_min))

    global DPMPP_3M_D2_WEIGHT
    # dpmpp-3m as documented converges at order 2, not the 3 docs/model.md claims: its
    # d2 = (d1_0 - d1_1)/(r0 + r1) is h^2 x0''/2, and the quadratic's integral wants
    # -phi3 h^2 x0'', so each step errs by about alpha' h^3 x0''/12 (measured: order
    # 2.01 at 512 -> 1024 steps; at 32 -> 64 it looks like 2.5). With the term in d2
    # doubled the error falls at order 3.5-5 from 32 to 256 steps (until the first,
    # first-order step's small O(h^2) shows below 1e-7).
    for sampler, weight, low, high, steps in (("unipc", 1.0, 2.8, 3.2, 512), ("unipc-3m", 1.0, 3.8, 4.2, 1024),
                                              ("dpmpp-3m", 1.0, 1.8, 2.2, 512), ("dpmpp-3m", 2.0, 3.3, 9, 64)):
        DPMPP_3M_D2_WEIGHT = weight
        for t0 in (0.9, 0.99):
            errs = [error_from(sampler, t0, n) for n in (steps, 2 * steps)]
            rate = math.log2(errs[0] / errs[1])
            tag = f"{sampler}{'' if weight == 1.0 else ' (2 d2)'}"
            print(f"{tag:>16} from {t0}: error {errs[0]:.2e} -> {errs[1]:.2e}, order {rate:.2f}")
            assert low < rate < high, (sampler, weight, t0, errs)
    DPMPP_3M_D2_WEIGHT = 1.0
    # From t = 1 on the lambda grid, through UniPC's corrector of the infinite first step
    # (weight b_1 = 1 there).
    errs = []
    for steps in (640, 1280):
        times = time_grid("lambda", steps, t_min, sch, sigma_max=1e4)
        errs.append(float((sample(den, "unipc", times, 3, 1, 1, 256, sch, torch.float64)["sample"] - x1 * scale)
                          .abs().max() / scale))
    rate = math.log2(errs[0] / errs[1])
    print(f"{'unipc':>16} from 1, lambda: error {errs[0]:.2e} -> {errs[1]:.2e}, order {rate:.2f}")
    assert abs(rate - 3) < 0.15, errs
    # The sample at t_min lacks the final step's noise, so the marginal is checked one
    # step earlier, on x after step N-2. 20000 values: the variance's sampling error is
    # 1 %; the 100-step discretization's is at most 2 % (measured, first-order sde).
    n, steps = 20000, 100
    times = time_grid("lambda", steps, t_min, sch)
    t = times[-2]
    want = sch.alpha(t) ** 2 * c * c + sch.sigma(t) ** 2
    for sampler in ("sde", "dpmpp-2m-sde", "dpmpp-3m-sde"):
        r = sample(den, sampler, times, 5, 1, 1, n, sch, torch.float64)
        var = float(r["x"][-2].var())
        print(f"{sampler:>12}   lambda: variance at t_{steps - 1} {var:.4f}, exact {want:.4f}")
        assert abs(var / want - 1) < 0.05, (sampler, var, want)
    print("sampling self-test OK")


if __name__ == "__main__":
    torch.set_num_threads(1)
    self_test()
