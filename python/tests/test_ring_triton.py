"""Triton-family kernels on the launch ring: the client decides ring
eligibility from ptxd's word (``KernelSignature.ring_launchable``), never
from the contract's text, and typed scalar args ride the ring's descriptor.
The ring half runs on the fakes of test_ring_cache (the Python ring orders
on a CUDA stream); the eligibility half loads real Triton PTX from the
corpus through ``load_triton`` on the host daemon."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import ptxd
from ptxd import _client
from test_ring_cache import (  # noqa: F401 (fixtures)
    FakeKernel,
    FakeTensor,
    fake,
    fake_torch,
    segment,
)

RNG = random.Random()

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "corpus" / "jit" / "triton"


class FakeTritonShaped(FakeKernel):
    # Triton's shape: a .u32 count, an f32 and an s32 scalar, null scratch
    # pointers, 4 elements per thread; ptxd grants it to rings.
    ring_launchable = True
    contract = ("params(x: ptr read, out: ptr written, n: count .u32, scale: .f32, "
                "k: .s32, s0: ptr null, s1: ptr null); block 128 (.reqntid); "
                "grid ceil(n / block × 4); x[roundup(n, 4) × 4] align 4")

    def signature(self):
        return (1, [4, 4], 2, 128, 128, 0)


class ScalarTextNotGranted(FakeKernel):
    # A contract whose text looks like the scalar ABI, but ptxd says no:
    # the client must believe ptxd.
    ring_launchable = False


def test_a_triton_shaped_kernel_launches_through_the_ring_with_typed_args(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    x, out = (FakeTensor(base + i * 4 * count, count) for i in range(2))
    kernel = _client.Kernel(FakeTritonShaped())
    scale, k = RNG.uniform(-2, 2), RNG.randrange(-1000, 1000)
    for _ in range(3):
        assert session.launch(kernel, [x], out, args=[scale, k]) == ptxd.Launched(0, False)
    assert native.unary == [], "no launch went unary"
    ring = native.rings[0]
    assert len(ring.launches) == 3
    for stream, (_, inputs, output, n, params, args) in ring.launches:
        index = next(iter(native.registered.values()))
        assert stream == 0x7700
        assert inputs == [(index, 0)] and output == (index, 4 * count)
        assert n == count and params == []
        assert args == [("f32", scale), ("i32", k)], "typed args ride the descriptor"
    # Explicitly typed args too, on the general path (a CuPy-less fresh cache).
    session.launch(kernel, [x], out, args=[ptxd.f32(scale), ptxd.i32(k)], n=count - 1)
    assert ring.launches[-1][1][3] == count - 1
    assert ring.launches[-1][1][5] == [("f32", scale), ("i32", k)]


def test_eligibility_is_ptxds_word_not_the_contracts_text(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    session.launch(_client.Kernel(ScalarTextNotGranted()), [a, b], out)
    assert len(native.unary) == 1
    assert all(len(r.launches) == 0 for r in native.rings)
    session.launch(_client.Kernel(FakeKernel()), [a, b], out)
    assert len(native.unary) == 1 and len(native.rings[0].launches) == 1


def compiled(name: str, symbol: str, num_warps: int = 4):
    """What ``load_triton`` reads of a Triton ``CompiledKernel``."""
    return SimpleNamespace(
        asm={"ptx": (CORPUS / name).read_text()},
        metadata=SimpleNamespace(name=symbol, num_warps=num_warps, shared=0),
    )


def test_ptxd_grants_real_triton_kernels_to_rings(client):
    with client.session("ring-triton") as session:
        for name, symbol in [
            ("scale_shift_f32_b1024_w4_nodiv.ptx", "scale_shift_kernel"),
            ("add_f32_b1024_w4_nodiv.ptx", "add_kernel"),
            ("add_f16_b1024_w4_nodiv.ptx", "add_kernel"),
        ]:
            kernel = session.load_triton(compiled(name, symbol))
            assert "count .u32" in kernel.contract, kernel.contract
            assert kernel._native.ring_launchable, kernel.contract
            assert kernel._ring_ok()

