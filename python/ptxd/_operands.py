"""Turning tensors, arrays and streams into what ptxd takes.

A launch operand is (registered buffer, byte offset). This module finds, for
an object the caller passes, the memory it covers:

- a ``torch.Tensor`` on CUDA: ``data_ptr()``, its byte length, element size
  and device index;
- anything with ``__cuda_array_interface__`` (CuPy, Numba, ...): the same,
  from the interface dict;
- a ``numpy.ndarray``: its address, which must lie in a ``shm_array`` or
  ``memfd_array`` of the session.

It refuses what ptxd cannot launch on: non-contiguous views (ptxd's kernels
index elements linearly), and CPU tensors. torch, CuPy and numpy are never
imported here: an object is recognised only through a module the caller has
already imported.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional, Tuple

from ._errors import NotContiguous


class CudaView(NamedTuple):
    """The device memory an object covers."""

    ptr: int
    nbytes: int
    itemsize: int
    numel: int
    ordinal: int
    #: The stream the producer's work on it is ordered on, when the object
    #: says (``__cuda_array_interface__`` v3 ``stream``); else ``None``.
    stream: Optional[int]
    #: ``"torch"``, ``"cupy"`` or ``"cai"``.
    framework: str


class HostView(NamedTuple):
    """The host memory a numpy array covers."""

    ptr: int
    nbytes: int
    itemsize: int
    numel: int


def _c_strides(shape: Tuple[int, ...], itemsize: int) -> Tuple[int, ...]:
    strides = []
    step = itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


def _is_c_contiguous(shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int) -> bool:
    # Extents of 1 (and empty arrays) may carry any stride.
    if any(int(extent) == 0 for extent in shape):
        return True
    expected = _c_strides(shape, itemsize)
    return all(
        int(extent) == 1 or int(s) == e for extent, s, e in zip(shape, strides, expected)
    )


def _numel(shape: Tuple[int, ...]) -> int:
    count = 1
    for extent in shape:
        count *= int(extent)
    return count


def torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def numpy_array(obj: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(obj, numpy.ndarray)


def cuda_view(obj: Any) -> Optional[CudaView]:
    """The device memory of a CUDA tensor or array, or ``None`` when ``obj``
    is neither."""
    if torch_tensor(obj):
        if not obj.is_cuda:
            raise TypeError(
                "a CPU tensor cannot be registered with ptxd: move it to CUDA, or use "
                "session.memfd_array() or shm_array() for the host backend"
            )
        if not obj.is_contiguous():
            raise NotContiguous(
                f"the tensor (shape {tuple(obj.shape)}, strides {tuple(obj.stride())}) is not "
                "contiguous; ptxd's kernels index elements linearly: pass tensor.contiguous()",
                reason="NOT_CONTIGUOUS",
            )
        itemsize = obj.element_size()
        return CudaView(
            ptr=obj.data_ptr(),
            nbytes=obj.numel() * itemsize,
            itemsize=itemsize,
            numel=obj.numel(),
            # get_device() is the index as an int, without building a
            # torch.device (this runs once per operand per launch).
            ordinal=obj.get_device(),
            stream=None,
            framework="torch",
        )
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is None:
        return None
    shape = tuple(int(extent) for extent in interface["shape"])
    typestr = interface["typestr"]
    try:
        itemsize = int(typestr[2:])
    except ValueError:
        raise TypeError(f"unsupported __cuda_array_interface__ typestr {typestr!r}") from None
    strides = interface.get("strides")
    if strides is not None and not _is_c_contiguous(shape, tuple(strides), itemsize):
        raise NotContiguous(
            f"the array (shape {shape}, strides {tuple(strides)}) is not C-contiguous; "
            "ptxd's kernels index elements linearly: pass a contiguous copy",
            reason="NOT_CONTIGUOUS",
        )
    if interface.get("mask") is not None:
        raise TypeError("masked __cuda_array_interface__ arrays are not supported")
    cupy = sys.modules.get("cupy")
    framework = "cupy" if cupy is not None and isinstance(obj, cupy.ndarray) else "cai"
    device = getattr(obj, "device", None)
    ordinal = getattr(device, "id", None)
    if ordinal is None:
        ordinal = getattr(device, "index", None)
    stream = interface.get("stream") if int(interface.get("version", 0)) >= 3 else None
    numel = _numel(shape)
    return CudaView(
        ptr=int(interface["data"][0]),
        nbytes=numel * itemsize,
        itemsize=itemsize,
        numel=numel,
        ordinal=int(ordinal) if ordinal is not None else 0,
        stream=int(stream) if stream is not None else None,
        framework=framework,
    )


def host_view(array: Any) -> HostView:
    """The host memory of a numpy array."""
    if not array.flags.c_contiguous:
        raise NotContiguous(
            f"the array (shape {array.shape}, strides {array.strides}) is not C-contiguous; "
            "pass a slice of a shm_array or memfd_array that is contiguous",
            reason="NOT_CONTIGUOUS",
        )
    return HostView(
        ptr=int(array.__array_interface__["data"][0]),
        nbytes=int(array.nbytes),
        itemsize=int(array.itemsize),
        numel=int(array.size),
    )


def stream_handle(stream: Any) -> int:
    """The ``CUstream`` address of a torch or CuPy stream, an object with
    ``__cuda_stream__``, or an int (0 and 1 are the legacy default stream,
    2 the per-thread one)."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        return int(value[1])
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TypeError(
        f"{type(stream).__name__} is not a stream: pass a torch.cuda.Stream, a cupy.cuda.Stream, "
        "an object with __cuda_stream__, or a CUstream address as an int"
    )


def current_stream(view: CudaView) -> Optional[int]:
    """The stream the framework that made ``view``'s object is working on."""
    if view.stream is not None:
        return view.stream
    if view.framework == "torch":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(view.ordinal).cuda_stream)
    if view.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(view.ordinal):
            return int(cupy.cuda.get_current_stream().ptr)
    return None


def current_raw_stream(view: CudaView) -> Optional[int]:
    """As :func:`current_stream`, without building a stream object where
    the framework can say the address alone: torch's
    ``torch._C._cuda_getCurrentRawStream`` (what Triton's launcher uses)
    costs well under a microsecond, ``torch.cuda.current_stream()`` several,
    since it makes a Python ``Stream`` on every call."""
    if view.stream is not None:
        return view.stream
    if view.framework == "torch":
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return int(raw(view.ordinal))
    return current_stream(view)
