#!/usr/bin/env bash
# Compiles the nvcc compatibility corpus's sources (../nvcc/src/*.cu and
# ../nvcc/refused/*.cu) as debug builds: nvcc -G -ptx (device code at -O0,
# `.target sm_XX, debug`), for sm_80 and sm_90 (the architectures whose PTX
# loads on an H200).
#
#   bash build.sh [OUT_DIR]
#
# Output: OUT_DIR/ptx/<stem>.<arch>.G.ptx (default OUT_DIR: next to this
# script). Keeps going when a compile fails; prints a summary and every
# failure with nvcc's message; exits 1 when anything failed. Needs only bash
# and nvcc (PATH, or $NVCC, or /usr/local/cuda/bin/nvcc).
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src_root="$here/../nvcc"
out_root="${1:-$here}"
mkdir -p "$out_root/ptx" || { echo "cannot create $out_root/ptx" >&2; exit 2; }
out_root="$(cd "$out_root" && pwd)"

nvcc="${NVCC:-}"
if [ -z "$nvcc" ]; then
    if command -v nvcc >/dev/null 2>&1; then
        nvcc="$(command -v nvcc)"
    elif [ -x /usr/local/cuda/bin/nvcc ]; then
        nvcc=/usr/local/cuda/bin/nvcc
    else
        echo "nvcc not found (PATH, \$NVCC, /usr/local/cuda/bin)" >&2
        exit 2
    fi
fi
echo "nvcc: $nvcc"
"$nvcc" --version | tail -n 2

compiled=0
failed=0
failures=""
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

for cu in "$src_root"/src/*.cu "$src_root"/refused/*.cu; do
    [ -e "$cu" ] || continue
    stem="$(basename "$cu" .cu)"
    for arch in sm_80 sm_90; do
        dst="$out_root/ptx/$stem.$arch.G.ptx"
        if "$nvcc" -G -ptx -arch="$arch" -o "$dst" "$cu" >"$log" 2>&1; then
            compiled=$((compiled + 1))
        else
            failed=$((failed + 1))
            rm -f "$dst"
            failures+="FAILED: $cu -arch=$arch -G"$'\n'"$(sed 's/^/    /' "$log")"$'\n'
        fi
    done
done

echo "debug corpus build: $compiled compiled, $failed failed (output in $out_root/ptx)"
if [ "$failed" -ne 0 ]; then
    printf '%s' "$failures"
    exit 1
fi
