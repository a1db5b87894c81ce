"""ptxd's exceptions: one class per refusal reason, generated from the SDK's list.

Every refusal the daemon sends carries a reason from a closed list (the
``ptxd.v1.Reason`` enum, the README's table and the Rust SDK's ``Refusal``).
This module makes one subclass of :class:`Refused` per reason from the list
the native module was built with, so a reason added to the proto reaches
Python without an edit here (the ``.pyi`` stub lists them for type checkers,
and a test checks the two agree).
"""

from __future__ import annotations

from typing import Dict, Optional

from . import _native

__all__ = [
    "Error",
    "Unavailable",
    "SessionClosed",
    "Refused",
    "NotContiguous",
    "NotExportable",
    "DtypeMismatch",
    "CudaError",
    "REFUSALS",
    "class_name",
]

class Error(Exception):
    """Base of every exception ptxd raises.

    Attributes:
        reason: a short name of what went wrong (the refusal's wire reason, or
            e.g. ``"TRANSPORT"``).
        message: the human-readable message.
        code: the gRPC status code name (e.g. ``"OUT_OF_RANGE"``).
        code_value: the gRPC status code number.
        metadata: the ``google.rpc.ErrorInfo`` metadata (empty when none).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str = "ERROR",
        code: str = "UNKNOWN",
        code_value: int = 2,
        metadata: Optional[Dict[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.code = code
        self.code_value = code_value
        self.metadata: Dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        return self.message


class Unavailable(Error):
    """The daemon could not be reached, or the connection broke."""


class SessionClosed(Error):
    """The session's lease ended (closed, or the daemon went away)."""


class Refused(Error):
    """ptxd refused the request; ``reason`` is the ErrorInfo reason string.

    There is one subclass per reason (``BufferTooSmall`` for
    ``"BUFFER_TOO_SMALL"``, ...), so ``except ptxd.StaleKernel:`` works, and
    ``except ptxd.Refused:`` catches them all.
    """

    def __str__(self) -> str:
        text = f"{self.reason}: {self.message}"
        if self.metadata:
            pairs = ", ".join(f"{k}={v}" for k, v in sorted(self.metadata.items()))
            text += f" [{pairs}]"
        return text


class NotContiguous(Error, ValueError):
    """A tensor or array that is not C-contiguous was given as an operand."""


class NotExportable(Error, ValueError):
    """Memory ptxd cannot be handed: neither legacy CUDA IPC nor a POSIX
    file descriptor exports it (a cudaMallocAsync pool, cuMemCreate memory
    made without descriptor handles), or a tensor spans two physical
    allocations of PyTorch's ``expandable_segments``."""


class DtypeMismatch(Error, TypeError):
    """An operand's element size differs from the one the kernel declares."""


class CudaError(Error):
    """A CUDA driver call in this process failed."""


def class_name(reason: str) -> str:
    """``"BUFFER_TOO_SMALL"`` -> ``"BufferTooSmall"``."""
    return "".join(part.capitalize() for part in reason.split("_"))


def _make_refusals() -> Dict[str, type]:
    refusals = {}
    for reason in _native.REASONS:
        name = class_name(reason)
        doc = f"ptxd refused the request with reason ``{reason}``."
        refusals[reason] = type(name, (Refused,), {"__doc__": doc, "__module__": "ptxd"})
    return refusals


#: Every refusal class, by wire reason.
REFUSALS: Dict[str, type] = _make_refusals()


def _from_native(
    kind: str,
    reason: str,
    message: str,
    code: str,
    code_value: int,
    metadata: Dict[str, str],
) -> Error:
    """Builds the exception for an error of the native module (its one
    error mapping calls this)."""
    fields = dict(reason=reason, code=code, code_value=code_value, metadata=metadata)
    if kind == "refused":
        return REFUSALS.get(reason, Refused)(message, **fields)
    if kind == "unavailable":
        return Unavailable(message, **fields)
    if kind == "closed":
        return SessionClosed(message, **fields)
    if kind == "not_exportable":
        return NotExportable(
            f"{message}. Memory from cudaMalloc registers by CUDA IPC handle, memory "
            f"from cuMemCreate with POSIX file-descriptor handles (PyTorch's "
            f"expandable_segments) by descriptor, one physical allocation at a time: "
            f"a tensor that spans two allocations cannot be registered whole",
            **fields,
        )
    if kind == "cuda":
        return CudaError(message, **fields)
    if kind == "invalid":
        return _InvalidInput(message, **fields)
    if kind == "os":
        return _OsError(message, **fields)
    return Error(message, **fields)


class _InvalidInput(Error, ValueError):
    """The input cannot be turned into a request."""


class _OsError(Error, OSError):
    """An OS call of this process failed (e.g. creating shared memory)."""


def refused(reason: str, message: str, code: str, metadata: Dict[str, str]) -> Refused:
    """A refusal raised by this package's own checks (``metadata`` then
    holds ``checked_by="client"``)."""
    values = {"OUT_OF_RANGE": 11, "INVALID_ARGUMENT": 3, "FAILED_PRECONDITION": 9}
    return REFUSALS[reason](
        message,
        reason=reason,
        code=code,
        code_value=values.get(code, 2),
        metadata={**metadata, "checked_by": "client"},
    )
