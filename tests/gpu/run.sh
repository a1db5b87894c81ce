#!/usr/bin/env bash
# Runs the packed GPU suite, then the benchmarks (copied into .gpu/ by
# tests/gpu/build.sh). Logs go to $OUT when the device tool provides it.
#
#   bash run.sh                 tests, Python tests, cuda_launch bench, ptxd bench
#   bash run.sh python          the Python client's GPU tests only
#   bash run.sh tests           tests, Python tests, then the soundness oracle under
#                               compute-sanitizer memcheck (no benchmarks)
#   bash run.sh bench           the cuda_launch benchmark only
#   bash run.sh daemon-bench    ptxd bench against a CUDA daemon, front/reply spin off/on
#   bash run.sh mps             the cuda_launch benchmark under MPS
#   bash run.sh python-bench    the Python client's launch costs (bench_launch.py)
#   bash run.sh python-bench-mps  the same under MPS
#   bash run.sh handover        the GPU cost of a stream hand-over by mechanism, without
#                               and with MPS (python/examples/handover.py)
#   bash run.sh mps-fault       a kernel fault in ptxd beside a torch process, without
#                               and with MPS (tests/gpu/mps.rs)
#   bash run.sh profile-ring    perf profiles of the ring's executor thread and client
#                               during `ptxd bench` (a pack built with PTXD_GPU_PERF=1)
set -uo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
LOGS=${OUT:-$HERE}
export PTXD_BIN="$HERE/ptxd" PTXD_CORPUS="$HERE/corpus" PTXD_NVCC_CORPUS="$HERE/nvcc" RUST_BACKTRACE=1
export PTXD_NVCC_G_CORPUS="$HERE/nvcc_g" PTXD_JIT_CORPUS="$HERE/jit"

date -u
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# cubin and fatbin of add_f32_scalar, built here with the machine's toolkit.
PATH="$PATH:/usr/local/cuda/bin"
ptxas -arch=sm_90 corpus/add_f32_scalar.ptx -o corpus/add_f32_scalar.cubin \
  && nvcc -fatbin -arch=sm_90 corpus/add_f32_scalar.ptx -o corpus/add_f32_scalar.fatbin \
  && ptxas -arch=sm_90 corpus/store_to_null.ptx -o corpus/store_to_null.cubin \
  || echo "run.sh: building the cubin/fatbin failed; the artifact test will fail"

# The two-GPU test (daemon::two_gpus_refuse_mismatched_devices_and_run_on_the_second)
# runs only with PTXD_GPU_TESTS_MULTI=1, and then fails on fewer than two GPUs;
# on one GPU it prints "skipped: set PTXD_GPU_TESTS_MULTI=1 on a 2-GPU machine".
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  export PTXD_GPU_TESTS_MULTI=1
  echo "run.sh: two or more GPUs; the multi-GPU test runs"
fi

# The Python client's GPU tests, with the machine's python3 (torch, CuPy) seen
# through --system-site-packages; the wheel and pytest come from the pack.
# A venv with the wheel (and pytest) over the machine's python3 with torch.
python_venv() {
  local venv="$HERE/pyenv" pip
  rm -rf "$venv"
  if python3 -m venv --system-site-packages "$venv"; then
    pip=("$venv/bin/python" -m pip)
  else
    # No ensurepip (Debian's python3 without python3-venv): the system pip installs into the venv.
    rm -rf "$venv"
    python3 -m venv --system-site-packages --without-pip "$venv" || return 1
    pip=(python3 -m pip --python "$venv/bin/python")
  fi
  # When python3 is itself a venv (the GPU image's is), --system-site-packages
  # reaches its base interpreter, not its packages: name them in a .pth file.
  local outer inner
  outer=$(python3 -c 'import site; print("\n".join(site.getsitepackages()))') || return 1
  inner=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  printf '%s\n' "$outer" > "$inner/zz-python3-site-packages.pth"
  "${pip[@]}" install --quiet --disable-pip-version-check --no-index --no-deps "$HERE"/wheels/ptxd-*.whl \
    && "${pip[@]}" install --quiet --disable-pip-version-check --no-index --find-links "$HERE/wheels/pytest" pytest \
    || return 1
  "$venv/bin/python" -c 'import ptxd, torch, pytest; print("ptxd", ptxd.__version__, "torch", torch.__version__, "pytest", pytest.__version__)'
}

python_tests() {
  python_venv || return 1
  local venv="$HERE/pyenv"
  mkdir -p "$LOGS/python"
  (cd "$HERE/python/tests" && PTXD_GPU_TESTS=1 PTXD_TEST_LOGS="$LOGS/python" \
    "$venv/bin/python" -m pytest -v -p no:cacheprovider -rs gpu)
}

# Starts `./ptxd serve --socket SOCK ARGS...` in the background, logging to
# bench-daemons.log, and waits until it answers health checks (30 s at most);
# its pid is left in $daemon_pid.
start_daemon() {
  local sock=$1
  shift
  rm -f "$sock"
  ./ptxd serve --socket "$sock" "$@" >>"$LOGS/bench-daemons.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 300); do
    ./ptxd health --socket "$sock" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
}

# Runs "$@" with an MPS control daemon of its own (private pipe directory).
under_mps() {
  export CUDA_MPS_PIPE_DIRECTORY="$HERE/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$HERE/mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "run.sh: MPS cannot start here"; return 1; }
  "$@"
  local rc=$?
  echo quit | nvidia-cuda-mps-control
  cat "$CUDA_MPS_LOG_DIRECTORY"/control.log 2>/dev/null | tail -5
  return $rc
}
# The Python client's launch costs (python/examples/bench_launch.py) against
# a CUDA daemon, twice.
python_bench() {
  python_venv >/dev/null || return 1
  local sock="$HERE/pybench.sock" pid rc=0 round
  start_daemon "$sock"
  pid=$daemon_pid
  for round in 1 2; do
    PTXD_CORPUS="$HERE/corpus" "$HERE/pyenv/bin/python" "$HERE/python/examples/bench_launch.py" "$sock" 2000 || rc=1
  done
  kill -TERM "$pid"
  wait "$pid"
  return $rc
}
if [ "${1:-}" = python-bench ]; then
  python_bench 2>&1 | tee "$LOGS/python-bench.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = python-bench-mps ]; then
  under_mps python_bench 2>&1 | tee "$LOGS/python-bench-mps.log"
  exit "${PIPESTATUS[0]}"
fi

# What a hand-over between two streams costs the GPU, by mechanism
# (python/examples/handover.py): without MPS, then under MPS.
if [ "${1:-}" = handover ]; then
  {
    echo "-- handover, without MPS"
    PYTHONUNBUFFERED=1 python3 "$HERE/python/examples/handover.py"
    without=$?
    echo "-- handover, under MPS"
    under_mps env PYTHONUNBUFFERED=1 python3 "$HERE/python/examples/handover.py"
    with=$?
    echo "handover: without MPS exit $without, under MPS exit $with"
  } 2>&1 | tee "$LOGS/handover.log"
  exit "${PIPESTATUS[0]}"
fi

# What a fault in ptxd does to another process on the GPU: once without
# MPS, once under an MPS control daemon of its own.
if [ "${1:-}" = mps-fault ]; then
  {
    ./gpu-tests mps:: --nocapture --test-threads 1
    without=$?
    under_mps ./gpu-tests mps:: --nocapture --test-threads 1
    with=$?
    echo "mps-fault: without MPS exit $without, under MPS exit $with"
  } 2>&1 | tee "$LOGS/mps-fault.log"
  exit 0
fi

if [ "${1:-}" = python ]; then
  python_tests 2>&1 | tee "$LOGS/python-gpu-tests.log"
  exit "${PIPESTATUS[0]}"
fi

# `ptxd bench` against a CUDA daemon in alternating rounds (so that drift
# hits every configuration): each entry of PTXD_BENCH_CONFIGS is
# FRONT_SPIN:REPLY_SPIN, the daemon's --front-spin and the client's
# --reply-spin (the executor's spin stays at its default). The default
# compares both off (the previous release) with both at their defaults.
daemon_bench() {
  local sock="$HERE/bench.sock" config front reply round pid rc=0
  for round in $(seq "${PTXD_BENCH_ROUNDS:-3}"); do
    for config in ${PTXD_BENCH_CONFIGS:-0:0 200us:200us}; do
      front=${config%%:*}
      reply=${config##*:}
      echo "== daemon: front spin $front, round $round" >>"$LOGS/bench-daemons.log"
      start_daemon "$sock" --front-spin "$front"
      pid=$daemon_pid
      echo "== ptxd bench: front spin $front, reply spin $reply, round $round"
      ./ptxd bench --socket "$sock" --json --iterations 3000 --n 4096 --reply-spin "$reply" || rc=1
      kill -TERM "$pid"
      wait "$pid"
    done
  done
  return $rc
}
# Where a ring launch's time goes: `ptxd bench` against a CUDA daemon (the
# defaults) with perf sampling the executor and the bench client; the
# reports are per thread, so the ring's own threads (ptxd-ring-* in the
# executor, the bench's ring client) can be read apart from the rest.
profile_ring() {
  local perf="$HERE/perf/perf" sock="$HERE/profile.sock" pid exec_pid bench_pid perf_pid
  [ -x "$perf" ] || { echo "run.sh: no perf in the pack (PTXD_GPU_PERF=1 bash tests/gpu/build.sh)"; return 1; }
  export LD_LIBRARY_PATH="$HERE/perf/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$perf" --version || return 1
  start_daemon "$sock"
  pid=$daemon_pid
  exec_pid=$(pgrep -P "$pid" | head -1)
  ./ptxd bench --socket "$sock" --json --iterations "${PTXD_PROFILE_ITERATIONS:-20000}" --n 4096 > "$LOGS/profile-bench.json" &
  bench_pid=$!
  sleep 0.3
  echo "run.sh: daemon $pid, executor $exec_pid, bench $bench_pid"
  "$perf" record -F "${PTXD_PERF_FREQ:-10000}" -o "$HERE/perf.data" -p "$exec_pid,$bench_pid" 2>&1 &
  perf_pid=$!
  wait "$bench_pid"
  kill -INT "$perf_pid"
  wait "$perf_pid"
  cat "$LOGS/profile-bench.json"; echo
  local who
  for who in "executor:$exec_pid" "bench:$bench_pid"; do
    echo "== ${who%%:*} (pid ${who##*:}): threads"
    "$perf" report -i "$HERE/perf.data" --pid "${who##*:}" --no-children --sort comm --stdio 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | head -12
    echo "== ${who%%:*} (pid ${who##*:}): symbols by thread"
    "$perf" report -i "$HERE/perf.data" --pid "${who##*:}" --no-children --sort comm,dso,sym --stdio 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | head -50
  done
  local comm
  for comm in $("$perf" report -i "$HERE/perf.data" --pid "$exec_pid" --no-children --sort comm --stdio 2>/dev/null \
      | awk '$2 ~ /ring/ {print $2}' | head -2); do
    echo "== executor thread $comm: by library"
    "$perf" report -i "$HERE/perf.data" --pid "$exec_pid" --comms "$comm" --no-children --sort dso --stdio 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | head -10
    echo "== executor thread $comm: symbols"
    "$perf" report -i "$HERE/perf.data" --pid "$exec_pid" --comms "$comm" --no-children --sort dso,sym --stdio 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | head -40
  done
  kill -TERM "$pid"
  wait "$pid"
}
if [ "${1:-}" = profile-ring ]; then
  profile_ring 2>&1 | tee "$LOGS/profile-ring.log"
  exit "${PIPESTATUS[0]}"
fi

# The benchmark under MPS (every process's work in one GPU context): is the
# ordered pipeline's cost the time-slicing between the session's context
# and ptxd's? MPS runs for this command only, from a private pipe directory.
if [ "${1:-}" = mps ]; then
  under_mps ./cuda-launch-bench --bench 2>&1 | tee "$LOGS/bench-mps.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = bench ]; then
  ./cuda-launch-bench --bench 2>&1 | tee "$LOGS/bench.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = daemon-bench ]; then
  daemon_bench 2>&1 | tee "$LOGS/daemon-bench.log"
  exit "${PIPESTATUS[0]}"
fi

# The soundness oracle and the canonical-vs-client comparison run after the
# rest, alone: they fill the GPU with allocations and launches that the
# tests measuring device memory would count as their own.
# mps:: (a fault beside a torch process) runs only in `run.sh mps-fault`: its
# torch process and its fault would disturb those measurements too.
./gpu-tests --test-threads=4 --skip oracle:: --skip canonical:: --skip mps:: --skip fault_memory:: 2>&1 | tee "$LOGS/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
./gpu-tests --test-threads=1 oracle:: canonical:: 2>&1 | tee -a "$LOGS/gpu-tests.log"
oracle_rc=${PIPESTATUS[0]}
[ "$tests_rc" -eq 0 ] && tests_rc=$oracle_rc
# Device memory, descriptors and processes over 100 faults (issue 23): alone,
# since it reads the whole device's used memory; about two minutes. The
# series is in the log.
./gpu-tests --test-threads=1 fault_memory:: --nocapture 2>&1 | tee "$LOGS/fault-memory.log"
fault_memory_rc=${PIPESTATUS[0]}
[ "$tests_rc" -eq 0 ] && tests_rc=$fault_memory_rc
echo "gpu-tests exit code: $tests_rc"

python_tests 2>&1 | tee "$LOGS/python-gpu-tests.log"
python_rc=${PIPESTATUS[0]}
echo "python gpu tests exit code: $python_rc"

if [ "${1:-}" = tests ]; then
  # The soundness oracle again, operands exact-size, under memcheck: an
  # accepted kernel's access past its operands is an error there.
  PTXD_ORACLE_EXACT=1 PTXD_MUTANTS=${PTXD_MEMCHECK_MUTANTS:-400} \
    timeout "${PTXD_MEMCHECK_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 99 \
    ./gpu-tests oracle:: --nocapture 2>&1 | tee "$LOGS/memcheck.log"
  memcheck_rc=${PIPESTATUS[0]}
  echo "memcheck oracle exit code: $memcheck_rc"
  [ "$tests_rc" -eq 0 ] && [ "$python_rc" -eq 0 ] && [ "$memcheck_rc" -eq 0 ]
  exit
fi

./cuda-launch-bench --bench 2>&1 | tee "$LOGS/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "benchmark exit code: $bench_rc"

daemon_bench 2>&1 | tee "$LOGS/daemon-bench.log"
daemon_bench_rc=${PIPESTATUS[0]}
echo "daemon bench exit code: $daemon_bench_rc"

[ "$tests_rc" -eq 0 ] && [ "$python_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$daemon_bench_rc" -eq 0 ]
