"""Test support: a ptxd daemon of the test run, the PTX corpus.

The daemon binary is ``$PTXD_BIN``, else the repository's
``target/debug/ptxd`` or ``target/release/ptxd`` (tests/run.sh builds it).
Its log goes to ``$PTXD_TEST_LOGS`` (a folder) when set, else beside its
socket in a temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import ptxd

REPO = Path(__file__).resolve().parents[2]


def corpus_dir() -> Path:
    return Path(os.environ.get("PTXD_CORPUS", REPO / "tests" / "corpus"))


def daemon_binary() -> Path:
    explicit = os.environ.get("PTXD_BIN")
    if explicit:
        return Path(explicit)
    for profile in ("debug", "release"):
        candidate = REPO / "target" / profile / "ptxd"
        if candidate.exists():
            return candidate
    raise RuntimeError("no ptxd binary: set PTXD_BIN or run `cargo build --bin ptxd`")


class Daemon:
    """A ptxd process listening on ``socket``."""

    def __init__(self, backend: str, name: str, extra=()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"ptxd-py-{name}-"))
        self.socket = str(self.dir / "ptxd.sock")
        logs = Path(os.environ.get("PTXD_TEST_LOGS", self.dir))
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"ptxd-{name}.log"
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [str(daemon_binary()), "serve", "--backend", backend, "--socket", self.socket, *extra],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ptxd exited with {self.process.returncode}; see {self.log_path}")
            if os.path.exists(self.socket):
                try:
                    with ptxd.Client(self.socket) as client:
                        info = client.info()
                    if info["devices"] and all(d["available"] for d in info["devices"]):
                        return
                except ptxd.Error as error:
                    last = error
            time.sleep(0.05)
        raise RuntimeError(f"ptxd did not become ready in {timeout}s ({last}); see {self.log_path}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()



def read_ptx(name: str) -> str:
    return (corpus_dir() / f"{name}.ptx").read_text()


#: A real compiler's kernel ptxd refuses (`NON_SCALAR_ABI`, sub_reason
#: `param_misuse`: nvcc's grid-stride loop, which computes with its count
#: param), as (text, entry): the tests' example of a refused load.
REFUSED_ENTRY = "grid_stride_scale_f32"


def read_refused_ptx() -> tuple[str, str]:
    nvcc = Path(os.environ.get("PTXD_NVCC_CORPUS", REPO / "tests" / "corpus" / "nvcc"))
    return (nvcc / "refused-ptx" / "grid_stride.sm_90.ptx").read_text(), REFUSED_ENTRY
