#!/usr/bin/env bash
# Where the CPU time of a Python ring launch on torch tensors goes
# (python/examples/profile_launch.py), then the model step
# (python/examples/model_step.py), against `./ptxd serve` from the pack,
# without MPS and then under MPS (an MPS control daemon of its own, as
# run.sh's python-bench-mps starts). Packed into .gpu/ by tests/gpu/build.sh:
#
#   bash .gpu/python-profile.sh [CALLS]     # on the GPU machine
#   PTXD_PROFILE_MPS_ONLY=1 bash .gpu/python-profile.sh   # under MPS only
#
# Logs go to $OUT when the device tool provides it. Exit status 1 when a
# profile run fails (a wrong result included).
set -uo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
LOGS=${OUT:-$HERE}
CALLS=${1:-20000}
export PTXD_CORPUS="$HERE/corpus" RUST_BACKTRACE=1

date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# A venv with the wheel over the machine's python3 with torch (as run.sh's
# python_venv, without pytest).
venv="$HERE/pyenv-profile"
rm -rf "$venv"
if python3 -m venv --system-site-packages "$venv"; then
  pip=("$venv/bin/python" -m pip)
else
  rm -rf "$venv"
  python3 -m venv --system-site-packages --without-pip "$venv" || exit 1
  pip=(python3 -m pip --python "$venv/bin/python")
fi
outer=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))') || exit 1
inner=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || exit 1
printf '%s\n' "$outer" > "$inner/zz-python3-site-packages.pth"
"${pip[@]}" install --quiet --disable-pip-version-check --no-index --no-deps "$HERE"/wheels/ptxd-*.whl || exit 1
"$venv/bin/python" -c 'import ptxd, torch; print("ptxd", ptxd.__version__, "torch", torch.__version__)' || exit 1

# One profile run against a fresh daemon.
profile() {
  local sock="$HERE/pyprofile.sock" pid rc
  rm -f "$sock"
  ./ptxd serve --socket "$sock" >>"$LOGS/python-profile-daemon.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    ./ptxd health --socket "$sock" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$venv/bin/python" "$HERE/python/examples/profile_launch.py" "$sock" "$CALLS"
  rc=$?
  # The model step (issue 22's second goal) against the same daemon: eager,
  # in-process PTX, through ptxd (answers awaited), with defer_errors, and
  # that with add and silu_mul as one launch_many, interleaved rep by rep;
  # per variant wall / CPU issue / GPU span / fed GPU time per step and what
  # bounds it, each ratio as the median of per-rep ratios [min-max]. A wrong
  # result exits 1.
  "$venv/bin/python" "$HERE/python/examples/model_step.py" "$sock" || rc=1
  kill -TERM "$pid"
  wait "$pid"
  return $rc
}

rc=0
# PTXD_PROFILE_MPS_ONLY=1: only the run under MPS (the goals' configuration),
# for a device budget that cannot hold both.
if [ "${PTXD_PROFILE_MPS_ONLY:-0}" != 1 ]; then
  echo "== without MPS"
  profile 2>&1 | tee "$LOGS/python-profile.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

echo "== under MPS"
export CUDA_MPS_PIPE_DIRECTORY="$HERE/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$HERE/mps/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if nvidia-cuda-mps-control -d; then
  profile 2>&1 | tee "$LOGS/python-profile-mps.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  echo quit | nvidia-cuda-mps-control
  tail -5 "$CUDA_MPS_LOG_DIRECTORY"/control.log 2>/dev/null
else
  echo "python-profile.sh: MPS cannot start here"
  rc=1
fi
exit $rc
