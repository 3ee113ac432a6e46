"""The PEP 517 build backend of `pip install .` (pyproject.toml: backend-path tools/python).

It runs CMake, as every other build of ldlm does: configure the repository with the
Python module on and everything else off, build the module, install its component into
a staging directory, and zip that into a wheel. Nothing is downloaded, so
`pip install --no-build-isolation .` works offline with Debian's pip and setuptools
(this backend needs neither). The wheel's metadata comes from pyproject.toml's [project]
table, its version from the root CMakeLists.txt's project(VERSION).
"""
from __future__ import annotations

import base64
import hashlib
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    match = re.search(r"project\(ldlm\s+VERSION\s+([0-9.]+)", text)
    if not match:
        raise RuntimeError("ldlm_build: no project(ldlm VERSION ...) in " + str(ROOT / "CMakeLists.txt"))
    return match.group(1)


def _tag() -> str:
    interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{interpreter}-{interpreter}{sys.abiflags}-{platform}"


def _metadata() -> str:
    project = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {_version()}"]
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _dist_info() -> str:
    return f"{_project()['name']}-{_version()}.dist-info"


def _run(*command: str) -> None:
    print("ldlm_build:", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def _stage(staging: pathlib.Path, build: pathlib.Path) -> None:
    """The installed package files under staging/ldlm."""
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run("cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLDLM_BUILD_PYTHON=ON",
         "-DLDLM_BUILD_TESTS=OFF", "-DLDLM_BUILD_BENCHMARKS=OFF", "-DLDLM_BUILD_EXAMPLES=OFF",
         "-DLDLM_BUILD_TOOLS=OFF", f"-DPython3_EXECUTABLE={sys.executable}", "-DLDLM_PYTHON_INSTALL_DIR=.")
    _run("cmake", "--build", str(build), "--target", "ldlm_python", "--parallel", jobs)
    _run("cmake", "--install", str(build), "--component", "ldlm_Python", "--prefix", str(staging))


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = pathlib.Path(metadata_directory) / _dist_info()
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata(), encoding="utf-8")
    return info.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project, version, tag = _project(), _version(), _tag()
    wheel_name = f"{project['name']}-{version}-{tag}.whl"
    with tempfile.TemporaryDirectory(prefix="ldlm-wheel-") as tmp:
        staging = pathlib.Path(tmp) / "staging"
        _stage(staging, pathlib.Path(tmp) / "build")
        files = {str(p.relative_to(staging)): p.read_bytes() for p in sorted(staging.rglob("*")) if p.is_file()}
        if not any(name.startswith("ldlm/_ldlm") for name in files):
            raise RuntimeError("ldlm_build: the CMake install holds no ldlm/_ldlm module: " + ", ".join(files))
        info = _dist_info()
        files[f"{info}/METADATA"] = _metadata().encode()
        files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: ldlm_build\nRoot-Is-Purelib: false\n"
                                  f"Tag: {tag}\n").encode()
        record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
        files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
        with zipfile.ZipFile(pathlib.Path(wheel_directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as wheel:
            for name, data in files.items():
                wheel.writestr(name, data)
    return wheel_name
