"""What the Python tests share: the small configuration, the reference model with the
generator's weights written as an ldlm weights file, module inputs, and the comparison
of core/compare.hpp (|got - ref| <= atol + rtol·|ref|, reporting the worst element)."""
from __future__ import annotations

import json
import pathlib

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
DEMO_WEIGHTS = REPO / "tools" / "assets" / "ldlm-demo" / "ldlm-demo.safetensors"

# tests/data/model_small's configuration (tools/reference/generate.py): every module in
# milliseconds, max_positions 48 so that T < max_positions slices the position tables.
SMALL = dict(d_model=64, n_heads=4, head_dim=16, max_positions=48, vocab_size=101, encoder_layers=2,
             latent_decoder_layers=2, token_decoder_layers=2, token_decoder_mlp_hidden=96, denoiser_blocks=2,
             gpt2_layers=3, gpt2_feature_layers=2)
INIT_SEED = 1
B, T = 2, 37

# The C++ parity tests' bounds (tests/support/reference.hpp kFp32Dump, tests/parity/
# test_bf16_model.cpp kBf16Module): a single module at the small width, against the
# reference in fp32, and against the reference's bf16 mode (bf16 operands of every
# product, fp32 elsewhere).
TOLERANCE = {"fp32": (1e-5, 1e-5), "bf16": (6e-3, 6e-3)}

# The argument each module takes (ldlm's name, the reference's name) and its output's.
MODULE_IO = {
    "feature_model": ("ids", "tokens", "features"),
    "encoder": ("features", "features", "latents"),
    "latent_decoder": ("z", "latents", "hidden"),
    "token_decoder": ("h", "hidden", "logits"),
    "denoiser": ("x_t", "x_t", "x0"),
}


def module_inputs(module: str, seed: int = 0) -> dict:
    """The inputs of `module` by the reference's names, as numpy arrays."""
    rng = np.random.default_rng(seed)
    d = SMALL["d_model"]
    if module == "feature_model":
        return {"tokens": rng.integers(0, SMALL["vocab_size"], (B, T), dtype=np.int64)}
    if module == "denoiser":
        return {"x_t": rng.standard_normal((B, T, d), dtype=np.float32), "t": np.float32([0.3, 0.85]),
                "self_cond": rng.standard_normal((B, T, d), dtype=np.float32)}
    return {MODULE_IO[module][1]: rng.standard_normal((B, T, d), dtype=np.float32)}


def reference_model(config: dict = SMALL, seed: int = INIT_SEED):
    """The PyTorch reference LDLM with the generator's weights (tools/reference/ldlm_init.py)."""
    from reference import ldlm_init, ldlm_torch

    model = ldlm_torch.LDLM(ldlm_torch.Config(**config))
    ldlm_init.init_module(model, "", seed)
    return model.eval()


def write_weights(model, path, edit=None) -> str:
    """The reference's state dict as an ldlm weights file, its configuration in the metadata;
    `edit(state)` may change the tensors first (a planted bug)."""
    from reference import safetensors_io

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if edit:
        edit(state)
    safetensors_io.write_safetensors(str(path), state, {"ldlm.config": json.dumps(model.cfg.to_dict())})
    return str(path)


def reference_output(model, module: str, inputs: dict, precision: str) -> np.ndarray:
    import torch
    from reference import ldlm_torch

    torch_inputs = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with torch.no_grad():
        if precision == "bf16":
            with ldlm_torch.bf16_operands():
                out = model.forward_module(module, **torch_inputs)
        else:
            out = model.forward_module(module, **torch_inputs)
    return out[MODULE_IO[module][2]].numpy()


def ldlm_output(model, module: str, inputs: dict) -> np.ndarray:
    ordered = [inputs[k] for k in (("x_t", "t", "self_cond") if module == "denoiser" else (MODULE_IO[module][1],))]
    return getattr(model, module)(*ordered, threads=2)


def comparison(got: np.ndarray, ref: np.ndarray, atol: float, rtol: float, what: str) -> tuple[bool, str]:
    """(every element within atol + rtol·|ref|, a report naming the worst element)."""
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, reference {ref.shape}"
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    error = np.abs(got64 - ref64)
    error[np.isnan(error)] = np.inf
    allowed = atol + rtol * np.abs(ref64)
    excess = error - allowed
    failures = int((excess > 0).sum())
    worst = np.unravel_index(int(np.argmax(excess)), got.shape)
    report = (f"{what}: {failures} of {got.size} elements outside |got - ref| <= {atol:g} + {rtol:g}·|ref|; "
              f"worst at {list(map(int, worst))}: got {got64[worst]:.9g}, ref {ref64[worst]:.9g}, "
              f"error {error[worst]:.3g}, allowed {allowed[worst]:.3g}; max error {error.max():.3g}")
    return failures == 0, report
