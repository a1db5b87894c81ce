"""Triton elementwise kernels written as vLLM/SGLang write them, compiled by
Triton on the GPU machine; writes <out>/triton/<name>.ptx and a manifest.

Usage: python3 triton_gen.py OUT_DIR
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y, mask=mask)


@triton.jit
def gelu_tanh_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
    y = 0.5 * x * (1.0 + t)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    s = x * tl.sigmoid(x)
    tl.store(out_ptr + offs, (s * y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def scale_shift_kernel(x_ptr, out_ptr, n, scale, shift, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (x * scale + shift).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


KERNELS = {
    "add": (add_kernel, 2, []),
    "mul": (mul_kernel, 2, []),
    "gelu_tanh": (gelu_tanh_kernel, 1, []),
    "silu_mul": (silu_mul_kernel, 2, []),
    "scale_shift": (scale_shift_kernel, 1, [1.5, -0.25]),
    "relu": (relu_kernel, 1, []),
}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# (BLOCK_SIZE, num_warps, n): n % 16 == 0 lets Triton assume divisibility
# (its vector accesses are then predicated on their first lane only).
SHAPES = [(1024, 4, 1 << 16), (1024, 4, (1 << 16) + 3), (256, 4, 1 << 16), (4096, 8, 1 << 20)]


def main():
    out = os.path.join(sys.argv[1], "triton")
    os.makedirs(out, exist_ok=True)
    manifest = {
        "generator": "tests/corpus/jit/gen/triton_gen.py",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "kernels": [],
    }
    for kname, (fn, inputs, scalars) in KERNELS.items():
        for dname, dtype in DTYPES.items():
            for block, warps, n in SHAPES:
                if dname != "f32" and block == 256:
                    continue
                xs = [torch.randn(n, device="cuda", dtype=dtype) for _ in range(inputs)]
                o = torch.empty(n, device="cuda", dtype=dtype)
                grid = (triton.cdiv(n, block),)
                try:
                    k = fn[grid](*xs, o, n, *scalars, BLOCK_SIZE=block, num_warps=warps)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"FAILED {kname} {dname} {block} {warps} {n}: {e}")
                    continue
                div = "div16" if n % 16 == 0 else "nodiv"
                name = f"{kname}_{dname}_b{block}_w{warps}_{div}"
                with open(os.path.join(out, name + ".ptx"), "w") as f:
                    f.write(k.asm["ptx"])
                md = k.metadata
                manifest["kernels"].append({
                    "file": f"triton/{name}.ptx",
                    "entry": md.name,
                    "op": kname,
                    "dtype": dname,
                    "block_size": block,
                    "num_warps": md.num_warps,
                    "shared": md.shared,
                    "inputs": inputs,
                    "scalars": scalars,
                    "n_at_compile": n,
                    "grid": "cdiv(n, BLOCK_SIZE)",
                })
                print("ok", name, md.name)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"triton: {len(manifest['kernels'])} kernels")


if __name__ == "__main__":
    main()
