"""The client, sessions, kernels and buffers (the public API of ``ptxd``).

Everything that talks to the daemon goes through the Rust SDK in
``ptxd._native``, with the GIL released. This module keeps the Python-side
state the SDK has no notion of:

- the session's **segment cache**: a CUDA allocation (a caching-allocator
  segment holds many tensors) is registered once, keyed by the driver's
  allocation id (``CU_POINTER_ATTRIBUTE_BUFFER_ID``), and each tensor is an
  offset into it. When an allocation is seen whose range overlaps a cached
  one, the cached one was freed: its registration is released first, so
  ptxd never keeps freed memory mapped;
- the session's **host arrays** (``shm_array`` and ``memfd_array``), found
  again by address;
- the session's **operand cache**: a launch operand's (device, address,
  length, element size) maps to its Buffer, so a launch on tensors it saw
  before makes no driver query to find them. An entry is used only while
  the driver still reports the allocation id it was registered with (the
  launch ring checks that in Rust before it submits, the unary path here),
  so a caching-allocator segment freed and allocated again at the same
  address is registered again, never launched against the old mapping;
- the session's **launch rings**, one per (device, stream), opened lazily:
  launches on torch or CuPy operands go through them, ordered on the
  framework's stream by two GPU words (``Ring.launch``); in a session with
  ``defer_errors`` an async launch does not wait for ptxd's answer
  (``Ring.launch_deferred``), and a refusal is raised by the next launch on
  that ring or by ``wait_answers``;
- a pool of registered **IPC event pairs** per device, for ordering unary
  launches (the fallback) against the caller's stream.
"""

from __future__ import annotations

import numbers
import operator
import re
import os
import sys
import threading
import weakref
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _native
from . import _operands as ops
from . import _args
from ._errors import CudaError, DtypeMismatch, Error, NotExportable, SessionClosed, refused

__all__ = ["Client", "Session", "Kernel", "Buffer", "Signature", "Launched", "cuda_available"]

#: Slots of each launch ring a session opens.
RING_SLOTS = 256
#: Launch rings one session opens at most (one per device and stream); a
#: launch on a further stream takes the unary path.
MAX_RINGS = 8
#: Seconds a ring launch waits for its completion (ptxd's answer that it
#: enqueued the kernel; with ``sync=True``, that it ran).
RING_TIMEOUT = 60.0
#: Operands the operand cache holds before it starts over.
OPERAND_CACHE_LIMIT = 4096
#: Set to ``0`` to send every launch through the unary path.
RING_ENV = "PTXD_PYTHON_RING"


def cuda_available() -> bool:
    """Whether libcuda can be loaded in this process."""
    return _native.cuda_available()


_devices: Dict[int, Any] = {}
_devices_lock = threading.Lock()


def _device(ordinal: int) -> Any:
    """This process's CUDA device ``ordinal`` (primary context retained)."""
    with _devices_lock:
        device = _devices.get(ordinal)
        if device is None:
            device = _devices[ordinal] = _native.CudaDevice(ordinal)
        return device


class Signature(NamedTuple):
    """The scalar-ABI signature ptxd verified for a kernel."""

    #: Number of input pointers.
    inputs: int
    #: Element size in bytes of each operand: the inputs, then the output.
    element_sizes: Tuple[int, ...]
    #: Number of trailing f32 scalar params.
    scalar_params: int
    #: The block size ptxd launches with.
    block_size: int
    #: ``.reqntid`` (0 when absent).
    reqntid: int
    #: ``.maxntid`` (0 when absent).
    maxntid: int


class Launched(NamedTuple):
    """What a launch reports."""

    #: Time inside ptxd in microseconds (to completion when synchronous).
    micros: int
    #: True when the kernel was reloaded after a STALE_KERNEL refusal and
    #: the launch retried (sessions opened with ``auto_reload=True``).
    reloaded: bool


class Kernel:
    """A kernel loaded into a session (from :meth:`Session.load_ptx`)."""

    __slots__ = ("_native", "_sizes", "_scalars", "_ring")

    def __init__(self, native: Any) -> None:
        self._native = native
        self._sizes: Optional[Tuple[int, ...]] = None
        self._scalars: Optional[List[Tuple[str, str]]] = None
        self._ring: Optional[bool] = None

    def _ring_ok(self) -> bool:
        # Whether ptxd grants this kernel to a launch ring, as ptxd says it
        # (KernelSignature.ring_launchable), never read from the contract's
        # text: Triton-family kernels (typed params, a .u32 count, null
        # pointers, several elements per thread) are granted too, their
        # typed args riding the ring. A native module without the field
        # launches unary (always correct).
        if self._ring is None:
            self._ring = bool(getattr(self._native, "ring_launchable", False))
        return self._ring

    def _scalar_params(self) -> List[Tuple[str, str]]:
        # ``(name, arg type)`` of each by-value scalar param, from the
        # contract (fixed for the kernel's PTX, as the sizes are).
        if self._scalars is None:
            self._scalars = _args.scalar_params(self._native.contract)
        return self._scalars

    def _element_sizes(self) -> Tuple[int, ...]:
        # Fixed for the kernel's PTX (a reload verifies the same text).
        if self._sizes is None:
            self._sizes = tuple(self._native.signature()[1])
        return self._sizes

    @property
    def signature(self) -> Signature:
        """The inputs, element sizes and param count ptxd verified."""
        inputs, sizes, params, block, reqntid, maxntid = self._native.signature()
        return Signature(inputs, tuple(sizes), params, block, reqntid, maxntid)

    @property
    def symbol(self) -> str:
        """The entry symbol."""
        return self._native.symbol

    @property
    def contract(self) -> str:
        """The launch contract ptxd checks every launch of this kernel
        against, as one line: the params, the geometry, each operand's
        footprint and the preconditions the verifier's proof assumed (e.g.
        ``requires index_fits_i32: grid × block <= 2^31``)."""
        return self._native.contract

    @property
    def cache_hit(self) -> bool:
        """True when ptxd had already compiled this artifact for the device
        (another session, or an earlier load, paid for the compile)."""
        return self._native.state()[1]

    @property
    def load_micros(self) -> int:
        """Time the load took inside ptxd, in microseconds."""
        return self._native.state()[2]

    @property
    def device_uuid(self) -> str:
        """The device the kernel lives on."""
        return self._native.state()[3]

    @property
    def generation(self) -> int:
        """The device generation the kernel was loaded in."""
        return self._native.state()[4]

    def __repr__(self) -> str:
        s = self.signature
        return (
            f"<ptxd.Kernel {self.symbol!r} inputs={s.inputs} element_sizes={s.element_sizes} "
            f"scalar_params={s.scalar_params} device={self.device_uuid}>"
        )


class _Registration:
    """One buffer registration with ptxd: a CUDA allocation, a host mapping
    of this process (a shared-memory object or a memfd), or a descriptor the
    caller registered (``base`` 0: no mapping here)."""

    __slots__ = ("handle", "size", "device_uuid", "generation", "kind", "base", "ordinal",
                 "buffer_id", "mapping", "_released", "ring_index")

    def __init__(self, reply: Dict[str, Any], kind: str, base: int, ordinal: Optional[int],
                 buffer_id: Optional[int] = None, mapping: Any = None) -> None:
        self.handle: str = reply["handle"]
        self.size: int = int(reply["size"])
        self.device_uuid: str = reply["device_uuid"]
        self.generation: int = int(reply["generation"])
        #: How the session's launch rings name the registration.
        self.ring_index: int = int(reply.get("ring_index", 0))
        self.kind = kind
        self.base = base
        self.ordinal = ordinal
        self.buffer_id = buffer_id
        # The native Shm or Memfd: registered, it stays mapped (and found by
        # address) even when its array is gone, until the release.
        self.mapping = mapping
        # Shared with the operand cache's native entries of this
        # registration: set once released, they miss.
        self._released = _native.Released()

    @property
    def released(self) -> bool:
        """True once the registration was released (for good)."""
        return bool(self._released)

    @released.setter
    def released(self, value: bool) -> None:
        if value:
            self._released.set()
        elif self._released:
            raise ValueError("a released registration stays released")

    def contains(self, ptr: int) -> bool:
        return self.base <= ptr < self.base + self.size


class Buffer:
    """A region of a registered buffer: what a launch operand names.

    ``register()`` returns one per object; tensors of one caching-allocator
    segment share the segment's registration and differ in ``offset``.
    """

    __slots__ = ("_registration", "offset", "nbytes", "itemsize", "numel", "_keep")

    def __init__(self, registration: _Registration, offset: int, nbytes: int, itemsize: int,
                 numel: int, keep: Any = None) -> None:
        self._registration = registration
        #: Byte offset of the region's first element in the registration.
        self.offset = offset
        #: The region's length in bytes.
        self.nbytes = nbytes
        #: The element size in bytes.
        self.itemsize = itemsize
        #: The number of elements.
        self.numel = numel
        # The object the region belongs to, kept alive with the Buffer.
        self._keep = keep

    @property
    def handle(self) -> str:
        """ptxd's handle of the registration."""
        return self._registration.handle

    @property
    def registered_size(self) -> int:
        """The size in bytes of the whole registration (a caching-allocator
        segment can be much larger than one tensor)."""
        return self._registration.size

    @property
    def device_uuid(self) -> str:
        """The device the registration is on."""
        return self._registration.device_uuid

    @property
    def kind(self) -> str:
        """``"cuda_ipc"``, ``"host_shm"``, or ``"posix_fd"`` (a memfd or
        another descriptor)."""
        return self._registration.kind

    def _ordinal(self) -> Optional[int]:
        return self._registration.ordinal

    def __repr__(self) -> str:
        return (
            f"<ptxd.Buffer {self.kind} offset={self.offset} nbytes={self.nbytes} "
            f"of {self.registered_size} on {self.device_uuid}>"
        )


class _EventPair:
    """Two registered IPC events of one device: ptxd waits on the first and
    records the second."""

    __slots__ = ("wait", "signal", "wait_handle", "signal_handle")

    def __init__(self, session: Any, ordinal: int) -> None:
        device = _device(ordinal)
        self.wait = device.ipc_event()
        self.signal = device.ipc_event()
        self.wait_handle = session.register_event(self.wait.handle(), device.uuid)
        self.signal_handle = session.register_event(self.signal.handle(), device.uuid)


class _OperandCache:
    """Launch operands already resolved, by (device ordinal, address, length
    in bytes, element size): the Buffer (registration and offset) an
    operand there resolved to.

    An entry is only a guess: the memory at an address may have been freed
    and allocated again since (torch's caching allocator frees a segment on
    ``empty_cache()`` or under memory pressure, and the driver may place the
    next one at the same address). Whoever uses an entry checks first that
    the driver's allocation id at the address is still the registration's
    ``buffer_id`` (ids are never reused) and calls :meth:`forget` when not;
    an entry whose registration was released is a miss.

    The entries live in Rust (``_native.OperandTable``), so that the lean
    launch path resolves a launch's tensors, checks them and builds the
    ring's launch in one native call (:meth:`resolve`)."""

    __slots__ = ("_table", "limit", "resolve", "launch")

    def __init__(self, limit: int = OPERAND_CACHE_LIMIT) -> None:
        self._table = _native.OperandTable(limit)
        self.limit = limit
        #: ``resolve(kernel, sizes, inputs, output, n, params, args,
        #: tensor_type)``: ``(ordinal, Plan)`` for ``Ring.launch_plan``
        #: when every operand is a cached contiguous CUDA tensor on one
        #: device and the checks pass, else ``None``.
        self.resolve = self._table.resolve
        #: ``launch(kernel, sizes, inputs, output, n, params, args,
        #: tensor_type, stream, current_stream, rings, sync, defer,
        #: timeout)``: ``resolve``, the stream, the ring in ``rings`` and
        #: its ``launch_plan`` in one call (see
        #: ``Session._launch_cached_tensors`` for what it returns).
        self.launch = self._table.launch

    def get(self, key: Tuple[int, int, int, int]) -> Optional[Buffer]:
        return self._table.get(key)

    def put(self, key: Tuple[int, int, int, int], buffer: Buffer) -> None:
        registration = buffer._registration
        self._table.put(key, buffer, registration._released, registration.ring_index,
                        buffer.offset, buffer.nbytes, buffer.itemsize, registration.size,
                        registration.buffer_id)

    def forget(self, key: Tuple[int, int, int, int]) -> None:
        self._table.forget(key)

    def clear(self) -> None:
        self._table.clear()

    def __len__(self) -> int:
        return len(self._table)


class _Prepared(NamedTuple):
    inputs: List[Tuple[str, int]]
    output: Tuple[str, int]
    n: int
    params: List[float]
    #: The CUDA device ordinal of the operands, ``None`` for host memory.
    ordinal: Optional[int]
    #: The stream of the framework the operands come from, if any.
    default_stream: Optional[int]
    #: The operands as a launch ring names them (ring index, offset), when
    #: every one is a CUDA tensor or array; ``None`` when any is a Buffer or
    #: host memory (those take the unary path).
    ring: Optional[Tuple[List[Tuple[int, int]], Tuple[int, int]]]
    #: ``(address, allocation id)`` of each operand resolved from the
    #: operand cache: still valid only while the driver reports that id.
    checks: List[Tuple[int, int]]
    #: The cache keys of those operands (forgotten when a check fails).
    keys: List[Tuple[int, int, int, int]]



def _vector_of(element_size: int, itemsize: int) -> bool:
    """Whether a kernel element of ``element_size`` bytes is a vector of an
    operand's ``itemsize``-byte elements: a 16-byte element (the
    Vectorized{4} family's float4, or a double2) over float32 or float64
    data. Smaller vectors (an f16 pair, a float2) have the size of a scalar
    type (a float, a double), so for them the element sizes must match:
    pass Buffers, or arrays of a dtype of the vector's size."""
    return element_size == 16 and itemsize in (4, 8)


class Session:
    """A ptxd session: a lease on the daemon, and the kernels and buffers it
    holds. The lease ends on :meth:`close`, on leaving a ``with`` block, or
    when the object is collected; ptxd then releases everything the session
    held."""

    def __init__(self, native: Any, label: str, auto_reload: bool = False,
                 defer_errors: bool = False) -> None:
        self._native = native
        self.label = label
        self.auto_reload = auto_reload
        #: Async ring launches return before ptxd answers (see
        #: :meth:`Client.session`).
        self.defer_errors = defer_errors
        self._lock = threading.RLock()
        self._cuda: Dict[Tuple[int, int], _Registration] = {}
        # Registrations of host memory this process maps, found by address.
        self._host: List[_Registration] = []
        self._events: Dict[int, List[_EventPair]] = {}
        self._operands = _OperandCache()
        # (device ordinal, raw stream) -> native Ring, or False where none
        # could be opened (that stream's launches take the unary path).
        self._rings: Dict[Tuple[int, int], Any] = {}
        # The torch module the lean path last saw, and its (torch.Tensor,
        # torch._C._cuda_getCurrentRawStream).
        self._torch: Any = None
        self._torch_parts: Tuple[Any, Any] = (None, None)

    # -- lifetime -----------------------------------------------------------

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def next_event(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The session's next lease event, waiting up to ``timeout`` seconds
        (forever when ``None``); ``None`` when none came in time or the lease
        ended. Each event is a dict with ``kind``:

        - ``"executor_restarted"``: a device's executor was replaced
          (``device_uuid``, ``old_generation``, ``new_generation``, ``cause``);
          the session's kernels on it are stale (reload them, or use
          ``auto_reload``), its buffers are open in the new generation.
        - ``"executor_down"``: a restart of the device's executor failed and
          the device has none for now (``device_uuid``, ``generation``,
          ``cause``, ``failed_restarts``, ``restart_error``, ``retry_in``
          seconds); launches on it are refused until an
          ``"executor_restarted"`` says it is back.
        - ``"draining"``: the daemon is shutting down (``reason``).
        - ``"ended"``: the lease ended (``why``).
        """
        return self._native.next_event(timeout)

    def close(self) -> Optional[Dict[str, int]]:
        """Ends the session. Returns what ptxd released (``None`` when it was
        already closed). Whatever the native call does (it raises when the
        daemon cannot be reached), the session lets go of what it held here:
        its rings, event pairs, operand cache and registrations, which are
        marked released (the lease's end released them in ptxd); host
        arrays stay mapped while the caller holds them."""
        with self._lock:
            self._rings.clear()
        try:
            report = self._native.close()
        finally:
            with self._lock:
                held = list(self._cuda.values()) + self._host
                self._cuda.clear()
                self._host = []
                self._events.clear()
                self._operands.clear()
            for registration in held:
                registration.released = True
        return report

    def _closed_error(self) -> Optional[SessionClosed]:
        """The error a call on this session raises once its lease ended, or
        ``None`` while it is open (as the native calls raise it)."""
        if self._native.is_open():
            return None
        return SessionClosed("the session is closed", reason="SESSION_CLOSED",
                             code="FAILED_PRECONDITION", code_value=9)

    @property
    def is_open(self) -> bool:
        """True while the lease is open."""
        return self._native.is_open()

    def wait_answers(self) -> None:
        """Waits for ptxd's answer to every launch of the session's launch
        rings not answered yet (in a session with ``defer_errors``, the
        async launches that returned before it), and raises the first
        refusal or failure among them (``.results`` lists them all). It
        does not wait for the kernels to run: synchronize the stream for
        that."""
        with self._lock:
            rings = [ring for ring in self._rings.values() if ring]
        refused: List[Any] = []
        for ring in rings:
            refused.extend(ring.drain(RING_TIMEOUT))
        _raise_deferred(refused)

    def __repr__(self) -> str:
        state = "open" if self.is_open else "closed"
        return f"<ptxd.Session {self.label!r} {state}>"

    # -- kernels ------------------------------------------------------------

    def load_ptx(self, ptx: str, symbol: str, device: Any = 0) -> Kernel:
        """Loads PTX text and returns the kernel.

        ``device`` is ptxd's device ordinal (as ``client.info()["devices"]``
        numbers them), a device UUID string, or a ``torch.device`` (resolved
        to its UUID, since ordinals differ between processes). ptxd verifies
        the kernel and compiles each distinct kernel once for all sessions.
        """
        return Kernel(self._native.load_ptx(ptx, symbol, _device_selector(device)))

    def load_triton(self, compiled: Any, device: Any = 0) -> Kernel:
        """Loads a compiled Triton kernel (what ``kernel.warmup(...)`` or
        ``triton.compile(...)`` returns, a ``CompiledKernel``) and returns
        it, ready for :meth:`launch` on torch tensors: ptxd computes the
        grid from the kernel's contract, passes the count, and passes null
        for Triton's scratch pointers; the caller passes the operands and
        the kernel's own scalar ``args``.

        Reads ``compiled.asm["ptx"]``, ``compiled.metadata.name``,
        ``.num_warps`` and ``.shared``. ptxd launches without dynamic shared
        memory, so a kernel that needs some (``shared > 0``) raises
        ``ValueError``, as does PTX whose ``.reqntid`` is not ``32 ×
        num_warps`` (the metadata and the code disagree). ptxd's verifier
        decides the rest: a kernel it cannot prove raises its refusal.
        """
        asm = getattr(compiled, "asm", None)
        if asm is None or "ptx" not in asm:
            raise TypeError("load_triton takes a Triton CompiledKernel (with asm['ptx'])")
        ptx = asm["ptx"]
        if isinstance(ptx, (bytes, bytearray)):
            ptx = bytes(ptx).decode()
        metadata = getattr(compiled, "metadata", None)

        def field(key: str) -> Any:
            try:
                return metadata[key] if isinstance(metadata, dict) else getattr(metadata, key)
            except (KeyError, AttributeError):
                raise TypeError(
                    f"load_triton takes a Triton CompiledKernel: its metadata has no {key!r} "
                    "(name, num_warps and shared are read)"
                ) from None

        name = field("name")
        num_warps, shared = _index(field("num_warps"), "num_warps"), _index(field("shared"), "shared")
        if shared > 0:
            raise ValueError(
                f"{name} needs {shared} bytes of dynamic shared memory; ptxd launches "
                "elementwise kernels without any"
            )
        block = 32 * num_warps
        reqntid = re.search(r"\.reqntid\s+(\d+)", ptx)
        if reqntid is not None and int(reqntid.group(1)) != block:
            raise ValueError(
                f"{name}: the PTX requires {reqntid.group(1)} threads per block but "
                f"num_warps={num_warps} means {block}"
            )
        return self.load_ptx(ptx, name, device)

    # -- buffers ------------------------------------------------------------

    def shm_array(self, shape: Union[int, Sequence[int]], dtype: Any) -> Any:
        """A zero-filled numpy array backed by a POSIX shared-memory object
        registered with this session (host backend). Launches read and write
        it in place. The daemon opens the object by name, so it needs the
        same ``/dev/shm`` as this process; :meth:`memfd_array` does not."""
        return self._host_array(shape, dtype, "shm_array", self._native.create_shm, "host_shm")

    def memfd_array(self, shape: Union[int, Sequence[int]], dtype: Any) -> Any:
        """A zero-filled numpy array backed by a memfd sealed against
        shrinking and growing, registered with this session by file
        descriptor over the daemon's fd socket (host backend, Unix socket
        only). Launches read and write it in place, as with
        :meth:`shm_array`; the memory has no name, so this works from a
        container that shares only the sockets with the daemon (no
        ``/dev/shm``, IPC or PID namespace in common)."""
        return self._host_array(shape, dtype, "memfd_array", self._native.create_memfd, "posix_fd")

    def _host_array(self, shape: Union[int, Sequence[int]], dtype: Any, what: str,
                    create: Any, kind: str) -> Any:
        numpy = _numpy(f"session.{what}()")
        dtype = numpy.dtype(dtype)
        if dtype.hasobject:
            # numpy would read the shared bytes (zeros, or whatever a kernel
            # wrote) as object pointers: None at first, a crash later.
            raise TypeError(f"{what} holds plain data, not Python objects (dtype {dtype})")
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            shape = (_index(shape, f"{what}'s shape"),)
        else:
            shape = tuple(_index(e, f"{what}'s shape extent") for e in shape)
        nbytes = dtype.itemsize
        for extent in shape:
            if extent < 0:
                raise ValueError(f"negative extent in shape {shape}")
            nbytes *= extent
        if nbytes == 0:
            raise ValueError(f"{what} needs at least one byte")
        if nbytes > _MAX_HOST_BYTES:
            raise ValueError(f"{what} of {nbytes} bytes: a host buffer holds at most "
                             f"{_MAX_HOST_BYTES} bytes (2^63 - 1, the largest file size)")
        if dtype.subdtype is not None:
            # A subarray dtype ((float32, 4)) is numpy's way of asking for
            # trailing extents, as numpy.zeros(shape, dtype) reads it.
            dtype, extents = dtype.subdtype
            shape = shape + extents
        mapping, reply = create(nbytes)
        registration = _Registration(reply, kind, mapping.address, None, mapping=mapping)
        try:
            array = numpy.asarray(_MappingHolder(mapping, shape, dtype))
        except BaseException:
            # Nothing stays registered for an array the caller never got.
            try:
                self._release(registration)
            except Error:
                pass
            raise
        with self._lock:
            self._host.append(registration)
        return array

    def register_fd(self, fd: int, size: int, device_uuid: Optional[str] = None,
                    offset: int = 0, label: str = "", dtype: Any = None) -> Buffer:
        """Registers ``size`` bytes, from byte ``offset``, of the memory
        behind the file descriptor ``fd`` and returns the :class:`Buffer`
        naming them (Unix socket only).

        On the host backend ``fd`` is a memfd sealed with ``F_SEAL_SHRINK``
        (``os.memfd_create(name, os.MFD_ALLOW_SEALING)``, ``os.ftruncate``,
        then ``fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)``):
        ptxd refuses an unsealed one or a plain file with
        :class:`ptxd.FdNotSealed` (metadata ``seals``), and a file shorter
        than ``offset + size`` with :class:`ptxd.InvalidHandle`. ``offset``
        is a multiple of the page size. ``device_uuid`` ``None`` means the
        daemon's first device.

        ptxd keeps its own reference to the memory: ``fd`` is used only
        during this call, and the caller may close it afterwards. With
        ``dtype``, the Buffer has that element type (checked against the
        kernel's, and giving ``launch`` its default ``n``); without, launches
        on it pass ``n``.
        """
        if isinstance(fd, bool) or not isinstance(fd, int):
            raise TypeError(f"fd must be an int file descriptor, got {type(fd).__name__}")
        size, offset = _u64(size, "size"), _u64(offset, "offset")
        itemsize = 0
        if dtype is not None:
            itemsize = _numpy("register_fd's dtype=").dtype(dtype).itemsize
            if itemsize == 0:
                raise ValueError(f"dtype {dtype!r} has no element size")
            if size % itemsize:
                raise ValueError(f"size {size} is not a multiple of the {itemsize}-byte dtype")
        reply = self._native.register_fd(fd, size, device_uuid, offset, label)
        registration = _Registration(reply, "posix_fd", 0, None)
        numel = size // itemsize if itemsize else 0
        return Buffer(registration, 0, size, itemsize, numel)

    def register(self, obj: Any) -> Buffer:
        """Registers ``obj`` and returns the :class:`Buffer` naming it.

        Accepted: a CUDA ``torch.Tensor``; anything with
        ``__cuda_array_interface__`` (CuPy, ...); a numpy array from
        :meth:`shm_array` or :meth:`memfd_array`; a :class:`Buffer` (returned
        as is). CUDA memory is
        registered per allocation (its base from
        ``cuPointerGetAttribute(RANGE_START_ADDR)``, its IPC handle from the
        base), once; the tensor is an offset into it.

        Raises :class:`ptxd.NotContiguous` for non-contiguous views and
        :class:`ptxd.NotExportable` for memory legacy CUDA IPC cannot export.
        """
        if isinstance(obj, Buffer):
            return obj
        view = ops.cuda_view(obj)
        if view is not None:
            return self._register_cuda(obj, view)
        if ops.numpy_array(obj):
            return self._register_host(obj)
        closed = self._closed_error()
        if closed is not None:
            raise closed
        raise TypeError(
            f"cannot register a {type(obj).__name__}: pass a CUDA torch.Tensor, an object with "
            "__cuda_array_interface__, or an array from session.shm_array() or memfd_array()"
        )

    def _register_cuda(self, obj: Any, view: ops.CudaView) -> Buffer:
        device = _device(view.ordinal)
        base, size, buffer_id, capable = device.locate(view.ptr)
        with self._lock:
            registration = self._cuda.get((view.ordinal, buffer_id))
            if registration is None:
                # Allocations do not overlap while alive: a cached one that
                # overlaps this range was freed. Release it first.
                for key, old in list(self._cuda.items()):
                    if key[0] == view.ordinal and old.base < base + size and base < old.base + old.size:
                        del self._cuda[key]
                        self._release_freed(old)
                if capable:
                    handle = device.export((base, size, buffer_id, capable))
                    reply = self._native.register_cuda_ipc(handle, device.uuid, size)
                    kind = "cuda_ipc"
                else:
                    # cuMemCreate memory (PyTorch's expandable segments):
                    # legacy IPC cannot export it, a file descriptor can. The
                    # whole physical allocation holding the tensor is
                    # registered; a tensor spanning two of them is refused
                    # (NotExportable).
                    fd, offset, allocation_size = device.export_fd(view.ptr, view.nbytes)
                    try:
                        reply = self._native.register_fd(
                            fd, allocation_size, device.uuid, 0, "", allocation_size
                        )
                    finally:
                        os.close(fd)
                    base, kind = view.ptr - offset, "posix_fd"
                registration = _Registration(reply, kind, base, view.ordinal, buffer_id)
                self._cuda[(view.ordinal, buffer_id)] = registration
            elif view.ptr + view.nbytes > registration.base + registration.size:
                raise NotExportable(
                    f"the tensor at {view.ptr:#x} ({view.nbytes} bytes) runs past the allocation "
                    f"it starts in ({registration.base:#x}, {registration.size} bytes)"
                )
        offset = view.ptr - registration.base
        return Buffer(registration, offset, view.nbytes, view.itemsize, view.numel, obj)

    def _register_host(self, array: Any) -> Buffer:
        view = ops.host_view(array)
        with self._lock:
            for registration in self._host:
                if registration.contains(view.ptr):
                    if view.ptr + view.nbytes > registration.base + registration.size:
                        break
                    offset = view.ptr - registration.base
                    return Buffer(registration, offset, view.nbytes, view.itemsize, view.numel, array)
        # A closed session holds no host buffers: every array misses.
        closed = self._closed_error()
        if closed is not None:
            raise closed
        raise TypeError(
            "this numpy array is not in a host buffer of this session: ptxd reads host memory "
            "only through session.shm_array() and session.memfd_array() arrays"
        )

    def release(self, buffer: Buffer) -> None:
        """Releases the registration ``buffer`` belongs to (every Buffer of
        the same allocation, host array or descriptor with it). Releasing it
        again does nothing; a Buffer of another session is refused by ptxd
        (``ptxd.StaleBuffer``) and stays registered in its own."""
        if not isinstance(buffer, Buffer):
            raise TypeError(f"expected a ptxd.Buffer, got {type(buffer).__name__}")
        registration = buffer._registration
        self._release(registration)
        with self._lock:
            for key, cached in list(self._cuda.items()):
                if cached is registration:
                    del self._cuda[key]
            if registration in self._host:
                self._host.remove(registration)

    def _release(self, registration: _Registration) -> None:
        # Marked released only once ptxd released it: a refused release (a
        # Buffer of another session) must not mark the other session's
        # registration, whose own release would then do nothing. The lock
        # keeps two threads from both sending it.
        with self._lock:
            if not registration.released:
                self._native.release_buffer(registration.handle)
                registration.released = True

    def _release_freed(self, registration: _Registration) -> None:
        # The allocation was freed: the registration is of no use whatever
        # ptxd answers, so it is marked released first (the operand cache's
        # entries of it miss from now on).
        if not registration.released:
            registration.released = True
            self._native.release_buffer(registration.handle)

    def buffers(self) -> List[Dict[str, Any]]:
        """The session's registrations, as ptxd lists them."""
        return self._native.list_buffers()

    # -- launches -----------------------------------------------------------

    def launch(
        self,
        kernel: Kernel,
        inputs: Sequence[Any],
        output: Any,
        n: Optional[int] = None,
        params: Sequence[float] = (),
        stream: Any = None,
        sync: bool = False,
        args: Sequence[Any] = (),
    ) -> Launched:
        """Launches ``kernel`` over ``n`` elements (default: the output's
        element count). ptxd computes the grid from the kernel's contract.

        ``params`` are the scalar ABI's f32 params; ``args`` are typed scalar
        arguments, one per by-value scalar param of the kernel in order
        (``ptxd.i32(5)``, ``ptxd.f32(0.5)``, ..., or plain numbers typed by
        the kernel's contract: see :mod:`ptxd._args`). Pass one or the
        other. f32 args are the same as params; typed args of any type ride
        the launch ring as they are (its descriptor carries them).

        ``inputs`` and ``output`` may be tensors, arrays or Buffers.

        Ordering: with ``stream`` (a torch or CuPy stream), ptxd's kernel runs
        after the work already on that stream, and the stream's later work
        after ptxd's kernel, with no host synchronization. Without
        ``stream``, torch tensors are ordered against torch's current stream
        and CuPy arrays against CuPy's current stream, as the framework's
        own operations are; Buffers alone are not ordered against anything.

        The path: when every operand is a CUDA tensor or array (not a
        Buffer) and there is a stream to order on, the launch goes through
        the session's launch ring for that device and stream (opened on
        first use), ordered by two GPU words, and returns once ptxd has
        enqueued it (``micros`` is then 0: the ring reports no time).
        Otherwise, or when no ring can be opened, it is a unary call ordered
        by a pair of IPC events. docs/python.md has the details.

        ``sync=True`` returns once the kernel completed. Launches on host
        memory (``shm_array`` and ``memfd_array`` arrays, descriptors) always
        complete before this returns, since the caller reads them from the
        CPU next.
        """
        if not isinstance(kernel, Kernel):
            raise TypeError(f"expected a ptxd.Kernel, got {type(kernel).__name__}")
        if params is None:
            params = ()
        typed: List[_args.Arg] = []
        if args:
            params, typed = _typed_args(kernel, params, args)
        ring_ok = kernel._ring_ok()
        if ring_ok:
            fast = self._launch_cached_tensors(kernel, inputs, output, n, params, stream, sync,
                                               typed)
            if fast is not None:
                return fast
        for _ in range(3):
            prepared = self._prepare(kernel, inputs, output, n, params)
            raw_stream = self._stream_for(prepared, stream)
            if raw_stream is not None and prepared.ring is not None and ring_ok:
                results = self._via_ring(raw_stream, [(kernel, prepared, typed)], sync)
                if results is _STALE:
                    continue
                if results is not None:
                    outcome = results[0]
                    if outcome is None:
                        return Launched(0, False)
                    if not self._retry_unary(outcome):
                        raise outcome
            if self._forget_stale(prepared):
                continue
            return self._launch_unary(kernel, prepared, raw_stream, sync, typed)
        raise Error("the operands' memory kept changing while the launch resolved them",
                    reason="OPERANDS_CHANGED")

    def _launch_cached_tensors(self, kernel: Kernel, inputs: Sequence[Any], output: Any,
                               n: Optional[int], params: Sequence[float], stream: Any,
                               sync: bool, typed: Sequence["_args.Arg"] = ()
                               ) -> Optional[Launched]:
        """The common case, lean: torch tensors the operand cache already
        holds, through the ring. ``None`` whenever anything is otherwise (an
        operand that is not a cached contiguous CUDA tensor, a check that
        would refuse, no ring, a stale entry): :meth:`launch`'s general path
        then decides, and raises what it raises."""
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(kernel, Kernel):
            return None
        if torch is not self._torch:
            # torch.Tensor and the raw stream lookup, read once per torch
            # module (not once per launch).
            self._torch = torch
            self._torch_parts = (torch.Tensor,
                                 getattr(torch._C, "_cuda_getCurrentRawStream", None))
        tensor, current = self._torch_parts
        sizes = kernel._sizes
        if sizes is None:
            sizes = kernel._element_sizes()
        typed_wire = [(a.type, a.value) for a in typed] if typed else ()
        raw_stream = ops.stream_handle(stream) if stream is not None else None
        if not (sync and self.defer_errors):
            # One native call reads the tensors, looks them up, checks
            # element sizes and bounds, finds the stream and its ring and
            # launches: no Python tuple per operand. True: launched; None:
            # the general path decides (a stale entry is forgotten); a list:
            # refusals; a tuple: the ring call raised.
            result = self._operands.launch(
                kernel._native, sizes, inputs, output, n, params, typed_wire, tensor,
                raw_stream, current, self._rings, sync, self.defer_errors, RING_TIMEOUT,
            )
            if result is True:
                return _RING_LAUNCHED
            if result is None:
                return None
            if type(result) is tuple:
                ordinal, raw_stream, ring, error = result
                if self._ring_failed(ring, ordinal, raw_stream, error):
                    return None
                raise error
            if self.defer_errors:
                _raise_deferred(result)
            outcome = next(o for o in result if o is not None)
            if self._retry_unary(outcome):
                return None
            raise outcome
        # A sync launch in a deferred session reads the earlier answers
        # first (_ring_call): resolve, then launch the plan.
        resolved = self._operands.resolve(kernel._native, sizes, inputs, output, n, params,
                                          typed_wire, tensor)
        if resolved is None:
            return None
        ordinal, plan = resolved
        if raw_stream is None:
            if current is None:
                return None
            raw_stream = current(ordinal)
        ring = self._ring(ordinal, raw_stream)
        if ring is None:
            return None
        outcomes = self._ring_call(ring, ordinal, raw_stream, None, None, None, sync, plan)
        if outcomes is None or outcomes is _STALE:
            return None
        outcome = outcomes[0]
        if outcome is None:
            return _RING_LAUNCHED
        if self._retry_unary(outcome):
            return None
        raise outcome

    def _launch_unary(self, kernel: Kernel, prepared: _Prepared, raw_stream: Optional[int],
                      sync: bool, typed: Sequence["_args.Arg"] = ()) -> Launched:
        # Typed args only when there are any: the call is otherwise what it
        # always was.
        typed_args = {"args": [(a.type, a.value) for a in typed]} if typed else {}
        if raw_stream is None:
            micros, reloaded = self._native.launch(
                kernel._native, prepared.inputs, prepared.output, prepared.n, prepared.params,
                sync or prepared.ordinal is None, **typed_args,
            )
            return Launched(micros, reloaded)
        assert prepared.ordinal is not None
        pair = self._take_events(prepared.ordinal)
        try:
            pair.wait.record(raw_stream)
            micros, reloaded = self._native.launch(
                kernel._native, prepared.inputs, prepared.output, prepared.n, prepared.params,
                sync, pair.wait_handle, pair.signal_handle, **typed_args,
            )
            # ptxd recorded `signal` after the kernel before it replied.
            pair.signal.wait(raw_stream)
        finally:
            self._put_events(prepared.ordinal, pair)
        return Launched(micros, reloaded)

    def launch_many(
        self,
        launches: Iterable[Any],
        stream: Any = None,
        sync: bool = False,
    ) -> List[int]:
        """Pipelines many launches (one round trip's latency for all of
        them, not one each).

        Each item is ``(kernel, inputs, output)``, optionally followed by
        ``n`` and ``params``, or a dict with those keys (or ``args`` instead
        of ``params``: typed scalar args, ``ptxd.i32(...)`` or plain numbers
        typed by the kernel's contract, as in :meth:`launch`; they ride the
        ring and the unary path alike). ptxd runs a session's
        launches in order; with a stream (or the framework's current one, as
        in :meth:`launch`) the first waits for the stream's earlier work and
        the stream's later work waits for the last. As in :meth:`launch`,
        a batch whose operands are all CUDA tensors or arrays goes through
        the launch ring (one pair of stream operations for the batch),
        except in a session with ``auto_reload``; otherwise it goes on one
        ``LaunchStream``.

        Returns each launch's time inside ptxd in microseconds (0 for ring
        launches). When any is refused, every launch is still answered, then
        the first failure is raised with ``.index`` (its position) and
        ``.results`` (the list, holding the exception at each refused
        position). In a session with ``defer_errors``, an async batch
        through the ring of at most ``RING_SLOTS`` (256) launches returns
        before ptxd answers, as :meth:`launch` does: a refusal is raised
        later (see :meth:`Client.session`).
        """
        items = [_launch_item(item) for item in launches]
        if not items:
            return []
        if not self.auto_reload:
            fast = self._launch_many_cached_tensors(items, stream, sync)
            if fast is not None:
                return fast
        for _ in range(3):
            # Operands and kernels repeat across a batch: resolve each once.
            memo: Dict[int, Any] = {}
            prepared = [self._prepare(*item[:5], memo=memo) for item in items]
            ordinals = {p.ordinal for p in prepared}
            if len(ordinals) != 1:
                raise ValueError("launch_many takes launches on one device (or all on host memory)")
            raw_stream = self._stream_for(prepared[0], stream)
            # A session with auto_reload sends batches the unary way, which
            # reloads a stale kernel and retries only the launch refused.
            ringable = (not self.auto_reload and all(p.ring is not None for p in prepared)
                        and all(item[0]._ring_ok() for item in items))
            if raw_stream is not None and ringable:
                outcomes = self._via_ring(
                    raw_stream, [(item[0], p, item[5]) for item, p in zip(items, prepared)], sync
                )
                if outcomes is _STALE:
                    continue
                if outcomes is not None:
                    results: List[Any] = [0 if o is None else o for o in outcomes]
                    return _raise_first(results)
            if any(self._forget_stale(p) for p in prepared):
                continue
            return _raise_first(self._launch_many_unary(items, prepared, raw_stream, sync))
        raise Error("the operands' memory kept changing while the launch resolved them",
                    reason="OPERANDS_CHANGED")

    def _launch_many_cached_tensors(self, items: List[Any], stream: Any,
                                    sync: bool) -> Optional[List[int]]:
        """:meth:`launch_many`'s lean path, as :meth:`_launch_cached_tensors`
        for each item: every launch's tensors cached and resolved natively,
        one ``Ring.launch_plan`` for the batch. ``None`` whenever anything
        is otherwise (the general path then decides)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        resolve = self._operands.resolve
        tensor = torch.Tensor
        plans = []
        ordinal = None
        for kernel, inputs, output, n, params, typed in items:
            if not isinstance(kernel, Kernel) or not kernel._ring_ok():
                return None
            resolved = resolve(kernel._native, kernel._element_sizes(), inputs, output, n, params,
                               [(a.type, a.value) for a in typed] if typed else (), tensor)
            if resolved is None or (ordinal is not None and resolved[0] != ordinal):
                return None
            ordinal = resolved[0]
            plans.append(resolved[1])
        assert ordinal is not None
        if stream is not None:
            raw_stream = ops.stream_handle(stream)
        else:
            current = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if current is None:
                return None
            raw_stream = int(current(ordinal))
        ring = self._ring(ordinal, raw_stream)
        if ring is None:
            return None
        outcomes = self._ring_call(ring, ordinal, raw_stream, None, None, None, sync, plans)
        if outcomes is None or outcomes is _STALE:
            return None
        return _raise_first([0 if o is None else o for o in outcomes])

    def _launch_many_unary(self, items: List[Any], prepared: List[_Prepared],
                           raw_stream: Optional[int], sync: bool) -> List[Any]:
        ordinal = prepared[0].ordinal
        pair = self._take_events(ordinal) if raw_stream is not None else None
        try:
            wire = []
            typed = [[(a.type, a.value) for a in item[5]] for item in items]
            for index, ((kernel, *_), p) in enumerate(zip(items, prepared)):
                wait = pair.wait_handle if pair is not None and index == 0 else None
                signal = pair.signal_handle if pair is not None and index == len(items) - 1 else None
                wire.append((kernel._native, p.inputs, p.output, p.n, p.params,
                             sync or ordinal is None, wait, signal))
            if pair is not None:
                pair.wait.record(raw_stream)
            # Typed args only when there are any: the call is otherwise what
            # it always was.
            if any(typed):
                results = self._native.launch_many(wire, typed)
            else:
                results = self._native.launch_many(wire)
            if pair is not None:
                pair.signal.wait(raw_stream)
        finally:
            if pair is not None:
                self._put_events(ordinal, pair)
        return list(results)

    # -- the launch ring ------------------------------------------------------

    def _ring(self, ordinal: int, raw_stream: int) -> Any:
        """The launch ring of (device, stream), opened on first use; ``None``
        when none can be (the unary path serves that stream then)."""
        key = (ordinal, raw_stream)
        ring = self._rings.get(key)
        if ring is not None:
            return ring or None
        if os.environ.get(RING_ENV, "1") == "0":
            return None
        with self._lock:
            ring = self._rings.get(key)
            if ring is not None:
                return ring or None
            if len(self._rings) >= MAX_RINGS:
                return None
            try:
                ring = self._native.open_ordered_ring(_device(ordinal), RING_SLOTS)
            except Error:
                # A daemon without rings on this device (the host backend,
                # an older daemon, a ring limit): the unary path.
                ring = False
            self._rings[key] = ring
        return ring or None

    def _via_ring(self, raw_stream: int,
                  launches: List[Tuple[Kernel, _Prepared, Sequence["_args.Arg"]]],
                  sync: bool) -> Any:
        """Launches through the ring of (device, ``raw_stream``). Returns
        one outcome per launch (``None``, or the exception it was refused
        with), ``_STALE`` when a cached operand's memory changed (its entry
        is forgotten: prepare again), or ``None`` when no ring serves the
        stream. Each launch comes with its typed args (empty for none)."""
        ordinal = launches[0][1].ordinal
        assert ordinal is not None
        ring = self._ring(ordinal, raw_stream)
        if ring is None:
            return None
        wire = []
        # Every operand's check: the ring asks about one address per
        # allocation id.
        checks: List[Tuple[int, int]] = []
        keys = []
        for kernel, p, typed in launches:
            assert p.ring is not None
            wire.append((kernel._native, p.ring[0], p.ring[1], p.n, p.params,
                         [(a.type, a.value) for a in typed]))
            checks.extend(p.checks)
            keys.extend(p.keys)
        return self._ring_call(ring, ordinal, raw_stream, wire, checks, keys, sync)

    def _ring_call(self, ring: Any, ordinal: int, raw_stream: int, wire: Optional[List[Any]],
                   checks: Optional[List[Tuple[int, int]]],
                   keys: Optional[List[Tuple[int, int, int, int]]], sync: bool,
                   plan: Any = None) -> Any:
        """``ring.launch`` and what its answers mean to the session (see
        :meth:`_via_ring`). With ``plan`` (one launch from the operand
        cache's ``resolve``), ``Ring.launch_plan`` instead of ``wire``,
        ``checks`` and ``keys``."""
        try:
            if plan is not None:
                # A list of plans is a batch (launch_many), deferred as a
                # single launch is while it fits the ring (a longer one
                # waits for answers while it submits: it is awaited).
                defer = self.defer_errors and not sync and (
                    type(plan) is not list or len(plan) <= RING_SLOTS)
                if self.defer_errors and not defer:
                    # A sync launch or a long batch waits for its own
                    # answers: the deferred ones before it are answered
                    # first.
                    _raise_deferred(ring.drain(RING_TIMEOUT))
                outcomes = ring.launch_plan(raw_stream, plan, sync, defer, RING_TIMEOUT)
                if defer and outcomes is not None:
                    _raise_deferred(outcomes)
                    outcomes = [None] * (len(plan) if type(plan) is list else 1)
            elif self.defer_errors:
                assert wire is not None
                if not sync and len(wire) <= RING_SLOTS:
                    refused = ring.launch_deferred(raw_stream, wire, checks, RING_TIMEOUT)
                    if refused is None:
                        outcomes = None
                    elif refused:
                        _raise_deferred(refused)
                    else:
                        outcomes = [None] * len(wire)
                else:
                    # A sync launch, or a batch longer than the ring, waits
                    # for its own answers: the deferred ones before it are
                    # answered first.
                    _raise_deferred(ring.drain(RING_TIMEOUT))
                    outcomes = ring.launch(raw_stream, wire, checks, sync, RING_TIMEOUT)
            else:
                outcomes = ring.launch(raw_stream, wire, checks, sync, RING_TIMEOUT)
        except Error as error:
            if self._ring_failed(ring, ordinal, raw_stream, error):
                return None  # the unary path reloads the kernel
            raise
        if outcomes is None:
            if type(plan) is list:
                keys = [key for one in plan for key in one.keys()]
            elif plan is not None:
                keys = plan.keys()
            for key in keys or ():
                self._operands.forget(key)
            return _STALE
        return outcomes

    def _ring_failed(self, ring: Any, ordinal: int, raw_stream: int,
                     error: BaseException) -> bool:
        """What a ring call that raised ``error`` means to the session's
        rings; True when the launch should take the unary path (which
        reloads a stale kernel), False when the caller raises ``error``."""
        if isinstance(error, CudaError):
            # A stream operation failed (e.g. a driver without stream memory
            # operations): this stream's later launches take the unary path.
            with self._lock:
                if self._rings.get((ordinal, raw_stream)) is ring:
                    self._rings[(ordinal, raw_stream)] = False
            return False
        if not isinstance(error, Error) or error.reason != "RING_ORPHANED":
            return False
        # The executor serving the ring was lost (restart) or the lease
        # ended: the next launch opens a new ring.
        with self._lock:
            if self._rings.get((ordinal, raw_stream)) is ring:
                del self._rings[(ordinal, raw_stream)]
        return self.auto_reload

    def _retry_unary(self, outcome: Any) -> bool:
        """Whether a ring launch's refusal is one the unary path recovers
        from: a stale kernel in a session with ``auto_reload``."""
        return (self.auto_reload and isinstance(outcome, BaseException)
                and getattr(outcome, "reason", None) == "STALE_KERNEL")

    def _forget_stale(self, prepared: _Prepared) -> bool:
        """For the unary path: True (and the entries forgotten) when an
        operand resolved from the cache now lies in another allocation than
        the one it was registered in."""
        if not prepared.checks:
            return False
        assert prepared.ordinal is not None
        device = _device(prepared.ordinal)
        for ptr, buffer_id in prepared.checks:
            if device.allocation_id(ptr) != buffer_id:
                for key in prepared.keys:
                    self._operands.forget(key)
                return True
        return False

    def _stream_for(self, prepared: _Prepared, stream: Any) -> Optional[int]:
        if stream is not None:
            if prepared.ordinal is None:
                raise ValueError("stream= orders CUDA work; these operands are host memory")
            return ops.stream_handle(stream)
        return prepared.default_stream

    def _take_events(self, ordinal: int) -> _EventPair:
        with self._lock:
            pool = self._events.setdefault(ordinal, [])
            if pool:
                return pool.pop()
        return _EventPair(self._native, ordinal)

    def _put_events(self, ordinal: int, pair: _EventPair) -> None:
        with self._lock:
            self._events.setdefault(ordinal, []).append(pair)

    def _resolve(self, obj: Any) -> Tuple[Buffer, Optional[ops.CudaView], Any]:
        """The Buffer of a launch operand, its CUDA view (``None`` for
        Buffers and host arrays), and for a CUDA tensor or array its
        operand-cache key and address (``None`` otherwise) with whether it
        came from the cache."""
        if isinstance(obj, Buffer):
            return obj, None, None
        view = ops.cuda_view(obj)
        if view is not None:
            key = (view.ordinal, view.ptr, view.nbytes, view.itemsize)
            buffer = self._operands.get(key)
            cached = buffer is not None
            if buffer is None:
                registered = self._register_cuda(obj, view)
                buffer = Buffer(registered._registration, registered.offset, view.nbytes,
                                view.itemsize, view.numel)
                self._operands.put(key, buffer)
            return buffer, view, (key, view.ptr, cached)
        return self.register(obj), None, None

    def _prepare(self, kernel: Kernel, inputs: Sequence[Any], output: Any,
                 n: Optional[int], params: Sequence[float],
                 memo: Optional[Dict[int, Any]] = None) -> _Prepared:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"expected a ptxd.Kernel, got {type(kernel).__name__}")
        if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
            raise TypeError("inputs must be a sequence of tensors, arrays or Buffers")
        objects = list(inputs) + [output]
        resolved = []
        for obj in objects:
            # The memo lives for one launch_many call, while the batch holds
            # every object: an id cannot be reused meanwhile.
            hit = memo.get(id(obj)) if memo is not None else None
            if hit is None:
                hit = self._resolve(obj)
                if memo is not None:
                    memo[id(obj)] = hit
            resolved.append(hit)
        buffers = [buffer for buffer, _, _ in resolved]
        # The stream of the framework the operands come from: asked once
        # per launch, of the first CUDA operand's framework.
        first_view = next((view for _, view, _ in resolved if view is not None), None)
        default_stream = ops.current_raw_stream(first_view) if first_view is not None else None
        cuda = [found for _, _, found in resolved]
        out = buffers[-1]
        if n is None and not out.itemsize:
            raise ValueError(
                "the output has no element type (register_fd without dtype=): pass n"
            )
        sizes = kernel._element_sizes()
        # A vectorized kernel's element is a vector (a float4 over float32
        # data): by default n counts the output's vectors.
        if n is None and sizes and sizes[-1] and _vector_of(sizes[-1], out.itemsize):
            count = out.nbytes // sizes[-1]
        else:
            count = out.numel if n is None else _element_count(n)
        last = len(buffers) - 1
        for index, (buffer, element_size) in enumerate(zip(buffers, sizes)):
            name = "output" if index == last else f"input {index}"
            if (element_size and buffer.itemsize and element_size != buffer.itemsize
                    and not _vector_of(element_size, buffer.itemsize)):
                raise DtypeMismatch(
                    f"{name}: the kernel takes {element_size}-byte elements, the operand has "
                    f"{buffer.itemsize}-byte elements",
                    reason="DTYPE_MISMATCH",
                )
            needed = count * element_size
            # Where the operand ends before its registration does (a tensor
            # inside a larger segment), ptxd's own bound is the segment's:
            # check the operand's here so a launch never spills into a
            # neighbouring tensor.
            ends_early = buffer.offset + buffer.nbytes < buffer.registered_size
            if ends_early and needed > buffer.nbytes:
                raise refused(
                    "BUFFER_TOO_SMALL",
                    f"operand {name} needs {needed} bytes but the tensor holds {buffer.nbytes}",
                    "OUT_OF_RANGE",
                    {"operand": name, "needed_bytes": str(needed), "buffer_bytes": str(buffer.nbytes)},
                )
        ordinals = {b._ordinal() for b in buffers}
        ordinal = next(iter(ordinals)) if len(ordinals) == 1 else next(o for o in ordinals if o is not None)
        ring = None
        checks: List[Tuple[int, int]] = []
        keys: List[Tuple[int, int, int, int]] = []
        if all(found is not None for found in cuda) and len(ordinals) == 1:
            ring = ([(b._registration.ring_index, b.offset) for b in buffers[:-1]],
                    (out._registration.ring_index, out.offset))
        for buffer, found in zip(buffers, cuda):
            if found is not None and found[2]:
                keys.append(found[0])
                checks.append((found[1], buffer._registration.buffer_id))
        return _Prepared(
            inputs=[(b.handle, b.offset) for b in buffers[:-1]],
            output=(out.handle, out.offset),
            n=count,
            params=_f32_params(params),
            ordinal=ordinal,
            default_stream=default_stream,
            ring=ring,
            checks=checks,
            keys=keys,
        )


#: What a ring launch returns (a NamedTuple: one object serves every launch).
_RING_LAUNCHED = Launched(0, False)

#: What ``Session._via_ring`` returns when a cached operand went stale.
_STALE = object()


def _raise_first(results: List[Any]) -> List[Any]:
    """``results``, or the first exception in it raised with ``.index`` and
    ``.results``."""
    for index, result in enumerate(results):
        if isinstance(result, BaseException):
            result.index = index
            result.results = results
            raise result
    return results


class Client:
    """A connection to ptxd.

    ``socket`` is a Unix socket path (or ``unix:PATH``), or ``HOST:PORT`` /
    ``http://HOST:PORT`` for TCP; ``None`` follows the SDK's rules:
    ``$PTXD_SOCKET``, else ``$XDG_RUNTIME_DIR/ptxd.sock``, else
    ``/run/ptxd/ptxd.sock`` for root, else ``$TMPDIR/ptxd-<uid>/ptxd.sock``.

    ``reply_spin`` is how many seconds a launch or load on the fd socket
    polls for its reply before its thread sleeps: ``None`` keeps the SDK's
    default (200 µs), ``0`` sleeps at once. A reply within the spin costs no
    wake-up (README, "The SDK"); the price is that thread's time until then.

    A client is a context manager; leaving it closes the sessions it opened.
    """

    def __init__(self, socket: Optional[str] = None, *, reply_spin: Optional[float] = None) -> None:
        self.socket = socket
        if reply_spin is not None and (isinstance(reply_spin, bool)
                                       or not isinstance(reply_spin, numbers.Real)):
            raise TypeError(f"reply_spin is a number of seconds, not {type(reply_spin).__name__}")
        self._native: Any = _native.Client(
            None if socket is None else str(socket),
            None if reply_spin is None else float(reply_spin),
        )
        self._sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the sessions this client opened and drops the connection."""
        for session in list(self._sessions):
            try:
                session.close()
            except Error:
                pass
        self._native = None

    def _client(self) -> Any:
        if self._native is None:
            raise Error("the client is closed", reason="CLIENT_CLOSED")
        return self._native

    def info(self) -> Dict[str, Any]:
        """The daemon's version, backend, devices, slot use, sessions and
        limits."""
        return self._client().info()

    def session(self, label: str, auto_reload: bool = False, defer_errors: bool = False
                ) -> Session:
        """Opens a session labelled ``label``. With ``auto_reload``, a launch
        refused as STALE_KERNEL (e.g. after an executor restart) reloads the
        kernel and retries once.

        With ``defer_errors``, an async launch through a launch ring returns
        once its descriptor is written and its stream operations enqueued,
        without waiting for ptxd's answer (as ``cuLaunchKernel`` returns
        before the kernel runs); a refusal ptxd answers later is raised by
        the session's next launch on that ring, which is then not sent, or
        by :meth:`Session.wait_answers`. An async ``launch_many`` through a
        ring is deferred the same way (its launches return 0, a refusal
        comes later, without ``.index``). The order on the stream is the
        same either way. Not with ``auto_reload`` (a stale kernel found
        later cannot be retried)."""
        if auto_reload and defer_errors:
            raise ValueError("defer_errors and auto_reload do not go together: a launch "
                             "refused STALE_KERNEL after it returned cannot be retried")
        session = Session(self._client().open_session(label, auto_reload), label, auto_reload,
                          defer_errors)
        self._sessions.add(session)
        return session

    def __repr__(self) -> str:
        return f"<ptxd.Client {self.socket or 'default socket'}>"


class _MappingHolder:
    """Exposes a host mapping (a native Shm or Memfd) to numpy; the array
    keeps it (and so the mapping) alive."""

    def __init__(self, mapping: Any, shape: Tuple[int, ...], dtype: Any) -> None:
        self._mapping = mapping
        self.__array_interface__ = {
            "version": 3,
            "shape": shape,
            "typestr": dtype.str,
            "data": (mapping.address, False),
        }
        if dtype.fields is not None:
            # A structured dtype's fields (its typestr alone is raw bytes).
            self.__array_interface__["descr"] = dtype.descr


def _numpy(what: str) -> Any:
    try:
        import numpy
    except ImportError:
        raise ImportError(f"{what} needs numpy: pip install numpy") from None
    return numpy


#: The most bytes a host buffer (``shm_array``, ``memfd_array``) holds:
#: its size is a file's, an ``off_t``.
_MAX_HOST_BYTES = (1 << 63) - 1

#: One past the largest value of a u64 (an element count, a byte size or
#: offset on the wire).
_U64_END = 1 << 64


def _index(value: Any, what: str) -> int:
    """``value`` as a Python int, for an integer argument: an ``int`` or
    anything with ``__index__`` (numpy's integers); a bool, a float or a
    string raises ``TypeError`` (nothing is truncated or parsed)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


def _u64(value: Any, what: str) -> int:
    """An integer argument the wire carries as a u64: 0 <= value < 2^64
    (``ValueError`` otherwise, rather than the conversion's
    ``OverflowError``)."""
    value = _index(value, what)
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value}")
    if value >= _U64_END:
        raise ValueError(f"{what} must be below 2^64, got {value}")
    return value


def _element_count(n: Any) -> int:
    """A launch's ``n`` (elements, or vectors for a vector kernel)."""
    return _u64(n, "n")


def _f32_params(params: Any) -> List[float]:
    """A launch's f32 ``params``, each checked to fit an f32 (a finite value
    beyond the f32 range raises ``OverflowError``, not an infinity)."""
    if params is None:
        return []
    if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise TypeError(f"params must be a sequence of numbers, not {type(params).__name__}")
    out = []
    for index, value in enumerate(params):
        out.append(_args.f32_value(float(value), f"param {index}"))
    return out


def _device_selector(device: Any) -> Union[int, str]:
    if isinstance(device, bool):
        raise TypeError("device must be an ordinal, a UUID or a torch.device")
    if isinstance(device, int):
        if not 0 <= device < 1 << 32:
            raise ValueError(f"a device ordinal is in 0..2^32-1, got {device}")
        return device
    if isinstance(device, str):
        return device
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda":
        return _device(index if index is not None else 0).uuid
    raise TypeError(f"device must be an ordinal, a UUID or a torch.device, got {device!r}")


#: The keys of a ``launch_many`` dict item.
_LAUNCH_KEYS = frozenset({"kernel", "inputs", "output", "n", "params", "args"})


def _launch_item(item: Any) -> Tuple[Kernel, Sequence[Any], Any, Optional[int], Sequence[float],
                                     List["_args.Arg"]]:
    """A batch item as ``(kernel, inputs, output, n, params, typed args)``."""
    if isinstance(item, dict):
        missing = [key for key in ("kernel", "inputs", "output") if key not in item]
        unknown = sorted(str(key) for key in item if key not in _LAUNCH_KEYS)
        if missing or unknown:
            raise TypeError(
                "a launch dict takes kernel, inputs and output, and optionally n and params "
                f"or args; {'missing ' + ', '.join(missing) if missing else ''}"
                f"{'; ' if missing and unknown else ''}"
                f"{'unknown ' + ', '.join(unknown) if unknown else ''}"
            )
        params = item.get("params", ())
        args = item.get("args", ())
        if args and params is not None and len(params):
            raise TypeError("a launch passes params or args, not both")
        kernel = item["kernel"]
        if not isinstance(kernel, Kernel):
            raise TypeError(f"expected a ptxd.Kernel, got {type(kernel).__name__}")
        params, typed = _typed_args(kernel, params, args)
        return (kernel, item["inputs"], item["output"], item.get("n"), params, typed)
    if isinstance(item, (str, bytes)) or not hasattr(item, "__iter__"):
        raise TypeError(
            f"a launch is (kernel, inputs, output[, n[, params]]) or a dict, not "
            f"{type(item).__name__}"
        )
    item = tuple(item)
    if not 3 <= len(item) <= 5:
        raise TypeError("a launch is (kernel, inputs, output[, n[, params]]) or a dict")
    kernel, inputs, output = item[:3]
    n = item[3] if len(item) > 3 else None
    params = item[4] if len(item) > 4 else ()
    return (kernel, inputs, output, n, params, [])


def _typed_args(kernel: Kernel, params: Sequence[float], args: Sequence[Any]
                ) -> Tuple[Sequence[float], List["_args.Arg"]]:
    """A launch's ``params`` and typed ``args`` as the wire carries them:
    f32 args for a kernel whose scalar params are all f32 become params
    (ptxd treats them alike, and every path carries them); anything else
    goes as typed args, for ptxd's own check (SCALAR_ARGS_MISMATCH)."""
    if not args:
        return params, []
    scalars = kernel._scalar_params()
    typed = _args.resolve(args, scalars)
    if ((params is None or len(params) == 0) and len(typed) == len(scalars)
            and all(a.type == "f32" == kind for a, (_, kind) in zip(typed, scalars))):
        return [a.value for a in typed], []
    return params, typed


def _raise_deferred(refused: List[Any]) -> None:
    """Raises the first refusal of deferred launches (``.results`` holds
    all of them), if any."""
    if refused:
        first = refused[0]
        first.results = list(refused)
        raise first
