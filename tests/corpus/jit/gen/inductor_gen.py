"""torch.compile (Inductor) pointwise kernels, static and dynamic shapes,
compiled on the GPU machine; writes <out>/inductor/<name>.ptx and a manifest.

Every PTX file the Triton cache gains while one function compiles belongs to
that function (Inductor may emit more than one kernel or autotune configs).

Usage: python3 inductor_gen.py OUT_DIR
"""
import glob
import json
import os
import sys
import tempfile

CACHE = tempfile.mkdtemp(prefix="ptxd-inductor-")
os.environ["TRITON_CACHE_DIR"] = os.path.join(CACHE, "triton")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(CACHE, "inductor")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402


def fns():
    return {
        "add": (lambda x, y: x + y, 2),
        "mul_add": (lambda x, y: x * y + 1.0, 2),
        "gelu": (lambda x: F.gelu(x), 1),
        "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), 1),
        "silu_mul": (lambda x, y: F.silu(x) * y, 2),
        "scale_shift": (lambda x: x * 1.5 - 0.25, 1),
        "relu": (lambda x: torch.relu(x), 1),
        "sigmoid_mul": (lambda x: torch.sigmoid(x) * x, 1),
        "tanh": (lambda x: torch.tanh(x), 1),
        "exp": (lambda x: torch.exp(x), 1),
        "residual_add": (lambda x, y: (x + y) * 0.5, 2),
    }


def ptx_files():
    return set(glob.glob(os.path.join(os.environ["TRITON_CACHE_DIR"], "**", "*.ptx"), recursive=True))


def main():
    out = os.path.join(sys.argv[1], "inductor")
    os.makedirs(out, exist_ok=True)
    manifest = {
        "generator": "tests/corpus/jit/gen/inductor_gen.py",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": torch.cuda.get_device_name(0),
        "kernels": [],
    }
    cases = []
    for name, (fn, arity) in fns().items():
        for dname, dtype in (("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)):
            if dname != "f32" and name not in ("add", "gelu", "silu_mul", "residual_add"):
                continue
            for dyn in (False, True):
                cases.append((name, fn, arity, dname, dtype, dyn))
    # Broadcast: a row bias over a 2-D activation.
    cases.append(("bias_gelu_2d", lambda x, b: F.gelu(x + b), "bias", "f32", torch.float32, False))
    cases.append(("bias_gelu_2d", lambda x, b: F.gelu(x + b), "bias", "f32", torch.float32, True))
    for name, fn, arity, dname, dtype, dyn in cases:
        torch._dynamo.reset()
        before = ptx_files()
        if arity == "bias":
            args = [torch.randn(64, 1024, device="cuda", dtype=dtype), torch.randn(1024, device="cuda", dtype=dtype)]
        else:
            args = [torch.randn(65536 + 17, device="cuda", dtype=dtype) for _ in range(arity)]
        try:
            c = torch.compile(fn, dynamic=dyn)
            got = c(*args)
            torch.cuda.synchronize()
            ref = fn(*args)
            ok = torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-2)
        except Exception as e:  # noqa: BLE001
            print(f"FAILED {name} {dname} dyn={dyn}: {e}")
            continue
        new = sorted(ptx_files() - before)
        tag = "dyn" if dyn else "static"
        for i, path in enumerate(new):
            base = f"{name}_{dname}_{tag}" + (f"_{i}" if len(new) > 1 else "")
            with open(path) as f:
                text = f.read()
            with open(os.path.join(out, base + ".ptx"), "w") as f:
                f.write(text)
            meta = {}
            js = path[:-4] + ".json"
            if os.path.exists(js):
                with open(js) as f:
                    meta = json.load(f)
            manifest["kernels"].append({
                "file": f"inductor/{base}.ptx",
                "entry": meta.get("name"),
                "op": name,
                "dtype": dname,
                "dynamic": dyn,
                "num_warps": meta.get("num_warps"),
                "shared": meta.get("shared"),
                "matches_eager": bool(ok),
                "shape": [list(a.shape) for a in args],
            })
            print("ok", base, meta.get("name"))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"inductor: {len(manifest['kernels'])} kernels")


if __name__ == "__main__":
    main()
