"""Per-launch cost of the Python client against a running CUDA daemon.

    ptxd serve &
    python python/examples/bench_launch.py [SOCKET] [LAUNCHES]

Prints the p50/p99 of `session.launch` on registered Buffers (async and
sync, the unary path), on torch tensors with `stream=` and on the current
stream (the launch ring, ordered by GPU words), the same on torch tensors
with the ring turned off (`PTXD_PYTHON_RING=0`: the unary path with IPC
events), `torch.add(x, y, out=z)` side by side as the in-process
reference, and the mean per launch of `launch_many` with a stream. Every
variant's output is checked against torch afterwards, so a wrong result
fails the run instead of printing a figure.
"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

import ptxd

CORPUS = Path(os.environ.get("PTXD_CORPUS", Path(__file__).resolve().parents[2] / "tests" / "corpus"))


def quantiles(samples):
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return p50 * 1e6, p99 * 1e6


def timed(launches, call):
    for _ in range(max(10, launches // 10)):
        call()
    samples = []
    for _ in range(launches):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return quantiles(samples)


def main() -> None:
    socket = sys.argv[1] if len(sys.argv) > 1 else None
    launches = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    device = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.current_stream(device)
    n = 64 * 1024
    with ptxd.Client(socket) as client, client.session("bench-launch") as session:
        add = session.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(), "add_f32_scalar", device=device)
        x = torch.randn(n, device=device)
        y = torch.randn(n, device=device)
        out = torch.full((n,), float("nan"), device=device)
        bx, by, bout = session.register(x), session.register(y), session.register(out)
        torch.cuda.synchronize(device)
        rows = []
        for sync in (False, True):
            p50, p99 = timed(launches, lambda: session.launch(add, [bx, by], bout, sync=sync))
            rows.append((f"launch on Buffers, sync={sync}", p50, p99))
        torch.cuda.synchronize(device)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        out.fill_(float("nan"))
        p50, p99 = timed(launches, lambda: torch.add(x, y, out=out))
        rows.append(("torch.add(x, y, out=z) (in-process reference)", p50, p99))
        out.fill_(float("nan"))
        p50, p99 = timed(launches, lambda: session.launch(add, [x, y], out, stream=stream))
        rows.append(("launch on torch tensors, stream= (ring)", p50, p99))
        torch.cuda.synchronize(device)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        out.fill_(float("nan"))
        p50, p99 = timed(launches, lambda: session.launch(add, [x, y], out))
        rows.append(("launch on torch tensors, current stream (ring)", p50, p99))
        torch.cuda.synchronize(device)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        out.fill_(float("nan"))
        os.environ["PTXD_PYTHON_RING"] = "0"
        with client.session("bench-launch-unary") as unary:
            add_unary = unary.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(), "add_f32_scalar",
                                       device=device)
            p50, p99 = timed(launches, lambda: unary.launch(add_unary, [x, y], out, stream=stream))
            rows.append(("launch on torch tensors, stream= (unary, IPC events)", p50, p99))
            torch.cuda.synchronize(device)
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        del os.environ["PTXD_PYTHON_RING"]
        out.fill_(float("nan"))
        torch.cuda.synchronize(device)
        batch = [(add, [x, y], out)] * launches
        start = time.perf_counter()
        session.launch_many(batch, stream=stream)
        per = (time.perf_counter() - start) / launches * 1e6
        torch.cuda.synchronize(device)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
        rows.append((f"launch_many with a stream ({launches} launches, mean)", per, per))
    print(f"python client, {launches} launches of add_f32_scalar on {n} elements")
    for name, p50, p99 in rows:
        print(f"  {name:55s} p50 {p50:8.1f} us   p99 {p99:8.1f} us")
    print("bench_launch: ok")


if __name__ == "__main__":
    main()
