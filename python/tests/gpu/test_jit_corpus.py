"""The JIT corpus on the GPU (tests/corpus/jit/nvrtc, generated on an H200
by NVRTC 13.0): every kernel ptxd accepts is launched through ptxd and, on
the same fresh random inputs, in this process from the client's own PTX text
(``cuModuleLoadData`` + ``cuLaunchKernel``, the geometry ptxd reports); the
two outputs must be equal bit for bit. ptxd runs its canonical text, so this
checks that the text ptxd compiles computes what the client's text computes.

The corpus folder is ``$PTXD_JIT_CORPUS`` (the GPU pack's ``jit/``) or the
repository's ``tests/corpus/jit``.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from pathlib import Path

import pytest

import ptxd
from support import REPO

CORPUS = Path(os.environ.get("PTXD_JIT_CORPUS", REPO / "tests" / "corpus" / "jit"))

# Pointee type -> (torch dtype name, lanes).
POINTEE = {
    "float": ("float32", 1), "double": ("float64", 1), "__half": ("float16", 1),
    "__nv_bfloat16": ("bfloat16", 1), "int": ("int32", 1),
    "float4": ("float32", 4), "float2": ("float32", 2), "__half2": ("float16", 2),
}


def params_of(source: str):
    """The kernel's parameters as (C type, name) from its CUDA C source."""
    args = re.search(r"void \w+\(([^)]*)\)", source).group(1)
    out = []
    for arg in args.split(","):
        ctype, name = arg.strip().rsplit(" ", 1)
        out.append((ctype.strip(), name))
    return out


class InProcess:
    """The client's PTX, loaded and launched in this process on torch's
    primary context and current stream."""

    def __init__(self, torch) -> None:
        self.torch = torch
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.check(self.cuda.cuInit(0), "cuInit")
        torch.cuda.synchronize()
        self.modules = []

    @staticmethod
    def check(code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"{call} failed: CUresult {code}")

    def launch(self, ptx: str, entry: str, args, grid: int, block: int) -> None:
        module = ctypes.c_void_p()
        self.check(self.cuda.cuModuleLoadData(ctypes.byref(module), ptx.encode() + b"\0"), "cuModuleLoadData")
        self.modules.append(module)
        function = ctypes.c_void_p()
        self.check(self.cuda.cuModuleGetFunction(ctypes.byref(function), module, entry.encode()),
                   "cuModuleGetFunction")
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
        stream = ctypes.c_void_p(self.torch._C._cuda_getCurrentRawStream(0))
        self.check(self.cuda.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, params, None),
                   "cuLaunchKernel")
        self.torch.cuda.synchronize()


def random_tensor(torch, dtype_name: str, count: int, gen):
    dtype = getattr(torch, dtype_name)
    if dtype_name == "int32":
        return torch.randint(-(1 << 20), 1 << 20, (count,), dtype=dtype, device="cuda", generator=gen)
    return (torch.rand(count, device="cuda", generator=gen, dtype=torch.float32) * 8 - 4).to(dtype)


def strided_matches(torch, gpu_session, here, gen, kernel, entry, ptx, pointers, scalars) -> bool:
    """The seed's Strided schedule (f32, `long long` shape and stride args
    after `n`): a 211 × 317 grid, rows padded (`s0` past the row), a
    contiguous bias (`s1` = 1), the transpose reading columns; launched
    through ptxd with typed u64 args and here from the client's text; equal
    bit for bit."""
    values = {"d0": 211, "d1": 317, "s1": 1,
              "s0": 213 if "transpose" in entry["entry"] else 320}
    argv = [values[name] for _, name in scalars[1:]]
    n = values["d0"] * values["d1"]
    span = 120_000  # past every index these shapes reach (at most 67,518)
    inputs = [random_tensor(torch, "float32", span, gen) for _ in pointers[:-1]]
    out_ptxd = torch.full((n,), float("nan"), device="cuda")
    out_here = out_ptxd.clone()
    buffers = [gpu_session.register(t) for t in inputs] + [gpu_session.register(out_ptxd)]
    gpu_session.launch(kernel, buffers[:-1], buffers[-1], n, args=[ptxd.u64(v) for v in argv], sync=True)
    block = kernel.signature[3]
    args = [ctypes.c_uint64(t.data_ptr()) for t in inputs] + [ctypes.c_uint64(out_here.data_ptr())]
    args += [ctypes.c_int64(n)] + [ctypes.c_int64(v) for v in argv]
    here.launch(ptx, entry["entry"], args, (n + block - 1) // block, block)
    torch.cuda.synchronize()
    assert not torch.isnan(out_ptxd).any(), f"{entry['file']}: ptxd left outputs unwritten"
    return torch.equal(out_ptxd.view(torch.uint8), out_here.view(torch.uint8))


def test_every_accepted_nvrtc_kernel_computes_bit_for_bit_what_its_own_text_computes(torch, gpu_session):
    manifest = json.loads((CORPUS / "nvrtc" / "manifest.json").read_text())
    here = InProcess(torch)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
    accepted, refused, differ = [], {}, []
    for entry in manifest["kernels"]:
        ptx = (CORPUS / entry["file"]).read_text()
        try:
            kernel = gpu_session.load_ptx(ptx, entry["entry"], 0)
        except ptxd.Refused as refusal:
            key = refusal.metadata.get("sub_reason", refusal.reason)
            refused[key] = refused.get(key, 0) + 1
            continue
        block = kernel.signature[3]
        params = params_of(entry["source"])
        pointers = [(t, n) for t, n in params if t.endswith("*")]
        scalars = [(t, n) for t, n in params if not t.endswith("*")]
        if len(scalars) != 1 + entry["params"]:
            if entry.get("abi") != "strided":
                refused["test: by-value args beyond n"] = refused.get("test: by-value args beyond n", 0) + 1
                continue
            if not strided_matches(torch, gpu_session, here, gen, kernel, entry, ptx, pointers, scalars):
                differ.append(entry["file"])
            accepted.append(entry["file"])
            continue
        count = 100_003  # elements (vectors for a vector type): not a multiple of any block
        tensors = []
        for ctype, _ in pointers:
            dtype_name, lanes = POINTEE[ctype.replace("const ", "").rstrip("*").strip()]
            tensors.append(random_tensor(torch, dtype_name, count * lanes, gen))
        out_ptxd = torch.full_like(tensors[-1], float("nan")) if tensors[-1].is_floating_point() \
            else torch.full_like(tensors[-1], -7)
        out_here = out_ptxd.clone()
        floats = [float(torch.rand(1, generator=torch.Generator().manual_seed(len(accepted) + i)) * 2 - 1)
                  for i in range(entry["params"])]
        # Through ptxd, on registered buffers (the kernel's own element size).
        buffers = [gpu_session.register(t) for t in tensors[:-1]] + [gpu_session.register(out_ptxd)]
        for buffer, (ctype, _) in zip(buffers, pointers):
            # A vector pointee (float4, __half2, ...): the buffer holds
            # vectors, `lanes` of the tensor's elements each.
            buffer.itemsize *= POINTEE[ctype.replace("const ", "").rstrip("*").strip()][1]
        gpu_session.launch(kernel, buffers[:-1], buffers[-1], count, params=floats, sync=True)
        # In this process, from the client's text.
        args = [ctypes.c_uint64(t.data_ptr()) for t in tensors[:-1]] + [ctypes.c_uint64(out_here.data_ptr())]
        count_type = scalars[0][0]
        args.append(ctypes.c_int32(count) if count_type == "int" else ctypes.c_int64(count))
        args += [ctypes.c_float(f) for f in floats]
        here.launch(ptx, entry["entry"], args, (count + block - 1) // block, block)
        torch.cuda.synchronize()
        if not torch.equal(out_ptxd.view(torch.uint8), out_here.view(torch.uint8)):
            differ.append(entry["file"])
        accepted.append(entry["file"])
    summary = (f"jit corpus (nvrtc): {len(accepted)} accepted and launched, {len(differ)} different; "
               f"refused {refused}")
    print("\n" + summary)
    logs = os.environ.get("PTXD_TEST_LOGS")
    if logs:
        Path(logs, "jit-corpus.txt").write_text(summary + "\n" + "\n".join(accepted) + "\n")
    assert accepted, "ptxd accepted no kernel of the corpus"
    assert not differ, f"ptxd's result differs from the client's text for {differ}"


# The Triton-family contract as `ptxd verify` and `Kernel.contract` print it.
_PARAM = re.compile(r"(\w+): (ptr read|ptr written|ptr null|count \.\w+|\.\w+)")
_PER_THREAD = re.compile(r"grid ceil\(n / block × (\d+)\)")
_TORCH_DTYPE = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
_CTYPE = {".f32": ctypes.c_float, ".f64": ctypes.c_double, ".u32": ctypes.c_uint32,
          ".s32": ctypes.c_int32, ".u64": ctypes.c_uint64, ".s64": ctypes.c_int64,
          ".b32": ctypes.c_uint32, ".b64": ctypes.c_uint64}


_INTEGER = {".u32", ".s32", ".u64", ".s64", ".b32", ".b64"}


def contract_params(contract: str):
    """(name, kind) for every param, in kernel order."""
    inside = contract.split("params(", 1)[1].split(");", 1)[0]
    return _PARAM.findall(inside)


@pytest.mark.parametrize("family", ["triton", "inductor"])
def test_every_accepted_triton_and_inductor_kernel_matches_its_own_text_bit_for_bit(
        torch, gpu_session, family):
    """Each Triton/Inductor corpus kernel ptxd accepts, launched through ptxd
    (typed args, ptxd's grid, null scratch pointers) and in this process from
    the compiler's own PTX with the same params and grid: equal bit for bit,
    and the padding past n untouched by both."""
    manifest = json.loads((CORPUS / family / "manifest.json").read_text())
    here = InProcess(torch)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
    accepted, refused, differ = [], {}, []
    for entry in manifest["kernels"]:
        ptx = (CORPUS / entry["file"]).read_text()
        try:
            kernel = gpu_session.load_ptx(ptx, entry["entry"], 0)
        except ptxd.Refused as refusal:
            key = refusal.metadata.get("sub_reason", refusal.reason)
            refused[key] = refused.get(key, 0) + 1
            continue
        contract = kernel.contract
        params = contract_params(contract)
        block = kernel.signature[3]
        per_thread = int(m.group(1)) if (m := _PER_THREAD.search(contract)) else 1
        if family == "inductor":
            n = 1
            for dim in entry["shape"][0]:
                n *= dim
        else:
            # Triton's `div16` builds assumed n % 16 == 0 (their masks test
            # the first lane only); `nodiv` builds take any n.
            n = 100_000 if "div16" in entry["file"] else 100_003
        dtype = _TORCH_DTYPE[entry["dtype"]]
        pad = 64
        reads = [random_tensor(torch, dtype, n + pad, gen)
                 for _, kind in params if kind == "ptr read"]
        out_ptxd = torch.full((n + pad,), float("nan"), device="cuda").to(getattr(torch, dtype))
        out_here = out_ptxd.clone()
        scalars = [kind for _, kind in params if kind.startswith(".")]
        # A float param gets a random value; an integer one is a size symbol
        # of a dynamic build (Inductor's `ks0`: the row length a 2-D
        # broadcast's bias is indexed by, `x mod ks0`), the first input's
        # last dimension (1 where the manifest gives no shape).
        size = entry["shape"][0][-1] if "shape" in entry else 1
        values = [size if kind in _INTEGER else
                  round(float(torch.rand(1, generator=torch.Generator().manual_seed(len(accepted) + i)))
                        * 2 - 1, 3) for i, kind in enumerate(scalars)]
        # Through ptxd: operands registered whole, n explicit, typed args.
        buffers = [gpu_session.register(t) for t in reads]
        gpu_session.launch(kernel, buffers, gpu_session.register(out_ptxd), n,
                           args=values, sync=True)
        # In this process: the same params in kernel order.
        args, next_read, next_scalar = [], iter(reads), iter(zip(scalars, values))
        for _, kind in params:
            if kind == "ptr read":
                args.append(ctypes.c_uint64(next(next_read).data_ptr()))
            elif kind == "ptr written":
                args.append(ctypes.c_uint64(out_here.data_ptr()))
            elif kind == "ptr null":
                args.append(ctypes.c_uint64(0))
            elif kind.startswith("count"):
                args.append(_CTYPE[kind.split(" ", 1)[1]](n))
            else:
                ty, value = next(next_scalar)
                args.append(_CTYPE[ty](value))
        grid = -(-n // (block * per_thread))
        here.launch(ptx, entry["entry"], args, grid, block)
        torch.cuda.synchronize()
        if not torch.equal(out_ptxd.view(torch.uint8), out_here.view(torch.uint8)):
            differ.append(entry["file"])
        accepted.append(entry["file"])
    summary = (f"jit corpus ({family}): {len(accepted)} accepted and launched, "
               f"{len(differ)} different; refused {refused}")
    print("\n" + summary)
    logs = os.environ.get("PTXD_TEST_LOGS")
    if logs:
        Path(logs, f"jit-corpus-{family}.txt").write_text(summary + "\n" + "\n".join(accepted) + "\n")
    assert len(accepted) * 100 >= 95 * len(manifest["kernels"]), summary
    assert not differ, f"ptxd's result differs from the compiler's text for {differ}"
