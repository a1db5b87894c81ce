#!/usr/bin/env bash
# The Python client's host-backend tests (tests/run.sh calls this): builds the
# wheel users install, a manylinux_2_28 abi3 wheel (maturin with zig as the
# linker against glibc 2.28, both from PyPI), installs it with pip into a
# clean venv whose PATH has no Rust toolchain, starts a host-backend daemon
# (conftest.py) and runs pytest with numpy.
# The GPU tests under gpu/ report as skipped here (tests/gpu/run.sh runs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_VENV=target/python-build-venv
VENV=target/python-venv
WHEELS=target/python-wheels

[ -x "$BUILD_VENV/bin/python" ] || python3 -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  "maturin>=1.16,<1.17" "ziglang>=0.17,<0.18"
rm -rf "$WHEELS"
# maturin finds zig through the python on PATH (python -m ziglang). The
# target triple gets its own build directory; without debug info it builds
# and links faster (cold: a few minutes on 2 cores; warm: seconds).
PATH="$PWD/$BUILD_VENV/bin:$PATH" CARGO_PROFILE_DEV_DEBUG=0 \
  "$BUILD_VENV/bin/maturin" build --manifest-path python/Cargo.toml --out "$WHEELS" --quiet \
  --zig --compatibility manylinux_2_28
wheel=$(ls "$WHEELS"/ptxd-*-cp39-abi3-manylinux_2_28_x86_64.whl)

# The user's install: a fresh venv, pip and nothing else on PATH (no cargo,
# no rustc), `pip install <wheel>`.
rm -rf "$VENV"
python3 -m venv "$VENV"
env PATH="$PWD/$VENV/bin:/usr/bin:/bin" sh -c '
  set -e
  ! command -v cargo >/dev/null 2>&1 && ! command -v rustc >/dev/null 2>&1 || {
    echo "python/tests/run.sh: a Rust toolchain is on the clean PATH" >&2; exit 1; }
  python -m pip install --quiet --disable-pip-version-check "$1" numpy pytest
  python -c "import ptxd, ptxd._native"
' sh "$wheel"

cargo build --quiet --bin ptxd
PTXD_BIN="$(realpath "${CARGO_TARGET_DIR:-target}")/debug/ptxd"
PYTHON="$PWD/$VENV/bin/python"
cd python/tests
PTXD_BIN="$PTXD_BIN" "$PYTHON" -m pytest -q -p no:cacheprovider .
