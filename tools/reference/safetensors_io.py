"""safetensors reading and writing with torch alone (no `safetensors` package).

Used by generate.py (reference dumps) and tools/convert.py (checkpoint conversion).
The reader treats its input as untrusted and holds the same line as ldlm's C++ reader
(include/ldlm/io/safetensors.hpp): the header is validated against the file size,
duplicate keys are refused, every tensor's byte range must match its dtype and shape,
and the tensors must tile the data section exactly. Little-endian hosts only.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
import sys

import torch

assert sys.byteorder == "little", "safetensors_io assumes a little-endian host"

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
CODES = {v: k for k, v in DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000
MAX_RANK = 8


class SafetensorsError(ValueError):
    """A malformed, truncated or hostile safetensors file."""


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw little-endian bytes of a tensor in row-major order."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write_safetensors(path, tensors: dict, metadata: dict | None = None):
    """Tensors in name order; the file appears complete or not at all (written aside, then renamed)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in CODES:
            raise SafetensorsError(f"safetensors {path}: tensor '{name}' has dtype {t.dtype}, which safetensors lacks")
        b = tensor_bytes(t)
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-len(h)) % 8)
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise SafetensorsError(f"duplicate key '{k}' in header")
        out[k] = v
    return out


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2 ** 63


def read_safetensors(path):
    """(tensors by name, metadata) of a file; SafetensorsError names the file and the
    tensor for anything malformed. Tensors share a private copy-on-write mapping."""
    def fail(msg):
        raise SafetensorsError(f"safetensors {path}: {msg}")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            fail(f"file is {size} bytes, too short for the 8-byte header length")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    n = struct.unpack("<Q", data[:8])[0]
    if n > MAX_HEADER_BYTES:
        fail(f"header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if n > size - 8:
        fail(f"header length {n} runs past the end of the file ({size - 8} bytes after the length prefix)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except SafetensorsError as e:
        fail(str(e))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        fail(f"header is not valid JSON: {e}")
    if not isinstance(header, dict):
        fail("header is not a JSON object")
    begin_data, data_size = 8 + n, size - 8 - n

    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        fail("__metadata__ is not an object of string -> string")

    entries = []
    for name, e in header.items():
        t = f"tensor '{name}' "
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            fail(t + "entry must be an object with exactly the keys dtype, shape and data_offsets")
        if e["dtype"] not in DTYPES:
            fail(t + f"has unknown dtype {json.dumps(e['dtype'])[:40]}")
        dtype, shape, offsets = DTYPES[e["dtype"]], e["shape"], e["data_offsets"]
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_count(x) for x in shape):
            fail(t + f"shape must be a list of at most {MAX_RANK} non-negative integers, got {json.dumps(shape)[:80]}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(x) for x in offsets):
            fail(t + f"data_offsets must be two non-negative integers, got {json.dumps(offsets)[:80]}")
        begin, end = offsets
        numel = 1
        for x in shape:
            numel *= x
        need = numel * torch.empty((), dtype=dtype).element_size()
        if begin > end or end > data_size:
            fail(t + f"data_offsets [{begin}, {end}] lie outside the data section of {data_size} bytes")
        if end - begin != need:
            fail(t + f"shape {shape} with dtype {e['dtype']} needs {need} bytes, but data_offsets [{begin}, {end}] "
                 f"span {end - begin}")
        entries.append((begin, end, name, dtype, shape))

    covered = 0
    for begin, end, name, _, _ in sorted(entries):
        if begin != covered:
            fail(f"tensor '{name}' data_offsets [{begin}, {end}] " +
                 ("overlap the previous tensor" if begin < covered else f"leave a gap of {begin - covered} bytes"))
        covered = end
    if covered != data_size:
        fail(f"{data_size - covered} trailing bytes after the last tensor")

    tensors = {}
    for begin, end, name, dtype, shape in entries:
        start, itemsize = begin_data + begin, torch.empty((), dtype=dtype).element_size()
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
        elif start % itemsize:  # misaligned for its dtype: copy the bytes
            tensors[name] = torch.frombuffer(bytearray(data[start:begin_data + end]), dtype=dtype).reshape(shape)
        else:
            tensors[name] = torch.frombuffer(data, dtype=dtype, count=(end - begin) // itemsize, offset=start).reshape(shape)
    return tensors, metadata
