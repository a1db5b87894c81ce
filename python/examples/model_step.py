"""A transformer-MLP step with its elementwise kernels run three ways, in one
process and one run: torch eager, the same PTX launched in-process
(``cuLaunchKernel`` through ctypes on torch's stream), and the same PTX
through ptxd from Python (``session.launch`` on torch tensors: the launch
ring, ordered on torch's stream by GPU words), answers awaited and deferred
(``defer_errors``), and deferred with ``add`` and ``silu_mul`` as one
``launch_many``.

    ptxd serve --socket /tmp/ptxd.sock &
    python python/examples/model_step.py /tmp/ptxd.sock [--steps N] [--batches 8,8192]

The step, on ``x`` of shape [batch, D] (f32, D=1024, H=4096):

    h = x @ W1                     torch matmul              [batch, H]
    g = gelu_tanh(h + b1)          elementwise: bias_gelu    [batch, H]
    y = g @ W2                     torch matmul              [batch, D]
    r = y + x                      elementwise: add          [batch, D]
    o = silu(r) * x                elementwise: silu_mul     [batch, D]

Eager torch runs its own kernels for the elementwise part (``h + b1`` and
``gelu`` are two, ``silu`` and ``*`` two more); the other two variants run the
three fused PTX kernels below (``b1`` is pre-broadcast to [batch, H] once,
since a scalar-ABI kernel indexes every operand alike). A small batch is
launch-bound, a large one bandwidth-bound.

Prints, per batch, the median step time of each variant over repetitions
and the ratios ptxd / in-process and ptxd / eager. Before timing, each
variant's output is checked: the in-process and the ptxd variant run the
same PTX on the same inputs and must agree bit for bit; both must match
eager torch within f32 rounding of the approximate exponent. A wrong result
fails the run instead of printing a figure.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import struct
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

import ptxd

D = 1024
H = 4096

HEADER = """.version 8.0
.target sm_90
.address_size 64

.visible .entry {name}(
\t.param .u64 {name}_param_0,
\t.param .u64 {name}_param_1,
\t.param .u64 {name}_param_2,
\t.param .u64 {name}_param_3
)
{{
\t.reg .pred \t%p<2>;
\t.reg .f32 \t%f<16>;
\t.reg .b32 \t%r<4>;
\t.reg .b64 \t%rd<15>;

\tld.param.u64 \t%rd2, [{name}_param_0];
\tld.param.u64 \t%rd3, [{name}_param_1];
\tld.param.u64 \t%rd4, [{name}_param_2];
\tld.param.u64 \t%rd5, [{name}_param_3];
\tmov.u32 \t%r1, %ctaid.x;
\tmov.u32 \t%r2, %ntid.x;
\tmul.wide.u32 \t%rd6, %r1, %r2;
\tmov.u32 \t%r3, %tid.x;
\tcvt.u64.u32 \t%rd7, %r3;
\tadd.s64 \t%rd1, %rd6, %rd7;
\tsetp.ge.s64 \t%p1, %rd1, %rd5;
\t@%p1 bra \t$L__BB0_2;

\tcvta.to.global.u64 \t%rd8, %rd2;
\tshl.b64 \t%rd9, %rd1, 2;
\tadd.s64 \t%rd10, %rd8, %rd9;
\tcvta.to.global.u64 \t%rd11, %rd3;
\tadd.s64 \t%rd12, %rd11, %rd9;
\tcvta.to.global.u64 \t%rd13, %rd4;
\tadd.s64 \t%rd14, %rd13, %rd9;
\tld.global.f32 \t%f1, [%rd10];
\tld.global.f32 \t%f2, [%rd12];
{body}\tst.global.f32 \t[%rd14], %f3;

$L__BB0_2:
\tret;

}}
"""


def f32(value: float) -> str:
    """A PTX f32 literal."""
    return "0f" + struct.pack(">f", value).hex().upper()


LOG2E = 1.4426950408889634
# gelu_tanh(v) = 0.5 v (1 + tanh(k (v + 0.044715 v^3))) = v / (1 + exp(-2k (v + 0.044715 v^3)))
GELU_K = 2 * 0.7978845608028654

BODIES = {
    # out = in0 + in1
    "add": "\tadd.f32 \t%f3, %f1, %f2;\n",
    # v = in0 + in1; out = v / (1 + 2^(-2k log2(e) v (1 + 0.044715 v^2)))
    "bias_gelu": (
        "\tadd.f32 \t%f4, %f1, %f2;\n"
        "\tmul.f32 \t%f5, %f4, %f4;\n"
        f"\tfma.rn.f32 \t%f6, %f5, {f32(0.044715)}, {f32(1.0)};\n"
        "\tmul.f32 \t%f7, %f4, %f6;\n"
        f"\tmul.f32 \t%f8, %f7, {f32(-GELU_K * LOG2E)};\n"
        "\tex2.approx.f32 \t%f9, %f8;\n"
        f"\tadd.f32 \t%f10, %f9, {f32(1.0)};\n"
        "\tdiv.rn.f32 \t%f3, %f4, %f10;\n"
    ),
    # out = in0 / (1 + 2^(-log2(e) in0)) * in1
    "silu_mul": (
        f"\tmul.f32 \t%f4, %f1, {f32(-LOG2E)};\n"
        "\tex2.approx.f32 \t%f5, %f4;\n"
        f"\tadd.f32 \t%f6, %f5, {f32(1.0)};\n"
        "\tdiv.rn.f32 \t%f7, %f1, %f6;\n"
        "\tmul.f32 \t%f3, %f7, %f2;\n"
    ),
}


def ptx_of(name: str) -> str:
    return HEADER.format(name=f"mlp_{name}", body=BODIES[name])


class Eager:
    name = "torch eager"

    def __init__(self, b1: torch.Tensor) -> None:
        self.b1 = b1

    def bias_gelu(self, h, bias_full, out):
        out.copy_(F.gelu(h + self.b1, approximate="tanh"))

    def add(self, a, b, out):
        torch.add(a, b, out=out)

    def silu_mul(self, a, b, out):
        torch.mul(F.silu(a), b, out=out)


class InProcess:
    """The PTX loaded into this process with the driver API (ctypes), launched
    with ``cuLaunchKernel`` on torch's current stream."""

    name = "in-process PTX (cuLaunchKernel)"
    BLOCK = 256

    def __init__(self, device: torch.device) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self._check(self.cuda.cuInit(0), "cuInit")
        torch.cuda.synchronize(device)  # torch's primary context is current on this thread
        self.functions: Dict[str, ctypes.c_void_p] = {}
        self.modules = []
        for name in BODIES:
            module = ctypes.c_void_p()
            self._check(self.cuda.cuModuleLoadData(ctypes.byref(module), ptx_of(name).encode() + b"\0"),
                        "cuModuleLoadData")
            function = ctypes.c_void_p()
            self._check(self.cuda.cuModuleGetFunction(ctypes.byref(function), module,
                                                      f"mlp_{name}".encode()), "cuModuleGetFunction")
            self.modules.append(module)
            self.functions[name] = function
        self.raw_stream = torch._C._cuda_getCurrentRawStream
        self.ordinal = device.index or 0

    @staticmethod
    def _check(code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"{call} failed: CUresult {code}")

    def _launch(self, name, a, b, out):
        n = out.numel()
        values = (ctypes.c_uint64 * 4)(a.data_ptr(), b.data_ptr(), out.data_ptr(), n)
        params = (ctypes.c_void_p * 4)(*(ctypes.addressof(values) + 8 * i for i in range(4)))
        grid = (n + self.BLOCK - 1) // self.BLOCK
        self._check(self.cuda.cuLaunchKernel(
            self.functions[name], grid, 1, 1, self.BLOCK, 1, 1, 0,
            ctypes.c_void_p(self.raw_stream(self.ordinal)), params, None,
        ), "cuLaunchKernel")

    def bias_gelu(self, h, bias_full, out):
        self._launch("bias_gelu", h, bias_full, out)

    def add(self, a, b, out):
        self._launch("add", a, b, out)

    def silu_mul(self, a, b, out):
        self._launch("silu_mul", a, b, out)


class ThroughPtxd:
    """The same PTX through ptxd: ``session.launch`` on the tensors, ordered
    on torch's current stream."""

    name = "through ptxd (Python, ring)"

    def __init__(self, session: ptxd.Session, device: torch.device) -> None:
        self.session = session
        if getattr(session, "defer_errors", False):
            self.name = "through ptxd (ring, defer_errors)"
        self.kernels = {name: session.load_ptx(ptx_of(name), f"mlp_{name}", device=device)
                        for name in BODIES}

    def bias_gelu(self, h, bias_full, out):
        self.session.launch(self.kernels["bias_gelu"], [h, bias_full], out)

    def add(self, a, b, out):
        self.session.launch(self.kernels["add"], [a, b], out)

    def silu_mul(self, a, b, out):
        self.session.launch(self.kernels["silu_mul"], [a, b], out)


class ThroughPtxdBatched(ThroughPtxd):
    """As :class:`ThroughPtxd`, with ``add`` and ``silu_mul`` (adjacent in
    the step, no torch kernel between them) as one ``launch_many``: one
    pair of stream operations and one ring call for both. ptxd runs a
    batch's launches in order, so ``silu_mul`` reads ``add``'s output."""

    def __init__(self, session: ptxd.Session, device: torch.device) -> None:
        super().__init__(session, device)
        self.name += ", launch_many tail"

    def add_silu_mul(self, y, x, r, o):
        self.session.launch_many([(self.kernels["add"], [y, x], r),
                                  (self.kernels["silu_mul"], [r, x], o)])


class Model:
    def __init__(self, batch: int, device: torch.device) -> None:
        generator = torch.Generator(device=device)
        generator.manual_seed(1234 + batch)
        scale = 1 / D ** 0.5

        def rand(*shape, s=1.0):
            return torch.randn(*shape, device=device, generator=generator) * s

        self.x = rand(batch, D)
        self.w1 = rand(D, H, s=scale)
        self.b1 = rand(H, s=0.1)
        self.w2 = rand(H, D, s=1 / H ** 0.5)
        self.bias_full = self.b1.expand(batch, H).contiguous()
        self.h = torch.empty(batch, H, device=device)
        self.g = torch.empty(batch, H, device=device)
        self.y = torch.empty(batch, D, device=device)
        self.r = torch.empty(batch, D, device=device)
        self.o = torch.empty(batch, D, device=device)

    def step(self, ew) -> torch.Tensor:
        torch.mm(self.x, self.w1, out=self.h)
        ew.bias_gelu(self.h, self.bias_full, self.g)
        torch.mm(self.g, self.w2, out=self.y)
        tail = getattr(ew, "add_silu_mul", None)
        if tail is not None:
            tail(self.y, self.x, self.r, self.o)
        else:
            ew.add(self.y, self.x, self.r)
            ew.silu_mul(self.r, self.x, self.o)
        return self.o


def time_steps(model: Model, ew, steps: int, reps: int, device: torch.device) -> float:
    """Median over ``reps`` of the wall time per step of ``steps`` steps,
    from the first enqueue to the stream's end (seconds)."""
    for _ in range(max(5, steps // 10)):
        model.step(ew)
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(steps):
            model.step(ew)
        torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - start) / steps)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("socket", nargs="?", default=None)
    parser.add_argument("--steps", type=int, default=0, help="steps per repetition (0: by batch)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--batches", default="8,8192")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False
    batches = [int(b) for b in args.batches.split(",")]
    with ptxd.Client(args.socket) as client, client.session("model-step") as session, \
            client.session("model-step-deferred", defer_errors=True) as deferred:
        gpu = torch.cuda.get_device_name(device)
        print(f"model step on {gpu}: D={D}, H={H}, f32; ptxd {ptxd.__version__}, torch {torch.__version__}")
        # The fourth: the same launches with ptxd's answers deferred (an
        # async launch returns once written; refusals come with the next).
        # The fifth: the deferred session with add and silu_mul as one
        # launch_many.
        variants = [None, InProcess(device), ThroughPtxd(session, device),
                    ThroughPtxd(deferred, device), ThroughPtxdBatched(deferred, device)]
        for batch in batches:
            model = Model(batch, device)
            variants[0] = Eager(model.b1)
            outputs: List[torch.Tensor] = []
            for ew in variants:
                model.o.fill_(float("nan"))
                outputs.append(model.step(ew).clone())
            torch.cuda.synchronize(device)
            deferred.wait_answers()
            eager, inproc, via_ptxd, via_deferred, via_batched = outputs
            for label, through in (("ptxd", via_ptxd), ("ptxd (defer_errors)", via_deferred),
                                   ("ptxd (defer_errors, launch_many tail)", via_batched)):
                if not torch.equal(inproc, through):
                    differ = (inproc != through).sum().item()
                    print(f"FAIL batch {batch}: {label} and in-process differ in {differ} elements")
                    return 1
            if not torch.allclose(inproc, eager, rtol=1e-3, atol=1e-4):
                worst = (inproc - eager).abs().max().item()
                print(f"FAIL batch {batch}: the PTX step differs from eager torch by up to {worst}")
                return 1
            steps = args.steps or (2000 if batch <= 64 else 50)
            times = {ew.name: time_steps(model, ew, steps, args.reps, device) for ew in variants}
            deferred.wait_answers()
            e, i, p, d, m = (times[ew.name] for ew in variants)
            print(f"batch {batch} ({steps} steps x {args.reps} reps, median per step):")
            for name, seconds in times.items():
                print(f"  {name:34s} {seconds * 1e6:10.1f} us")
            print(f"  ratio ptxd / in-process {p / i:6.3f}   ptxd / eager {p / e:6.3f}   "
                  f"in-process / eager {i / e:6.3f}")
            print(f"  ratio ptxd (defer_errors) / in-process {d / i:6.3f}   / eager {d / e:6.3f}")
            print(f"  ratio ptxd (defer_errors, launch_many tail) / in-process {m / i:6.3f}   "
                  f"/ eager {m / e:6.3f}")
        print(f"rings: {sum(1 for r in session._rings.values() if r)} "
              f"(unary fallbacks would show 0 here)")
    print("model_step: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
