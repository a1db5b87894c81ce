"""Where the CPU time of one Python ring launch on torch tensors goes.

    ptxd serve &
    python python/examples/profile_launch.py [SOCKET] [CALLS]

Prints the p50 and p99 (microseconds, CALLS timed calls after a warm-up) of
each stage of ``Session.launch(add, [x, y], out)`` on CUDA torch tensors
through the session's launch ring, timed one stage at a time in a loop:

- the stream lookup (``torch._C._cuda_getCurrentRawStream``, and
  ``torch.cuda.current_stream()`` for comparison);
- operand resolution: the per-tensor attribute reads and the operand-cache
  lookups the fast path makes;
- the descriptor's Python half (the wire tuples and allocation checks);
- the native call (``Ring.launch``), with and without the allocation-id
  checks, and the native phases it reports where the module can say them
  (``Ring.profile``: argument conversion, the GIL release, the checks, the
  stream memops, the submission, the wait for ptxd's completion), with
  ptxd's answer awaited and deferred (``defer_errors=True``);
- the stream memops alone, through ctypes on libcuda (and cuda-python where
  it is installed): ``cuStreamWriteValue32``, ``cuStreamWaitValue32``, one
  ``cuStreamBatchMemOp`` of both;
- the whole ``Session.launch`` (current stream, and ``stream=``), with the
  GPU kept ahead (a host sync every 32 calls, not timed) and back to back,
  in a session that awaits ptxd's answers and in one with
  ``defer_errors=True``, and ``launch_many`` per launch; awaited answers
  polled for the client's default ``reply_spin`` against a client with
  ``reply_spin=0`` (the SDK's own wait only, as before w32b), alternated;

and, side by side in the same process and run, the in-process references:
``torch.add(x, y, out=z)``, ``cuLaunchKernel`` of the same PTX through
ctypes, a CuPy ``RawKernel`` of it (CuPy installed), and a Triton ``add``
through Triton's own launcher (Triton installed). Nothing optional that is
missing fails the run: its rows say why they are absent. Every ptxd launch
variant's output is compared with ``x + y`` afterwards (a wrong result fails
the run, exit status 1).
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import torch

import ptxd

CORPUS = Path(os.environ.get("PTXD_CORPUS", Path(__file__).resolve().parents[2] / "tests" / "corpus"))
#: Elements of each operand (the issue's figures are for 64 Ki floats).
N = 64 * 1024
BLOCK = 256

rows: List[Tuple[str, str]] = []


def quantiles(samples: List[float]) -> Tuple[float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return p50 * 1e6, p99 * 1e6


def timed(calls: int, call: Callable[[], Any], sync_every: int = 0, device: Any = None
          ) -> Tuple[float, float]:
    """p50 and p99 of ``call`` in µs; with ``sync_every``, a host sync every
    that many calls (not timed) keeps the GPU from falling behind."""
    for _ in range(max(10, calls // 10)):
        call()
    if device is not None:
        torch.cuda.synchronize(device)
    samples = []
    clock = time.perf_counter
    for index in range(calls):
        if sync_every and index % sync_every == 0:
            torch.cuda.synchronize(device)
        start = clock()
        call()
        samples.append(clock() - start)
    return quantiles(samples)


def row(name: str, calls: int, call: Callable[[], Any], **kw: Any) -> Optional[float]:
    """Times ``call`` and records a row; a failure records why instead."""
    try:
        p50, p99 = timed(calls, call, **kw)
    except Exception as error:  # noqa: BLE001 - a profile row, not a test
        rows.append((name, f"unavailable: {type(error).__name__}: {error}"))
        return None
    rows.append((name, f"p50 {p50:8.2f} us   p99 {p99:8.2f} us"))
    return p50


def note(name: str, text: str) -> None:
    rows.append((name, text))


def section(title: str) -> None:
    rows.append(("", ""))
    rows.append((f"-- {title}", ""))


class Driver:
    """libcuda through ctypes, in torch's primary context."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")

    @staticmethod
    def check(code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"{call} failed: CUresult {code}")


class _MemOpWrite(ctypes.Structure):
    # CUstreamMemOpWriteValueParams: operation, address, value (union of
    # 32/64), flags, alias; 48 bytes with the union's padding.
    _fields_ = [("operation", ctypes.c_uint32), ("pad0", ctypes.c_uint32),
                ("address", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("pad1", ctypes.c_uint32),
                ("alias", ctypes.c_uint64), ("pad2", ctypes.c_uint64)]


CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1
CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2
CU_STREAM_WAIT_VALUE_GEQ = 0


def profile_memops(calls: int, driver: Driver, word: torch.Tensor, device: Any) -> None:
    """The two GPU words' stream operations on torch's stream, alone: a write
    of 1 and a wait for >= 0 on a word of device memory (the wait is met at
    once; what is timed is the CPU's enqueue)."""
    lib = driver.lib

    def symbol(name: str) -> Any:
        # CUDA 12's headers name the _v2 entry points; the old ones remain.
        try:
            return getattr(lib, f"{name}_v2")
        except AttributeError:
            return getattr(lib, name)

    write_value32 = symbol("cuStreamWriteValue32")
    wait_value32 = symbol("cuStreamWaitValue32")
    batch_mem_op = symbol("cuStreamBatchMemOp")
    addr = ctypes.c_uint64(word.data_ptr())
    raw = torch._C._cuda_getCurrentRawStream

    def write32() -> None:
        driver.check(write_value32(ctypes.c_void_p(raw(device.index)), addr,
                                              ctypes.c_uint32(1), 0), "cuStreamWriteValue32")

    def wait32() -> None:
        driver.check(wait_value32(ctypes.c_void_p(raw(device.index)), addr,
                                             ctypes.c_uint32(0), CU_STREAM_WAIT_VALUE_GEQ),
                     "cuStreamWaitValue32")

    ops = (_MemOpWrite * 2)()
    ops[0].operation, ops[0].address, ops[0].value = CU_STREAM_MEM_OP_WRITE_VALUE_32, word.data_ptr(), 1
    ops[1].operation, ops[1].address, ops[1].value = CU_STREAM_MEM_OP_WAIT_VALUE_32, word.data_ptr(), 0
    ops[1].flags = CU_STREAM_WAIT_VALUE_GEQ

    def batch() -> None:
        driver.check(batch_mem_op(ctypes.c_void_p(raw(device.index)), 2, ops, 0),
                     "cuStreamBatchMemOp")

    row("ctypes cuStreamWriteValue32", calls, write32, sync_every=256, device=device)
    row("ctypes cuStreamWaitValue32", calls, wait32, sync_every=256, device=device)
    row("ctypes cuStreamBatchMemOp (write + wait)", calls, batch, sync_every=256, device=device)
    try:
        try:
            from cuda.bindings import driver as cu  # cuda-python >= 12.6
        except ImportError:
            from cuda import cuda as cu  # type: ignore[no-redef]
    except ImportError:
        note("cuda-python stream memops", "unavailable: cuda-python is not installed")
        return
    stream = cu.CUstream(raw(device.index))
    dptr = cu.CUdeviceptr(word.data_ptr())

    def cp_write() -> None:
        cu.cuStreamWriteValue32(stream, dptr, 1, 0)

    def cp_wait() -> None:
        cu.cuStreamWaitValue32(stream, dptr, 0, 0)

    row("cuda-python cuStreamWriteValue32", calls, cp_write, sync_every=256, device=device)
    row("cuda-python cuStreamWaitValue32", calls, cp_wait, sync_every=256, device=device)


def in_process_references(calls: int, driver: Optional[Driver], x: torch.Tensor, y: torch.Tensor,
                          out: torch.Tensor, device: Any) -> None:
    section("in-process references (same process, same run)")
    row("torch.add(x, y, out=z)", calls, lambda: torch.add(x, y, out=out), sync_every=32,
        device=device)
    ptx = (CORPUS / "add_f32_scalar.ptx").read_text()
    if driver is None:
        note("cuLaunchKernel (ctypes)", "unavailable: libcuda did not load through ctypes")
    else:
        try:
            lib = driver.lib
            module, function = ctypes.c_void_p(), ctypes.c_void_p()
            driver.check(lib.cuModuleLoadData(ctypes.byref(module), ptx.encode() + b"\0"),
                         "cuModuleLoadData")
            driver.check(lib.cuModuleGetFunction(ctypes.byref(function), module, b"add_f32_scalar"),
                         "cuModuleGetFunction")
            raw = torch._C._cuda_getCurrentRawStream
            grid = (N + BLOCK - 1) // BLOCK

            def launch() -> None:
                values = (ctypes.c_uint64 * 4)(x.data_ptr(), y.data_ptr(), out.data_ptr(), N)
                params = (ctypes.c_void_p * 4)(*(ctypes.addressof(values) + 8 * i for i in range(4)))
                driver.check(lib.cuLaunchKernel(function, grid, 1, 1, BLOCK, 1, 1, 0,
                                                ctypes.c_void_p(raw(device.index)), params, None),
                             "cuLaunchKernel")

            out.fill_(float("nan"))
            row("cuLaunchKernel through ctypes (data_ptr + raw stream per call)", calls, launch,
                sync_every=32, device=device)
            torch.cuda.synchronize(device)
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        except Exception as error:  # noqa: BLE001
            note("cuLaunchKernel (ctypes)", f"unavailable: {error}")
    try:
        import cupy
    except ImportError:
        note("CuPy RawKernel", "unavailable: cupy is not installed")
    else:
        try:
            path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ptxd-profile-{os.getpid()}.ptx"
            path.write_text(ptx)
            kernel = cupy.RawModule(path=str(path)).get_function("add_f32_scalar")
            cx, cy, cout = cupy.asarray(x), cupy.asarray(y), cupy.asarray(out)
            n = cupy.uint64(N)
            grid = ((N + BLOCK - 1) // BLOCK,)
            # On torch's stream, as ptxd's launches are.
            stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream)
            with stream:
                out.fill_(float("nan"))
                row("CuPy RawKernel of the same PTX", calls,
                    lambda: kernel(grid, (BLOCK,), (cx, cy, cout, n)), sync_every=32, device=device)
            torch.cuda.synchronize(device)
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        except Exception as error:  # noqa: BLE001
            note("CuPy RawKernel", f"unavailable: {type(error).__name__}: {error}")
    try:
        from _profile_triton import triton_add  # beside this file
    except Exception as error:  # noqa: BLE001
        note("Triton launcher", f"unavailable: {type(error).__name__}: {error}")
    else:
        try:
            out.fill_(float("nan"))
            row("Triton add through Triton's launcher", calls, lambda: triton_add(x, y, out),
                sync_every=32, device=device)
            torch.cuda.synchronize(device)
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        except Exception as error:  # noqa: BLE001
            note("Triton launcher", f"unavailable: {type(error).__name__}: {error}")


def stages(calls: int, session: ptxd.Session, add: ptxd.Kernel, x: torch.Tensor, y: torch.Tensor,
           out: torch.Tensor, device: Any) -> List[Optional[float]]:
    """The fast path's stages one at a time (python/ptxd/_client.py,
    ``Session._launch_cached_tensors``), as it runs them."""
    section("stages of one ring launch (python/ptxd/_client.py fast path)")
    ordinal = device.index
    raw_of = torch._C._cuda_getCurrentRawStream
    row("empty Python call (the loop's own cost)", calls, lambda: None)
    row("torch.cuda.current_stream(d).cuda_stream", calls,
        lambda: torch.cuda.current_stream(device).cuda_stream)
    p_stream = row("torch._C._cuda_getCurrentRawStream(i)", calls, lambda: raw_of(ordinal))
    # What the native resolution reads of each tensor (5 calls each).
    row("x.data_ptr()", calls, x.data_ptr)
    row("the 5 reads of one tensor (is_contiguous .. numel)", calls,
                  lambda: (x.is_contiguous(), x.get_device(), x.element_size(), x.data_ptr(),
                           x.numel()))
    tensor = torch.Tensor
    resolve_native = session._operands.resolve
    if session._operands.get((ordinal, x.data_ptr(), x.numel() * 4, 4)) is None:
        raise AssertionError("operand cache miss: launch once first")

    def resolve() -> Any:
        return resolve_native(add._native, add._element_sizes(), [x, y], out, None, (), (),
                              tensor)

    p_resolve = row("native resolution: 3 tensors read, looked up, checked, a Plan (resolve)",
                    calls, resolve)
    resolved = resolve()
    if resolved is None:
        raise AssertionError("the native resolution missed: launch once first")
    plan = resolved[1]
    raw = raw_of(ordinal)
    ring = session._ring(ordinal, raw)
    if ring is None:
        note("the ring", "unavailable: no ring for torch's current stream; the native rows are absent")
        return [p_stream, p_resolve]
    rings = session._rings
    p_lookup = row("ring lookup (session._rings.get)", calls, lambda: rings.get((ordinal, raw)))
    dev = ptxd._client._device(ordinal)
    row("native allocation_id(ptr) (one check, PyO3 + cuPointerGetAttribute)", calls,
        lambda: dev.allocation_id(x.data_ptr()))
    row("native words_handle getter (a PyO3 call's floor)", calls, lambda: ring.words_handle)
    out.fill_(float("nan"))
    p_native = row(f"native Ring.launch_plan, {len(plan.checks())} allocation check(s), "
                   "answer awaited, GPU kept ahead", calls,
                   lambda: ring.launch_plan(raw, plan, False, False, 60.0), sync_every=32,
                   device=device)
    torch.cuda.synchronize(device)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    deferred = getattr(session, "_deferred_twin", None)
    p_native_d = None
    if deferred is not None:
        session_d, add_d = deferred
        resolved_d = session_d._operands.resolve(add_d._native, add_d._element_sizes(), [x, y],
                                                 out, None, (), (), tensor)
        ring_d = session_d._ring(ordinal, raw)
        if resolved_d is not None and ring_d is not None:
            plan_d = resolved_d[1]
            out.fill_(float("nan"))
            p_native_d = row("native Ring.launch_plan, deferred answers, GPU kept ahead", calls,
                             lambda: ring_d.launch_plan(raw, plan_d, False, True, 60.0),
                             sync_every=32, device=device)
            session_d.wait_answers()
            torch.cuda.synchronize(device)
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    # The lean path's one native call (OperandTable.launch): the rows above
    # (stream, resolve, ring lookup, launch_plan) in one.
    one_call = session._operands.launch
    rings = session._rings

    def lean(owner: ptxd.Session, kernel: ptxd.Kernel, defer: bool) -> Any:
        return owner._operands.launch(kernel._native, kernel._element_sizes(), [x, y], out, None,
                                      (), (), tensor, None, raw_of, owner._rings, False, defer,
                                      60.0)

    if one_call(add._native, add._element_sizes(), [x, y], out, None, (), (), tensor, None, raw_of,
                rings, False, False, 60.0) is not True:
        raise AssertionError("OperandTable.launch did not launch")
    out.fill_(float("nan"))
    row("native OperandTable.launch (the lean path's one call), answer awaited, GPU kept ahead",
        calls, lambda: lean(session, add, False), sync_every=32, device=device)
    torch.cuda.synchronize(device)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    if deferred is not None:
        session_d, add_d = deferred
        out.fill_(float("nan"))
        row("native OperandTable.launch, deferred answers, GPU kept ahead", calls,
            lambda: lean(session_d, add_d, True), sync_every=32, device=device)
        session_d.wait_answers()
        torch.cuda.synchronize(device)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    # The older wire path (the general path takes it), for the native
    # phases below.
    w = [plan.wire()]
    c = plan.checks()
    row(f"native Ring.launch (wire tuples), {len(c)} allocation check(s), GPU kept ahead", calls,
        lambda: ring.launch(raw, w, c, False, 60.0), sync_every=32, device=device)
    torch.cuda.synchronize(device)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    native_phases(calls, ring, raw, w, c, device, defer=False)
    native_phases(calls, ring, raw, w, c, device, defer=True)
    torch.cuda.synchronize(device)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    return [p_stream, p_resolve, p_lookup, p_native, p_native_d]


def native_phases(calls: int, ring: Any, raw: int, wire: List[Any], checks: List[Any], device: Any,
                  defer: bool) -> None:
    """The native call's phases as ``Ring.profile`` times them, 32 calls at
    a time with a host sync between (not timed)."""
    label = "deferred answers" if defer else "answers awaited"
    profile = getattr(ring, "profile", None)
    if profile is None:
        note(f"native phases ({label})", "unavailable: this native module has no Ring.profile")
        return
    try:
        samples: dict = {}
        for _ in range(max(1, calls // 32)):
            torch.cuda.synchronize(device)
            for name, values in profile(raw, wire, checks, 32, defer).items():
                samples.setdefault(name, []).extend(values)
        if defer:
            refused = ring.drain(60.0)
            if refused:
                raise refused[0]
        for name, values in samples.items():
            p50, p99 = quantiles([v * 1e-9 for v in values])
            rows.append((f"  native ({label}): {name}", f"p50 {p50:8.2f} us   p99 {p99:8.2f} us"))
    except Exception as error:  # noqa: BLE001
        note(f"native phases ({label})", f"failed: {type(error).__name__}: {error}")


def whole(calls: int, session: ptxd.Session, add: ptxd.Kernel, x: torch.Tensor, y: torch.Tensor,
          out: torch.Tensor, device: Any) -> int:
    section("whole launches (ptxd)")
    failures = 0
    stream = torch.cuda.current_stream(device)
    variants = [
        ("Session.launch, current stream, GPU kept ahead",
         lambda: session.launch(add, [x, y], out), dict(sync_every=32, device=device)),
        ("Session.launch, current stream, back to back",
         lambda: session.launch(add, [x, y], out), {}),
        ("Session.launch, stream=torch stream, GPU kept ahead",
         lambda: session.launch(add, [x, y], out, stream=stream), dict(sync_every=32, device=device)),
    ]
    for name, call, kw in variants:
        out.fill_(float("nan"))
        torch.cuda.synchronize(device)
        row(name, calls, call, **kw)
        torch.cuda.synchronize(device)
        if not torch.equal(out, x + y):
            print(f"profile_launch: WRONG RESULT after {name!r}", file=sys.stderr)
            failures += 1
    # Awaited answers polled for the client's reply_spin (200 us by
    # default) against reply_spin=0 (the SDK's own wait from the start, as
    # before w32b), alternated twice so drift lands on both.
    spin0 = getattr(session, "_spin0_twin", None)
    if spin0 is not None:
        session_0, add_0 = spin0
        for round_ in range(2):
            for name, call in [
                (f"Session.launch, awaited, reply_spin default, GPU kept ahead (#{round_ + 1})",
                 lambda: session.launch(add, [x, y], out)),
                (f"Session.launch, awaited, reply_spin=0 (as before w32b), GPU kept ahead "
                 f"(#{round_ + 1})", lambda: session_0.launch(add_0, [x, y], out)),
            ]:
                out.fill_(float("nan"))
                torch.cuda.synchronize(device)
                row(name, calls, call, sync_every=32, device=device)
                torch.cuda.synchronize(device)
                if not torch.equal(out, x + y):
                    print(f"profile_launch: WRONG RESULT after {name!r}", file=sys.stderr)
                    failures += 1
    else:
        note("Session.launch, awaited, reply_spin=0", "unavailable: no second client")
    deferred = getattr(session, "_deferred_twin", None)
    if deferred is not None:
        session_d, add_d = deferred
        for name, call, kw in [
            ("Session.launch, defer_errors=True, current stream, GPU kept ahead",
             lambda: session_d.launch(add_d, [x, y], out), dict(sync_every=32, device=device)),
            ("Session.launch, defer_errors=True, current stream, back to back",
             lambda: session_d.launch(add_d, [x, y], out), {}),
        ]:
            out.fill_(float("nan"))
            torch.cuda.synchronize(device)
            row(name, calls, call, **kw)
            session_d.wait_answers()
            torch.cuda.synchronize(device)
            if not torch.equal(out, x + y):
                print(f"profile_launch: WRONG RESULT after {name!r}", file=sys.stderr)
                failures += 1
    else:
        note("Session.launch, defer_errors=True", "unavailable: this client has no defer_errors")
    out.fill_(float("nan"))
    torch.cuda.synchronize(device)
    batch = [(add, [x, y], out)] * calls
    start = time.perf_counter()
    session.launch_many(batch)
    per = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize(device)
    if not torch.equal(out, x + y):
        print("profile_launch: WRONG RESULT after launch_many", file=sys.stderr)
        failures += 1
    note(f"launch_many, {calls} launches (mean per launch)", f"mean {per:8.2f} us")
    return failures


def main() -> int:
    socket = sys.argv[1] if len(sys.argv) > 1 else None
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize(device)
    x = torch.randn(N, device=device)
    y = torch.randn(N, device=device)
    out = torch.full((N,), float("nan"), device=device)
    word = torch.zeros(4, dtype=torch.int32, device=device)
    try:
        driver: Optional[Driver] = Driver()
    except Exception as error:  # noqa: BLE001
        print(f"profile_launch: libcuda through ctypes: {error}", file=sys.stderr)
        driver = None
    failures = 0
    mps = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
    try:
        with ptxd.Client(socket) as client, client.session("profile-launch") as session:
            add = session.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(), "add_f32_scalar",
                                   device=device)
            # One launch fills the operand cache and opens the ring.
            session.launch(add, [x, y], out, sync=True)
            try:
                twin = client.session("profile-launch-deferred", defer_errors=True)
            except TypeError:
                twin = None
            if twin is not None:
                add_d = twin.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(), "add_f32_scalar",
                                      device=device)
                twin.launch(add_d, [x, y], out, sync=True)
                session._deferred_twin = (twin, add_d)
            try:
                client_0 = ptxd.Client(socket, reply_spin=0)
                session_0 = client_0.session("profile-launch-spin0", defer_errors=False)
                add_0 = session_0.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(),
                                           "add_f32_scalar", device=device)
                session_0.launch(add_0, [x, y], out, sync=True)
                session._spin0_twin = (session_0, add_0)
            except Exception as error:  # noqa: BLE001 - its rows say why they are absent
                print(f"profile_launch: no reply_spin=0 client: {error}", file=sys.stderr)
            torch.cuda.synchronize(device)
            if not torch.equal(out, x + y):
                print("profile_launch: WRONG RESULT after the first launch", file=sys.stderr)
                failures += 1
            in_process_references(calls, driver, x, y, out, device)
            try:
                parts = stages(calls, session, add, x, y, out, device)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                failures += 1
                parts = []
            section("stream memops alone (torch's stream, a word of device memory)")
            if driver is not None:
                try:
                    profile_memops(calls, driver, word, device)
                except Exception as error:  # noqa: BLE001
                    note("stream memops", f"unavailable: {error}")
            failures += whole(calls, session, add, x, y, out, device)
            if len(parts) == 5 and None not in parts[:4]:
                section("sum of the stage p50s above (stream, resolve, ring lookup, launch_plan)")
                note("sum, answer awaited", f"{sum(parts[:4]):8.2f} us")
                if parts[4] is not None:
                    note("sum, deferred answers", f"{sum(parts[:3]) + parts[4]:8.2f} us")
            spin0 = getattr(session, "_spin0_twin", None)
            if spin0 is not None:
                spin0[0].close()
    except Exception:  # noqa: BLE001 - print what was measured before the failure
        traceback.print_exc()
        failures += 1
    print(f"profile_launch: {calls} calls per row, add_f32_scalar on {N} floats, "
          f"torch {torch.__version__}, ptxd {getattr(ptxd, '__version__', '?')}, "
          f"MPS {'on' if mps else 'off'}")
    for name, text in rows:
        print(f"  {name:72s} {text}" if name else "")
    if failures:
        print(f"profile_launch: {failures} wrong result(s)")
        return 1
    print("profile_launch: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
