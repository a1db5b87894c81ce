#!/usr/bin/env bash
# The GPU soundness oracle and the canonical-vs-client comparison, on a GPU
# machine, from a test binary built elsewhere:
#
#   here:  cargo test --features gpu-tests --test gpu --no-run   # then copy the
#          executable it names to .oracle/gpu-tests (git-ignored) and strip it
#   there: bash tests/gpu/oracle.sh          # run(command=..., carry=[".oracle"])
#
# Steps: the -G debug builds of the nvcc corpus (tests/corpus/nvcc_g/build.sh,
# packed as nvcc_g.tgz to commit), the canonical-vs-client comparison over
# the whole corpus with them, the register-leak/canary oracle over
# $PTXD_MUTANTS (3000) mutant tries, and the same oracle with exact-size
# operands under compute-sanitizer memcheck over $PTXD_MEMCHECK_MUTANTS (400)
# tries. Logs and findings go to $OUT (or .oracle/out); exits non-zero when
# any step found something.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
LOGS=${OUT:-$ROOT/.oracle/out}
mkdir -p "$LOGS" "$ROOT/.oracle/findings"
export PATH="$PATH:/usr/local/cuda/bin" RUST_BACKTRACE=1
export PTXD_NVCC_CORPUS="$ROOT/tests/corpus/nvcc" PTXD_NVCC_G_CORPUS="$ROOT/tests/corpus/nvcc_g"
export PTXD_ORACLE_OUT="$ROOT/.oracle/findings"
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

bash tests/corpus/nvcc_g/build.sh 2>&1 | tee "$LOGS/nvcc_g_build.log"
build_rc=${PIPESTATUS[0]}
tar czf "$LOGS/nvcc_g.tgz" -C tests/corpus/nvcc_g ptx

./.oracle/gpu-tests canonical:: --nocapture 2>&1 | tee "$LOGS/canonical.log"
canonical_rc=${PIPESTATUS[0]}

PTXD_MUTANTS=${PTXD_MUTANTS:-3000} ./.oracle/gpu-tests oracle:: --nocapture 2>&1 | tee "$LOGS/oracle.log"
oracle_rc=${PIPESTATUS[0]}

PTXD_ORACLE_EXACT=1 PTXD_MUTANTS=${PTXD_MEMCHECK_MUTANTS:-400} \
  timeout "${PTXD_MEMCHECK_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 99 \
  ./.oracle/gpu-tests oracle:: --nocapture 2>&1 | tee "$LOGS/memcheck.log"
memcheck_rc=${PIPESTATUS[0]}

tar czf "$LOGS/findings.tgz" -C "$ROOT/.oracle" findings
echo "oracle.sh: nvcc -G build $build_rc, canonical $canonical_rc, oracle $oracle_rc, memcheck $memcheck_rc"
[ "$build_rc" -eq 0 ] && [ "$canonical_rc" -eq 0 ] && [ "$oracle_rc" -eq 0 ] && [ "$memcheck_rc" -eq 0 ]
