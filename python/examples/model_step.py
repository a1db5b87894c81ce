"""A transformer-MLP step with its elementwise kernels run three ways, in one
process and one run: torch eager, the same PTX launched in-process
(``cuLaunchKernel`` through ctypes on torch's stream), and the same PTX
through ptxd from Python (``session.launch`` on torch tensors: the launch
ring, ordered on torch's stream by GPU words), answers awaited and deferred
(``defer_errors``), and deferred with ``add`` and ``silu_mul`` as one
``launch_many``.

    ptxd serve --socket /tmp/ptxd.sock &
    python python/examples/model_step.py /tmp/ptxd.sock [--steps N] [--reps N] [--fed-reps N]
        [--batches 8,8192]

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

Prints, per batch, for each variant the median over repetitions of the
wall time per step (first enqueue to the stream's end), the CPU issue time
per step (the enqueue loop alone, before the sync), the GPU span per step
(CUDA events around the loop) and the fed GPU time per step (the steps
queued behind a sleep kernel, so the GPU never waits for the CPU), and what
bounds the variant: its kernels (fed ~ wall), the CPU's enqueue loop (issue
~ wall; an awaited ptxd launch includes ptxd's answer), or the ordering
(the GPU idles between kernels). The variants run interleaved, one
repetition of each in turn, so drift in clocks or other load lands on all
alike, and each ratio is the median of the per-repetition ratios, with its
min and max.

Before and after timing, each variant's output is checked: the in-process
and the ptxd variants run the same PTX on the same inputs and must agree
bit for bit; both must match eager torch within f32 rounding of the
approximate exponent. A wrong result fails the run (exit status 1) instead
of printing a figure.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import struct
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

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


class _Site:
    """One call site's prebuilt launch: the kernel, its parameter buffer
    (three pointers and n) and the ``void*`` array that points into it, made
    once; a call rewrites the values only when the operands moved (what a
    real launcher's per-call-site cache does: Triton's and CuPy's pack their
    arguments in C, not in per-call ctypes objects)."""

    __slots__ = ("function", "values", "params", "params_at", "key", "grid")

    def __init__(self, function: int) -> None:
        self.function = function
        self.values = (ctypes.c_uint64 * 4)()
        self.params = (ctypes.c_void_p * 4)(*(ctypes.addressof(self.values) + 8 * i
                                              for i in range(4)))
        self.params_at = ctypes.addressof(self.params)
        self.key: Tuple[int, int, int, int] = (0, 0, 0, 0)
        self.grid = 0


class InProcess:
    """The PTX loaded into this process with the driver API (ctypes), launched
    with ``cuLaunchKernel`` on torch's current stream, as cheaply as ctypes
    allows: ``cuLaunchKernel``'s argument types declared once (plain ints
    pass without a ``c_void_p`` per argument), and per call site a prebuilt
    parameter buffer (:class:`_Site`). A call reads the operands' pointers,
    n and torch's raw stream (a launcher must) and makes one foreign call.
    (Until w32b it built two ctypes arrays and four ``c_void_p`` per call,
    about 3-4 us that flattered every ratio against it.)"""

    name = "in-process PTX (cuLaunchKernel)"
    BLOCK = 256

    def __init__(self, device: torch.device) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")  # its own function objects
        self._check(self.cuda.cuInit(0), "cuInit")
        torch.cuda.synchronize(device)  # torch's primary context is current on this thread
        self.sites: Dict[str, _Site] = {}
        self.modules = []
        for name in BODIES:
            module = ctypes.c_void_p()
            self._check(self.cuda.cuModuleLoadData(ctypes.byref(module), ptx_of(name).encode() + b"\0"),
                        "cuModuleLoadData")
            function = ctypes.c_void_p()
            self._check(self.cuda.cuModuleGetFunction(ctypes.byref(function), module,
                                                      f"mlp_{name}".encode()), "cuModuleGetFunction")
            self.modules.append(module)
            assert function.value is not None
            self.sites[name] = _Site(function.value)
        launch = self.cuda.cuLaunchKernel
        u32 = ctypes.c_uint
        launch.argtypes = [ctypes.c_void_p, u32, u32, u32, u32, u32, u32, u32, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_void_p]
        launch.restype = ctypes.c_int
        self.cu_launch = launch
        self.raw_stream = torch._C._cuda_getCurrentRawStream
        self.ordinal = device.index or 0

    @staticmethod
    def _check(code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"{call} failed: CUresult {code}")

    def _launch(self, site: _Site, a, b, out):
        key = (a.data_ptr(), b.data_ptr(), out.data_ptr(), out.numel())
        if key != site.key:
            site.values[0:4] = key
            site.grid = (key[3] + self.BLOCK - 1) // self.BLOCK
            site.key = key
        code = self.cu_launch(site.function, site.grid, 1, 1, self.BLOCK, 1, 1, 0,
                              self.raw_stream(self.ordinal), site.params_at, None)
        if code != 0:
            raise RuntimeError(f"cuLaunchKernel failed: CUresult {code}")

    def bias_gelu(self, h, bias_full, out):
        self._launch(self.sites["bias_gelu"], h, bias_full, out)

    def add(self, a, b, out):
        self._launch(self.sites["add"], a, b, out)

    def silu_mul(self, a, b, out):
        self._launch(self.sites["silu_mul"], a, b, out)


class ThroughPtxd:
    """The same PTX through ptxd: ``session.launch`` on the tensors, ordered
    on torch's current stream."""

    name = "through ptxd (ring, answers awaited)"

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


class Sample:
    """One repetition of one variant: seconds per step."""

    __slots__ = ("wall", "cpu", "gpu")

    def __init__(self, wall: float, cpu: float, gpu: float) -> None:
        self.wall = wall  # first enqueue to the stream's end (synchronize returned)
        self.cpu = cpu  # the enqueue loop alone (perf_counter, before the sync)
        self.gpu = gpu  # torch.cuda.Event before the first enqueue to one after the last


def run_steps(model: Model, ew, steps: int, device: torch.device) -> Sample:
    """``steps`` steps of ``ew`` from an idle GPU, timed three ways."""
    torch.cuda.synchronize(device)
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    start_event.record()
    start = time.perf_counter()
    for _ in range(steps):
        model.step(ew)
    issued = time.perf_counter()
    end_event.record()
    torch.cuda.synchronize(device)
    done = time.perf_counter()
    return Sample((done - start) / steps, (issued - start) / steps,
                  start_event.elapsed_time(end_event) * 1e-3 / steps)


def sleep_cycles_per_second(device: torch.device) -> Optional[float]:
    """The GPU's ``torch.cuda._sleep`` rate (cycles a second), or ``None``
    where torch has no ``_sleep``."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    sleep(1000)
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start_event.record()
    sleep(cycles)
    end_event.record()
    torch.cuda.synchronize(device)
    return cycles / (start_event.elapsed_time(end_event) * 1e-3)


def fed_gpu_time(model: Model, ew, steps: int, issue_seconds: float, rate: float,
                 device: torch.device) -> Optional[float]:
    """The GPU time per step when the GPU is never starved: the stream first
    runs a sleep kernel longer than the whole enqueue loop, so every step is
    queued before the GPU starts on it; the span from the sleep's end to the
    last step's end (events) is what the steps cost on the GPU, the
    cross-stream hand-overs included (ptxd's kernels wait on GPU words).
    ``None`` when the enqueue loop outlasted the sleep (the GPU was starved
    after all: no fed figure)."""
    torch.cuda.synchronize(device)
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    cover = 2.0 * issue_seconds * steps + 0.002
    torch.cuda._sleep(int(cover * rate))
    start_event.record()
    before = time.perf_counter()
    for _ in range(steps):
        model.step(ew)
    issued = time.perf_counter() - before
    end_event.record()
    torch.cuda.synchronize(device)
    if issued >= cover:
        return None
    return start_event.elapsed_time(end_event) * 1e-3 / steps


def spread(values: Sequence[float]) -> str:
    """``median [min-max]``."""
    return f"{statistics.median(values):6.3f} [{min(values):.3f}-{max(values):.3f}]"


def bound(wall: float, cpu: float, fed: Optional[float]) -> str:
    """What sets a variant's step time, from its medians."""
    if fed is not None and fed >= 0.9 * wall:
        return "GPU-bound (fed ~ wall)"
    if cpu >= 0.9 * wall:
        return "CPU-bound (issue ~ wall)"
    if fed is None:
        return "not CPU-bound (no fed figure)"
    return "latency-bound (GPU idles, CPU done early)"


def check_outputs(model: Model, variants: List[Any], deferred: ptxd.Session,
                  device: torch.device, when: str) -> Optional[str]:
    """Runs one step of each variant from poisoned outputs; ``None`` when
    every ptxd variant equals the in-process one bit for bit and that one
    matches eager torch, else what failed."""
    outputs: List[torch.Tensor] = []
    for ew in variants:
        model.o.fill_(float("nan"))
        outputs.append(model.step(ew).clone())
    torch.cuda.synchronize(device)
    deferred.wait_answers()
    eager, inproc = outputs[0], outputs[1]
    for ew, through in zip(variants[2:], outputs[2:]):
        if not torch.equal(inproc, through):
            differ = (inproc != through).sum().item()
            return f"{when}: {ew.name} and in-process differ in {differ} elements"
    if not torch.allclose(inproc, eager, rtol=1e-3, atol=1e-4):
        worst = (inproc - eager).abs().max().item()
        return f"{when}: the PTX step differs from eager torch by up to {worst}"
    return None


def measure(model: Model, variants: List[Any], deferred: ptxd.Session, steps: int, reps: int,
            fed_reps: int, rate: Optional[float], device: torch.device
            ) -> Tuple[Dict[str, List[Sample]], Dict[str, List[float]]]:
    """Every variant's samples, interleaved rep by rep (A B C D E, B C D E
    A, ...: each repetition runs every variant once, the starting one
    rotating), so drift lands on all variants alike and each ratio can be
    taken within one repetition; then the fed GPU time, interleaved too."""
    for ew in variants:  # warm-up: caches, rings, allocator
        for _ in range(max(5, steps // 10)):
            model.step(ew)
    torch.cuda.synchronize(device)
    deferred.wait_answers()
    samples: Dict[str, List[Sample]] = {ew.name: [] for ew in variants}
    for rep in range(reps):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for ew in order:
            samples[ew.name].append(run_steps(model, ew, steps, device))
            deferred.wait_answers()
    fed: Dict[str, List[float]] = {ew.name: [] for ew in variants}
    if rate is not None:
        fed_steps = min(steps, 100)
        for rep in range(fed_reps):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for ew in order:
                issue = max(s.cpu for s in samples[ew.name])
                figure = fed_gpu_time(model, ew, fed_steps, issue, rate, device)
                if figure is not None:
                    fed[ew.name].append(figure)
                deferred.wait_answers()
    return samples, fed


def report(batch: int, steps: int, reps: int, variants: List[Any],
           samples: Dict[str, List[Sample]], fed: Dict[str, List[float]]) -> None:
    names = [ew.name for ew in variants]
    print(f"batch {batch} ({steps} steps x {reps} reps, variants interleaved; "
          f"per step, median over reps, us):")
    print(f"  {'variant':52s} {'wall':>9s} {'cpu issue':>10s} {'gpu span':>9s} "
          f"{'gpu fed':>9s}  what bounds it")
    for name in names:
        wall = statistics.median(s.wall for s in samples[name])
        cpu = statistics.median(s.cpu for s in samples[name])
        gpu = statistics.median(s.gpu for s in samples[name])
        fed_median = statistics.median(fed[name]) if fed[name] else None
        fed_text = f"{fed_median * 1e6:9.1f}" if fed_median is not None else f"{'-':>9s}"
        print(f"  {name:52s} {wall * 1e6:9.1f} {cpu * 1e6:10.1f} {gpu * 1e6:9.1f} {fed_text}  "
              f"{bound(wall, cpu, fed_median)}")

    def ratios(top: str, bottom: str) -> List[float]:
        return [a.wall / b.wall for a, b in zip(samples[top], samples[bottom])]

    eager, inproc = names[0], names[1]
    print("  ratios of wall time per step (median of the per-rep ratios [min-max]):")
    print(f"    {'in-process / eager':66s} {spread(ratios(inproc, eager))}")
    for name in names[2:]:
        print(f"    {name + ' / in-process':66s} {spread(ratios(name, inproc))}")
        print(f"    {name + ' / eager':66s} {spread(ratios(name, eager))}")
    if fed[inproc]:
        base = statistics.median(fed[inproc])
        print("  GPU time of the ordering per step (fed, minus in-process fed: ptxd's word waits "
              "and the hand-overs between torch's context and ptxd's):")
        for name in names[2:]:
            if fed[name]:
                extra = statistics.median(fed[name]) - base
                print(f"    {name:64s} {extra * 1e6:8.1f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("socket", nargs="?", default=None)
    parser.add_argument("--steps", type=int, default=0, help="steps per repetition (0: by batch)")
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--fed-reps", type=int, default=3,
                        help="repetitions of the fed GPU time (0: not measured)")
    parser.add_argument("--batches", default="8,8192")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False
    batches = [int(b) for b in args.batches.split(",")]
    with ptxd.Client(args.socket) as client, \
            client.session("model-step", defer_errors=False) as session, \
            client.session("model-step-deferred", defer_errors=True) as deferred:
        gpu = torch.cuda.get_device_name(device)
        print(f"model step on {gpu}: D={D}, H={H}, f32; ptxd {ptxd.__version__}, "
              f"torch {torch.__version__}")
        rate = sleep_cycles_per_second(device) if args.fed_reps > 0 else None
        # Eager (set per batch), in-process, through ptxd with answers
        # awaited, deferred (an async launch returns once written; refusals
        # come with the next), and deferred with add and silu_mul as one
        # launch_many.
        variants: List[Any] = [None, InProcess(device), ThroughPtxd(session, device),
                               ThroughPtxd(deferred, device), ThroughPtxdBatched(deferred, device)]
        for batch in batches:
            model = Model(batch, device)
            variants[0] = Eager(model.b1)
            failed = check_outputs(model, variants, deferred, device, f"batch {batch}")
            if failed is not None:
                print(f"FAIL {failed}")
                return 1
            steps = args.steps or (2000 if batch <= 64 else 50)
            samples, fed = measure(model, variants, deferred, steps, args.reps, args.fed_reps,
                                   rate, device)
            # The timed steps must not have changed what a step computes.
            failed = check_outputs(model, variants, deferred, device,
                                   f"batch {batch}, after timing")
            if failed is not None:
                print(f"FAIL {failed}")
                return 1
            report(batch, steps, args.reps, variants, samples, fed)
        print("  (cpu issue: the enqueue loop, perf_counter, before the sync; gpu span: events "
              "around the loop;\n   gpu fed: events around the steps queued behind a sleep "
              "kernel, the GPU never starved)")
        print(f"rings: {sum(1 for r in session._rings.values() if r)} "
              f"(unary fallbacks would show 0 here)")
    print("model_step: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
