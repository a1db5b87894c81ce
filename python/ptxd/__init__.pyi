"""Type stubs of the ptxd Python client (see the module docstring of ptxd)."""

from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Type, Union

__version__: str

def cuda_available() -> bool:
    """Whether libcuda can be loaded in this process."""

class Signature(NamedTuple):
    """The scalar-ABI signature ptxd verified for a kernel."""

    inputs: int
    element_sizes: Tuple[int, ...]
    scalar_params: int
    block_size: int
    reqntid: int
    maxntid: int

class Arg(NamedTuple):
    """A typed scalar launch argument: its wire type ("i32", "u32", "i64", "u64", "f32",
    "f64") and value."""

    type: str
    value: Union[int, float]

def i32(value: int) -> Arg:
    """An argument for an .s32 param (OverflowError out of range)."""
def u32(value: int) -> Arg:
    """An argument for a .u32 or .b32 param."""
def i64(value: int) -> Arg:
    """An argument for an .s64 param."""
def u64(value: int) -> Arg:
    """An argument for a .u64 or .b64 param."""
def f32(value: float) -> Arg:
    """An argument for an .f32 param (rounded to the nearest f32; OverflowError for a finite
    value past the f32 range)."""
def f64(value: float) -> Arg:
    """An argument for an .f64 param."""

class Launched(NamedTuple):
    """What a launch reports: time inside ptxd, and whether the kernel was reloaded."""

    micros: int
    reloaded: bool

class Kernel:
    """A kernel loaded into a session."""

    @property
    def signature(self) -> Signature: ...
    @property
    def symbol(self) -> str: ...
    @property
    def contract(self) -> str: ...
    @property
    def cache_hit(self) -> bool: ...
    @property
    def load_micros(self) -> int: ...
    @property
    def device_uuid(self) -> str: ...
    @property
    def generation(self) -> int: ...

class Buffer:
    """A region of a registered buffer: what a launch operand names."""

    offset: int
    nbytes: int
    itemsize: int
    numel: int
    @property
    def handle(self) -> str: ...
    @property
    def registered_size(self) -> int: ...
    @property
    def device_uuid(self) -> str: ...
    @property
    def kind(self) -> str: ...

#: A launch operand: a CUDA torch.Tensor, an object with __cuda_array_interface__,
#: a numpy array from Session.shm_array or Session.memfd_array, or a Buffer.
Operand = Any
#: A torch.cuda.Stream, a cupy.cuda.Stream, an object with __cuda_stream__, or a CUstream address.
Stream = Any

class Session:
    """A ptxd session; a context manager. The lease ends on close, exit or collection."""

    label: str
    #: Whether a launch refused as STALE_KERNEL reloads the kernel and retries once.
    auto_reload: bool
    #: Whether async ring launches return before ptxd answers (refusals raised later).
    defer_errors: bool
    def __enter__(self) -> "Session": ...
    def __exit__(self, *exc: Any) -> None: ...
    def close(self) -> Optional[Dict[str, int]]:
        """Ends the lease and lets go of what the session held; None when already closed.
        Later calls raise SessionClosed."""
    def next_event(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]: ...
    @property
    def is_open(self) -> bool: ...
    def wait_answers(self) -> None:
        """Waits for ptxd's answer to every ring launch not answered yet; raises the first
        refusal among them."""
    def load_ptx(self, ptx: str, symbol: str, device: Union[int, str, Any] = 0) -> Kernel: ...
    def load_triton(self, compiled: Any, device: Union[int, str, Any] = 0) -> Kernel:
        """Loads a compiled Triton kernel (asm["ptx"], metadata name, num_warps, shared);
        ptxd computes its grid and passes its count and null scratch pointers."""
    def shm_array(self, shape: Union[int, Sequence[int]], dtype: Any) -> Any:
        """A numpy.ndarray backed by a registered shared-memory buffer (host backend)."""
    def memfd_array(self, shape: Union[int, Sequence[int]], dtype: Any) -> Any:
        """A numpy.ndarray backed by a sealed memfd registered by file descriptor (host
        backend, Unix socket): needs no /dev/shm shared with the daemon."""
    def register_fd(
        self,
        fd: int,
        size: int,
        device_uuid: Optional[str] = None,
        offset: int = 0,
        label: str = "",
        dtype: Any = None,
    ) -> Buffer:
        """Registers size bytes from offset of the memory behind fd (host: a memfd sealed
        with F_SEAL_SHRINK); fd is used only during the call."""
    def register(self, obj: Operand) -> Buffer: ...
    def release(self, buffer: Buffer) -> None:
        """Releases buffer's registration; again, nothing; another session's Buffer raises
        StaleBuffer and stays registered there."""
    def buffers(self) -> List[Dict[str, Any]]: ...
    def launch(
        self,
        kernel: Kernel,
        inputs: Sequence[Operand],
        output: Operand,
        n: Optional[int] = None,
        params: Optional[Sequence[float]] = (),
        stream: Optional[Stream] = None,
        sync: bool = False,
        args: Sequence[Union[Arg, int, float]] = (),
    ) -> Launched:
        """n: an int (or __index__) in 0..2^64-1 (TypeError, ValueError); params: f32 values
        (OverflowError for a finite one past the f32 range)."""
    def launch_many(
        self,
        launches: Iterable[Union[Tuple[Any, ...], Dict[str, Any]]],
        stream: Optional[Stream] = None,
        sync: bool = False,
    ) -> List[int]: ...

class Client:
    """A connection to ptxd; a context manager."""

    socket: Optional[str]
    def __init__(self, socket: Optional[str] = None, *, reply_spin: Optional[float] = None) -> None: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: Any) -> None: ...
    def close(self) -> None:
        """Closes the client's sessions; later calls raise Error with reason CLIENT_CLOSED."""
    def info(self) -> Dict[str, Any]: ...
    def session(self, label: str, auto_reload: bool = False, defer_errors: bool = False
                ) -> Session: ...

class Error(Exception):
    """Base of every exception ptxd raises."""

    message: str
    reason: str
    code: str
    code_value: int
    metadata: Dict[str, str]

class Unavailable(Error):
    """The daemon could not be reached, or the connection broke."""

class SessionClosed(Error):
    """The session's lease ended."""

class Refused(Error):
    """ptxd refused the request; ``reason`` is the ErrorInfo reason string."""

    #: Set on the exception launch_many raises: the refused launch's position.
    index: int
    #: Set on the exception launch_many raises: every launch's result.
    results: List[Union[int, "Error"]]

class NotContiguous(Error, ValueError):
    """A non-contiguous tensor or array was given."""

class NotExportable(Error, ValueError):
    """Memory legacy CUDA IPC cannot export (expandable_segments, cuMemCreate, pools)."""

class DtypeMismatch(Error, TypeError):
    """An operand's element size differs from the kernel's."""

class CudaError(Error):
    """A CUDA driver call in this process failed."""

#: Every refusal class, by wire reason.
REFUSALS: Dict[str, Type[Refused]]

# One class per ErrorInfo reason (generated at import from the SDK's list).

class NonScalarAbi(Refused):
    """``NON_SCALAR_ABI``: The kernel does not follow the scalar ABI."""

class DeviceMismatch(Refused):
    """``DEVICE_MISMATCH``: An operand sits on another device or device generation than the kernel."""

class StaleKernel(Refused):
    """``STALE_KERNEL``: The kernel handle is stale (slot reused, dead generation, earlier boot): reload the kernel."""

class StaleBuffer(Refused):
    """``STALE_BUFFER``: The buffer was released, is from an earlier boot, or could not be re-opened after an executor restart."""

class SlotBankFull(Refused):
    """``SLOT_BANK_FULL``: Every kernel slot is held by a live kernel."""

class BufferTooSmall(Refused):
    """``BUFFER_TOO_SMALL``: An operand's range exceeds its buffer."""

class UnknownDevice(Refused):
    """``UNKNOWN_DEVICE``: No device with that UUID or ordinal."""

class SymbolNotFound(Refused):
    """``SYMBOL_NOT_FOUND``: The artifact has no entry with that symbol."""

class InvalidArtifact(Refused):
    """``INVALID_ARTIFACT``: The artifact does not parse or does not compile."""

class UnsupportedArtifact(Refused):
    """``UNSUPPORTED_ARTIFACT``: The artifact kind cannot be loaded here."""

class InvalidHandle(Refused):
    """``INVALID_HANDLE``: A CUDA IPC handle or shared-memory name does not open."""

class NotOwner(Refused):
    """``NOT_OWNER``: The handle belongs to another session, or the session to another uid."""

class LimitExceeded(Refused):
    """``LIMIT_EXCEEDED``: A configured limit was reached."""

class KernelFault(Refused):
    """``KERNEL_FAULT``: The kernel faulted on the device; its executor restarts."""

class ExecutorUnavailable(Refused):
    """``EXECUTOR_UNAVAILABLE``: The device's executor is down or restarting: retry shortly."""

class UnsupportedOnHost(Refused):
    """``UNSUPPORTED_ON_HOST``: The host backend cannot run this."""

class AbiMismatch(Refused):
    """``ABI_MISMATCH``: The kernel's ABI or the launch's counts do not match what was declared."""

class UnknownSession(Refused):
    """``UNKNOWN_SESSION``: No open session with that id."""

class InvalidArgument(Refused):
    """``INVALID_ARGUMENT``: A request field is malformed or missing."""

class Draining(Refused):
    """``DRAINING``: The daemon is shutting down."""

class Internal(Refused):
    """``INTERNAL``: A fault inside ptxd itself."""

class KernelTimeout(Refused):
    """``KERNEL_TIMEOUT``: The launch ran past the daemon's per-launch budget (``--max-kernel-time``)."""

class UnverifiedArtifact(Refused):
    """``UNVERIFIED_ARTIFACT``: Machine code (cubin, fatbin) from a caller not trusted with unverified artifacts: load PTX instead."""

class IdentityRequired(Refused):
    """``IDENTITY_REQUIRED``: The request needs a caller identity (shared memory, CUDA IPC) and the connection has none (TCP): use the Unix socket."""

class FdNotSealed(Refused):
    """``FD_NOT_SEALED``: A memfd passed as a buffer lacks F_SEAL_SHRINK (metadata ``seals``), or the descriptor cannot be sealed at all: seal it first."""

class StaleFdToken(Refused):
    """``STALE_FD_TOKEN``: The fd token is unknown, used or expired (metadata ``why``): register the buffer again."""

class ScalarArgsMismatch(Refused):
    """``SCALAR_ARGS_MISMATCH``: The launch's typed scalar args do not match the kernel's scalar params (metadata ``what``: count, type or both; for a type ``index``, ``param``, ``expected``, ``given``)."""
