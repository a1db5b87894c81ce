#!/usr/bin/env bash
# Compiles the compatibility corpus with nvcc (-O3 -ptx), 9 variants per .cu:
# -arch sm_80/sm_90/sm_100, each plain, -lineinfo and -use_fast_math.
#
#   bash build.sh [OUT_DIR]
#
# Without OUT_DIR the PTX goes into the tree: ptx/ (src/*.cu) and refused-ptx/
# (refused/*.cu) next to this script. With OUT_DIR it goes into OUT_DIR/ptx and
# OUT_DIR/refused-ptx. Output names: <stem>.<arch>[.lineinfo|.fastmath].ptx.
# Keeps going when a compile fails; prints a summary and every failure with
# nvcc's message; exits 1 when anything failed. Needs only bash and nvcc
# (PATH, or $NVCC, or /usr/local/cuda/bin/nvcc).
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out_root="${1:-$here}"
mkdir -p "$out_root" || { echo "cannot create $out_root" >&2; exit 2; }
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

archs=(sm_80 sm_90 sm_100)
variants=(plain lineinfo fastmath)

compiled=0
failed=0
failures=""
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

build_dir() {
    local src_dir="$1" dst_dir="$2"
    mkdir -p "$dst_dir"
    local cu stem arch variant flags suffix dst
    for cu in "$src_dir"/*.cu; do
        [ -e "$cu" ] || continue
        stem="$(basename "$cu" .cu)"
        for arch in "${archs[@]}"; do
            for variant in "${variants[@]}"; do
                case "$variant" in
                    plain) flags=(); suffix="" ;;
                    lineinfo) flags=(-lineinfo); suffix=".lineinfo" ;;
                    fastmath) flags=(-use_fast_math); suffix=".fastmath" ;;
                esac
                dst="$dst_dir/$stem.$arch$suffix.ptx"
                if "$nvcc" -O3 -ptx -arch="$arch" ${flags[@]+"${flags[@]}"} -o "$dst" "$cu" >"$log" 2>&1; then
                    compiled=$((compiled + 1))
                else
                    failed=$((failed + 1))
                    rm -f "$dst"
                    failures+="FAILED: $cu -arch=$arch ${flags[*]}"$'\n'"$(sed 's/^/    /' "$log")"$'\n'
                fi
            done
        done
    done
}

build_dir "$here/src" "$out_root/ptx"
build_dir "$here/refused" "$out_root/refused-ptx"

echo "corpus build: $compiled compiled, $failed failed (output in $out_root/ptx and $out_root/refused-ptx)"
if [ "$failed" -ne 0 ]; then
    printf '%s' "$failures"
    exit 1
fi
