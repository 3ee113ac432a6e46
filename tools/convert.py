#!/usr/bin/python3
"""Convert a PyTorch checkpoint of LDLM into a self-describing ldlm safetensors file.

    /usr/bin/python3 tools/convert.py IN OUT [--config C.json] [--dtype f32|bf16]
                                     [--strip-prefix P] [--key K] [--trust-pickle]

Reads what torch.save writes (a bare state dict, or a dict holding one under
`state_dict`, `model`, `module` or --key) or a safetensors file; keeps the parameters,
checks every name and shape against the configuration (tools/reference/ldlm_torch.py
is the one source of names and shapes) and writes OUT with the configuration in its
__metadata__ under `ldlm.config`. See docs/checkpoints.md.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import sys
import types
import zipfile
from collections.abc import Mapping

import torch

# Run as a script, Python puts this file's directory (tools/) first on the path, where
# the reference package lives.
from reference import ldlm_torch as L
from reference.safetensors_io import SafetensorsError, read_safetensors, write_safetensors

CONFIG_KEY = "ldlm.config"
SEED_KEY = "ldlm.feature_model_init_seed"
STATE_DICT_KEYS = ("state_dict", "model", "module")  # in this order
WRAPPER_PREFIXES = ("model.", "module.", "_orig_mod.")  # Lightning, DDP/DataParallel, torch.compile
# GPT-2's attention-mask buffers: exactly h.<block>.attn.bias / .masked_bias, bare or
# under feature_model. (LDLM) or transformer. (Hugging Face). The same rule as ldlm's
# is_gpt2_buffer (include/ldlm/io/state_dict.hpp).
GPT2_BUFFER = re.compile(r"(?:feature_model\.|transformer\.)?h\.(?:0|[1-9][0-9]*)\.attn\.(?:bias|masked_bias)")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

HELP_EPILOG = """\
A pickle is code: loading a torch.save file with Python's pickle can run anything its
author put in it. Pickles are therefore loaded with torch.load(weights_only=True),
which builds only tensors and plain containers; a checkpoint that needs any other
class is refused. (Torch 1.13's weights-only unpickler cannot read a float, which
every optimizer state holds; the same allowlist then runs on Python's unpickler.)
Pass --trust-pickle only for a file from a source you trust.

Dropped, not parameters: every entry beside the state dict (optimizer and scheduler
state, counters, hyper-parameters), non-tensor values inside it, and GPT-2's
attention buffers h.<i>.attn.bias / h.<i>.attn.masked_bias. The wrapper prefix that
every key shares (model., module., _orig_mod., repeatedly) is stripped, or exactly the
one given with --strip-prefix. Every missing, unexpected and mis-shaped tensor is
reported at once.

The configuration is --config, or the input's own __metadata__ 'ldlm.config' (they
must agree), or ldlm-base. Then `ldlm forward MODULE --weights OUT ...` needs no
--config.
"""


class ConvertError(Exception):
    """Bad input: reported as one 'convert: error: ...' message, exit status 1."""


# ------------------------------------------------------------------ configuration
def full_config(d: dict, origin: str) -> dict:
    """Every key of ldlm's configuration, d's values over the defaults, validated
    by the reference Config (architecture) and by type (sampling keys)."""
    if not isinstance(d, dict):
        raise ConvertError(f"{origin}: the configuration must be a JSON object, got {type(d).__name__}")
    arch = {k: v for k, v in d.items() if k not in L.SAMPLING_DEFAULTS}
    try:
        out = L.Config.from_dict(arch).to_dict()
    except (ValueError, TypeError) as e:
        raise ConvertError(f"{origin}: {e}") from None
    for k, default in L.SAMPLING_DEFAULTS.items():
        v = d.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConvertError(f"{origin}: config key {k}: expected a number, got {json.dumps(v)[:40]}")
        out[k] = float(v)
    return out


def _unique_keys(pairs):
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise ValueError(f"duplicate key {k!r}")
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_config_text(text: str, origin: str) -> dict:
    """As strict as ldlm's Config::parse: no repeated key, no NaN or Infinity."""
    try:
        d = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise ConvertError(f"{origin}: not valid JSON: {e}") from None
    return full_config(d, origin)


def resolve_config(given_path: str | None, stored_text: str | None, in_path: str) -> tuple[dict, str]:
    """(configuration, where it came from); a --config that differs from the input's
    own is an error naming every differing key with both values."""
    given = None
    if given_path is not None:
        try:
            with open(given_path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConvertError(f"--config {given_path}: cannot read: {e}") from None
        given = parse_config_text(text, f"--config {given_path}")
    stored = None
    if stored_text is not None:
        stored = parse_config_text(stored_text, f"{in_path}: __metadata__ '{CONFIG_KEY}'")
    if given is not None and stored is not None and given != stored:
        diff = [f"{k} (given {json.dumps(given[k])}, file {json.dumps(stored[k])})" for k in given if given[k] != stored[k]]
        raise ConvertError(f"{in_path}: --config {given_path} differs from the file's own (__metadata__ "
                           f"'{CONFIG_KEY}') in {len(diff)} key(s): " + ", ".join(diff))
    if given is not None:
        return given, f"--config {given_path}"
    if stored is not None:
        return stored, f"the input's __metadata__ '{CONFIG_KEY}'"
    return full_config({}, "ldlm-base"), "ldlm-base (no --config given and the input carries none)"


# -------------------------------------------------------------------- reading
def sniff(path: str) -> str:
    """'safetensors', 'zip' (torch.save since 1.6), 'pickle' (older torch.save) or 'unknown'."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{":  # u64 header length, then the JSON header
        return "safetensors"
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if head.startswith(b"\x80"):  # pickle protocol 2+
        return "pickle"
    return "unknown"


class _WeightsOnlyUnpickler(pickle.Unpickler):
    """Python's unpickler restricted to torch's weights-only allowlist of globals."""

    def find_class(self, module, name):
        allowed = _allowed_globals()
        if f"{module}.{name}" not in allowed:
            raise pickle.UnpicklingError(f"Unsupported class {module}.{name}")
        return allowed[f"{module}.{name}"]


def _allowed_globals() -> dict:
    from torch._weights_only_unpickler import _get_allowed_globals
    allowed = dict(_get_allowed_globals())
    for t in (torch.bfloat16, torch.bool, torch.uint8):  # dtypes torch 1.13's list lacks
        allowed[str(t)] = t
    allowed.update({"builtins.set": set, "builtins.frozenset": frozenset})
    return allowed


_weights_only_pickle = types.ModuleType("ldlm_weights_only_pickle")
_weights_only_pickle.Unpickler = _WeightsOnlyUnpickler


def refuse(path: str, error: Exception) -> ConvertError:
    found = re.search(r"Unsupported class (\S+)", str(error))
    return ConvertError(
        f"{path}: refusing to unpickle an object of class '{found.group(1)}': torch.load(weights_only=True) builds "
        "only tensors and plain containers. A pickle is code: unpickling it can run anything its author put in it. "
        "Pass --trust-pickle only if you trust the file's source (its classes must then be importable), or re-save "
        "the state dict alone with torch.save(model.state_dict(), path).")


def load_weights_only(path: str):
    """torch.load(weights_only=True). Torch 1.13's weights-only unpickler lacks opcodes
    that almost every training checkpoint needs (BINFLOAT, for a learning rate); on
    that failure alone the same allowlist runs on Python's unpickler, through torch's
    own zip reader (torch.load itself ignores pickle_module in 1.13.0)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "Unsupported operand" not in str(error):
            raise
        e = str(error).split("WeightsUnpickler error: ")[-1]
    if not zipfile.is_zipfile(path):
        raise ConvertError(f"{path}: cannot be read weights-only with this torch ({e}); a torch.save file in the "
                           "legacy (pre-1.6) format loads with --trust-pickle, only if you trust its source")
    from torch.serialization import _load, _open_zipfile_reader
    with _open_zipfile_reader(path) as z:
        return _load(z, "cpu", _weights_only_pickle, encoding="utf-8")


def load_pickle(path: str, trust: bool):
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any(n.endswith("/constants.pkl") for n in z.namelist()):
                if not trust:
                    raise ConvertError(f"{path}: a TorchScript archive holds code; pass --trust-pickle to load it "
                                       "with torch.jit.load, only if you trust its source")
                return torch.jit.load(path, map_location="cpu")
    if trust:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        return load_weights_only(path)
    except pickle.UnpicklingError as e:
        if "Unsupported class" in str(e):
            raise refuse(path, e) from None
        raise


def read_input(path: str, trust: bool):
    """(the loaded object, safetensors metadata or {}, a description of the format)."""
    if not os.path.isfile(path):
        raise ConvertError(f"{path}: not a readable file")
    kind = sniff(path)
    if kind == "unknown":
        with open(path, "rb") as f:
            head = f.read(8).hex(" ")
        raise ConvertError(f"{path}: neither a safetensors file nor a torch.save checkpoint (it starts with "
                           f"bytes {head or 'none: the file is empty'})")
    try:
        if kind == "safetensors":
            tensors, metadata = read_safetensors(path)
            return tensors, metadata, "safetensors"
        return load_pickle(path, trust), {}, "torch.save checkpoint"
    except (ConvertError, SafetensorsError):
        raise
    except (AttributeError, ImportError) as e:
        if trust:  # a trusted pickle names a class this Python cannot find
            raise ConvertError(f"{path}: unpickling needs a class that cannot be imported here: {e}") from None
        raise ConvertError(f"{path}: cannot read: {type(e).__name__}: {str(e)[:300]}") from None
    except Exception as e:  # torch.load on something that is no checkpoint: zip, EOF, pickle errors
        why = str(e).split("WeightsUnpickler error: ")[-1]  # without torch's advice to unpickle unsafely
        raise ConvertError(f"{path}: cannot read as a torch.save checkpoint or a safetensors file: "
                           f"{type(e).__name__}: {why[:300]}") from None


def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}"
    return type(value).__name__


def find_state_dict(obj, key: str | None, path: str):
    """(state dict, where it was found, {dropped top-level key: description})."""
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict(), "a pickled module", {}
    if not isinstance(obj, Mapping):
        raise ConvertError(f"{path}: holds a {type(obj).__name__}, not a state dict or a dict holding one")
    if key is not None:
        if key not in obj:
            keys = ", ".join(repr(k) for k in list(obj)[:20])
            raise ConvertError(f"{path}: no key {key!r} (top-level keys: {keys})")
        found = key
    else:
        found = next((k for k in STATE_DICT_KEYS
                      if isinstance(obj.get(k), (Mapping, torch.nn.Module))), None)
    if found is None:
        return obj, "the top level (a bare state dict)", {}
    sd = obj[found]
    if isinstance(sd, torch.nn.Module):
        sd = sd.state_dict()
    if not isinstance(sd, Mapping):
        raise ConvertError(f"{path}: {found!r} holds a {type(sd).__name__}, not a state dict")
    dropped = {str(k): describe(v) for k, v in obj.items() if k != found}
    return sd, f"key {found!r}", dropped


def strip_wrapper(names: list[str], given: str | None, path: str) -> list[str]:
    """The prefixes stripped from every name, in order."""
    if given is not None:
        lacking = [n for n in names if not n.startswith(given)]
        if lacking:
            raise ConvertError(f"{path}: --strip-prefix {given!r}: {len(lacking)} of {len(names)} tensor name(s) do "
                               f"not start with it, e.g. {lacking[0]!r}")
        return [given]
    stripped = []
    while names:
        prefix = next((p for p in WRAPPER_PREFIXES if all(n.startswith(p) for n in names)), None)
        if prefix is None:
            break
        stripped.append(prefix)
        names = [n[len(prefix):] for n in names]
    return stripped


# -------------------------------------------------------------------- checking
def check(tensors: dict, expected: dict, path: str, config_origin: str) -> None:
    """Every missing, unexpected, mis-shaped and non-floating tensor, in one error."""
    missing = [f"{n} {list(s)}" for n, s in expected.items() if n not in tensors]
    unexpected = [f"{n} {list(t.shape)}" for n, t in tensors.items() if n not in expected]
    misshaped = [f"{n}: expected {list(expected[n])}, got {list(t.shape)}" for n, t in tensors.items()
                 if n in expected and tuple(t.shape) != expected[n]]
    not_float = [f"{n}: dtype {t.dtype}" for n, t in tensors.items() if n in expected and not t.is_floating_point()]
    problems = [(len(missing), "missing", missing), (len(unexpected), "unexpected", unexpected),
                (len(misshaped), "mis-shaped", misshaped), (len(not_float), "not floating-point", not_float)]
    if not any(n for n, _, _ in problems):
        return
    lines = [f"{path} does not fit the configuration from {config_origin}:"]
    for n, label, items in problems:
        if n:
            lines.append(f"  {label} {n} tensor(s):")
            lines.extend(f"    {item}" for item in sorted(items))
    raise ConvertError("\n".join(lines))


def feature_model_seed(metadata: dict, path: str) -> str | None:
    seed = metadata.get(SEED_KEY)
    if seed is not None and not (re.fullmatch(r"[0-9]+", seed) and int(seed) < 2 ** 64):
        raise ConvertError(f"{path}: __metadata__ '{SEED_KEY}' must be a decimal integer in [0, 2^64), "
                           f"got {seed[:64]!r}")
    return seed


# ------------------------------------------------------------------------ main
def convert(a) -> list[str]:
    """Converts a.input to a.output; returns the report lines."""
    obj, metadata, fmt = read_input(a.input, a.trust_pickle)
    config, config_origin = resolve_config(a.config, metadata.get(CONFIG_KEY), a.input)
    seed = feature_model_seed(metadata, a.input)
    sd, where, dropped = find_state_dict(obj, a.key, a.input)
    if not any(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ConvertError(f"{a.input}: the state dict at {where} holds no tensors")
    dropped.update({f"{where}: {k}": describe(v) for k, v in sd.items() if not isinstance(v, torch.Tensor)})
    names = [str(k) for k, v in sd.items() if isinstance(v, torch.Tensor)]
    prefixes = strip_wrapper(names, a.strip_prefix, a.input)
    cut = sum(len(p) for p in prefixes)
    tensors = {str(k)[cut:]: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    buffers = sorted(n for n in tensors if GPT2_BUFFER.fullmatch(n))
    for n in buffers:
        del tensors[n]

    expected = L.state_dict_shapes(L.Config.from_dict({k: v for k, v in config.items()
                                                       if k not in L.SAMPLING_DEFAULTS}))
    if seed is not None:  # a generated feature model: its tensors are not in the file
        expected = {n: s for n, s in expected.items() if not n.startswith("feature_model.")}
    check(tensors, expected, a.input, config_origin)

    dtype = DTYPES[a.dtype]
    out = {n: t.detach().to(dtype) for n, t in tensors.items()}
    out_metadata = {CONFIG_KEY: json.dumps(config, sort_keys=True)}
    if seed is not None:
        out_metadata[SEED_KEY] = seed
    try:
        write_safetensors(a.output, out, out_metadata)
    except OSError as e:
        raise ConvertError(f"{a.output}: cannot write: {e}") from None

    report = [f"read {a.input}: {fmt}, state dict at {where}, {len(names)} tensor(s)"]
    if dropped:
        report.append("dropped (not parameters): " + ", ".join(f"{k} ({v})" for k, v in dropped.items()))
    if buffers:
        report.append(f"dropped {len(buffers)} GPT-2 attention buffer(s): {', '.join(buffers[:4])}"
                      + (", ..." if len(buffers) > 4 else ""))
    if prefixes:
        report.append("stripped the wrapper prefix " + " + ".join(repr(p) for p in prefixes))
    size = os.path.getsize(a.output)
    report.append(f"wrote {a.output}: {len(out)} tensor(s), {a.dtype.upper()}, {size / 1e6:.1f} MB, "
                  f"configuration from {config_origin} in __metadata__ '{CONFIG_KEY}'")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="convert.py", description="Convert a PyTorch checkpoint of LDLM (torch.save or safetensors) into an "
        "ldlm safetensors file that carries its configuration.",
        epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", metavar="IN", help="torch.save checkpoint (.pt, .pth, .ckpt, .bin) or .safetensors")
    ap.add_argument("output", metavar="OUT", help="the safetensors file to write")
    ap.add_argument("--config", metavar="C.json", help="model configuration (JSON, keys of docs/model.md)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="dtype of OUT's tensors (default f32)")
    ap.add_argument("--strip-prefix", metavar="P", help="strip exactly this prefix from every key instead of the "
                    "usual wrapper prefixes")
    ap.add_argument("--key", metavar="K", help="the state dict is the value of this top-level key")
    ap.add_argument("--trust-pickle", action="store_true", help="unpickle arbitrary classes: runs code from IN")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        for line in convert(a):
            print(f"convert: {line}")
    except (ConvertError, SafetensorsError) as e:
        print(f"convert: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
