"""A session in a process of its own, for the GPU tests.

    python worker.py SOCKET hold       open a session, register a tensor, load a
                                       kernel, print READY, then wait to be killed
    python worker.py SOCKET load SYMBOL  load the generated f32 add kernel under
                                       SYMBOL; print its cache_hit, then wait
                                       for a line on stdin before exiting
    python worker.py SOCKET expandable register tensors of PyTorch's
                                       expandable_segments (by descriptor), launch
                                       add on them and check it against torch;
                                       then try a tensor spanning two segment
                                       pages; print the outcomes
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import ptxd  # noqa: E402
from kernels import add_kernel  # noqa: E402


def main() -> None:
    socket, mode = sys.argv[1], sys.argv[2]
    client = ptxd.Client(socket)
    session = client.session(f"worker-{mode}")
    if mode == "hold":
        tensor = torch.ones(1 << 16, device="cuda")
        session.register(tensor)
        ptx, symbol = add_kernel("f32")
        session.load_ptx(ptx, symbol)
        print("READY", flush=True)
        sys.stdin.readline()
    elif mode == "load":
        ptx, symbol = add_kernel("f32")
        ptx = ptx.replace(symbol, sys.argv[3])
        kernel = session.load_ptx(ptx, sys.argv[3])
        print(f"CACHE_HIT {kernel.cache_hit}", flush=True)
        sys.stdin.readline()
    elif mode == "expandable":
        count = 1 << 16  # 256 KiB each: the three share one 2 MiB page
        a = torch.randn(count, device="cuda")
        b = torch.randn(count, device="cuda")
        out = torch.full((count,), float("nan"), device="cuda")
        buffers = [session.register(t) for t in (a, b, out)]
        kinds = sorted({buffer.kind for buffer in buffers})
        ptx, symbol = add_kernel("f32")
        kernel = session.load_ptx(ptx, symbol)
        session.launch(kernel, [a, b], out, sync=True)
        torch.cuda.synchronize()
        print(f"LAUNCHED kinds={kinds} equal={torch.equal(out, a + b)}", flush=True)
        # 32 MiB: larger than one 20 MiB page, so two physical allocations.
        big = torch.empty(8 << 20, device="cuda")
        try:
            session.register(big)
            print("BIG REGISTERED", flush=True)
        except ptxd.NotExportable as error:
            print(f"BIG NOT_EXPORTABLE {error}", flush=True)
    session.close()


if __name__ == "__main__":
    main()
