#!/usr/bin/env bash
# The GPU soundness oracle and the canonical-vs-client comparison, on a GPU
# machine, from a test binary built elsewhere:
#
#   here:  bash tests/gpu/oracle.sh pack [DIR]   # build the gpu test binary, pack
#                                               # it with the corpus and this script
#                                               # into DIR (default .oracle, git-ignored)
#   there: bash DIR/oracle.sh                   # run(command=..., carry=["DIR"])
#
# Steps: the -G debug builds of the nvcc corpus (tests/corpus/nvcc_g/build.sh,
# packed as nvcc_g.tgz to commit), the canonical-vs-client comparison over
# the whole corpus with them, the register-leak/canary oracle over
# $PTXD_MUTANTS (3000) mutant tries, and the same oracle with exact-size
# operands under compute-sanitizer memcheck over $PTXD_MEMCHECK_MUTANTS (400)
# tries. Logs and findings go to $OUT (or .oracle/out); exits non-zero when
# any step found something.
set -uo pipefail
if [ "${1:-}" = pack ]; then
  cd "$(dirname "$0")/../.."
  pack=${2:-.oracle}
  exe=$(cargo test --features gpu-tests --test gpu --no-run --message-format=json \
    | jq -r 'select(.reason == "compiler-artifact" and .target.name == "gpu" and .executable != null) | .executable')
  [ -x "$exe" ] || { echo "oracle.sh: the gpu test executable was not built" >&2; exit 1; }
  rm -rf "$pack"
  mkdir -p "$pack/corpus"
  cp "$exe" "$pack/gpu-tests"
  strip "$pack/gpu-tests"
  cp tests/gpu/oracle.sh "$pack/oracle.sh"
  cp -r tests/corpus/*.ptx tests/corpus/nvcc tests/corpus/nvcc_g "$pack/corpus/"
  du -sh "$pack"
  exit 0
fi
cd "$(dirname "$0")"
HERE=$(pwd)
LOGS=${OUT:-$HERE/out}
rm -rf "$HERE/findings"
mkdir -p "$LOGS" "$HERE/findings"
export PATH="$PATH:/usr/local/cuda/bin" RUST_BACKTRACE=1
export PTXD_NVCC_CORPUS="$HERE/corpus/nvcc" PTXD_NVCC_G_CORPUS="$HERE/corpus/nvcc_g"
export PTXD_ORACLE_OUT="$HERE/findings"
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

bash corpus/nvcc_g/build.sh 2>&1 | tee "$LOGS/nvcc_g_build.log"
build_rc=${PIPESTATUS[0]}
tar czf "$LOGS/nvcc_g.tgz" -C corpus/nvcc_g ptx

./gpu-tests canonical:: --nocapture 2>&1 | tee "$LOGS/canonical.log"
canonical_rc=${PIPESTATUS[0]}

PTXD_MUTANTS=${PTXD_MUTANTS:-3000} ./gpu-tests oracle:: --nocapture 2>&1 | tee "$LOGS/oracle.log"
oracle_rc=${PIPESTATUS[0]}

PTXD_ORACLE_EXACT=1 PTXD_MUTANTS=${PTXD_MEMCHECK_MUTANTS:-400} \
  timeout "${PTXD_MEMCHECK_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 99 \
  ./gpu-tests oracle:: --nocapture 2>&1 | tee "$LOGS/memcheck.log"
memcheck_rc=${PIPESTATUS[0]}

tar czf "$LOGS/findings.tgz" -C "$HERE" findings
echo "oracle.sh: nvcc -G build $build_rc, canonical $canonical_rc, oracle $oracle_rc, memcheck $memcheck_rc"
[ "$build_rc" -eq 0 ] && [ "$canonical_rc" -eq 0 ] && [ "$oracle_rc" -eq 0 ] && [ "$memcheck_rc" -eq 0 ]
