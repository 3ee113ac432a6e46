"""Reference sampler of docs/model.md §Sampler: the tangent schedule, the time grids,
the seven solvers and ldlm's NormalGenerator, over the reference Denoiser.

Written from the formulas, independently of include/ldlm/sampling, so that the C++
parity test (tests/test_sampler_parity.cpp) compares two implementations and not one
twice. Schedule values and steps are float64; the state x, the noise and every x0
prediction are float32, as the model sees them: each step reads float32 x and x0,
computes in float64 per element and rounds to float32 once.

The dumps (tests/data/sampling/<sampler>_<grid>.safetensors) are written by
`generate.py --only sampling`, which calls write_dumps below.
"""
from __future__ import annotations

import json
import math
import os

import torch

import ldlm_torch as L
from safetensors_io import read_safetensors, write_safetensors

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


def phi2_phi3(h):
    if math.isinf(h):
        return 1.0, -0.5
    phi2 = 1.0 - (1.0 - math.exp(-2.0 * h)) / (2.0 * h)
    return phi2, phi2 / (2.0 * h) - 0.5


def dpmpp_3m_sde_history(D, st: Step, hist):
    """x0 quadratic in lambda through D_{i-2}, D_{i-1}, D_i when both previous steps
    have finite h; linear (k-diffusion's fallback) when only the last one has."""
    phi2, phi3 = phi2_phi3(st.h)
    usable1 = len(hist) >= 1 and math.isfinite(hist[-1][0])
    usable2 = usable1 and len(hist) >= 2 and math.isfinite(hist[-2][0])
    if usable2:
        (h_prev2, D_prev2), (h_prev, D_prev) = hist[-2], hist[-1]
        r0, r1 = h_prev / st.h, h_prev2 / st.h
        d1_0 = (D - D_prev) / r0
        d1_1 = (D_prev - D_prev2) / r1
        d1 = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1)
        d2 = (d1_0 - d1_1) / (r0 + r1)
        return st.an * (phi2 * d1 - phi3 * d2)
    if usable1:
        h_prev, D_prev = hist[-1]
        return st.an * phi2 * (D - D_prev) / (h_prev / st.h)
    return 0.0


SAMPLERS = ("sde", "ode", "ddim", "heun", "dpmpp-2m", "dpmpp-2m-sde", "dpmpp-3m-sde")
STOCHASTIC = {"sde", "dpmpp-2m-sde", "dpmpp-3m-sde"}


# ------------------------------------------------------------------ the sampler
def sample(denoiser, sampler, times, seed, B, T, d, sch: Schedule, dtype=torch.float32):
    """Runs the loop of docs/model.md §Self-conditioning and the result with the model
    type `dtype` (float64 only for the self-test, to see past float32's rounding).
    Returns {"x": [x after step i], "x0": [D_i], "x0_corrector": [D'_i] (heun),
    "sample", "denoised"}, all [B, T, d] in dtype."""
    assert sampler in SAMPLERS, sampler
    rng = NormalGenerator(seed)
    x = rng.normals((B, T, d), dtype)
    recent = torch.zeros(B, T, d, dtype=dtype)

    def denoise(at, t, self_cond):
        tb = torch.full((B,), t, dtype=torch.float64).to(dtype)
        out = denoiser(at, tb, self_cond)
        assert out.dtype == dtype and torch.isfinite(out).all()
        return out

    steps = len(times) - 1
    out = {"x": [], "x0": [], "x0_corrector": []}
    hist = []  # (h, D as float64) of the steps done
    for i in range(steps):
        st = Step(sch, times[i], times[i + 1])
        last = i == steps - 1
        D32 = denoise(x, times[i], recent)
        # ξ is drawn after the step's denoiser call, and never for the final step.
        xi = rng.normals((B, T, d), dtype).double() if sampler in STOCHASTIC and not last else None
        xd, D = x.double(), D32.double()
        recent = D32
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
        else:
            xn = sde_base(xd, D, xi, st) + dpmpp_3m_sde_history(D, st, hist)
        hist.append((st.h, D))
        x = xn.to(dtype)
        out["x"].append(x)
        out["x0"].append(D32)
    out["sample"], out["denoised"] = x, recent
    return out


# ------------------------------------------------------------------ dumps
# (sampler, grid, steps): every sampler on the uniform grid, the second-order
# multistep solver on the two other grids, and a first-order one on Karras'.
CASES = [(s, "uniform", 4 if s == "heun" else 6) for s in SAMPLERS] + [
    ("dpmpp-2m", "lambda", 6), ("dpmpp-2m", "karras", 6), ("ddim", "karras", 6)]
SEED, B, T = 11, 2, 8
SIGMA_MAX, RHO = 20.0, 7.0


def load_small_denoiser(data_dir):
    with open(os.path.join(data_dir, "model_small", "config.json")) as f:
        cfg = L.Config.from_json(f.read())
    weights, _ = read_safetensors(os.path.join(data_dir, "model_small", "weights.safetensors"))
    denoiser = L.Denoiser(cfg)
    prefix = "denoiser."
    state = {k[len(prefix):]: v.clone() for k, v in weights.items() if k.startswith(prefix)}
    denoiser.load_state_dict(state, strict=True)
    denoiser.eval()
    return cfg, denoiser


def case_name(sampler, grid):
    return f"{sampler}_{grid}"


def write_dumps(data_dir, want=lambda case: True):
    """tests/data/sampling/<sampler>_<grid>.safetensors (tests/data/README.md)."""
    check_normal_generator()
    cfg, denoiser = load_small_denoiser(data_dir)
    sd = L.SAMPLING_DEFAULTS
    sch = Schedule(sd["schedule_d"], sd["beta_t_clip"])
    for sampler, grid, steps in CASES:
        case = case_name(sampler, grid)
        if not want(case):
            continue
        times = time_grid(grid, steps, sd["t_min"], sch, SIGMA_MAX, RHO)
        assert times[0] == 1.0 and times[-1] == sd["t_min"]
        assert all(b < a for a, b in zip(times, times[1:])), times
        with torch.no_grad():
            r = sample(denoiser, sampler, times, SEED, B, T, cfg.d_model, sch)
        tensors = {"times": torch.tensor(times, dtype=torch.float64),
                   "latents.sample": r["sample"], "latents.denoised": r["denoised"]}
        for key in ("x", "x0", "x0_corrector"):
            for i, v in enumerate(r[key]):
                tensors[f"{key}.{i}"] = v
        for k, v in tensors.items():
            assert torch.isfinite(v).all(), (case, k)
        config = {"sampler": sampler, "grid": grid, "steps": steps, "seed": SEED, "B": B, "T": T,
                  "sigma_max": SIGMA_MAX, "rho": RHO, **sd}
        meta = {"case": f"sampling/{case}", "config": json.dumps(config, sort_keys=True),
                **{k: str(v) if not isinstance(v, float) else repr(v) for k, v in config.items()}}
        write_safetensors(os.path.join(data_dir, "sampling", case + ".safetensors"), tensors, meta)


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

        python3 tools/reference/sampling.py    (the interpreter generate.py runs under)
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
