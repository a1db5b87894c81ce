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
