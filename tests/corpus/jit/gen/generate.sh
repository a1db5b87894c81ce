#!/usr/bin/env bash
# Regenerates tests/corpus/jit/ on a GPU machine with torch, Triton and
# cuda-python: bash tests/corpus/jit/gen/generate.sh OUT_DIR
# (then copy OUT_DIR/{triton,inductor,nvrtc} into tests/corpus/jit/).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: generate.sh OUT_DIR}"
mkdir -p "$out"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -2
} > "$out/VERSIONS.txt" 2>&1
python3 "$here/nvrtc_gen.py" "$out" 2>&1 | tail -40
python3 "$here/triton_gen.py" "$out" 2>&1 | grep -v '^ok ' | tail -40
python3 "$here/inductor_gen.py" "$out" 2>&1 | grep -v '^ok ' | tail -40
