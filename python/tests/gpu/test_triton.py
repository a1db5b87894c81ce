"""A real Triton kernel through ``Session.load_triton`` on a GPU (issue 21):
loaded from the ``CompiledKernel`` Triton's own launch returned, launched by
ptxd with its scalar args and no grid, and compared bit for bit with what
Triton's launcher wrote. Needs triton (installed with torch on the GPU
machine) and a verifier that accepts Triton elementwise kernels.

Triton is imported inside the tests, so collecting this module on a machine
without it (where the GPU tests are skipped) needs nothing.
"""

from __future__ import annotations

import pytest


def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError as error:  # pragma: no cover - the GPU machine has triton
        pytest.fail(f"PTXD_GPU_TESTS=1 but triton does not import: {error}")
    return triton, tl


def _scale_shift(triton, tl):
    @triton.jit
    def scale_shift(x_ptr, out_ptr, n, scale, shift, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x * scale + shift, mask=mask)

    return scale_shift


@pytest.mark.parametrize("block,num_warps", [(1024, 4), (256, 2)])
def test_a_triton_kernel_through_ptxd_matches_tritons_own_launch(torch, gpu_session, block,
                                                                  num_warps):
    triton, tl = _triton()
    kernel = _scale_shift(triton, tl)
    n = 10_007  # not a multiple of any block
    scale, shift = 0.75, -1.25
    x = torch.randn(n, device="cuda")
    by_triton = torch.full_like(x, float("nan"))
    compiled = kernel[(triton.cdiv(n, block),)](
        x, by_triton, n, scale, shift, BLOCK=block, num_warps=num_warps
    )
    torch.cuda.synchronize()
    loaded = gpu_session.load_triton(compiled, device=x.device)
    assert loaded.signature.block_size == 32 * num_warps
    by_ptxd = torch.full_like(x, float("nan"))
    # Plain floats take the contract's .f32; ptxd computes the grid, passes
    # n as the kernel's count and null for the scratch pointers.
    gpu_session.launch(loaded, [x], by_ptxd, args=[scale, shift], sync=True)
    torch.cuda.synchronize()
    assert not torch.isnan(by_ptxd).any(), "ptxd's launch left elements unwritten"
    assert torch.equal(by_ptxd.view(torch.int32), by_triton.view(torch.int32))
    # One element more than the output holds is refused, nothing written.
    poisoned = torch.full((n,), float("nan"), device="cuda")
    with pytest.raises(Exception) as refused:
        gpu_session.launch(loaded, [x], poisoned, n=n + 1, args=[scale, shift], sync=True)
    assert getattr(refused.value, "reason", None) == "BUFFER_TOO_SMALL"
    torch.cuda.synchronize()
    assert torch.isnan(poisoned).all()
