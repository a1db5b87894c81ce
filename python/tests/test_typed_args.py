"""Typed scalar arguments and Session.load_triton against a host-backend
daemon (no GPU, no Triton: the compiled kernel is faked)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

import ptxd
from ptxd import _args
from support import read_ptx

RNG = np.random.default_rng()


def filled(session, values: np.ndarray) -> np.ndarray:
    array = session.shm_array(values.shape, values.dtype)
    array[:] = values
    return array


def poisoned(session, count: int) -> np.ndarray:
    array = session.shm_array(count, np.float32)
    array[:] = np.nan
    return array


def affine_reference(x: np.ndarray, a: float, b: float) -> np.ndarray:
    # fma in f32, as the kernel computes it: exact in f64, then rounded.
    a32, b32 = np.float32(a), np.float32(b)
    return (x.astype(np.float64) * np.float64(a32) + np.float64(b32)).astype(np.float32)


def test_f32_args_write_exactly_what_params_write(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    n = 3001
    x = filled(session, RNG.uniform(-100, 100, n).astype(np.float32))
    a, b = float(RNG.uniform(-2, 2)), float(RNG.uniform(-1, 1))
    want = affine_reference(np.asarray(x), a, b)
    outputs = []
    for how in ("params", "typed", "plain", "mixed", "none-params", "none-params-batch"):
        y = poisoned(session, n)
        if how == "params":
            session.launch(kernel, [x], y, params=[a, b], sync=True)
        elif how == "none-params":
            # params=None beside args is no params (as before len() replaced
            # the truth test).
            session.launch(kernel, [x], y, params=None, args=[a, b], sync=True)
        elif how == "none-params-batch":
            session.launch_many([{"kernel": kernel, "inputs": [x], "output": y,
                                  "params": None, "args": [a, b]}], sync=True)
        elif how == "typed":
            session.launch(kernel, [x], y, args=[ptxd.f32(a), ptxd.f32(b)], sync=True)
        elif how == "plain":
            # Plain floats take their type from the contract (.f32).
            session.launch(kernel, [x], y, args=[a, b], sync=True)
        else:
            session.launch(kernel, [x], y, args=[ptxd.f32(a), b], sync=True)
        np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32), err_msg=how)
        outputs.append(np.array(y))
    assert all((o.view(np.uint32) == outputs[0].view(np.uint32)).all() for o in outputs)


def test_each_mismatch_is_refused_by_ptxd_with_its_metadata(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    names = [name for name, _ in _args.scalar_params(kernel.contract)]
    assert len(names) == 2, kernel.contract
    n = 64
    x = filled(session, RNG.uniform(-1, 1, n).astype(np.float32))
    y = poisoned(session, n)
    cases = [
        ([ptxd.i32(1), ptxd.f32(2.0)], {}, {"what": "type", "index": "0", "param": names[0],
                                            "expected": "f32", "given": "i32"}),
        ([ptxd.f32(1.0), ptxd.f64(2.0)], {}, {"what": "type", "index": "1", "param": names[1],
                                              "expected": "f32", "given": "f64"}),
        ([ptxd.f32(1.0)], {}, {"what": "count", "expected": "2", "given": "1"}),
        ([ptxd.f32(1.0), ptxd.f32(2.0), ptxd.u64(3)], {},
         {"what": "count", "expected": "2", "given": "3"}),
        ([ptxd.f32(1.0), ptxd.f32(2.0)], {"params": [1.0, 2.0]}, {"what": "both"}),
    ]
    for args, extra, metadata in cases:
        with pytest.raises(ptxd.ScalarArgsMismatch) as refused:
            session.launch(kernel, [x], y, args=args, sync=True, **extra)
        error = refused.value
        assert error.reason == "SCALAR_ARGS_MISMATCH" and error.code == "INVALID_ARGUMENT"
        for key, value in metadata.items():
            assert error.metadata[key] == value, (args, key, error.metadata)
    assert np.isnan(y).all(), "a refused launch wrote nothing"


def test_plain_numbers_are_typed_by_the_contract_or_refused_before_sending(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    x = filled(session, np.ones(8, np.float32))
    y = poisoned(session, 8)
    # An int for an .f32 param is not converted.
    with pytest.raises(TypeError, match="takes a float"):
        session.launch(kernel, [x], y, args=[1, 2.0], sync=True)
    with pytest.raises(TypeError, match="takes a float"):
        session.launch(kernel, [x], y, args=[True, 2.0], sync=True)
    # Past the contract's scalars there is no type to take.
    with pytest.raises(TypeError, match="no param"):
        session.launch(kernel, [x], y, args=[1.0, 2.0, 3.0], sync=True)
    assert np.isnan(y).all()


def test_the_typed_helpers_check_their_ranges():
    assert ptxd.i32(-(2**31)) == ("i32", -(2**31))
    assert ptxd.u32(2**32 - 1).value == 2**32 - 1
    assert ptxd.u64(2**64 - 1).value == 2**64 - 1
    assert ptxd.i64(np.int64(-5)) == ("i64", -5)
    assert ptxd.f64(1) == ("f64", 1.0)
    for make, value in [(ptxd.i32, 2**31), (ptxd.u32, -1), (ptxd.u32, 2**32),
                        (ptxd.i64, 2**63), (ptxd.u64, -1)]:
        with pytest.raises(OverflowError):
            make(value)
    for make, value in [(ptxd.i32, 1.5), (ptxd.u64, "3"), (ptxd.i32, True), (ptxd.f32, "x")]:
        with pytest.raises(TypeError):
            make(value)


def test_the_contract_names_each_scalar_param_with_its_type():
    text = ("params(out: ptr written, x: ptr read, n: count .u32, scale: .f32, y: ptr read, "
            "k: .s32, m: .u64, d: .f64, s0: ptr null, s1: ptr null); block 128 (.reqntid); "
            "grid ceil(n / block × 8)")
    assert _args.scalar_params(text) == [("scale", "f32"), ("k", "i32"), ("m", "u64"),
                                         ("d", "f64")]
    params = _args.scalar_params(text)
    assert _args.resolve([0.5, -3, 2**40, 2.0], params) == [
        ("f32", 0.5), ("i32", -3), ("u64", 2**40), ("f64", 2.0)]
    with pytest.raises(OverflowError):
        _args.resolve([0.5, 2**31, 0, 0.0], params)
    with pytest.raises(TypeError, match="takes an int"):
        _args.resolve([0.5, 1.0, 0, 0.0], params)


def fake_triton(ptx: str, name: str, num_warps: int, shared: int = 0, as_dict: bool = False,
                as_bytes: bool = False):
    """What ``load_triton`` reads of a Triton ``CompiledKernel``."""
    metadata = {"name": name, "num_warps": num_warps, "shared": shared}
    return SimpleNamespace(
        asm={"ptx": ptx.encode() if as_bytes else ptx, "ttir": "unused"},
        metadata=metadata if as_dict else SimpleNamespace(**metadata),
    )


def with_reqntid(ptx: str, threads: int) -> str:
    """The PTX with ``.reqntid threads`` on its entry (as Triton writes it)."""
    return re.sub(r"\)\s*\{", f")\n.reqntid {threads}\n{{", ptx, count=1)


def test_load_triton_reads_the_compiled_kernel_and_launches_without_a_grid(session):
    ptx = with_reqntid(read_ptx("affine_f32_scalar"), 128)
    for as_dict, as_bytes in [(False, False), (True, True)]:
        kernel = session.load_triton(
            fake_triton(ptx, "affine_f32_scalar", num_warps=4, as_dict=as_dict,
                        as_bytes=as_bytes))
        assert kernel.symbol == "affine_f32_scalar"
        assert kernel.signature.block_size == 128 and kernel.signature.reqntid == 128
        n = 1000  # not a multiple of the block
        x = filled(session, RNG.uniform(-10, 10, n).astype(np.float32))
        y = poisoned(session, n)
        a, b = 0.75, -0.5
        session.launch(kernel, [x], y, args=[a, b], sync=True)
        np.testing.assert_array_equal(y, affine_reference(np.asarray(x), a, b))


def test_load_triton_refuses_what_ptxd_cannot_launch_as_compiled(session):
    ptx = with_reqntid(read_ptx("affine_f32_scalar"), 128)
    with pytest.raises(ValueError, match="num_warps=8 means 256"):
        session.load_triton(fake_triton(ptx, "affine_f32_scalar", num_warps=8))
    with pytest.raises(ValueError, match="16 bytes of dynamic shared memory"):
        session.load_triton(fake_triton(ptx, "affine_f32_scalar", num_warps=4, shared=16))
    with pytest.raises(TypeError, match="CompiledKernel"):
        session.load_triton(SimpleNamespace(asm={}, metadata=None))
    # The symbol comes from the metadata: a wrong one is ptxd's refusal.
    with pytest.raises(ptxd.SymbolNotFound):
        session.load_triton(fake_triton(ptx, "not_there", num_warps=4))


def test_ring_eligibility_comes_from_ptxd(session):
    # ptxd says whether it grants a kernel to launch rings
    # (KernelSignature.ring_launchable); the client reads that, never the
    # contract's text. Scalar-ABI kernels are granted.
    for name in ("affine_f32_scalar", "add_f32_scalar"):
        kernel = session.load_ptx(read_ptx(name), name)
        assert kernel._native.ring_launchable, kernel.contract
        assert kernel._ring_ok()


def test_launch_many_takes_typed_args_and_ptxd_checks_each(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    n = 517
    x = filled(session, RNG.uniform(-5, 5, n).astype(np.float32))
    ys = [poisoned(session, n) for _ in range(3)]
    coefficients = [(float(RNG.uniform(-2, 2)), float(RNG.uniform(-1, 1))) for _ in range(3)]
    session.launch_many([
        {"kernel": kernel, "inputs": [x], "output": y, "args": [ptxd.f32(a), b]}
        for y, (a, b) in zip(ys, coefficients)
    ], sync=True)
    for y, (a, b) in zip(ys, coefficients):
        np.testing.assert_array_equal(y, affine_reference(np.asarray(x), a, b))
    # Typed args of other types go to ptxd as they are (no f32-only
    # refusal here any more): ptxd refuses the mismatched launch alone, and
    # the others in the batch run.
    for y in ys:
        y[:] = np.nan
    (a0, b0), (a2, b2) = coefficients[0], coefficients[2]
    with pytest.raises(ptxd.ScalarArgsMismatch) as refused:
        session.launch_many([
            {"kernel": kernel, "inputs": [x], "output": ys[0], "args": [a0, b0]},
            {"kernel": kernel, "inputs": [x], "output": ys[1],
             "args": [ptxd.f64(1.0), ptxd.f32(2.0)]},
            {"kernel": kernel, "inputs": [x], "output": ys[2], "args": [ptxd.f32(a2), ptxd.f32(b2)]},
        ], sync=True)
    error = refused.value
    assert error.index == 1
    assert error.metadata["given"] == "f64" and error.metadata["index"] == "0"
    assert not isinstance(error.results[0], BaseException)
    assert not isinstance(error.results[2], BaseException)
    np.testing.assert_array_equal(ys[0], affine_reference(np.asarray(x), a0, b0))
    assert np.isnan(ys[1]).all(), "the refused launch wrote nothing"
    np.testing.assert_array_equal(ys[2], affine_reference(np.asarray(x), a2, b2))
    with pytest.raises(TypeError, match="not both"):
        session.launch_many([{"kernel": kernel, "inputs": [x], "output": ys[0],
                              "params": [1.0, 2.0], "args": [1.0, 2.0]}])


def test_a_real_triton_kernel_through_load_triton(session, corpus):
    # Triton 3.6's scale_shift (f32, BLOCK_SIZE 1024, 4 warps) as a compiled
    # kernel would hand it over: loaded with its Triton-family contract,
    # granted to rings (ptxd's `ring_launchable`), launched with typed args.
    ptx = (corpus / "jit" / "triton" / "scale_shift_f32_b1024_w4_nodiv.ptx").read_text()
    compiled = fake_triton(ptx, "scale_shift_kernel", num_warps=4)
    kernel = session.load_triton(compiled)
    assert "count .u32" in kernel.contract and kernel._ring_ok()
    n = 3001
    x = filled(session, RNG.uniform(-10, 10, n).astype(np.float32))
    y = poisoned(session, n + 8)
    scale, shift = 1.5, -0.25
    session.launch(kernel, [x], y, n=n, args=[scale, shift], sync=True)
    np.testing.assert_array_equal(y[:n].view(np.uint32),
                                  affine_reference(np.asarray(x), scale, shift).view(np.uint32))
    assert np.isnan(y[n:]).all(), "written past n"
    with pytest.raises(ptxd.ScalarArgsMismatch) as refused:
        session.launch(kernel, [x], y, n=n, args=[ptxd.f32(scale), ptxd.i32(2)], sync=True)
    assert refused.value.metadata["given"] == "i32"
