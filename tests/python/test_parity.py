"""Live parity of every module of ldlm.load_model with tools/reference's PyTorch modules,
on the same generator weights, in fp32 and bf16, with the C++ parity tests' tolerances
(parity_support.TOLERANCE), and the planted bugs that this comparison must catch."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the live parity tests need PyTorch (Debian: python3-torch)")

import ldlm  # noqa: E402
from parity_support import (MODULE_IO, TOLERANCE, comparison, ldlm_output, module_inputs,  # noqa: E402
                            reference_model, reference_output, write_weights)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def reference():
    return reference_model()


@pytest.fixture(scope="module")
def weights(reference, tmp_path_factory):
    return write_weights(reference, tmp_path_factory.mktemp("parity") / "small.safetensors")


@pytest.fixture(scope="module")
def models(weights):
    return {p: ldlm.load_model(weights, precision=p) for p in TOLERANCE}


@pytest.mark.parametrize("precision", sorted(TOLERANCE))
@pytest.mark.parametrize("module", list(MODULE_IO))
def test_module_matches_reference(reference, models, module, precision):
    inputs = module_inputs(module)
    got = ldlm_output(models[precision], module, inputs)
    ref = reference_output(reference, module, inputs, precision)
    ok, report = comparison(got, ref, *TOLERANCE[precision], f"ldlm.{module} ({precision})")
    print(report)
    assert ok, report


# Planted bugs: each must take a module out of its tolerance. If one of these passes,
# the parity test above could not see that bug.

def test_transposed_weight_fails_parity(reference, tmp_path):
    name = "denoiser.blocks.0.attn_out.weight"  # square, so a transposed copy still loads

    def transpose(state):
        state[name] = state[name].t().contiguous()

    model = ldlm.load_model(write_weights(reference, tmp_path / "transposed.safetensors", transpose))
    inputs = module_inputs("denoiser")
    ok, report = comparison(ldlm_output(model, "denoiser", inputs),
                            reference_output(reference, "denoiser", inputs, "fp32"), *TOLERANCE["fp32"],
                            "denoiser with a transposed weight")
    print(report)
    assert not ok, "a transposed attn_out weight passed the parity check: " + report


def test_dropped_rotary_fails_parity(reference, models, monkeypatch):
    from reference import ldlm_torch

    monkeypatch.setattr(ldlm_torch, "apply_rotary", lambda x, base, interleaved=False: x)
    for module in ("denoiser", "token_decoder"):
        inputs = module_inputs(module)
        ok, report = comparison(ldlm_output(models["fp32"], module, inputs),
                                reference_output(reference, module, inputs, "fp32"), *TOLERANCE["fp32"],
                                f"{module} against a reference without rotary")
        print(report)
        assert not ok, "a reference without rotary passed the parity check: " + report


def test_comparison_reports_the_worst_element():
    ref = np.zeros((1, 2, 3), dtype=np.float32)
    got = ref.copy()
    got[0, 1, 2] = 1.0
    ok, report = comparison(got, ref, 1e-5, 1e-5, "planted")
    assert not ok
    assert "worst at [0, 1, 2]" in report and "1 of 6" in report
