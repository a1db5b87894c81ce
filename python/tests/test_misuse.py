"""The Python client as its users meet it with bad input or misuse, against a
host-backend daemon: every mistake raises a typed exception (a ptxd class
with ptxd's reason, or TypeError/ValueError/OverflowError with a clear
message; never a Rust panic or an AttributeError), a failed call leaves
nothing registered or held, and a closed session lets go of what it held."""

from __future__ import annotations

import fcntl
import gc
import os
import threading

import numpy as np
import pytest

import ptxd
from support import read_ptx

RNG = np.random.default_rng()


def random_f32(count: int) -> np.ndarray:
    return RNG.uniform(-1000, 1000, count).astype(np.float32)


def filled(session, values: np.ndarray) -> np.ndarray:
    array = session.shm_array(values.shape, values.dtype)
    array[:] = values
    return array


def open_fds() -> set:
    return set(os.listdir("/proc/self/fd"))


def client_shm_names() -> set:
    prefix = f"ptxd-client-{os.getpid()}-"
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


def sessions_of(client) -> int:
    return client.info()["sessions"]


def settled(check) -> bool:
    # A lease ends, and a dropped connection's socket is closed, by the
    # runtime's tasks shortly after the call that let go of it returns.
    for _ in range(250):
        if check():
            return True
        threading.Event().wait(0.02)
    return check()


def wait_for_sessions(client, count: int) -> int:
    settled(lambda: sessions_of(client) == count)
    return sessions_of(client)


def warm_up(client) -> None:
    """Opens what a client keeps for its whole life (the fd socket's
    connection, made on first use), so that descriptors counted after it
    are the test's own."""
    with client.session("warm-up") as warm:
        warm.memfd_array(1, np.float32)
        warm.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    gc.collect()


def test_a_reply_spin_past_the_longest_duration_is_refused_not_a_panic(socket):
    # Past about 2^63 s the SDK's clock addition panicked at the first call
    # on the fd socket (a PanicException, no ptxd error); the bound is the
    # daemon's flags' longest duration, 2^32 - 1 s.
    past = [2.0**32, float(RNG.uniform(2.0**63, 2.0**64 - 2.0**20)), 1e19]
    for spin in past:
        with pytest.raises(ValueError, match=r"reply_spin must be a number of seconds from 0 to 4294967295"):
            ptxd.Client(socket, reply_spin=spin)
    # The longest one taken works (a reply ends the spin at once).
    with ptxd.Client(socket, reply_spin=float(2**32 - 1)) as client, client.session("spin") as s:
        kernel = s.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
        assert kernel.symbol == "add_f32_scalar"


def test_a_launch_of_something_else_than_a_kernel_is_a_type_error(session):
    values = random_f32(64)
    a, b = filled(session, values), filled(session, values)
    out = filled(session, np.full(64, np.nan, np.float32))
    for args in ((), (ptxd.f32(1.0),), (1.0,)):
        with pytest.raises(TypeError, match="expected a ptxd.Kernel, got str"):
            session.launch("add_f32_scalar", [a, b], out, args=args)
    assert np.isnan(out).all(), "nothing ran"


def test_n_is_an_int_in_the_u64_range_or_a_type_or_value_error(session):
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    count = int(RNG.integers(2, 4096))
    values_a, values_b = random_f32(count), random_f32(count)
    a, b = filled(session, values_a), filled(session, values_b)
    out = filled(session, np.full(count, np.nan, np.float32))
    # A float was truncated (2.5 -> 2) and a string parsed; both ran.
    for n, kind, text in [
        (count - 0.5, TypeError, "n must be an int, not float"),
        (str(count), TypeError, "n must be an int, not str"),
        (True, TypeError, "n must be an int, not bool"),
        (-1, ValueError, "n must not be negative, got -1"),
        (-int(RNG.integers(2, 2**62)), ValueError, "n must not be negative"),
        (2**64, ValueError, r"n must be below 2\^64, got 18446744073709551616"),
        (2**64 + int(RNG.integers(1, 2**62)), ValueError, r"n must be below 2\^64"),
    ]:
        with pytest.raises(kind, match=text):
            session.launch(kernel, [a, b], out, n=n)
        with pytest.raises(kind, match=text):
            session.launch_many([(kernel, [a, b], out, n)])
    assert np.isnan(out).all(), "nothing ran"
    # numpy's integers are ints (they have __index__).
    session.launch(kernel, [a, b], out, n=np.int64(count))
    np.testing.assert_array_equal(out, values_a + values_b)
    # A count inside the u64 range is ptxd's to refuse: past the arrays,
    # or past what a launch's count can be.
    with pytest.raises(ptxd.BufferTooSmall):
        session.launch(kernel, [a, b], out, n=count + 1)
    with pytest.raises(ptxd.InvalidArgument) as refused:
        session.launch(kernel, [a, b], out, n=2**64 - 1)
    assert refused.value.metadata == {"field": "n"}


def test_f32_values_past_the_f32_range_overflow_instead_of_becoming_infinities(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    count = int(RNG.integers(1, 2048))
    x = filled(session, random_f32(count))
    out = filled(session, np.full(count, np.nan, np.float32))
    big = float(RNG.uniform(3.5e38, 1e300)) * float(RNG.choice([-1.0, 1.0]))
    for value in (big, 3.4028236e38, -1e39):
        with pytest.raises(OverflowError, match="does not fit an f32"):
            ptxd.f32(value)
        with pytest.raises(OverflowError, match="param 0: .* does not fit an f32"):
            session.launch(kernel, [x], out, params=(value, 1.0))
        with pytest.raises(OverflowError, match="does not fit an f32"):
            session.launch(kernel, [x], out, args=[value, 1.0])
        with pytest.raises(OverflowError, match="param 1: .* does not fit an f32"):
            session.launch_many([(kernel, [x], out, None, (1.0, value))])
    assert np.isnan(out).all(), "nothing was sent"
    # The largest f32, infinities and NaN are f32 values.
    assert ptxd.f32(3.4028235e38).value == 3.4028235e38
    session.launch(kernel, [x], out, params=(0.0, float("inf")))
    assert np.isposinf(out).all()
    session.launch(kernel, [x], out, args=[ptxd.f32(0.0), ptxd.f32(float("-inf"))])
    assert np.isneginf(out).all()
    # params=None is no params, as () is.
    add = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    session.launch(add, [x, x], out, params=None)
    np.testing.assert_array_equal(out, x + x)


def test_a_device_ordinal_out_of_range_is_a_value_error(session):
    ptx = read_ptx("add_f32_scalar")
    for device in (-1, -int(RNG.integers(2, 2**40)), 2**32, int(RNG.integers(2**32, 2**62))):
        with pytest.raises(ValueError, match=r"a device ordinal is in 0..2\^32-1"):
            session.load_ptx(ptx, "add_f32_scalar", device=device)
    # In range but absent: ptxd's refusal.
    with pytest.raises(ptxd.UnknownDevice) as refused:
        session.load_ptx(ptx, "add_f32_scalar", device=2**32 - 1)
    assert refused.value.reason == "UNKNOWN_DEVICE"


def test_launch_many_items_say_what_is_missing_or_misspelt(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    x = filled(session, random_f32(32))
    out = filled(session, np.full(32, np.nan, np.float32))
    with pytest.raises(TypeError, match="missing output"):
        session.launch_many([{"kernel": kernel, "inputs": [x]}])
    with pytest.raises(TypeError, match="missing kernel, inputs, output"):
        session.launch_many([{}])
    # A misspelt key was ignored: the launch went without its params.
    with pytest.raises(TypeError, match="unknown param"):
        session.launch_many([{"kernel": kernel, "inputs": [x], "output": out, "param": (2.0, 1.0)}])
    with pytest.raises(TypeError, match=r"a launch is \(kernel, inputs, output\[, n\[, params\]\]\) or a dict, not int"):
        session.launch_many([5])
    assert np.isnan(out).all(), "nothing ran"


def test_register_fd_sizes_and_offsets_are_checked_before_anything_is_sent(session):
    fd = os.memfd_create("ptxd-misuse", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 4096)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        huge = 2**64 + int(RNG.integers(0, 2**32))
        for size, offset, kind, text in [
            (-1, 0, ValueError, "size must not be negative, got -1"),
            (huge, 0, ValueError, rf"size must be below 2\^64, got {huge}"),
            (4096, -4096, ValueError, "offset must not be negative, got -4096"),
            (4096.0, 0, TypeError, "size must be an int, not float"),
            (4096, "0", TypeError, "offset must be an int, not str"),
        ]:
            with pytest.raises(kind, match=text):
                session.register_fd(fd, size, offset=offset)
        with pytest.raises(ValueError, match="has no element size"):
            session.register_fd(fd, 4096, dtype="S")
        buffer = session.register_fd(fd, np.int64(4096), dtype=np.float32)
        assert buffer.numel == 1024
    finally:
        os.close(fd)
    assert [b["handle"] for b in session.buffers()] == [buffer.handle]


def test_host_array_shapes_are_ints_and_fit_a_file(session):
    extent = int(RNG.integers(1, 512))
    assert session.shm_array(np.int64(extent), np.float32).shape == (extent,)
    assert session.memfd_array((np.uint16(2), extent), np.float32).shape == (2, extent)
    with pytest.raises(TypeError, match="shape extent must be an int, not float"):
        session.shm_array((extent + 0.5,), np.float32)
    with pytest.raises(TypeError, match="shape must be an int, not float"):
        session.memfd_array(float(extent), np.float32)
    with pytest.raises(ValueError, match="at most 9223372036854775807 bytes"):
        session.shm_array(2**70, np.uint8)
    with pytest.raises(ValueError, match="at most 9223372036854775807 bytes"):
        session.memfd_array((2**31, 2**31), np.float64)
    with pytest.raises(ValueError, match="negative extent"):
        session.shm_array((extent, -1), np.float32)
    assert len(session.buffers()) == 2


def test_a_host_array_ptxd_refuses_leaves_nothing_registered_or_held(session, client):
    limit = client.info()["limits"]["max_buffer_bytes_per_session"]
    warm_up(client)
    before = session.buffers()
    fds, names = open_fds(), client_shm_names()
    for make in (session.shm_array, session.memfd_array):
        # A sparse object of the limit and a byte or more: made here,
        # refused by ptxd, and let go of.
        with pytest.raises(ptxd.LimitExceeded) as refused:
            make(limit + int(RNG.integers(1, 4096)), np.uint8)
        assert refused.value.metadata["limit"] == "max_buffer_bytes_per_session"
    gc.collect()
    assert session.buffers() == before
    assert settled(lambda: open_fds() == fds), (fds, open_fds())
    assert client_shm_names() == names


def test_releasing_another_sessions_buffer_is_refused_and_leaves_it_registered(client, session):
    with client.session("owner") as owner:
        buffer = owner.register(owner.shm_array(int(RNG.integers(1, 4096)), np.float32))
        with pytest.raises(ptxd.StaleBuffer) as refused:
            session.release(buffer)
        assert refused.value.reason == "STALE_BUFFER"
        # The refusal did not mark it released: its own session still
        # releases it (that release was a no-op).
        assert [b["handle"] for b in owner.buffers()] == [buffer.handle]
        owner.release(buffer)
        assert owner.buffers() == []
        owner.release(buffer)  # again: nothing to do
        with pytest.raises(TypeError, match="expected a ptxd.Buffer, got str"):
            owner.release(buffer.handle)


def test_a_closed_session_lets_go_of_its_host_memory_and_refuses_typed(client):
    kernel_ptx = read_ptx("add_f32_scalar")
    warm_up(client)
    fds = open_fds()
    names = client_shm_names()
    session = client.session("closing")
    kernel = session.load_ptx(kernel_ptx, "add_f32_scalar")
    count = int(RNG.integers(1, 4096))
    a, b = session.memfd_array(count, np.float32), session.shm_array(count, np.float32)
    out = session.memfd_array(count, np.float32)
    session.launch(kernel, [a, b], out)
    buffer = session.register(out)
    assert session.close() == {"buffers_released": 3, "kernels_released": 1, "events_released": 0}
    assert session.close() is None
    # Every call raises SessionClosed; an array of the closed session is
    # not "not in a host buffer of this session" (TypeError) nor launched.
    for call in (
        lambda: session.launch(kernel, [a, b], out),
        lambda: session.register(a),
        lambda: session.launch_many([(kernel, [a, b], out)]),
        lambda: session.shm_array(count, np.float32),
        lambda: session.memfd_array(count, np.float32),
        lambda: session.load_ptx(kernel_ptx, "add_f32_scalar"),
        lambda: session.buffers(),
    ):
        with pytest.raises(ptxd.SessionClosed) as closed:
            call()
        assert closed.value.reason == "SESSION_CLOSED"
    session.release(buffer)  # released with the lease: nothing to do
    # The session object lives on, but holds no mapping or descriptor of
    # the arrays once the caller lets go of them.
    del a, b, out, buffer
    gc.collect()
    assert settled(lambda: open_fds() == fds), (fds, open_fds())
    assert client_shm_names() == names
    del session


def test_no_descriptor_or_lease_outlives_many_open_close_cycles(socket):
    def cycle(index: int) -> None:
        with ptxd.Client(socket) as client:
            session = client.session(f"cycle-{index}")
            kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
            count = int(RNG.integers(1, 1024))
            a, b = session.memfd_array(count, np.float32), session.shm_array(count, np.float32)
            out = session.memfd_array(count, np.float32)
            a[:], b[:] = random_f32(count), random_f32(count)
            session.launch(kernel, [a, b], out)
            np.testing.assert_array_equal(out, a + b)
            if index % 3 == 0:
                session.close()
            elif index % 3 == 1:
                # The client's exit closes it, an exception on the way out
                # included.
                with pytest.raises(RuntimeError, match="on the way out"):
                    with session:
                        raise RuntimeError("on the way out")
            # else: left to the client's close

    with ptxd.Client(socket) as watcher:
        cycle(0)  # the runtime's own descriptors, made once per process
        gc.collect()
        fds, names = open_fds(), client_shm_names()
        sessions = sessions_of(watcher)
        for index in range(1, 31):
            cycle(index)
        gc.collect()
        assert wait_for_sessions(watcher, sessions) == sessions
        assert settled(lambda: open_fds() == fds), (fds, open_fds())
        assert client_shm_names() == names


def test_context_managers_end_the_leases_on_exceptions(socket, client):
    before = sessions_of(client)
    with pytest.raises(KeyError):
        with ptxd.Client(socket) as other:
            held = other.session("held")
            held.shm_array(16, np.float32)
            assert sessions_of(client) == before + 1
            raise KeyError("boom")
    assert not held.is_open
    assert wait_for_sessions(client, before) == before
    with pytest.raises(ptxd.Error) as closed:
        other.info()
    assert closed.value.reason == "CLIENT_CLOSED"
    with pytest.raises(ptxd.Error) as closed:
        other.session("late")
    assert closed.value.reason == "CLIENT_CLOSED"
    other.close()  # again: nothing to do


def test_load_triton_names_the_metadata_it_misses(session):
    from types import SimpleNamespace

    ptx = read_ptx("affine_f32_scalar")
    with pytest.raises(TypeError, match=r"asm\['ptx'\]"):
        session.load_triton(SimpleNamespace(asm={}))
    # No metadata at all, or a field missing: an AttributeError or a
    # KeyError before.
    with pytest.raises(TypeError, match="its metadata has no 'name'"):
        session.load_triton(SimpleNamespace(asm={"ptx": ptx}))
    for missing in ("name", "num_warps", "shared"):
        metadata = {"name": "affine_f32_scalar", "num_warps": 4, "shared": 0}
        del metadata[missing]
        with pytest.raises(TypeError, match=f"its metadata has no '{missing}'"):
            session.load_triton(SimpleNamespace(asm={"ptx": ptx}, metadata=metadata))
        with pytest.raises(TypeError, match=f"its metadata has no '{missing}'"):
            session.load_triton(SimpleNamespace(asm={"ptx": ptx}, metadata=SimpleNamespace(**metadata)))
    with pytest.raises(TypeError, match="num_warps must be an int, not str"):
        session.load_triton(SimpleNamespace(
            asm={"ptx": ptx}, metadata={"name": "affine_f32_scalar", "num_warps": "4", "shared": 0}))
    kernel = session.load_triton(SimpleNamespace(
        asm={"ptx": ptx}, metadata={"name": "affine_f32_scalar", "num_warps": np.int64(4), "shared": 0}))
    assert kernel.symbol == "affine_f32_scalar"


def test_a_reply_spin_is_a_number_of_seconds(socket):
    # A string was parsed ("0.001") and True was a spin of one second.
    for spin, name in (("0.001", "str"), (True, "bool"), (b"1", "bytes")):
        with pytest.raises(TypeError, match=f"reply_spin is a number of seconds, not {name}"):
            ptxd.Client(socket, reply_spin=spin)
    with ptxd.Client(socket, reply_spin=np.float32(RNG.uniform(0, 1e-3))) as client:
        assert client.info()["backend"] == "host"


def test_a_host_array_of_python_objects_is_refused_before_anything_is_made(session):
    # numpy read the zero-filled shared bytes as object pointers (an array
    # of None), and a kernel's output as pointers to dereference.
    before, names, fds = session.buffers(), client_shm_names(), open_fds()
    extent = int(RNG.integers(1, 64))
    for dtype in (object, np.dtype([("x", np.float32), ("o", object)])):
        for make in (session.shm_array, session.memfd_array):
            with pytest.raises(TypeError, match="holds plain data, not Python objects"):
                make(extent, dtype)
    assert session.buffers() == before
    assert client_shm_names() == names and open_fds() == fds


def test_the_host_ring_refuses_f32_params_past_the_f32_range(session):
    kernel = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    count = int(RNG.integers(1, 1024))
    x = filled(session, random_f32(count))
    out = filled(session, np.full(count, np.nan, np.float32))
    index = [session.register(a)._registration.ring_index for a in (x, out)]
    ring = session._native.open_ring(0, 8)
    operands = [(index[0], 0)], (index[1], 0)
    huge = float(RNG.uniform(3.5e38, 1e300))
    for defer in (False, True):
        with pytest.raises(OverflowError, match=r"param 1: .* does not fit an f32"):
            ring.launch(kernel._native, *operands, count, [1.0, huge], False, defer, 10.0)
    with pytest.raises(OverflowError, match=r"param 0: .* does not fit an f32"):
        ring.profile(kernel._native, *operands, count, [-huge, 0.0], 1, 10.0)
    assert ring.outstanding() == 0, "nothing was sent"
    assert ring.launch(kernel._native, *operands, count, [0.0, float("inf")], False, False,
                       10.0) is True
    assert np.isposinf(out).all()


def test_host_arrays_have_the_dtype_asked_for(session):
    # A structured dtype came back as raw bytes (|V8), a subarray dtype as
    # |V16 elements instead of trailing extents (as numpy.zeros gives).
    extent = int(RNG.integers(1, 256))
    pair = np.dtype([("x", "<f4"), ("n", "<i4")])
    for make in (session.shm_array, session.memfd_array):
        structured = make(extent, pair)
        assert structured.dtype == pair and structured.shape == (extent,)
        structured["x"], structured["n"] = 1.5, -3
        assert structured.tobytes() == np.array([(1.5, -3)] * extent, pair).tobytes()
        lanes = make((extent, 2), (np.float32, 4))
        assert lanes.dtype == np.float32 and lanes.shape == (extent, 2, 4)
        assert lanes.shape == np.zeros((extent, 2), (np.float32, 4)).shape
        assert session.register(lanes).itemsize == 4


def test_a_next_event_timeout_past_the_longest_duration_is_refused_not_a_panic(session):
    # Duration::from_secs_f64 panicked past 2^64 s (a PanicException); the
    # bound is reply_spin's, 2^32 - 1 s.
    # (Without the bound 2^32 s was taken, and waited for: it comes last.)
    past = [1e300, float(RNG.uniform(2.0**64, 1e300)), 2.0**32]
    for timeout in [-1.0, float("nan"), float("inf")] + past:
        with pytest.raises(ValueError, match="timeout must be a number of seconds from 0 to 4294967295"):
            session.next_event(timeout)
    assert session.next_event(float(RNG.uniform(0, 0.01))) is None
