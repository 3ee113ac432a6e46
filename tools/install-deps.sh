#!/usr/bin/env bash
# Installs the Debian 12 packages ldlm needs, skipping those already installed.
#
#   bash tools/install-deps.sh            build + tests + tool + benchmarks + Python module
#   bash tools/install-deps.sh --python   also PyTorch/Matplotlib/OpenBLAS/Dask: for tools/convert.py
#                                         and its tests, the Python module's parity and Dask
#                                         tests, to regenerate tests/data, or to compare benchmarks
#   bash tools/install-deps.sh --browser  also Chromium and its WebDriver: for the playground's test in a
#                                         real browser (tests/browser), which is skipped without them
#
# Runs apt-get update once, and only when something is missing. Uses sudo when
# not run as root. Works non-interactively (CI).
set -euo pipefail

# pybind11-dev, python3-dev, python3-numpy, python3-pytest: the Python module (tools/python)
# and its tests, built and run by default when they are found; python3-pip: its
# `pip install --no-build-isolation .`.
packages=(cmake g++ make libeigen3-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libdnnl-dev libpcre2-dev
          pybind11-dev python3-dev python3-numpy python3-pytest python3-pip)

usage() {
  sed -n '2,12s/^# \{0,1\}//p' "$0"
}

for arg in "$@"; do
  case "$arg" in
    # libopenblas0: without it python3-torch's BLAS is the reference libblas3, and
    # PyTorch fp32 runs 25x slower than at its best (bench/compare.py's baseline).
    # python3-distributed (with python3-dask): ldlm.dask and its tests (docs/dask.md).
    # wamerican: /usr/share/dict/words, for the dictionary-word share of the model card
    # and of bench/int8_compare.py (research/train/dictionary.py).
    --python) packages+=(python3 python3-torch python3-numpy python3-matplotlib libopenblas0 python3-distributed
                         wamerican) ;;
    # A separate flag: Chromium is some 300 MB that only the playground's test needs, and
    # tools/quickstart.sh installs the base list for a first build.
    --browser) packages+=(python3 chromium chromium-driver) ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done
# `ldlm serve` (tools/ldlm/server): cpp-httplib, found through pkg-config.
packages+=(libcpp-httplib-dev pkgconf)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps.sh: all required packages are installed"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps.sh: missing ${missing[*]}; run as root or install sudo" >&2
  exit 1
fi

echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Wait (up to 10 min) for another apt/dpkg run to release its lock instead of failing.
apt_opts=(-o DPkg::Lock::Timeout=600)
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"
