"""NVRTC kernels in the scalar ABI (and the seed's Vectorized and Strided
schedules), compiled with NVRTC through cuda-python on the GPU machine, with
and without -G and --use_fast_math; writes <out>/nvrtc/<name>.ptx and a
manifest.

Usage: python3 nvrtc_gen.py OUT_DIR
"""
import json
import os
import sys

try:
    from cuda.bindings import nvrtc
except ImportError:  # older cuda-python
    from cuda import nvrtc

HEAD = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
IDX64 = "long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;"
IDX32 = "int i = blockIdx.x * blockDim.x + threadIdx.x;"


def scalar(name, ty, inputs, body, params=0, idx=IDX64, count="long long n"):
    args = [f"const {ty}* in{k}" for k in range(inputs)] + [f"{ty}* out", count]
    args += [f"float p{k}" for k in range(params)]
    src = f'extern "C" __global__ void {name}({", ".join(args)}) {{\n  {idx}\n  if (i < n) {{ {body} }}\n}}\n'
    return {"name": name, "abi": "scalar", "inputs": inputs, "params": params, "src": src}


KERNELS = [
    scalar("add_f32", "float", 2, "out[i] = in0[i] + in1[i];"),
    scalar("sub_f32", "float", 2, "out[i] = in0[i] - in1[i];"),
    scalar("mul_f32", "float", 2, "out[i] = in0[i] * in1[i];"),
    scalar("affine_f32", "float", 1, "out[i] = in0[i] * p0 + p1;", params=2),
    scalar("clamp_f32", "float", 1, "out[i] = fminf(fmaxf(in0[i], p0), p1);", params=2),
    scalar("relu_f32", "float", 1, "out[i] = fmaxf(in0[i], 0.0f);"),
    scalar("exp_f32", "float", 1, "out[i] = expf(in0[i]);"),
    scalar("sin_f32", "float", 1, "out[i] = sinf(in0[i]);"),
    scalar("cos_f32", "float", 1, "out[i] = cosf(in0[i]);"),
    scalar("tanh_f32", "float", 1, "out[i] = tanhf(in0[i]);"),
    scalar("gelu_erf_f32", "float", 1, "float x = in0[i]; out[i] = 0.5f * x * (1.0f + erff(x * 0.70710678f));"),
    scalar("silu_mul_f32", "float", 2, "float a = in0[i]; out[i] = a / (1.0f + expf(-a)) * in1[i];"),
    scalar("sqrt_f32", "float", 1, "out[i] = sqrtf(fabsf(in0[i]));"),
    scalar("rsqrt_f32", "float", 1, "out[i] = rsqrtf(fabsf(in0[i]) + 1.0f);"),
    scalar("select_f32", "float", 2, "out[i] = in0[i] > in1[i] ? in0[i] : p0;", params=1),
    scalar("sin_f64", "double", 1, "out[i] = sin(in0[i]);"),
    scalar("pow_f64", "double", 1, "out[i] = pow(fabs(in0[i]), 2.5);"),
    scalar("add_f64", "double", 2, "out[i] = in0[i] + in1[i];"),
    scalar("hadd_f16", "__half", 2, "out[i] = __hadd(in0[i], in1[i]);"),
    scalar("silu_mul_f16", "__half", 2,
           "float a = __half2float(in0[i]); out[i] = __float2half(a / (1.0f + __expf(-a)) * __half2float(in1[i]));"),
    scalar("add_bf16", "__nv_bfloat16", 2, "out[i] = __float2bfloat16(__bfloat162float(in0[i]) + __bfloat162float(in1[i]));"),
    scalar("add_i32", "int", 2, "out[i] = in0[i] + in1[i];"),
    # 32-bit indices, as hand-written CUDA often has them.
    scalar("add_f32_idx32", "float", 2, "out[i] = in0[i] + in1[i];", idx=IDX32),
    scalar("affine_f32_idx32", "float", 1, "out[i] = in0[i] * p0 + p1;", params=2, idx=IDX32),
    scalar("add_f32_idx32_n32", "float", 2, "out[i] = in0[i] + in1[i];", idx=IDX32, count="int n"),
]

# The seed's Vectorized{width} schedule: the pointee reinterpreted as a vector,
# n counted in vectors.
for w, vt in ((4, "float4"), (2, "float2")):
    comps = "xyzw"[:w]
    body = f"{vt} a = in0[i], b = in1[i]; {vt} r; " + " ".join(f"r.{c} = a.{c} + b.{c};" for c in comps) + " out[i] = r;"
    k = scalar(f"add_f32_vec{w}", vt, 2, body)
    k["abi"] = f"vectorized{w}"
    KERNELS.append(k)
    body = f"{vt} a = in0[i]; {vt} r; " + " ".join(f"r.{c} = a.{c} * p0 + p1;" for c in comps) + " out[i] = r;"
    k = scalar(f"affine_f32_vec{w}", vt, 1, body, params=2)
    k["abi"] = f"vectorized{w}"
    KERNELS.append(k)
k = scalar("add_f16_vec2", "__half2", 2, "out[i] = __hadd2(in0[i], in1[i]);")
k["abi"] = "vectorized2"
KERNELS.append(k)

# The seed's Strided schedule: by-value shape and stride args after n.
STRIDED = [
    ("add_f32_strided", 2,
     "long long r = i / d1; long long c = i % d1; out[i] = in0[r * s0 + c] + in1[c * s1];",
     "long long s0, long long s1, long long d0, long long d1"),
    ("bias_add_f32_strided", 2,
     "long long c = i % d1; out[i] = in0[i] + in1[c * s1];",
     "long long s0, long long s1, long long d0, long long d1"),
    ("transpose_copy_f32_strided", 1,
     "long long r = i / d1; long long c = i % d1; out[i] = in0[c * s0 + r];",
     "long long s0, long long d0, long long d1"),
]
for name, inputs, body, extra in STRIDED:
    args = [f"const float* in{k}" for k in range(inputs)] + ["float* out", "long long n", extra]
    src = f'extern "C" __global__ void {name}({", ".join(args)}) {{\n  {IDX64}\n  if (i < n) {{ {body} }}\n}}\n'
    KERNELS.append({"name": name, "abi": "strided", "inputs": inputs, "params": 0, "src": src})

OPTIONS = {"O3": [], "G": ["-G"], "fast": ["--use_fast_math"]}


def check(res, what):
    err = res[0]
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err}")
    return res[1:] if len(res) > 1 else None


def compile_ptx(src, name, opts):
    prog = check(nvrtc.nvrtcCreateProgram(src.encode(), f"{name}.cu".encode(), 0, [], []), "create")[0]
    inc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
    all_opts = [b"--gpu-architecture=compute_90", f"--include-path={inc}".encode()] + [o.encode() for o in opts]
    res = nvrtc.nvrtcCompileProgram(prog, len(all_opts), all_opts)
    if int(res[0]) != 0:
        size = check(nvrtc.nvrtcGetProgramLogSize(prog), "logsize")[0]
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(log.decode(errors="replace"))
    size = check(nvrtc.nvrtcGetPTXSize(prog), "ptxsize")[0]
    buf = b" " * size
    check(nvrtc.nvrtcGetPTX(prog, buf), "ptx")
    return buf.rstrip(b"\0 ").decode()


def main():
    out = os.path.join(sys.argv[1], "nvrtc")
    os.makedirs(out, exist_ok=True)
    ver = nvrtc.nvrtcVersion()
    manifest = {"generator": "tests/corpus/jit/gen/nvrtc_gen.py", "nvrtc": f"{ver[1]}.{ver[2]}", "kernels": []}
    for k in KERNELS:
        for oname, opts in OPTIONS.items():
            try:
                ptx = compile_ptx(HEAD + k["src"], k["name"], opts)
            except Exception as e:  # noqa: BLE001
                print(f"FAILED {k['name']} {oname}: {e}")
                continue
            base = f"{k['name']}_{oname}"
            with open(os.path.join(out, base + ".ptx"), "w") as f:
                f.write(ptx)
            manifest["kernels"].append({
                "file": f"nvrtc/{base}.ptx", "entry": k["name"], "abi": k["abi"], "inputs": k["inputs"],
                "params": k["params"], "options": opts, "source": k["src"],
            })
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"nvrtc: {len(manifest['kernels'])} kernels")


if __name__ == "__main__":
    main()
