"""Deterministic parameter generator of tests/data/README.md (Python side).

Bit-identical with the C++ ``ldlm::init_parameters``: every float32 value is a pure
function of (seed, full state-dict name, flat index, shape).  Vectorised with numpy
uint64 arithmetic, which wraps modulo 2^64 as the algorithm requires.
"""
from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_CHUNK = 1 << 22  # elements per vectorised chunk (bounds peak memory for [V, d] tables)


def fnv1a64(name: str) -> int:
    h = 0xCBF29CE484222325
    for b in name.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & _M64
    return h


def tensor_key(full_name: str, seed: int) -> int:
    return fnv1a64(full_name) ^ ((int(seed) * _GOLDEN) & _M64)


def offset_scale(full_name: str, shape) -> tuple[np.float32, np.float32]:
    """(offset, scale) of the README table, both float32."""
    shape = tuple(int(s) for s in shape)
    if len(shape) >= 2:
        return np.float32(0.0), np.float32(1.0) / np.sqrt(np.float32(shape[-1]))
    if full_name.endswith(".weight") or full_name.endswith(".gamma"):
        return np.float32(1.0), np.float32(0.25)
    return np.float32(0.0), np.float32(0.1)


def uniform_bits(key: int, start: int, count: int) -> np.ndarray:
    """u in [-1, 1) (float32, exact) for flat indices start .. start+count-1."""
    with np.errstate(over="ignore"):
        i = np.arange(start + 1, start + count + 1, dtype=np.uint64)
        z = np.uint64(key) + i * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
    top = (z >> np.uint64(40)).astype(np.float32)  # 24 bits: exact in float32
    return top / np.float32(1 << 23) - np.float32(1.0)  # exact


def init_tensor(full_name: str, shape, seed: int) -> np.ndarray:
    """The float32 tensor of the given shape the generator assigns to ``full_name``."""
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    key = tensor_key(full_name, seed)
    offset, scale = offset_scale(full_name, shape)
    out = np.empty(n, dtype=np.float32)
    off64, sc64 = np.float64(offset), np.float64(scale)
    for s in range(0, n, _CHUNK):
        c = min(_CHUNK, n - s)
        u = uniform_bits(key, s, c).astype(np.float64)
        out[s:s + c] = (off64 + sc64 * u).astype(np.float32)
    return out.reshape(shape)


def init_module(module, prefix: str = "", seed: int = 1) -> None:
    """Fill every parameter (trainable or frozen) of a torch module in place, by its
    full state-dict name ``prefix + name``."""
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            v = init_tensor(prefix + name, tuple(p.shape), seed)
            p.copy_(torch.from_numpy(v))


def _self_test() -> None:
    # scalar reference implementation with Python ints for a few elements
    def ref(name, shape, seed, idx):
        key = tensor_key(name, seed)
        z = (key + (idx + 1) * _GOLDEN) & _M64
        z = ((z ^ (z >> 30)) * _MIX1) & _M64
        z = ((z ^ (z >> 27)) * _MIX2) & _M64
        z = z ^ (z >> 31)
        u = np.float32(z >> 40) / np.float32(2 ** 23) - np.float32(1)
        off, sc = offset_scale(name, shape)
        return np.float32(np.float64(off) + np.float64(sc) * np.float64(u))

    for name, shape in [("a.weight", (3, 5)), ("b.gamma", (7,)), ("c.bias", (4,)), ("mask_vector", (6,))]:
        v = init_tensor(name, shape, 3).reshape(-1)
        for i in range(v.size):
            assert v[i] == ref(name, shape, 3, i), (name, i)


if __name__ == "__main__":
    _self_test()
    print("ldlm_init self-test ok;", init_tensor("denoiser.blocks.0.norm1.weight", (4,), 1))
