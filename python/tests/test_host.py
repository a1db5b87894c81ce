"""The Python client against a host-backend daemon (no GPU), with numpy."""

from __future__ import annotations

import fcntl
import gc
import mmap
import os
import re
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

import ptxd
from support import Daemon, read_ptx, read_refused_ptx
from kernels import add_kernel

RNG = np.random.default_rng()


def random_f32(count: int) -> np.ndarray:
    return RNG.uniform(-1000, 1000, count).astype(np.float32)


def filled(session, values: np.ndarray) -> np.ndarray:
    array = session.shm_array(values.shape, values.dtype)
    array[:] = values
    return array


def test_the_issue_snippet_and_buffer_too_small(socket, monkeypatch):
    # The issue's "Done when", as written (reading the corpus from the repository root).
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    SOCKET = socket
    with ptxd.Client(SOCKET) as c, c.session("t") as s:
        k = s.load_ptx(open("tests/corpus/add_f32_scalar.ptx").read(), "add_f32_scalar")
        a, b, o = (s.shm_array(1024, np.float32) for _ in range(3))
        a[:] = 1
        b[:] = 2
        s.launch(k, [a, b], o)
        assert (o == 3).all()

        o[:] = -7
        with pytest.raises(ptxd.Refused) as refused:
            s.launch(k, [a, b], o, n=2048)
        error = refused.value
        assert error.reason == "BUFFER_TOO_SMALL"
        assert type(error) is ptxd.BufferTooSmall
        assert error.code == "OUT_OF_RANGE" and error.code_value == 11
        # ptxd itself refused it (the arrays are whole registrations).
        assert error.metadata == {
            "operand": "input 0",
            "needed_bytes": str(2048 * 4),
            "buffer_bytes": str(1024 * 4),
        }
        assert "BUFFER_TOO_SMALL" in str(error) and "needed_bytes=8192" in str(error)
        assert (o == -7).all(), "a refused launch wrote nothing"


def test_add_matches_numpy_on_random_inputs(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    values_a, values_b = random_f32(5000), random_f32(5000)
    a, b = filled(session, values_a), filled(session, values_b)
    out = filled(session, np.full(5000, np.nan, np.float32))
    launched = session.launch(kernel, [a, b], out)
    assert isinstance(launched, ptxd.Launched) and launched.micros >= 0
    np.testing.assert_array_equal(out, values_a + values_b)


@pytest.mark.parametrize("reply_spin", [0, 0.001, None])
def test_the_reply_spin_changes_timing_only(socket, reply_spin):
    with ptxd.Client(socket, reply_spin=reply_spin) as client, client.session("spin") as session:
        kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
        values_a, values_b = random_f32(3001), random_f32(3001)
        a, b = filled(session, values_a), filled(session, values_b)
        for _ in range(20):
            out = filled(session, np.full(3001, np.nan, np.float32))
            session.launch(kernel, [a, b], out)
            np.testing.assert_array_equal(out, values_a + values_b)
        with pytest.raises(ptxd.BufferTooSmall):
            session.launch(kernel, [a, b], out, n=3002)


@pytest.mark.parametrize("reply_spin", [-1.0, float("nan"), float("inf")])
def test_a_reply_spin_that_is_no_duration_is_refused(socket, reply_spin):
    with pytest.raises(ValueError, match="reply_spin"):
        ptxd.Client(socket, reply_spin=reply_spin)


def test_signature_and_kernel_state(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    assert kernel.signature == ptxd.Signature(
        inputs=1,
        element_sizes=(4, 4),
        scalar_params=2,
        block_size=kernel.signature.block_size,
        reqntid=0,
        maxntid=0,
    )
    assert kernel.signature.block_size > 0
    assert kernel.symbol == "affine_f32_scalar"
    assert kernel.device_uuid.startswith("HOST")
    again = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    assert again.cache_hit


def test_params_reach_the_kernel(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    values = random_f32(777)
    x = filled(session, values)
    out = filled(session, np.full(777, np.nan, np.float32))
    session.launch(kernel, [x], out, params=(2.5, -3.0))
    # One rounding (the kernel's fma): exact in f64, then rounded to f32.
    np.testing.assert_array_equal(out, (values.astype(np.float64) * 2.5 - 3.0).astype(np.float32))
    with pytest.raises(ptxd.AbiMismatch) as refused:
        session.launch(kernel, [x], out, params=(1.0,))
    assert refused.value.reason == "ABI_MISMATCH"


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "f16"])
def test_generated_kernels_per_dtype(session, dtype):
    ptx, symbol = add_kernel(dtype)
    kernel = session.load_ptx(ptx, symbol)
    numpy_dtype = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "f16": np.float16}[dtype]
    assert kernel.signature.element_sizes == (np.dtype(numpy_dtype).itemsize,) * 3
    count = 3001
    if dtype == "i32":
        values_a = RNG.integers(-(2**31), 2**31 - 1, count, dtype=np.int64)
        values_b = RNG.integers(-(2**31), 2**31 - 1, count, dtype=np.int64)
        expected = ((values_a + values_b + 2**31) % 2**32 - 2**31).astype(np.int32)
        values_a, values_b = values_a.astype(np.int32), values_b.astype(np.int32)
    else:
        values_a = RNG.uniform(-60, 60, count).astype(numpy_dtype)
        values_b = RNG.uniform(-60, 60, count).astype(numpy_dtype)
        expected = (values_a.astype(np.float64) + values_b.astype(np.float64)).astype(numpy_dtype)
        if dtype == "f32":
            expected = values_a + values_b
    a, b = filled(session, values_a), filled(session, values_b)
    out = session.shm_array(count, numpy_dtype)
    session.launch(kernel, [a, b], out)
    np.testing.assert_array_equal(out, expected)


def bf16_round(values: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits, rounding to nearest even (finite values)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def test_generated_bf16_kernel(session):
    ptx, symbol = add_kernel("bf16")
    kernel = session.load_ptx(ptx, symbol)
    count = 2049
    a_bits = bf16_round(RNG.uniform(-60, 60, count))
    b_bits = bf16_round(RNG.uniform(-60, 60, count))
    as_f32 = lambda bits: (bits.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    a, b = filled(session, a_bits), filled(session, b_bits)
    out = session.shm_array(count, np.uint16)
    session.launch(kernel, [a, b], out)
    np.testing.assert_array_equal(out, bf16_round(as_f32(a_bits) + as_f32(b_bits)))


def test_slices_are_offsets_and_the_rest_is_untouched(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    values_a, values_b = random_f32(1024), random_f32(1024)
    a, b = filled(session, values_a), filled(session, values_b)
    out = filled(session, np.full(1024, -1.0, np.float32))
    session.launch(kernel, [a[256:512], b[512:768]], out[100:356])
    np.testing.assert_array_equal(out[100:356], values_a[256:512] + values_b[512:768])
    assert (out[:100] == -1).all() and (out[356:] == -1).all()
    buffer = session.register(a[256:512])
    assert (buffer.offset, buffer.nbytes, buffer.registered_size) == (1024, 1024, 4096)
    assert buffer.kind == "host_shm"


def test_a_slice_ending_inside_its_array_is_bounds_checked_here(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    a, b = session.shm_array(1024, np.float32), session.shm_array(1024, np.float32)
    out = filled(session, np.full(1024, 5.0, np.float32))
    # ptxd sees the whole 4096-byte array; the client knows the slice is 512 elements.
    with pytest.raises(ptxd.BufferTooSmall) as refused:
        session.launch(kernel, [a[:512], b], out[:512], n=600)
    assert refused.value.metadata == {
        "operand": "input 0",
        "needed_bytes": "2400",
        "buffer_bytes": "2048",
        "checked_by": "client",
    }
    assert (out == 5).all()


def test_non_contiguous_and_foreign_arrays_are_refused_clearly(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    a = session.shm_array(1024, np.float32)
    with pytest.raises(ptxd.NotContiguous, match="not C-contiguous"):
        session.launch(kernel, [a[::2], a[::2]], a[:512])
    with pytest.raises(TypeError, match="shm_array"):
        session.register(np.zeros(16, np.float32))
    with pytest.raises(TypeError, match="cannot register a str"):
        session.register("nope")
    half = session.shm_array(1024, np.float16)
    with pytest.raises(ptxd.DtypeMismatch, match="4-byte elements"):
        session.launch(kernel, [half, half], half)


def test_each_refusal_is_its_own_class(session):
    with pytest.raises(ptxd.SymbolNotFound) as missing:
        session.load_ptx(read_ptx("add_f32_scalar"), "no_such_symbol")
    assert missing.value.reason == "SYMBOL_NOT_FOUND"
    with pytest.raises(ptxd.InvalidArtifact):
        session.load_ptx("this is not PTX", "add_f32_scalar")
    with pytest.raises(ptxd.NonScalarAbi) as refused:
        session.load_ptx(*read_refused_ptx())
    assert isinstance(refused.value, ptxd.Refused)
    assert refused.value.metadata["sub_reason"] == "param_misuse"
    with pytest.raises(ptxd.UnknownDevice):
        session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar", device=99)


def test_reason_classes_match_the_sdk_and_the_stub():
    reasons = list(ptxd._native.REASONS)
    assert len(reasons) == 27 and "BUFFER_TOO_SMALL" in reasons
    assert ptxd.REFUSALS["SCALAR_ARGS_MISMATCH"] is ptxd.ScalarArgsMismatch
    assert ptxd.REFUSALS["FD_NOT_SEALED"] is ptxd.FdNotSealed
    assert ptxd.REFUSALS["STALE_FD_TOKEN"] is ptxd.StaleFdToken
    for reason in reasons:
        cls = ptxd.REFUSALS[reason]
        assert issubclass(cls, ptxd.Refused)
        assert getattr(ptxd, cls.__name__) is cls
        assert cls.__name__ == "".join(p.capitalize() for p in reason.split("_"))
    stub = (Path(ptxd.__file__).parent / "__init__.pyi").read_text()
    in_stub = re.findall(r"^class (\w+)\(Refused\):", stub, re.MULTILINE)
    assert sorted(in_stub) == sorted(ptxd.REFUSALS[r].__name__ for r in reasons)


def python_memfd(size: int, seals: int = 0) -> int:
    """A memfd made with Python's own calls, sized to ``size``, with ``seals``
    added (none by default)."""
    fd = os.memfd_create("ptxd-py-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_memfd_array_launch_matches_numpy(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    count = 5000
    values_a, values_b = random_f32(count), random_f32(count)
    a, b, out = (session.memfd_array(count, np.float32) for _ in range(3))
    assert (a == 0).all(), "a memfd_array starts zero-filled"
    a[:], b[:] = values_a, values_b
    out[:] = np.nan
    session.launch(kernel, [a, b], out)
    expected = values_a + values_b
    for index in range(count):
        assert out[index] == expected[index], (index, out[index], expected[index])

    buffer = session.register(out[1000:2000])
    assert buffer.kind == "posix_fd"
    assert (buffer.offset, buffer.nbytes, buffer.registered_size) == (4000, 4000, count * 4)
    listed = {b["handle"]: b for b in session.buffers()}
    assert listed[buffer.handle]["kind"] == "posix_fd"
    assert listed[buffer.handle]["size"] == count * 4

    # A slice of one array and a whole other one, in the same launch.
    out[:] = np.nan
    session.launch(kernel, [a[:1000], b[1000:2000]], out[2000:3000])
    np.testing.assert_array_equal(out[2000:3000], values_a[:1000] + values_b[1000:2000])
    assert np.isnan(out[:2000]).all() and np.isnan(out[3000:]).all()

    session.release(buffer)
    assert buffer.handle not in {b["handle"] for b in session.buffers()}
    with pytest.raises(TypeError, match="memfd_array"):
        session.register(out)


IN_NAMESPACES = """
import os, sys
import numpy as np, ptxd
assert os.getpid() == 1, "not in a fresh PID namespace"
assert os.listdir("/dev/shm") == [], "/dev/shm is not private"
with ptxd.Client(sys.argv[1]) as client, client.session("namespaced") as session:
    kernel = session.load_ptx(open(sys.argv[2]).read(), "add_f32_scalar")
    a, b, out = (session.memfd_array(3001, np.float32) for _ in range(3))
    a[:] = np.arange(3001); b[:] = 0.5; out[:] = np.nan
    session.launch(kernel, [a, b], out)
    assert (out == np.arange(3001, dtype=np.float32) + 0.5).all()
    # A name in this namespace's /dev/shm means nothing to the daemon.
    try:
        session.shm_array(1024, np.float32)
        raise SystemExit("shm_array registered a name the daemon cannot see")
    except ptxd.InvalidHandle:
        pass
print("namespaced client ok")
"""


def test_memfd_arrays_work_from_private_pid_and_mount_namespaces(socket, corpus):
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.fail("unshare --pid --mount needs root; this test must run as root")
    script = f'mount -t tmpfs tmpfs /dev/shm && exec "{sys.executable}" -c "$0" "$1" "$2"'
    done = subprocess.run(
        ["unshare", "--pid", "--mount", "--fork", "sh", "-c", script,
         IN_NAMESPACES, socket, str(corpus / "add_f32_scalar.ptx")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0 and "namespaced client ok" in done.stdout, done.stdout + done.stderr


def test_an_unsealed_python_memfd_is_refused_fd_not_sealed(session):
    fd = python_memfd(4096)
    try:
        with pytest.raises(ptxd.FdNotSealed) as refused:
            session.register_fd(fd, 4096)
    finally:
        os.close(fd)
    error = refused.value
    assert isinstance(error, ptxd.Refused) and error.reason == "FD_NOT_SEALED"
    assert error.code == "FAILED_PRECONDITION" and error.code_value == 9
    assert error.metadata == {"seals": "0x0"}
    assert session.buffers() == []


def test_a_sealed_python_memfd_registers_and_launches(session):
    count = 2048
    size = count * 4
    values_a, values_b = random_f32(count), random_f32(count)
    fds = [python_memfd(size, fcntl.F_SEAL_SHRINK) for _ in range(3)]
    try:
        maps = [mmap.mmap(fd, size) for fd in fds]
        views = [np.frombuffer(m, np.float32) for m in maps]
        views[0][:], views[1][:], views[2][:] = values_a, values_b, np.nan
        a, b = (session.register_fd(fd, size, dtype=np.float32) for fd in fds[:2])
        out = session.register_fd(fds[2], size, label="python memfd")
    finally:
        for fd in fds:
            os.close(fd)  # ptxd holds its own references
    assert (a.kind, a.nbytes, a.numel, a.itemsize) == ("posix_fd", size, count, 4)
    assert (out.numel, out.itemsize) == (0, 0)
    listed = {b["handle"]: b for b in session.buffers()}
    assert listed[out.handle]["label"] == "python memfd"
    assert listed[out.handle]["kind"] == "posix_fd"

    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    with pytest.raises(ValueError, match="pass n"):
        session.launch(kernel, [a, b], out)
    session.launch(kernel, [a, b], out, n=count)
    expected = values_a + values_b
    for index in range(count):
        assert views[2][index] == expected[index], (index, views[2][index], expected[index])
    with pytest.raises(ptxd.BufferTooSmall):
        session.launch(kernel, [a, b], out, n=count + 1)

    session.release(out)
    assert out.handle not in {b["handle"] for b in session.buffers()}
    del views
    for m in maps:
        m.close()


def test_register_fd_refuses_a_size_past_the_memfd_and_bad_descriptors(session):
    fd = python_memfd(4096, fcntl.F_SEAL_SHRINK)
    try:
        with pytest.raises(ptxd.InvalidHandle) as refused:
            session.register_fd(fd, 8192)
        assert refused.value.reason == "INVALID_HANDLE"
        assert "4096" in refused.value.message
        with pytest.raises(ptxd.InvalidHandle):
            session.register_fd(fd, 4096, offset=4096)
    finally:
        os.close(fd)
    assert session.buffers() == []
    with pytest.raises(ValueError, match="non-negative"):
        session.register_fd(-1, 4096)
    with pytest.raises(TypeError, match="int file descriptor"):
        session.register_fd(True, 4096)
    with pytest.raises(ValueError, match="non-negative"):
        session.register_fd(2**40, 4096)
    # A number above any open descriptor (a closed one could be reused by
    # another thread meanwhile).
    with pytest.raises(OSError) as bad:
        session.register_fd(2**30, 4096)
    assert isinstance(bad.value, ptxd.Error)
    assert "Bad file descriptor" in str(bad.value)


def test_unreachable_daemon_raises_unavailable(tmp_path):
    with pytest.raises(ptxd.Unavailable) as error:
        ptxd.Client(str(tmp_path / "nothing.sock"))
    assert error.value.code == "UNAVAILABLE"


def test_default_socket_follows_ptxd_socket(socket, monkeypatch):
    monkeypatch.setenv("PTXD_SOCKET", socket)
    with ptxd.Client() as client:
        info = client.info()
    assert info["backend"] == "host"
    assert info["devices"][0]["uuid"].startswith("HOST")
    assert info["limits"]["slots"] > 0


def test_lease_ends_on_close_exit_and_collection(client):
    def sessions():
        return client.info()["sessions"]

    before = sessions()
    s = client.session("closing")
    assert sessions() == before + 1 and s.is_open
    report = s.close()
    assert report == {"buffers_released": 0, "kernels_released": 0, "events_released": 0}
    assert not s.is_open
    with pytest.raises(ptxd.SessionClosed):
        s.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")

    with client.session("with") as s2:
        s2.shm_array(16, np.float32)
        assert sessions() == before + 1
    assert sessions() == before

    s3 = client.session("collected")
    s3.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    assert sessions() == before + 1
    del s3
    gc.collect()
    for _ in range(100):
        if sessions() == before:
            break
        threading.Event().wait(0.02)
    assert sessions() == before


def test_release_and_buffers_listing(session):
    a = session.shm_array(64, np.float32)
    buffer = session.register(a)
    assert [b["handle"] for b in session.buffers()] == [buffer.handle]
    session.release(buffer)
    assert session.buffers() == []


def test_launch_many_pipelines_and_reports_the_refused_one(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    values_a, values_b = random_f32(4096), random_f32(4096)
    a, b = filled(session, values_a), filled(session, values_b)
    out = filled(session, np.full(4096, np.nan, np.float32))
    chunks = [(kernel, [a[i : i + 64], b[i : i + 64]], out[i : i + 64]) for i in range(0, 4096, 64)]
    results = session.launch_many(chunks)
    assert len(results) == 64 and all(isinstance(r, int) for r in results)
    np.testing.assert_array_equal(out, values_a + values_b)

    out[:] = 0
    bad = list(chunks)
    bad[10] = {"kernel": kernel, "inputs": [a, b], "output": out, "n": 8192}
    with pytest.raises(ptxd.BufferTooSmall) as refused:
        session.launch_many(bad)
    assert refused.value.index == 10
    assert isinstance(refused.value.results[9], int) and isinstance(refused.value.results[11], int)
    # Every other launch ran.
    np.testing.assert_array_equal(out[:640], (values_a + values_b)[:640])
    np.testing.assert_array_equal(out[704:], (values_a + values_b)[704:])


def test_threads_share_a_session(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    values_a, values_b = random_f32(8192), random_f32(8192)
    a, b = filled(session, values_a), filled(session, values_b)
    out = filled(session, np.full(8192, np.nan, np.float32))
    errors = []

    def work(start):
        try:
            for i in range(start, 8192, 1024):
                session.launch(kernel, [a[i : i + 256], b[i : i + 256]], out[i : i + 256])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(0, 1024, 256)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    np.testing.assert_array_equal(out, values_a + values_b)


def test_stream_on_host_memory_is_refused(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    a = session.shm_array(16, np.float32)
    with pytest.raises(ValueError, match="host memory"):
        session.launch(kernel, [a, a], a, stream=0)


def test_serve_sessions_example_shares_one_compiled_kernel(socket, corpus):
    import json
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[1] / "examples" / "serve_sessions.py"
    env = dict(os.environ, PTXD_CORPUS=str(corpus))
    done = subprocess.run(
        [sys.executable, str(example), "--socket", socket, "--workers", "3", "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["workers"] == 3 and report["correct"] == 3
    # Another test of this run may have compiled it already; at most one compiles.
    assert report["cache_hits"] >= 2, report


def test_calls_release_the_gil(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    count = 1 << 19
    a, b = session.shm_array(count, np.float32), session.shm_array(count, np.float32)
    out = session.shm_array(count, np.float32)
    session.launch(kernel, [a, b], out)  # warm up

    import sys
    import time

    def spin(seconds):
        ticks, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            ticks += 1
        return ticks

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        rate = spin(0.1) / 0.1
        done = threading.Event()
        thread = threading.Thread(target=lambda: (session.launch(kernel, [a, b], out), done.set()))
        began = time.perf_counter()
        thread.start()
        ticks = 0
        while not done.is_set():
            ticks += 1
            time.perf_counter()
        elapsed = time.perf_counter() - began
        thread.join()
    finally:
        sys.setswitchinterval(old)
    assert elapsed > 0.02, f"the launch took only {elapsed:.3f}s: too short to tell"
    # Holding the GIL, this thread would only have run for a switch interval
    # or so (well under 1% of the call); released, it ran for much of it
    # (about 20% on a loaded 2-core machine, where the daemon spins a core).
    assert ticks > 0.05 * rate * elapsed, (ticks, rate, elapsed)


def test_a_client_used_after_fork_raises_instead_of_hanging(client):
    client.info()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        try:
            client.info()
            os._exit(1)
        except RuntimeError as error:
            os._exit(0 if "fork" in str(error) else 2)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _children(pid: int) -> list:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def test_a_killed_executor_is_a_lease_event_and_its_kernels_go_stale(corpus):
    """The executor's death reaches the session as an ``executor_restarted``
    event (new generation), and a kernel loaded before it is refused
    STALE_KERNEL until it is loaded again."""
    daemon = Daemon("host", "events")
    try:
        with ptxd.Client(daemon.socket) as client, client.session("events") as s:
            kernel = s.load_ptx((corpus / "add_f32_scalar.ptx").read_text(), "add_f32_scalar")
            assert s.next_event(timeout=0.05) is None
            executors = _children(daemon.process.pid)
            assert executors, "the daemon has no executor child"
            for pid in executors:
                os.kill(pid, signal.SIGKILL)
            event = s.next_event(timeout=20)
            assert event is not None and event["kind"] == "executor_restarted", event
            assert event["new_generation"] > event["old_generation"]
            n = 1000
            x, y, out = (s.shm_array(n, np.float32) for _ in range(3))
            x[:] = np.random.rand(n).astype(np.float32)
            y[:] = np.random.rand(n).astype(np.float32)
            out[:] = np.nan
            with pytest.raises(ptxd.Refused) as refused:
                s.launch(kernel, [x, y], out, n, sync=True)
            assert refused.value.reason == "STALE_KERNEL"
            again = s.load_ptx((corpus / "add_f32_scalar.ptx").read_text(), "add_f32_scalar")
            s.launch(again, [x, y], out, n, sync=True)
            np.testing.assert_array_equal(out, x + y)
    finally:
        daemon.stop()


def test_a_vectorized_kernel_runs_on_arrays_of_its_lanes_with_its_contract(session):
    """The seed's Vectorized{4} schedule (float4, n counted in vectors) on
    float32 arrays: the contract names its 16-byte footprint, every lane is
    compared, and one vector past the arrays is refused BUFFER_TOO_SMALL."""
    kernel = session.load_ptx(read_ptx("add_f32_vec4"), "add_f32_vec4")
    assert kernel.signature.element_sizes == (16, 16, 16)
    assert "[n × 16] align 16" in kernel.contract, kernel.contract
    vectors = 1000 + np.random.randint(0, 100)
    x, y, out = (session.shm_array(4 * vectors, np.float32) for _ in range(3))
    x[:] = np.random.rand(4 * vectors).astype(np.float32)
    y[:] = np.random.rand(4 * vectors).astype(np.float32)
    out[:] = np.nan
    session.launch(kernel, [x, y], out, sync=True)  # n: the output's vectors
    np.testing.assert_array_equal(out, x + y)
    with pytest.raises(ptxd.BufferTooSmall):
        session.launch(kernel, [x, y], out, vectors + 1, sync=True)
    # A float4 kernel over float16 data is not its lanes.
    h = session.shm_array(4 * vectors, np.float16)
    with pytest.raises(ptxd.DtypeMismatch):
        session.launch(kernel, [h, h], h, vectors, sync=True)
