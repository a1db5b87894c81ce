"""ptxd: the Python client of the ptxd kernel-loader daemon.

A session hands PTX to ptxd and launches it on tensors that stay in the
session's own memory (CUDA tensors through IPC handles, host arrays through
shared memory or sealed memfds passed by file descriptor); ptxd compiles each distinct kernel once for all sessions and
checks every launch. This package wraps the Rust SDK (``ptxd-client``); calls
are synchronous and release the GIL.

    import numpy as np, ptxd
    with ptxd.Client() as client, client.session("demo") as session:
        kernel = session.load_ptx(open("add_f32_scalar.ptx").read(), "add_f32_scalar")
        a, b, out = (session.shm_array(1024, np.float32) for _ in range(3))
        a[:] = 1; b[:] = 2
        session.launch(kernel, [a, b], out)
        assert (out == 3).all()

Refusals raise :class:`Refused` (one subclass per reason, e.g.
:class:`BufferTooSmall`); a daemon that cannot be reached raises
:class:`Unavailable`.
"""

from . import _native
from ._args import Arg, f32, f64, i32, i64, u32, u64
from ._client import Buffer, Client, Kernel, Launched, Session, Signature, cuda_available
from ._errors import (
    REFUSALS,
    CudaError,
    DtypeMismatch,
    Error,
    NotContiguous,
    NotExportable,
    Refused,
    SessionClosed,
    Unavailable,
)

__version__ = _native.VERSION

# One class per refusal reason (BufferTooSmall, StaleKernel, ...), from the
# reason list the native module was built with.
globals().update({cls.__name__: cls for cls in REFUSALS.values()})

__all__ = [
    "Client",
    "Session",
    "Kernel",
    "Buffer",
    "Signature",
    "Launched",
    "Arg",
    "i32",
    "u32",
    "i64",
    "u64",
    "f32",
    "f64",
    "cuda_available",
    "Error",
    "Unavailable",
    "SessionClosed",
    "Refused",
    "NotContiguous",
    "NotExportable",
    "DtypeMismatch",
    "CudaError",
    "REFUSALS",
    *sorted(cls.__name__ for cls in REFUSALS.values()),
]
