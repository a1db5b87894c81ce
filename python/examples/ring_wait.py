"""What waiting for ptxd's answer costs a Python launch through the launch
ring, on any backend (the host backend needs no GPU):

    ptxd serve --backend host --socket /tmp/ptxd.sock &
    python python/examples/ring_wait.py /tmp/ptxd.sock [--calls N] [--runs R] [--n ELEMENTS]

It opens a plain launch ring (``HostRing``: no GPU ordering, the ring the
host backend serves) and launches ``add_f32_scalar`` on three registered
shared-memory arrays, timing per call (p50 and p99, CALLS calls after a
warm-up, R runs):

- the awaited launch (``defer=False``): one native call that submits and
  waits for ptxd's answer with the GIL released once;
- the deferred launch (``defer=True``): submits and returns, the answers
  read by the next call; with a drain every 32 calls (not timed) so the
  ring never fills;
- the awaited launch's phases, timed natively (``HostRing.profile``): the
  GIL release and reacquire, the descriptor's build and submission, the
  wait for the answer, the whole call;
- for scale, the unary ``Session.launch`` of the same kernel (gRPC).

awaited - deferred is what waiting costs; the wait phase is ptxd's turn
(reading the descriptor, the launch itself, the completion) as the client
sees it. Every variant's output is compared with ``x + y`` (a wrong result
fails the run, exit status 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Tuple

import numpy as np

import ptxd

CORPUS = Path(os.environ.get("PTXD_CORPUS", Path(__file__).resolve().parents[2] / "tests" / "corpus"))
TIMEOUT = 60.0


def quantiles(samples: List[float]) -> Tuple[float, float]:
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1e6,
            ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6)


def timed(calls: int, call: Callable[[], Any], every: int = 0,
          between: Callable[[], Any] = lambda: None) -> Tuple[float, float]:
    for _ in range(max(10, calls // 10)):
        call()
    between()
    samples = []
    clock = time.perf_counter
    for index in range(calls):
        if every and index % every == 0:
            between()
        start = clock()
        call()
        samples.append(clock() - start)
    between()
    return quantiles(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("socket", nargs="?", default=None)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=256, help="elements per operand")
    args = parser.parse_args()
    n = args.n
    failures = 0
    with ptxd.Client(args.socket) as client, client.session("ring-wait") as session:
        backend = client.info().get("backend", "?")
        kernel = session.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(), "add_f32_scalar")
        x = session.shm_array(n, np.float32)
        y = session.shm_array(n, np.float32)
        out = session.shm_array(n, np.float32)
        rng = np.random.default_rng()
        x[:] = rng.standard_normal(n, dtype=np.float32)
        y[:] = rng.standard_normal(n, dtype=np.float32)
        expected = x + y
        bx, by, bo = (session.register(a) for a in (x, y, out))
        ops = [(b._registration.ring_index, b.offset) for b in (bx, by)]
        target = (bo._registration.ring_index, bo.offset)
        ring = session._native.open_ring(0, 256)
        native = kernel._native

        def awaited() -> None:
            answer = ring.launch(native, ops, target, n, [], False, False, TIMEOUT)
            if answer is not True:
                raise answer

        def deferred() -> None:
            answer = ring.launch(native, ops, target, n, [], False, True, TIMEOUT)
            if answer is not True:
                raise answer[0]

        def drain() -> None:
            refused = ring.drain(TIMEOUT)
            if refused:
                raise refused[0]

        def check(what: str) -> None:
            nonlocal failures
            drain()
            if not np.array_equal(out, expected):
                print(f"ring_wait: WRONG RESULT after {what}", file=sys.stderr)
                failures += 1
            out[:] = np.nan

        def unary() -> None:
            session.launch(kernel, [x, y], out)

        print(f"ring_wait: backend {backend}, add_f32_scalar on {n} floats, {args.calls} calls "
              f"per row, ptxd {ptxd.__version__}, {os.cpu_count()} CPUs")
        table: List[Tuple[str, List[Tuple[float, float]]]] = []

        def row(name: str, figures: Tuple[float, float]) -> None:
            for existing, values in table:
                if existing == name:
                    values.append(figures)
                    return
            table.append((name, [figures]))

        for _ in range(args.runs):
            out[:] = np.nan
            row("HostRing.launch, answer awaited", timed(args.calls, awaited))
            check("the awaited launches")
            row("HostRing.launch, deferred (drain every 32, not timed)",
                timed(args.calls, deferred, every=32, between=drain))
            check("the deferred launches")
            phases = {}
            for _ in range(max(1, args.calls // 1000)):
                for name, values in ring.profile(native, ops, target, n, [], 1000,
                                                 TIMEOUT).items():
                    phases.setdefault(name, []).extend(values)
            check("the profiled launches")
            for name, values in phases.items():
                row(f"  phase: {name}", quantiles([v * 1e-9 for v in values]))
            row("Session.launch (unary, gRPC), for scale", timed(max(1, args.calls // 10), unary))
            check("the unary launches")
        print(f"  {'p50 / p99 in us, one column per run':60s}")
        for name, values in table:
            text = "   ".join(f"{p50:7.2f} /{p99:8.2f}" for p50, p99 in values)
            print(f"  {name:60s} {text}")
        awaited_p50 = [v[0] for n_, vs in table if n_.startswith("HostRing.launch, answer")
                       for v in vs]
        deferred_p50 = [v[0] for n_, vs in table if n_.startswith("HostRing.launch, deferred")
                        for v in vs]
        if awaited_p50 and deferred_p50:
            diffs = ", ".join(f"{a - d:.2f}" for a, d in zip(awaited_p50, deferred_p50))
            print(f"  {'awaited - deferred p50 (what waiting costs), per run':60s} {diffs}")
    if failures:
        print(f"ring_wait: {failures} wrong result(s)")
        return 1
    print("ring_wait: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
