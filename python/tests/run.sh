#!/usr/bin/env bash
# The Python client's host-backend tests (tests/run.sh calls this): builds the
# wheel with maturin from PyPI, installs it into a venv under target/, starts
# a host-backend daemon (conftest.py) and runs pytest with numpy.
# The GPU tests under gpu/ report as skipped here (tests/gpu/run.sh runs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=target/python-venv
WHEELS=target/python-wheels

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  "maturin>=1.16,<1.17" numpy pytest
rm -rf "$WHEELS"
# The dev profile shares its dependencies with `cargo test`'s build.
"$VENV/bin/maturin" build --manifest-path python/Cargo.toml --out "$WHEELS" --quiet
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$WHEELS"/ptxd-*.whl
cargo build --quiet --bin ptxd
PTXD_BIN="$(realpath "${CARGO_TARGET_DIR:-target}")/debug/ptxd"
PYTHON="$PWD/$VENV/bin/python"
cd python/tests
PTXD_BIN="$PTXD_BIN" "$PYTHON" -m pytest -q -p no:cacheprovider .
