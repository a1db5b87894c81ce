"""A complete ptxd session with torch tensors.

Allocates tensors with torch, loads PTX kernels into ptxd, launches them
ordered with torch's current stream (no synchronize between torch's work and
ptxd's), and checks the results against torch.

    ptxd serve &                       # a daemon on a machine with a GPU
    python python/examples/torch_elementwise.py [SOCKET]

The socket defaults to the SDK's rules ($PTXD_SOCKET, ...). The kernels come
from the repository's tests/corpus (or $PTXD_CORPUS).
"""

import os
import sys
from pathlib import Path

import torch

import ptxd

CORPUS = Path(os.environ.get("PTXD_CORPUS", Path(__file__).resolve().parents[2] / "tests" / "corpus"))


def main() -> None:
    socket = sys.argv[1] if len(sys.argv) > 1 else None
    device = torch.device("cuda", torch.cuda.current_device())
    with ptxd.Client(socket) as client, client.session("torch-elementwise") as session:
        print(f"ptxd {client.info()['version']}, backend {client.info()['backend']}")
        # `device=` takes the torch device: ptxd finds it by UUID.
        add = session.load_ptx((CORPUS / "add_f32_scalar.ptx").read_text(), "add_f32_scalar", device=device)
        silu_mul = session.load_ptx(
            (CORPUS / "silu_mul_f16_scalar.ptx").read_text(), "silu_mul_f16_scalar", device=device
        )
        print(f"add_f32_scalar: {add.signature}")

        n = 1 << 20
        x = torch.randn(n, device=device)
        y = torch.randn(n, device=device)
        total = torch.empty(n, device=device)
        # torch's work, then ptxd's kernel, then torch's again: all on the
        # current stream, ordered through the session's launch ring (GPU
        # words on the stream; docs/python.md says which path a launch takes).
        x.mul_(3.0)
        session.launch(add, [x, y], total, stream=torch.cuda.current_stream(device))
        doubled = total * 2
        torch.testing.assert_close(doubled, (x + y) * 2, rtol=0, atol=0)

        gate = torch.randn(n, device=device, dtype=torch.float16)
        up = torch.randn(n, device=device, dtype=torch.float16)
        out = torch.empty_like(gate)
        session.launch(silu_mul, [gate, up], out)  # torch's current stream by default
        expected = (torch.nn.functional.silu(gate.float()) * up.float()).half()
        torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)

        # The session defers ptxd's answers (the default): a refusal of any
        # launch above would be raised here, if not by a later launch.
        session.wait_answers()

        registered = [b for b in session.buffers() if b["label"] != ptxd._native.RING_WORDS_LABEL]
        print(f"{len(registered)} registration(s) for 7 tensors (caching-allocator segments)")
    print("torch_elementwise: ok")


if __name__ == "__main__":
    main()
