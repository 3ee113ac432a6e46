"""ldlm.load_model's modules on numpy: zero copy in and out, and every bad input named
(module, argument, expected, found). On the demo model's weights file: no PyTorch needed."""
import ctypes

import numpy as np
import pytest

import ldlm
from parity_support import DEMO_WEIGHTS


@pytest.fixture(scope="module")
def model():
    return ldlm.load_model(str(DEMO_WEIGHTS))


def activation(model, B=2, T=5, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, model.config.d_model), dtype=np.float32)


def address(a):
    return a.__array_interface__["data"][0]


def capsule_pointer(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, None)


def calls(model):
    """Each module's call on fresh inputs: (name, inputs by argument, output)."""
    d, V = model.config.d_model, model.config.vocab_size
    ids = np.arange(10, dtype=np.int64).reshape(2, 5)
    x, s = activation(model), activation(model, seed=1)
    t = np.float32([0.2, 0.9])
    yield "feature_model", {"ids": ids}, model.feature_model(ids), d
    yield "encoder", {"features": x}, model.encoder(x), d
    yield "latent_decoder", {"z": x}, model.latent_decoder(z=x), d
    yield "token_decoder", {"h": x}, model.token_decoder(x), V
    yield "denoiser", {"x_t": x, "t": t, "self_cond": s}, model.denoiser(x, t, s), d


def test_inputs_are_read_in_place_and_outputs_owned_by_cpp(model):
    for name, inputs, out, width in calls(model):
        read = model._last_input_addresses
        for argument, array in inputs.items():
            assert read[argument] == address(array), f"{name}: '{argument}' was not read in place"
        assert out.shape == (2, 5, width) and out.dtype == np.float32 and out.flags.c_contiguous, name
        assert not out.flags.owndata and type(out.base).__name__ == "PyCapsule", f"{name}: output copied"
        assert capsule_pointer(out.base) == address(out), f"{name}: the array's memory is not the C++ buffer"


def test_a_contiguous_view_is_read_in_place(model):
    x = activation(model, B=3)
    view = x[1:]  # C-contiguous, at an offset into x's buffer
    model.encoder(view)
    assert model._last_input_addresses["features"] == address(view) != address(x)


def test_output_outlives_model_and_is_writable(model):
    m = ldlm.load_model(str(DEMO_WEIGHTS), modules=["encoder"])
    out = m.encoder(activation(m))
    del m
    out += 1  # the buffer belongs to the array now
    assert np.isfinite(out).all()


def test_same_input_same_output(model):
    x = activation(model)
    np.testing.assert_array_equal(model.encoder(x, threads=1), model.encoder(x, threads=2))


def test_self_cond_none_is_zeros(model):
    x, t = activation(model), np.float32([0.5, 0.5])
    np.testing.assert_array_equal(model.denoiser(x, t), model.denoiser(x, t, np.zeros_like(x)))


def error_of(call, kind=ldlm.Error):
    with pytest.raises(kind) as raised:
        call()
    assert isinstance(raised.value, ldlm.Error)
    return str(raised.value)


def test_wrong_dtype_names_module_argument_expected_and_found(model):
    message = error_of(lambda: model.encoder(activation(model).astype(np.float64)), ldlm.InvalidArgument)
    assert "ldlm.encoder" in message and "'features'" in message and "float32" in message and "float64" in message
    message = error_of(lambda: model.feature_model(np.zeros((1, 4), dtype=np.int32)), ldlm.InvalidArgument)
    assert "ldlm.feature_model" in message and "'ids'" in message and "int64" in message and "int32" in message


def test_non_contiguous_names_the_strides(model):
    x = np.ascontiguousarray(activation(model, B=2, T=2).transpose(1, 0, 2))
    message = error_of(lambda: model.latent_decoder(x.transpose(1, 0, 2)), ldlm.InvalidArgument)
    assert "ldlm.latent_decoder" in message and "'z'" in message and "C-contiguous" in message
    assert "strides [" in message and "shape [2, 2, 128]" in message


def test_wrong_shape_names_expected_and_found(model):
    d = model.config.d_model
    message = error_of(lambda: model.token_decoder(np.zeros((2, 5, d + 1), np.float32)), ldlm.ShapeError)
    assert "ldlm.token_decoder" in message and "'h'" in message and f"[*, *, {d}]" in message
    assert f"[2, 5, {d + 1}]" in message
    message = error_of(lambda: model.encoder(np.zeros((5, d), np.float32)), ldlm.ShapeError)
    assert f"[5, {d}]" in message
    too_long = model.config.max_positions + 1
    message = error_of(lambda: model.encoder(np.zeros((1, too_long, d), np.float32)), ldlm.ShapeError)
    assert "max_positions" in message and str(too_long) in message
    message = error_of(lambda: model.encoder(np.zeros((0, 3, d), np.float32)), ldlm.ShapeError)
    assert "B >= 1" in message


def test_denoiser_arguments(model):
    x = activation(model)
    message = error_of(lambda: model.denoiser(x, np.float32([0.5]), x), ldlm.ShapeError)
    assert "ldlm.denoiser" in message and "'t'" in message and "[2]" in message and "[1]" in message
    message = error_of(lambda: model.denoiser(x, np.float32([0.5, np.nan]), x), ldlm.InvalidArgument)
    assert "'t'" in message and "non-finite" in message and "index 1" in message
    message = error_of(lambda: model.denoiser(x, np.float32([0.5, 0.5]), x[:, :4].copy()), ldlm.ShapeError)
    assert "'self_cond'" in message and "[2, 5, 128]" in message and "[2, 4, 128]" in message
    message = error_of(lambda: model.denoiser(x), ldlm.InvalidArgument)
    assert "ldlm.denoiser" in message and "missing argument 't'" in message


def test_not_an_array_and_bad_keywords(model):
    message = error_of(lambda: model.encoder([[0.0]]), ldlm.InvalidArgument)
    assert "'features'" in message and "numpy.ndarray" in message and "list" in message
    message = error_of(lambda: model.encoder(activation(model), scale=2), ldlm.InvalidArgument)
    assert "ldlm.encoder" in message and "'scale'" in message
    message = error_of(lambda: model.encoder(activation(model), threads=-1), ldlm.InvalidArgument)
    assert "threads" in message and "-1" in message
    message = error_of(lambda: model.encoder(activation(model), threads="2"), ldlm.InvalidArgument)
    assert "ldlm.encoder" in message and "threads must be an int, got str" in message


def test_ids_outside_the_vocabulary(model):
    ids = np.zeros((1, 3), dtype=np.int64)
    ids[0, 2] = model.config.vocab_size
    message = error_of(lambda: model.feature_model(ids), ldlm.InvalidArgument)
    assert "ldlm.feature_model" in message and f"id {model.config.vocab_size} at [0, 2]" in message


def test_module_left_out_by_load_model(model):
    m = ldlm.load_model(str(DEMO_WEIGHTS), modules=["denoiser"])
    assert m.modules == ["denoiser"]
    message = error_of(lambda: m.encoder(activation(m)), ldlm.InvalidArgument)
    assert "ldlm.encoder" in message and "not loaded" in message
    message = error_of(lambda: ldlm.load_model(str(DEMO_WEIGHTS), modules=["decoder"]), ldlm.InvalidArgument)
    assert "unknown module 'decoder'" in message


def test_int8_is_kept_or_refused_with_the_reason():
    try:
        int8 = ldlm.load_model(str(DEMO_WEIGHTS), precision="int8")
    except ldlm.Error as refused:  # a CPU without int8 dot products (docs/model.md §Precision)
        assert "int8 dot-product instructions" in str(refused)
        return
    assert int8.precision == "int8"


def test_load_model_errors(tmp_path):
    message = error_of(lambda: ldlm.load_model(str(tmp_path / "missing.safetensors")), ldlm.IoError)
    assert "missing.safetensors" in message
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    message = error_of(lambda: ldlm.load_model(str(garbage)), ldlm.FormatError)
    assert "garbage.safetensors" in message
    message = error_of(lambda: ldlm.load_model(str(DEMO_WEIGHTS), precision="fp8"), ldlm.InvalidArgument)
    assert "fp8" in message and "bf16" in message
    other = ldlm.Config.from_weights(str(DEMO_WEIGHTS)).to_dict()
    other["d_model"] *= 2
    message = error_of(lambda: ldlm.load_model(str(DEMO_WEIGHTS), config=other), ldlm.ConfigError)
    assert "d_model" in message
    message = error_of(lambda: ldlm.load_model(str(DEMO_WEIGHTS), config=3), ldlm.InvalidArgument)
    assert "'config'" in message and "int" in message
