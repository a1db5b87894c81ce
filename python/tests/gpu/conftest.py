"""GPU tests: run only with PTXD_GPU_TESTS=1, and then fail (never skip) when
torch, CUDA or the daemon are missing.

The daemon is ``$PTXD_BIN serve --backend cuda``; logs go to
``$PTXD_TEST_LOGS`` when set (tests/gpu/run.sh points it at ``$OUT``).
"""

from __future__ import annotations

import os

import pytest

import ptxd
from support import Daemon

ENABLED = os.environ.get("PTXD_GPU_TESTS") == "1"


def pytest_collection_modifyitems(config, items):
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="GPU tests: set PTXD_GPU_TESTS=1 on a machine with a GPU")
    for item in items:
        if "/gpu/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def torch():
    try:
        import torch
    except ImportError as error:  # pragma: no cover - a GPU machine has torch
        pytest.fail(f"PTXD_GPU_TESTS=1 but torch does not import: {error}")
    if not torch.cuda.is_available():
        pytest.fail("PTXD_GPU_TESTS=1 but torch sees no CUDA device")
    if not ptxd.cuda_available():
        pytest.fail("PTXD_GPU_TESTS=1 but libcuda does not load")
    return torch


@pytest.fixture(scope="session")
def gpu_daemon(torch):
    daemon = Daemon("cuda", "cuda")
    yield daemon
    daemon.stop()


@pytest.fixture
def gpu_client(gpu_daemon):
    with ptxd.Client(gpu_daemon.socket) as c:
        yield c


@pytest.fixture
def gpu_session(gpu_client):
    with gpu_client.session("pytest-gpu") as s:
        yield s


@pytest.fixture
def device(torch, gpu_client):
    """The torch device ptxd's device 0 is, found by UUID."""
    uuid = gpu_client.info()["devices"][0]["uuid"]
    for index in range(torch.cuda.device_count()):
        if ptxd._client._device(index).uuid == uuid:
            return torch.device("cuda", index)
    pytest.fail(f"no torch device has ptxd's device UUID {uuid}")
