"""A plain launch ring (``HostRing``) against the host-backend daemon: the
awaited answer is the launch's own, its refusal the exact typed exception of
that call; a deferred refusal comes with the next call, which is not sent."""

from __future__ import annotations

import time

import numpy as np
import pytest

import ptxd
from support import read_ptx

RNG = np.random.default_rng()
TIMEOUT = 30.0


def filled(session, values: np.ndarray) -> np.ndarray:
    array = session.shm_array(values.shape, values.dtype)
    array[:] = values
    return array


@pytest.fixture(params=[None, 0.0, 0.002], ids=["spin-default", "spin-0", "spin-2ms"])
def spin_session(socket, request):
    # The awaited answer is polled for the client's reply_spin before the
    # SDK's wait: every spin must read the same (own) answer.
    with ptxd.Client(socket, reply_spin=request.param) as client:
        with client.session("host-ring") as session:
            yield session


@pytest.fixture
def ring_setup(spin_session):
    session = spin_session
    count = int(RNG.integers(16, 4096))
    x = filled(session, RNG.uniform(-1000, 1000, count).astype(np.float32))
    y = filled(session, RNG.uniform(-1000, 1000, count).astype(np.float32))
    out = filled(session, np.full(count, np.nan, dtype=np.float32))
    kernel = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    where = [(b._registration.ring_index, b.offset)
             for b in (session.register(a) for a in (x, y, out))]
    ring = session._native.open_ring(0, 16)
    return ring, kernel._native, where[:2], where[2], x, y, out, count


def test_an_awaited_ring_launch_raises_its_own_refusal_on_that_call(ring_setup):
    ring, kernel, inputs, output, x, y, out, count = ring_setup
    expected = x + y
    # Rounds of good and refused launches in a random order: each call's
    # answer is its own (a refusal is never reported by a later call).
    for round_ in range(24):
        out[:] = np.nan
        refuse = RNG.random() < 0.5
        n = count + int(RNG.integers(1, 1 << 20)) if refuse else count
        answer = ring.launch(kernel, inputs, output, n, [], False, False, TIMEOUT)
        assert ring.outstanding() == 0, "an awaited call reads its own answer"
        if refuse:
            assert isinstance(answer, ptxd.BufferTooSmall), (round_, answer)
            assert type(answer) is ptxd.BufferTooSmall
            assert answer.reason == "BUFFER_TOO_SMALL"
            # The unary path's code for the reason (test_host.py).
            assert (answer.code, answer.code_value) == ("OUT_OF_RANGE", 11)
            assert answer.metadata.get("path") == "ring"
            assert "deferred" not in answer.metadata
            assert np.isnan(out).all(), "a refused launch does not run"
        else:
            assert answer is True, (round_, answer)
            assert np.array_equal(out, expected)


def test_a_deferred_ring_refusal_comes_with_the_next_call_which_is_not_sent(ring_setup):
    ring, kernel, inputs, output, x, y, out, count = ring_setup
    out[:] = np.nan
    assert ring.launch(kernel, inputs, output, count * 4, [], False, True, TIMEOUT) is True
    time.sleep(1.0)  # ptxd answers within microseconds; the answer waits unread
    refused = ring.launch(kernel, inputs, output, count, [], False, True, TIMEOUT)
    assert [type(e) for e in refused] == [ptxd.BufferTooSmall]
    assert refused[0].metadata.get("deferred") == "true"
    assert ring.drain(TIMEOUT) == []
    assert np.isnan(out).all(), "neither launch ran"
    # Sent now; its answer read by drain.
    assert ring.launch(kernel, inputs, output, count, [], False, True, TIMEOUT) is True
    assert ring.drain(TIMEOUT) == [] and ring.outstanding() == 0
    assert np.array_equal(out, x + y)
    # An awaited call reads the answers deferred calls before it left
    # first: an accepted one is passed over; a refusal comes back as the
    # deferred call's would (the awaited launch is not sent), never dropped.
    out[:] = np.nan
    assert ring.launch(kernel, inputs, output, count, [], False, True, TIMEOUT) is True
    assert ring.launch(kernel, inputs, output, count, [], False, False, TIMEOUT) is True
    assert ring.outstanding() == 0 and np.array_equal(out, x + y)
    out[:] = np.nan
    assert ring.launch(kernel, inputs, output, count * 8, [], False, True, TIMEOUT) is True
    refused = ring.launch(kernel, inputs, output, count, [], False, False, TIMEOUT)
    assert [type(e) for e in refused] == [ptxd.BufferTooSmall]
    assert refused[0].metadata.get("deferred") == "true"
    assert ring.outstanding() == 0 and np.isnan(out).all(), "the awaited launch was not sent"
    assert ring.launch(kernel, inputs, output, count, [], False, False, TIMEOUT) is True
    assert ring.outstanding() == 0 and np.array_equal(out, x + y)
    # A sync launch is awaited, whatever defer says.
    out[:] = np.nan
    answer = ring.launch(kernel, inputs, output, count + 1, [], True, True, TIMEOUT)
    assert type(answer) is ptxd.BufferTooSmall and ring.outstanding() == 0


def test_a_ring_refusal_raises_what_the_unary_path_raises(spin_session, ring_setup):
    # The ring's refusal (its code from the Python module's own table) and
    # the unary launch's (the daemon's): the same class, reason and gRPC
    # code, for each refusal a plain ring launch can meet.
    session = spin_session
    ring, _, inputs, output, x, y, out, count = ring_setup
    add = session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar")
    affine = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar")
    out[:] = np.nan
    cases = [(add, inputs, [x, y], count + int(RNG.integers(1, 1 << 20)), [],
              ptxd.BufferTooSmall),
             (affine, inputs[:1], [x], count, [float(RNG.uniform(-2, 2))],  # it takes two
              ptxd.AbiMismatch)]
    for kernel, where, arrays, n, params, cls in cases:
        answer = ring.launch(kernel._native, where, output, n, params, False, False, TIMEOUT)
        with pytest.raises(ptxd.Refused) as unary:
            session.launch(kernel, arrays, out, n=n, params=params)
        assert type(answer) is cls and type(unary.value) is cls, (answer, unary.value)
        assert (answer.reason, answer.code, answer.code_value) == (
            unary.value.reason, unary.value.code, unary.value.code_value)
        assert answer.metadata.get("path") == "ring" and "path" not in unary.value.metadata
    assert ring.outstanding() == 0 and np.isnan(out).all(), "no refused launch ran"


def test_ring_wait_example_runs_and_checks_its_results(socket, corpus):
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "ring_wait.py"
    run = subprocess.run([sys.executable, str(example), socket, "--calls", "200", "--runs", "1"],
                         capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PTXD_CORPUS": str(corpus)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ring_wait: ok" in run.stdout
    assert "HostRing.launch, answer awaited" in run.stdout
