"""Fixtures of the host-backend tests (helpers in support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ptxd
from support import Daemon, corpus_dir


@pytest.fixture(scope="session")
def host_daemon():
    daemon = Daemon("host", "host")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def socket(host_daemon) -> str:
    return host_daemon.socket


@pytest.fixture
def client(socket):
    with ptxd.Client(socket) as c:
        yield c


@pytest.fixture
def session(client):
    with client.session("pytest") as s:
        yield s


@pytest.fixture(scope="session")
def corpus() -> Path:
    return corpus_dir()
