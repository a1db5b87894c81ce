"""What a hand-over between two CUDA streams costs the GPU, by the mechanism
that orders them: the floor under an ordered launch through ptxd.

A launch through ptxd on a framework's stream is two hand-overs: the
framework's stream writes a GPU word that ptxd's stream waits for (the
kernel may start), and ptxd's stream writes a word that the framework's
stream waits for (its next kernel may start). ``model_step.py`` measured ptxd's
small-batch step as GPU-bound, with more GPU time per step than in-process;
this measures the hand-over alone, without ptxd, so that figure can be split
into what the mechanism costs and what ptxd adds.

Each row is the GPU time per round, with the GPU never waiting for a CPU:
every round is queued behind a sleep kernel before the GPU starts on it, and
the time is taken by CUDA events from the sleep's end to the last round's
end. A round is one small torch kernel (``t.add_(1)`` on one float) and,
where the row says so, a hand-over there and back:

- ``in-process, one stream``: the kernel alone, back to back. The floor.
- ``in-process, two streams, events``: the kernel on a second stream,
  ordered by ``cudaStreamWaitEvent`` both ways (what a framework does).
- ``in-process, two streams, words``: the same, ordered by
  ``cuStreamWriteValue32`` / ``cuStreamWaitValue32`` on two words of device
  memory (ptxd's mechanism, in one context).
- ``two processes, words``: the kernel in a second process, ordered by the
  same words through a CUDA IPC mapping (ptxd's shape; under MPS when the
  script runs under an MPS control daemon).
- ``two processes, words, no kernel``: the hand-over there and back alone.

    python python/examples/handover.py [--rounds N] [--reps N]

Run it once without and once with an MPS control daemon (``bash .gpu/run.sh
handover`` does both). Exit status 1 when a round's kernel did not run
exactly once per round (the counter is checked after every row).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from typing import Callable, Dict, List

import torch
import torch.multiprocessing as mp

WAIT_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ
# The words live a cache line apart (128 bytes) in one allocation.
LINE = 32  # int32s


class Words:
    """``cuStreamWriteValue32`` / ``cuStreamWaitValue32`` through ctypes."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")

        def symbol(name: str):
            try:
                return getattr(lib, f"{name}_v2")
            except AttributeError:
                return getattr(lib, name)

        self.write_fn = symbol("cuStreamWriteValue32")
        self.wait_fn = symbol("cuStreamWaitValue32")
        for fn in (self.write_fn, self.wait_fn):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32]
            fn.restype = ctypes.c_int

    def write(self, stream: torch.cuda.Stream, addr: int, value: int) -> None:
        code = self.write_fn(stream.cuda_stream, addr, value, 0)
        if code != 0:
            raise RuntimeError(f"cuStreamWriteValue32: CUresult {code}")

    def wait(self, stream: torch.cuda.Stream, addr: int, value: int) -> None:
        code = self.wait_fn(stream.cuda_stream, addr, value, WAIT_GEQ)
        if code != 0:
            raise RuntimeError(f"cuStreamWaitValue32: CUresult {code}")


def sleep_rate(device: torch.device) -> float:
    """``torch.cuda._sleep`` cycles per second on this GPU."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize(device)
    return cycles / (start.elapsed_time(end) * 1e-3)


def fed(stream: torch.cuda.Stream, rate: float, cover_s: float, enqueue: Callable[[], None],
        rounds: int, device: torch.device) -> float:
    """Seconds of GPU time per round of ``enqueue``'s work, queued behind a
    sleep of ``cover_s`` on ``stream``."""
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(cover_s * rate))
        start.record()
        enqueue()
        end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) * 1e-3 / rounds


def child(conn, words_tensor: torch.Tensor) -> None:
    """The second process: for each request ``(base, rounds, kernel)``, queue
    ``rounds`` times: wait for word A >= base + i, the kernel (if asked), write
    word B = base + i; answer ``queued``, then ``done`` once its stream is idle."""
    device = words_tensor.device
    torch.cuda.set_device(device)
    words = Words()
    stream = torch.cuda.Stream(device)
    counter = torch.zeros(1, device=device)
    a = words_tensor.data_ptr()
    b = a + 4 * LINE
    while True:
        request = conn.recv()
        if request is None:
            conn.send(float(counter.item()))
            return
        base, rounds, kernel = request
        with torch.cuda.stream(stream):
            for i in range(1, rounds + 1):
                words.wait(stream, a, base + i)
                if kernel:
                    counter.add_(1)
                words.write(stream, b, base + i)
        conn.send("queued")
        stream.synchronize()
        conn.send("done")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("handover: no CUDA device")
        return 1
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    rounds = args.rounds
    words = Words()
    rate = sleep_rate(device)
    s1 = torch.cuda.Stream(device)
    s2 = torch.cuda.Stream(device)
    counter = torch.zeros(1, device=device)
    local_words = torch.zeros(2 * LINE, dtype=torch.int32, device=device)
    la, lb = local_words.data_ptr(), local_words.data_ptr() + 4 * LINE
    shared_words = torch.zeros(2 * LINE, dtype=torch.int32, device=device)
    sa, sb = shared_words.data_ptr(), shared_words.data_ptr() + 4 * LINE
    context = mp.get_context("spawn")
    parent_end, child_end = context.Pipe()
    process = context.Process(target=child, args=(child_end, shared_words), daemon=True)
    process.start()
    # Enqueueing a round takes the CPU well under 50 us; the cover leaves
    # room for four times that.
    cover = 4 * 50e-6 * rounds + 0.005
    state = {"local": 0, "shared": 0, "expect": 0.0}

    def one_stream() -> None:
        for _ in range(rounds):
            counter.add_(1)
        state["expect"] += rounds

    def two_streams_events() -> None:
        for _ in range(rounds):
            there = torch.cuda.Event()
            there.record(s1)
            s2.wait_event(there)
            with torch.cuda.stream(s2):
                counter.add_(1)
            back = torch.cuda.Event()
            back.record(s2)
            s1.wait_event(back)
        state["expect"] += rounds

    def two_streams_words() -> None:
        base = state["local"]
        # s2's side first: its waits hold it until s1 writes.
        with torch.cuda.stream(s2):
            for i in range(1, rounds + 1):
                words.wait(s2, la, base + i)
                counter.add_(1)
                words.write(s2, lb, base + i)
        for i in range(1, rounds + 1):
            words.write(s1, la, base + i)
            words.wait(s1, lb, base + i)
        state["local"] = base + rounds
        state["expect"] += rounds

    def two_processes(kernel: bool) -> Callable[[], None]:
        def enqueue() -> None:
            base = state["shared"]
            parent_end.send((base, rounds, kernel))
            if not parent_end.poll(60):
                raise RuntimeError("handover: the second process did not queue its rounds")
            if parent_end.recv() != "queued":
                raise RuntimeError("handover: the second process answered out of turn")
            for i in range(1, rounds + 1):
                words.write(s1, sa, base + i)
                words.wait(s1, sb, base + i)
            state["shared"] = base + rounds
        return enqueue

    def settle() -> None:
        # The second process answers ``done`` once its stream is idle.
        if not parent_end.poll(60) or parent_end.recv() != "done":
            raise RuntimeError("handover: the second process did not finish its rounds")

    rows: Dict[str, Callable[[], None]] = {
        "in-process, one stream": one_stream,
        "in-process, two streams, events": two_streams_events,
        "in-process, two streams, words": two_streams_words,
        "two processes, words": two_processes(True),
        "two processes, words, no kernel": two_processes(False),
    }
    samples: Dict[str, List[float]] = {name: [] for name in rows}
    child_kernels = 0
    for rep in range(args.reps + 1):  # the first repetition warms up and is dropped
        for name, enqueue in rows.items():
            seconds = fed(s1, rate, cover, enqueue, rounds, device)
            if name.startswith("two processes"):
                settle()
                if name == "two processes, words":
                    child_kernels += rounds
            if rep > 0:
                samples[name].append(seconds)
    parent_end.send(None)
    counted_child = parent_end.recv() if parent_end.poll(60) else -1.0
    process.join(10)
    torch.cuda.synchronize(device)
    if counter.item() != state["expect"] or counted_child != child_kernels:
        print(f"handover: wrong kernel counts: this process {counter.item()} of {state['expect']}, "
              f"the second {counted_child} of {child_kernels}")
        return 1
    floor = statistics.median(samples["in-process, one stream"])
    print(f"GPU time per round, {rounds} rounds fed, median of {args.reps} [min-max]; ratio to one stream")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"  {name:36s} {median * 1e6:7.2f} us [{min(values) * 1e6:.2f}-{max(values) * 1e6:.2f}]"
              f"  {median / floor:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
