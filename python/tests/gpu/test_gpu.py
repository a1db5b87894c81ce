"""The Python client with torch (and CuPy) on a CUDA daemon.

Run with PTXD_GPU_TESTS=1 (tests/gpu/run.sh does); otherwise every test here
is reported as skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import ptxd
from support import corpus_dir, read_ptx, read_refused_ptx
from kernels import add_kernel

TESTS = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "worker.py"
EXAMPLES = Path(os.environ.get("PTXD_PY_EXAMPLES", TESTS.parent / "examples"))


def add_f32(session, device):
    return session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar", device=device)


def test_tensor_in_the_middle_of_a_caching_allocator_segment(torch, gpu_session, device):
    import gc

    gc.collect()
    torch.cuda.empty_cache()  # a fresh 2 MiB small-pool segment for the tensors below
    kernel = add_f32(gpu_session, device)
    count = 1 << 14  # 64 KiB each: the small pool puts them in one 2 MiB segment
    tensors = [torch.randn(count, device=device) for _ in range(6)]
    guard_before, a, b, out, guard_after = tensors[0], tensors[1], tensors[2], tensors[3], tensors[4]
    out.fill_(float("nan"))
    before, after = guard_before.clone(), guard_after.clone()
    buffers = [gpu_session.register(t) for t in (a, b, out)]
    assert len({buf.handle for buf in buffers}) == 1, "one segment, one registration"
    assert all(buf.offset > 0 for buf in buffers[1:])
    assert buffers[0].registered_size > 3 * count * 4
    assert [bu["size"] for bu in gpu_session.buffers()] == [buffers[0].registered_size]
    gpu_session.launch(kernel, [a, b], out)
    torch.cuda.synchronize(device)
    assert torch.equal(out, a + b)
    assert torch.equal(guard_before, before) and torch.equal(guard_after, after)
    # Registering again reuses the segment's registration.
    again = gpu_session.register(b)
    assert again.handle == buffers[0].handle and again.offset == buffers[1].offset
    # (The launch went through the session's launch ring, whose ordering
    # words are a registration of their own.)
    own = [bu for bu in gpu_session.buffers() if bu["label"] != ptxd._native.RING_WORDS_LABEL]
    assert len(own) == 1


@pytest.mark.parametrize("dtype_name", ["f32", "f16", "bf16", "f64", "i32"])
def test_dtypes_against_torch(torch, gpu_session, device, dtype_name):
    dtype = {
        "f32": torch.float32,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "f64": torch.float64,
        "i32": torch.int32,
    }[dtype_name]
    ptx, symbol = add_kernel(dtype_name)
    kernel = gpu_session.load_ptx(ptx, symbol, device=device)
    count = 100_003
    if dtype == torch.int32:
        a = torch.randint(-(2**31), 2**31 - 1, (count,), dtype=dtype, device=device)
        b = torch.randint(-(2**31), 2**31 - 1, (count,), dtype=dtype, device=device)
        expected = a + b  # wraps, as add.s32 does
    else:
        a = (torch.randn(count, device=device) * 100).to(dtype)
        b = (torch.randn(count, device=device) * 100).to(dtype)
        expected = (a.float() + b.float()).to(dtype) if dtype in (torch.float16, torch.bfloat16) else a + b
    out = torch.full_like(a, 7)
    gpu_session.launch(kernel, [a, b], out, sync=True)
    assert torch.equal(out, expected), f"{dtype_name}: {(out != expected).sum().item()} elements differ"


def test_stream_ordering_producer_ptxd_consumer_without_synchronize(torch, gpu_session, device):
    kernel = add_f32(gpu_session, device)
    count = 1 << 22
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        a = torch.full((count,), float("nan"), device=device)
        b = torch.full((count,), float("nan"), device=device)
        out = torch.full((count,), float("nan"), device=device)
        values_a = torch.randn(count, device=device)
        values_b = torch.randn(count, device=device)
        for round_ in range(3):
            # Producer: a long sleep, then the inputs; ptxd must wait for both.
            torch.cuda._sleep(50_000_000)
            a.copy_(values_a * (round_ + 1))
            b.copy_(values_b)
            gpu_session.launch(kernel, [a, b], out, stream=stream)
            # Consumer: reads ptxd's output, then poisons the inputs, which
            # must not happen before ptxd's kernel has read them.
            result = out * 2
            a.fill_(float("nan"))
            b.fill_(float("nan"))
            stream.synchronize()
            assert torch.equal(result, (values_a * (round_ + 1) + values_b) * 2), round_


def test_the_current_stream_orders_by_default(torch, gpu_session, device):
    kernel = add_f32(gpu_session, device)
    count = 1 << 20
    with torch.cuda.device(device):
        a = torch.full((count,), float("nan"), device=device)
        b = torch.randn(count, device=device)
        out = torch.empty(count, device=device)
        torch.cuda._sleep(50_000_000)
        a.fill_(3.0)
        gpu_session.launch(kernel, [a, b], out)  # no stream: the current one
        result = out.clone()
        torch.cuda.synchronize()
    assert torch.equal(result, b + 3.0)


def test_launch_many_on_a_stream(torch, gpu_session, device):
    kernel = add_f32(gpu_session, device)
    count = 1 << 16
    a = torch.randn(count, device=device)
    b = torch.randn(count, device=device)
    out = torch.full((count,), float("nan"), device=device)
    chunk = 4096
    launches = [
        (kernel, [a[i : i + chunk], b[i : i + chunk]], out[i : i + chunk]) for i in range(0, count, chunk)
    ]
    stream = torch.cuda.current_stream(device)
    times = gpu_session.launch_many(launches, stream=stream)
    assert len(times) == count // chunk
    total = out.sum()  # ordered after the last launch by the stream
    torch.cuda.synchronize(device)
    assert torch.equal(out, a + b)
    assert torch.isclose(total, (a + b).sum(), rtol=1e-3)


def test_cupy_arrays(torch, gpu_session, device):
    cupy = pytest.importorskip("cupy")
    kernel = add_f32(gpu_session, device)
    with cupy.cuda.Device(device.index):
        a = cupy.random.standard_normal(50_000, dtype=cupy.float32)
        b = cupy.random.standard_normal(50_000, dtype=cupy.float32)
        out = cupy.full(50_000, cupy.nan, dtype=cupy.float32)
        gpu_session.launch(kernel, [a, b], out)
        cupy.cuda.get_current_stream().synchronize()
        assert bool((out == a + b).all())
        with pytest.raises(ptxd.NotContiguous):
            gpu_session.register(a[::2])


def test_a_refusal_of_each_class(torch, gpu_client, gpu_session, device):
    kernel = add_f32(gpu_session, device)
    a = torch.randn(1024, device=device)
    b = torch.randn(1024, device=device)
    out = torch.zeros(1024, device=device)

    # Client-side bound: the tensor ends inside its segment.
    with pytest.raises(ptxd.BufferTooSmall) as client_side:
        gpu_session.launch(kernel, [a, b], out, n=2048)
    assert client_side.value.metadata["checked_by"] == "client"
    # ptxd's bound: past the end of the whole segment.
    segment = gpu_session.register(out).registered_size
    with pytest.raises(ptxd.BufferTooSmall) as daemon_side:
        gpu_session.launch(kernel, [ptxd_buffer(gpu_session, a)] * 2, ptxd_buffer(gpu_session, out), n=segment)
    assert "checked_by" not in daemon_side.value.metadata
    assert daemon_side.value.reason == "BUFFER_TOO_SMALL"

    with pytest.raises(ptxd.SymbolNotFound):
        gpu_session.load_ptx(read_ptx("add_f32_scalar"), "missing", device=device)
    with pytest.raises(ptxd.InvalidArtifact):
        gpu_session.load_ptx(".version 8.0\n.target sm_90\nnot ptx", "x", device=device)
    with pytest.raises(ptxd.NonScalarAbi) as refused:
        gpu_session.load_ptx(*read_refused_ptx(), device=device)
    assert refused.value.metadata["sub_reason"] == "param_misuse"
    with pytest.raises(ptxd.UnknownDevice):
        gpu_session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar", device=99)
    affine = gpu_session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar", device=device)
    with pytest.raises(ptxd.AbiMismatch):
        gpu_session.launch(affine, [a], out, params=(1.0,))

    # A released registration is stale.
    released = gpu_session.register(a)
    gpu_session.release(released)
    with pytest.raises(ptxd.StaleBuffer):
        gpu_session.launch(kernel, [released, released], released, n=16)

    # Another session's buffer is not ours.
    with gpu_client.session("other") as other:
        foreign = other.register(b)
        with pytest.raises(ptxd.Refused) as not_ours:
            gpu_session.launch(kernel, [foreign, foreign], foreign, n=16)
        assert not_ours.value.reason in ("NOT_OWNER", "STALE_BUFFER")

    with pytest.raises(ptxd.NotContiguous):
        gpu_session.register(torch.randn(64, 64, device=device).t())
    with pytest.raises(ptxd.DtypeMismatch):
        half = a.half()
        gpu_session.launch(kernel, [half, half], half)
    with pytest.raises(TypeError, match="CPU tensor"):
        gpu_session.register(torch.ones(4))

    closed = gpu_client.session("closed")
    closed.close()
    with pytest.raises(ptxd.SessionClosed):
        closed.register(a)
    with pytest.raises(ptxd.Unavailable):
        ptxd.Client("/nonexistent/ptxd.sock")


def ptxd_buffer(session, tensor):
    """The whole-segment Buffer of ``tensor``'s allocation (offset kept)."""
    buffer = session.register(tensor)
    whole = ptxd.Buffer(buffer._registration, buffer.offset, buffer.registered_size - buffer.offset,
                        buffer.itemsize, (buffer.registered_size - buffer.offset) // buffer.itemsize)
    return whole


def test_expandable_segments_register_by_descriptor_and_launch(gpu_daemon):
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    done = subprocess.run(
        [sys.executable, str(WORKER), gpu_daemon.socket, "expandable"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "LAUNCHED kinds=['posix_fd'] equal=True" in lines, done.stdout + done.stderr
    big = [line for line in lines if line.startswith("BIG ")]
    assert big and big[0].startswith("BIG NOT_EXPORTABLE"), done.stdout + done.stderr
    assert "run past" in big[0] or "runs past" in big[0], big[0]


def test_a_killed_worker_releases_its_session(gpu_client, gpu_daemon):
    before = gpu_client.info()["sessions"]
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), gpu_daemon.socket, "hold"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert worker.stdout.readline().strip() == "READY"
        assert gpu_client.info()["sessions"] == before + 1
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    deadline = time.monotonic() + 20
    while gpu_client.info()["sessions"] != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gpu_client.info()["sessions"] == before


def test_a_second_process_gets_a_cache_hit(gpu_daemon):
    symbol = f"add_f32_{uuid.uuid4().hex[:12]}"
    workers = []
    try:
        hits = []
        for _ in range(2):
            worker = subprocess.Popen(
                [sys.executable, str(WORKER), gpu_daemon.socket, "load", symbol],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
            workers.append(worker)
            hits.append(worker.stdout.readline().strip())
        assert hits == ["CACHE_HIT False", "CACHE_HIT True"]
    finally:
        for worker in workers:
            worker.communicate("\n", timeout=60)
    assert [w.returncode for w in workers] == [0, 0]


def test_examples_run(gpu_daemon):
    env = dict(os.environ, PTXD_SOCKET=gpu_daemon.socket, PTXD_CORPUS=str(corpus_dir()))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "torch_elementwise.py")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch_elementwise: ok" in done.stdout
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "serve_sessions.py"), "--workers", "4", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["workers"] == 4 and report["correct"] == 4
    assert report["cache_hits"] >= 3, report
