"""N worker processes, each with its own ptxd session, sharing one daemon and
one compiled kernel.

Each worker connects, opens a session, loads the same PTX (the first load
compiles it; every other one is a cache hit), launches on its own memory and
checks the result. On a CUDA daemon the workers use torch tensors; on the
host backend, numpy arrays in shared memory.

    python python/examples/serve_sessions.py [--socket SOCKET] [--workers N] [--json]
"""

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

CORPUS = Path(os.environ.get("PTXD_CORPUS", Path(__file__).resolve().parents[2] / "tests" / "corpus"))


def worker(socket, index, ready, loaded, results):
    import ptxd  # imported in the child: a ptxd client does not survive fork

    ptx = (CORPUS / "add_f32_scalar.ptx").read_text()
    with ptxd.Client(socket) as client, client.session(f"worker-{index}") as session:
        backend = client.info()["backend"]
        # Every worker connected before any loads, and every worker loaded
        # before any leaves its session: the kernel is held throughout, so
        # exactly one load compiles it (a worker that closed its session
        # first would free it, and a late one would compile it again).
        ready.wait()
        kernel = session.load_ptx(ptx, "add_f32_scalar")
        loaded.wait()
        n = 4096 + index
        if backend == "cuda":
            import torch

            a = torch.randn(n, device="cuda")
            b = torch.randn(n, device="cuda")
            out = torch.full((n,), float("nan"), device="cuda")
            session.launch(kernel, [a, b], out)
            correct = bool(torch.equal(out, a + b))
        else:
            import numpy as np

            rng = np.random.default_rng(index)
            a, b, out = (session.shm_array(n, np.float32) for _ in range(3))
            a[:] = rng.standard_normal(n)
            b[:] = rng.standard_normal(n)
            out[:] = np.nan
            session.launch(kernel, [a, b], out)
            correct = bool((out == a + b).all())
        results.put({"worker": index, "pid": os.getpid(), "cache_hit": kernel.cache_hit,
                     "load_micros": kernel.load_micros, "correct": correct})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=None, help="ptxd's socket (default: the SDK's rules)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print one JSON summary line last")
    args = parser.parse_args()

    # 'spawn': each worker starts a fresh interpreter (and its own client).
    context = multiprocessing.get_context("spawn")
    ready, loaded = context.Barrier(args.workers, timeout=120), context.Barrier(args.workers, timeout=120)
    results = context.Queue()
    processes = [context.Process(target=worker, args=(args.socket, i, ready, loaded, results))
                 for i in range(args.workers)]
    began = time.monotonic()
    for p in processes:
        p.start()
    reports = [results.get(timeout=300) for _ in processes]
    for p in processes:
        p.join(timeout=60)
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    for report in sorted(reports, key=lambda r: r["worker"]):
        print(f"worker {report['worker']} (pid {report['pid']}): cache_hit={report['cache_hit']} "
              f"load={report['load_micros']} us correct={report['correct']}")
    summary = {
        "workers": len(reports),
        "correct": sum(r["correct"] for r in reports),
        "cache_hits": sum(r["cache_hit"] for r in reports),
        "seconds": round(time.monotonic() - began, 3),
        "failed_exit_codes": failed,
    }
    print(json.dumps(summary) if args.json else summary)
    if failed or summary["correct"] != summary["workers"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
