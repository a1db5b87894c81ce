"""What waiting for ptxd's answer costs a Python launch through the launch
ring, on any backend (the host backend needs no GPU):

    ptxd serve --backend host --socket /tmp/ptxd.sock &
    python python/examples/ring_wait.py /tmp/ptxd.sock [--calls N] [--runs R] [--n ELEMENTS]
        [--spins 0,default]

It opens a plain launch ring (``HostRing``: no GPU ordering, the ring the
host backend serves) and launches ``add_f32_scalar`` on three registered
shared-memory arrays, timing per call (p50 and p99, CALLS calls after a
warm-up, R runs):

- the awaited launch (``defer=False``): one native call that submits and
  waits for ptxd's answer with the GIL released once, polling for the
  client's ``reply_spin`` before the SDK's wait (which polls 30 us more,
  then sleeps on the futex word); each ``reply_spin`` of ``--spins`` is its
  own client, the clients interleaved run by run (``0``: the SDK's wait
  from the start, as before w32b);
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
from typing import Any, Callable, Dict, List, Tuple

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


class Rig:
    """One client (with its ``reply_spin``), session, ring, kernel and three
    registered shared-memory arrays."""

    def __init__(self, socket: Any, reply_spin: Any, n: int) -> None:
        self.client = ptxd.Client(socket, reply_spin=reply_spin)
        self.session = self.client.session(f"ring-wait-{reply_spin}")
        session = self.session
        self.n = n
        self.kernel = session.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(),
                                       "add_f32_scalar")
        self.x = session.shm_array(n, np.float32)
        self.y = session.shm_array(n, np.float32)
        self.out = session.shm_array(n, np.float32)
        rng = np.random.default_rng()
        self.x[:] = rng.standard_normal(n, dtype=np.float32)
        self.y[:] = rng.standard_normal(n, dtype=np.float32)
        self.expected = self.x + self.y
        bx, by, bo = (session.register(a) for a in (self.x, self.y, self.out))
        self.ops = [(b._registration.ring_index, b.offset) for b in (bx, by)]
        self.target = (bo._registration.ring_index, bo.offset)
        self.ring = session._native.open_ring(0, 256)
        self.native = self.kernel._native

    def awaited(self) -> None:
        answer = self.ring.launch(self.native, self.ops, self.target, self.n, [], False, False,
                                  TIMEOUT)
        if answer is not True:
            raise answer

    def deferred(self) -> None:
        answer = self.ring.launch(self.native, self.ops, self.target, self.n, [], False, True,
                                  TIMEOUT)
        if answer is not True:
            raise answer[0]

    def drain(self) -> None:
        refused = self.ring.drain(TIMEOUT)
        if refused:
            raise refused[0]

    def unary(self) -> None:
        self.session.launch(self.kernel, [self.x, self.y], self.out)

    def correct(self) -> bool:
        self.drain()
        good = bool(np.array_equal(self.out, self.expected))
        self.out[:] = np.nan
        return good

    def close(self) -> None:
        self.session.close()
        self.client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("socket", nargs="?", default=None)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=256, help="elements per operand")
    parser.add_argument("--spins", default="0,default",
                        help="reply_spin values to compare, seconds or 'default' (200 us)")
    args = parser.parse_args()
    spins = [None if s == "default" else float(s) for s in args.spins.split(",")]
    rigs = [(f"reply_spin={'default' if s is None else s}", Rig(args.socket, s, args.n))
            for s in spins]
    backend = rigs[0][1].client.info().get("backend", "?")
    print(f"ring_wait: backend {backend}, add_f32_scalar on {args.n} floats, {args.calls} calls "
          f"per row, ptxd {ptxd.__version__}, {os.cpu_count()} CPUs; one column per run, the "
          f"rigs interleaved")
    table: Dict[str, List[Tuple[float, float]]] = {}
    failures = 0

    def row(name: str, figures: Tuple[float, float]) -> None:
        table.setdefault(name, []).append(figures)

    for _ in range(args.runs):
        for label, rig in rigs:
            rig.out[:] = np.nan
            row(f"{label}: HostRing.launch, answer awaited", timed(args.calls, rig.awaited))
            failures += not rig.correct()
            row(f"{label}: HostRing.launch, deferred (drain every 32, not timed)",
                timed(args.calls, rig.deferred, every=32, between=rig.drain))
            failures += not rig.correct()
            phases: Dict[str, List[int]] = {}
            for _ in range(max(1, args.calls // 1000)):
                for name, values in rig.ring.profile(rig.native, rig.ops, rig.target, rig.n, [],
                                                     1000, TIMEOUT).items():
                    phases.setdefault(name, []).extend(values)
            failures += not rig.correct()
            for name, values in phases.items():
                row(f"{label}:   phase: {name}", quantiles([v * 1e-9 for v in values]))
    label, rig = rigs[0]
    row("Session.launch (unary, gRPC), for scale", timed(max(1, args.calls // 10), rig.unary))
    failures += not rig.correct()
    print(f"  {'p50 / p99 in us':80s}")
    for name, values in table.items():
        text = "   ".join(f"{p50:7.2f} /{p99:8.2f}" for p50, p99 in values)
        print(f"  {name:80s} {text}")
    for label, _ in rigs:
        awaited = table[f"{label}: HostRing.launch, answer awaited"]
        deferred = table[f"{label}: HostRing.launch, deferred (drain every 32, not timed)"]
        diffs = ", ".join(f"{a[0] - d[0]:.2f}" for a, d in zip(awaited, deferred))
        print(f"  {label + ': awaited - deferred p50 (what waiting costs)':80s} {diffs}")
    for _, rig in rigs:
        rig.close()
    if failures:
        print(f"ring_wait: {failures} wrong result(s)")
        return 1
    print("ring_wait: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
