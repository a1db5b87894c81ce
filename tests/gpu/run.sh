#!/usr/bin/env bash
# Runs the packed GPU suite, then the benchmark (copied into .gpu/ by
# tests/gpu/build.sh). Logs go to $OUT when the device tool provides it.
set -uo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
LOGS=${OUT:-$HERE}
export PTXD_BIN="$HERE/ptxd" PTXD_CORPUS="$HERE/corpus" PTXD_NVCC_CORPUS="$HERE/nvcc" RUST_BACKTRACE=1

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

./gpu-tests --test-threads=4 2>&1 | tee "$LOGS/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
echo "gpu-tests exit code: $tests_rc"

./cuda-launch-bench --bench 2>&1 | tee "$LOGS/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "benchmark exit code: $bench_rc"

[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
