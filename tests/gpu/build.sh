#!/usr/bin/env bash
# Builds the GPU test suite and the CUDA benchmark on a machine WITHOUT a GPU
# and packs everything a GPU machine needs into .gpu/ (git-ignored):
#
#   bash tests/gpu/build.sh          # here: build, strip, pack
#   PTXD_GPU_PERF=1 bash tests/gpu/build.sh   # the same, with this machine's perf and
#                                    # its libraries, and ptxd's symbols, for
#                                    # `bash .gpu/run.sh profile-ring`
#   bash .gpu/run.sh                 # on the GPU machine: tests, Python tests, then the benchmark
#   bash .gpu/run.sh python          # on the GPU machine: the Python client's tests only
#
# Through the device tool: run(command="bash .gpu/run.sh", carry=[".gpu"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
PACK=.gpu
FEATURES=gpu-tests

cargo build --release --features "$FEATURES" --bin ptxd
test_exe=$(cargo test --release --features "$FEATURES" --test gpu --no-run --message-format=json \
  | jq -r 'select(.reason == "compiler-artifact" and .target.name == "gpu" and .executable != null) | .executable')
bench_exe=$(cargo bench --features "$FEATURES" --bench cuda_launch --no-run --message-format=json \
  | jq -r 'select(.reason == "compiler-artifact" and .target.name == "cuda_launch" and .executable != null) | .executable')
[ -x "$test_exe" ] && [ -x "$bench_exe" ] || { echo "build.sh: test or bench executable not found" >&2; exit 1; }

rm -rf "$PACK"
mkdir -p "$PACK/corpus"
cp target/release/ptxd "$PACK/ptxd"
cp "$test_exe" "$PACK/gpu-tests"
cp "$bench_exe" "$PACK/cuda-launch-bench"
strip "$PACK/gpu-tests" "$PACK/cuda-launch-bench"
if [ "${PTXD_GPU_PERF:-0}" = 1 ]; then
  # Symbols stay (perf names ptxd's functions); the debug info goes.
  strip --strip-debug "$PACK/ptxd"
  # perf and the libraries it needs beyond the C and C++ runtimes, which
  # the GPU machine has in newer versions.
  mkdir -p "$PACK/perf/lib"
  cp "$(command -v perf)" "$PACK/perf/perf"
  ldd "$(command -v perf)" | awk '/=>/ {print $3}' \
    | grep -vE '/(libc|libm|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' \
    | while read -r lib; do cp -L "$lib" "$PACK/perf/lib/"; done
else
  strip "$PACK/ptxd"
fi
# The corpus lives beside the repository (../shared/corpus) and does not
# travel to the GPU machine on its own.
cp "${PTXD_CORPUS:-../shared/corpus}"/*.ptx tests/gpu/store_to_null.ptx "$PACK/corpus/"
chmod u+w "$PACK"/corpus/*
# The nvcc compatibility corpus (PTX, manifest and the .cu sources, whose
# __launch_bounds__ the test reads); run.sh points PTXD_NVCC_CORPUS at it.
mkdir -p "$PACK/nvcc"
cp -r tests/corpus/nvcc/manifest.json tests/corpus/nvcc/ptx tests/corpus/nvcc/refused-ptx \
  tests/corpus/nvcc/src tests/corpus/nvcc/refused "$PACK/nvcc/"
chmod -R u+w "$PACK/nvcc"
# Its -G (debug) builds, for the canonical-vs-client comparison
# (tests/gpu/canonical.rs).
cp -r tests/corpus/nvcc_g "$PACK/nvcc_g"
cp -r tests/corpus/jit "$PACK/jit"
chmod -R u+w "$PACK/nvcc_g"
cp tests/gpu/run.sh "$PACK/run.sh"
# python/examples/profile_launch.py against the pack's daemon, with and
# without MPS: `bash .gpu/python-profile.sh`.
cp tests/gpu/python-profile.sh "$PACK/python-profile.sh"

# The Python client: its wheel, tests and examples, and pytest's wheels,
# since nothing can be fetched on the GPU machine. The wheel is the one
# users install (python/tests/run.sh builds it the same way): manylinux_2_28, abi3, linked by zig against glibc 2.28 (maturin and
# ziglang from PyPI; maturin finds zig through the python on PATH).
PYVENV=target/python-build-venv
[ -x "$PYVENV/bin/python" ] || python3 -m venv "$PYVENV"
"$PYVENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin>=1.16,<1.17" "ziglang>=0.17,<0.18"
PATH="$PWD/$PYVENV/bin:$PATH" "$PYVENV/bin/maturin" build --release --strip --quiet \
  --manifest-path python/Cargo.toml --out "$PACK/wheels" --zig --compatibility manylinux_2_28
"$PYVENV/bin/python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --platform any --implementation py --abi none --python-version 3.10 \
  --dest "$PACK/wheels/pytest" pytest exceptiongroup tomli typing_extensions
mkdir -p "$PACK/python"
cp -r python/tests python/examples "$PACK/python/"
find "$PACK/python" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$PACK"
size=$(du -sb "$PACK" | cut -f1)
limit=$((48 * 1024 * 1024))
[ "${PTXD_GPU_PERF:-0}" = 1 ] && limit=$((62 * 1024 * 1024))
if [ "$size" -gt "$limit" ]; then
  echo "build.sh: the pack is $size bytes; the device tool carries at most 64 MiB" >&2
  exit 1
fi
