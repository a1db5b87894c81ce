"""The launch path a torch or CuPy operand takes, without a GPU or a daemon:
which path a launch takes, the operand cache, and what happens when a
caching allocator's segment is freed and allocated again at the same
address. The native session, device and ring are fakes with the native
module's interface; the GPU tests (gpu/test_ring.py) run the real ones."""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Tuple

import pytest

import ptxd
from ptxd import _client, _native
from ptxd._errors import _from_native

RNG = random.Random()


class FakeAllocator:
    """Device memory as the driver reports it: allocations with ids that
    are never reused, at addresses that are."""

    def __init__(self) -> None:
        self.allocations: Dict[int, Tuple[int, int]] = {}  # base -> (size, id)
        self.next_id = RNG.randrange(1, 1 << 30)
        self.locates = 0

    def allocate(self, base: int, size: int) -> int:
        self.next_id += 1
        self.allocations[base] = (size, self.next_id)
        return self.next_id

    def free(self, base: int) -> None:
        del self.allocations[base]

    def find(self, ptr: int) -> Tuple[int, int, int]:
        for base, (size, buffer_id) in self.allocations.items():
            if base <= ptr < base + size:
                return base, size, buffer_id
        raise AssertionError(f"{ptr:#x} is in no allocation")


class FakeDevice:
    uuid = "GPU-fake"
    ordinal = 0

    def __init__(self, allocator: FakeAllocator) -> None:
        self.allocator = allocator

    def locate(self, ptr: int) -> Tuple[int, int, int, bool]:
        self.allocator.locates += 1
        base, size, buffer_id = self.allocator.find(ptr)
        return base, size, buffer_id, True

    def export(self, located: Tuple[int, int, int, bool]) -> bytes:
        return located[0].to_bytes(8, "little") * 8

    def allocation_id(self, ptr: int) -> int:
        return self.allocator.find(ptr)[2]


class FakeArray:
    """A contiguous float32 array on the fake device (``__cuda_array_interface__``
    v3, naming its stream as CuPy does)."""

    def __init__(self, ptr: int, count: int, stream: int = 0x5000) -> None:
        self.__cuda_array_interface__ = {
            "shape": (count,),
            "typestr": "<f4",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": stream,
        }


class FakeKernel:
    # The scalar ABI's contract: one ptxd grants to a launch ring (it says
    # so in ring_launchable; the client reads that, not the text).
    ring_launchable = True
    contract = ("params(a: ptr read, b: ptr read, out: ptr written, n: count .s64); "
                "block <= 256; grid ceil(n / block); a[n × 4] align 4; b[n × 4] align 4; "
                "out[n × 4] align 4; requires count_fits_i64: n <= 9223372036854775807")

    def signature(self) -> Tuple[int, List[int], int, int, int, int]:
        return (2, [4, 4, 4], 0, 256, 0, 0)


class FakeRing:
    """The native Ring: checks the operand cache's guesses as the real one
    does (before anything is submitted), then records the launches."""

    def __init__(self, device: FakeDevice, outcomes: Optional[List[Any]] = None) -> None:
        self.device = device
        self.launches: List[Tuple[int, Any]] = []
        self.stale_answers = 0
        self.plans = 0
        self.awaited_calls = 0
        self.outcomes = outcomes
        self.error: Optional[BaseException] = None

    def launch(self, stream: int, wire: List[Any], checks: List[Tuple[int, int]], sync: bool,
               timeout: float) -> Optional[List[Any]]:
        if self.error is not None:
            raise self.error
        self.awaited_calls += 1
        for ptr, buffer_id in checks:
            if self.device.allocation_id(ptr) != buffer_id:
                self.stale_answers += 1
                return None
        for item in wire:
            self.launches.append((stream, item))
        if self.outcomes is not None:
            return self.outcomes
        return [None] * len(wire)

    # Deferred answers (a session with defer_errors): what ptxd answered
    # since the last call, read before anything is submitted.
    answered: List[Any]

    def launch_deferred(self, stream: int, wire: List[Any], checks: List[Tuple[int, int]],
                        timeout: float) -> Optional[List[Any]]:
        if self.error is not None:
            raise self.error
        for ptr, buffer_id in checks:
            if self.device.allocation_id(ptr) != buffer_id:
                self.stale_answers += 1
                return None
        refused, self.answered = list(getattr(self, "answered", [])), []
        if refused:
            return refused
        for item in wire:
            self.launches.append((stream, item))
        return []

    def launch_plan(self, stream: int, plan: Any, sync: bool, defer: bool,
                    timeout: float) -> Optional[List[Any]]:
        # The native Ring's launch of one resolved Plan: the same checks
        # and answers as launch (launch_deferred with defer and not sync).
        # A list of plans is a batch (launch_many).
        plans = plan if isinstance(plan, list) else [plan]
        self.plans += len(plans)
        checks = list({buffer_id: (ptr, buffer_id)
                       for p in plans for ptr, buffer_id in p.checks()}.values())
        wire = [p.wire() for p in plans]
        if defer and not sync:
            return self.launch_deferred(stream, wire, checks, timeout)
        return self.launch(stream, wire, checks, sync, timeout)

    def drain(self, timeout: float) -> List[Any]:
        refused, self.answered = list(getattr(self, "answered", [])), []
        return refused


class FakeNativeSession:
    def __init__(self, device: FakeDevice, ring_fails: bool = False) -> None:
        self.device = device
        self.registered: Dict[str, int] = {}  # handle -> ring index
        self.released: List[str] = []
        self.unary: List[Any] = []
        self.rings: List[FakeRing] = []
        self.ring_fails = ring_fails
        self.next_index = RNG.randrange(1, 1000)
        self.batches: List[Any] = []

    def register_cuda_ipc(self, handle: bytes, uuid: str, size: int) -> Dict[str, Any]:
        self.next_index += 1
        name = f"buf-{self.next_index}"
        self.registered[name] = self.next_index
        return {"handle": name, "size": size, "device_uuid": uuid, "generation": 1,
                "ring_index": self.next_index}

    def release_buffer(self, handle: str) -> None:
        self.released.append(handle)

    def open_ordered_ring(self, device: FakeDevice, slots: int) -> FakeRing:
        if self.ring_fails:
            raise ptxd.Error("no ring here", reason="UNSUPPORTED_ON_HOST")
        ring = FakeRing(device)
        self.rings.append(ring)
        return ring

    def launch(self, kernel: Any, inputs: Any, output: Any, n: int, params: Any, sync: bool,
               wait: Any = None, signal: Any = None) -> Tuple[int, bool]:
        self.unary.append((inputs, output, n, wait, signal))
        return (5, False)

    def launch_many(self, wire: List[Any], args: Optional[List[Any]] = None) -> List[int]:
        self.batches.append((wire, args))
        return [5] * len(wire)

    def close(self) -> None:
        return None


class FakeEvent:
    def __init__(self) -> None:
        self.records: List[int] = []
        self.waits: List[int] = []

    def handle(self) -> bytes:
        return bytes(64)

    def record(self, stream: int) -> None:
        self.records.append(stream)

    def wait(self, stream: int) -> None:
        self.waits.append(stream)


@pytest.fixture
def fake(monkeypatch):
    allocator = FakeAllocator()
    device = FakeDevice(allocator)
    device.ipc_event = lambda: FakeEvent()
    monkeypatch.setattr(_client, "_device", lambda ordinal: device)
    monkeypatch.delenv(_client.RING_ENV, raising=False)
    native = FakeNativeSession(device)
    native.register_event = lambda handle, uuid: f"event-{RNG.random()}"
    session = _client.Session(native, "fake")
    return session, native, allocator


def segment(allocator: FakeAllocator, size: int = 1 << 21) -> int:
    base = RNG.randrange(1 << 20, 1 << 30) << 21
    allocator.allocate(base, size)
    return base


def test_cuda_arrays_launch_through_the_ring_and_resolve_once(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(1, 4096)
    offsets = [0, 4 * count, 8 * count]
    a, b, out = (FakeArray(base + offset, count) for offset in offsets)
    kernel = _client.Kernel(FakeKernel())

    assert session.launch(kernel, [a, b], out) == ptxd.Launched(0, False)
    assert allocator.locates == 3, "each operand is located once"
    assert len(native.rings) == 1 and native.unary == []
    ring = native.rings[0]
    index = native.registered[next(iter(native.registered))]
    assert len(native.registered) == 1, "one segment, one registration"
    stream, (_, inputs, output, n, params, args) = ring.launches[0]
    assert stream == 0x5000
    assert inputs == [(index, 0), (index, 4 * count)] and output == (index, 8 * count)
    assert n == count and params == [] and args == []

    for _ in range(5):
        session.launch(kernel, [a, b], out)
    assert allocator.locates == 3, "later launches take the operands from the cache"
    assert len(ring.launches) == 6 and len(native.rings) == 1


def test_a_reused_segment_never_launches_against_the_old_registration(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeArray(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], out)
    (old_handle, old_index), = native.registered.items()

    # The caching allocator frees the segment; the driver gives the next one
    # (another size) the same address. Tensors there have the same addresses
    # and lengths as before: the cache's keys match, the memory does not.
    allocator.free(base)
    allocator.allocate(base, 1 << 22)
    a2, b2, out2 = (FakeArray(base + i * 4 * count, count) for i in range(3))
    session.launch(kernel, [a2, b2], out2)

    ring = native.rings[0]
    assert ring.stale_answers == 1, "the ring refused the stale guess before submitting"
    assert native.released == [old_handle], "the freed segment's registration was released"
    new_index = native.registered[next(h for h in native.registered if h != old_handle)]
    assert new_index != old_index
    _, (_, inputs, output, _, _, _) = ring.launches[-1]
    assert {index for index, _ in inputs + [output]} == {new_index}
    for _, (_, inputs, output, _, _, _) in ring.launches[1:]:
        assert old_index not in {index for index, _ in inputs + [output]}


def test_the_unary_path_checks_the_cache_too(fake, monkeypatch):
    session, native, allocator = fake
    monkeypatch.setenv(_client.RING_ENV, "0")
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeArray(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], out)
    assert native.rings == [] and len(native.unary) == 1
    (old_handle, _), = native.registered.items()
    allocator.free(base)
    allocator.allocate(base, 1 << 20)
    session.launch(kernel, [FakeArray(base + i * 4 * count, count) for i in range(3)][:2],
                   FakeArray(base + 8 * count, count))
    assert native.released == [old_handle]
    inputs, output, _, wait, signal = native.unary[-1]
    assert {handle for handle, _ in inputs + [output]} == set(native.registered) - {old_handle}
    assert wait is not None and signal is not None, "ordered by the IPC event pair"


def test_buffers_take_the_unary_path(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    arrays = [FakeArray(base + i * 4 * count, count) for i in range(3)]
    buffers = [session.register(x) for x in arrays]
    kernel = _client.Kernel(FakeKernel())
    assert session.launch(kernel, buffers[:2], buffers[2]) == ptxd.Launched(5, False)
    assert native.rings == [] and len(native.unary) == 1
    # One Buffer among tensors is enough to take the unary path.
    session.launch(kernel, [arrays[0], buffers[1]], arrays[2])
    assert native.rings == [] and len(native.unary) == 2


def test_a_ring_that_cannot_open_is_not_asked_for_again(fake):
    session, native, allocator = fake
    native.ring_fails = True
    opened = []
    real_open = native.open_ordered_ring
    native.open_ordered_ring = lambda *args: opened.append(1) or real_open(*args)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    arrays = [FakeArray(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    for _ in range(3):
        session.launch(kernel, arrays[:2], arrays[2])
    assert opened == [1] and len(native.unary) == 3


def test_one_ring_per_stream(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    kernel = _client.Kernel(FakeKernel())
    for stream in (0x100, 0x200, 0x100):
        arrays = [FakeArray(base + i * 4 * count, count, stream) for i in range(3)]
        session.launch(kernel, arrays[:2], arrays[2])
    assert len(native.rings) == 2
    assert [s for s, _ in native.rings[0].launches] == [0x100, 0x100]
    # An explicit stream= wins over the arrays' own.
    arrays = [FakeArray(base + i * 4 * count, count, 0x100) for i in range(3)]
    session.launch(kernel, arrays[:2], arrays[2], stream=0x300)
    assert len(native.rings) == 3 and native.rings[2].launches[0][0] == 0x300


def test_ring_refusals_raise_the_typed_exception(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    arrays = [FakeArray(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, arrays[:2], arrays[2])
    refusal = _from_native("refused", "STALE_BUFFER", "ring launch 2 was refused: STALE_BUFFER",
                           "FAILED_PRECONDITION", 9, {"path": "ring"})
    native.rings[0].outcomes = [refusal]
    with pytest.raises(ptxd.StaleBuffer) as raised:
        session.launch(kernel, arrays[:2], arrays[2])
    assert raised.value.reason == "STALE_BUFFER" and raised.value.metadata["path"] == "ring"
    # launch_many: every launch answered, the first refusal raised with its index.
    native.rings[0].outcomes = [None, refusal, None]
    with pytest.raises(ptxd.StaleBuffer) as raised:
        session.launch_many([(kernel, arrays[:2], arrays[2])] * 3)
    assert raised.value.index == 1 and raised.value.results[0] == 0
    assert native.unary == []


def test_an_orphaned_ring_is_replaced(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    arrays = [FakeArray(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, arrays[:2], arrays[2])
    native.rings[0].error = ptxd.Error("the executor was lost", reason="RING_ORPHANED")
    with pytest.raises(ptxd.Error) as raised:
        session.launch(kernel, arrays[:2], arrays[2])
    assert raised.value.reason == "RING_ORPHANED"
    session.launch(kernel, arrays[:2], arrays[2])
    assert len(native.rings) == 2 and len(native.rings[1].launches) == 1


def test_the_client_checks_still_apply_on_the_ring_path(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    arrays = [FakeArray(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    with pytest.raises(ptxd.BufferTooSmall) as raised:
        session.launch(kernel, arrays[:2], arrays[2], n=count + 1)
    assert raised.value.metadata["checked_by"] == "client"
    assert native.rings == [] or native.rings[0].launches == []


def test_operand_cache_misses_released_registrations_and_starts_over_when_full():
    cache = _client._OperandCache(limit=3)
    registration = _client._Registration(
        {"handle": "h", "size": 64, "device_uuid": "GPU-x", "generation": 1, "ring_index": 4},
        "cuda_ipc", 0x1000, 0, 77,
    )
    buffer = _client.Buffer(registration, 0, 16, 4, 4)
    cache.put((0, 0x1000, 16, 4), buffer)
    assert cache.get((0, 0x1000, 16, 4)) is buffer
    registration.released = True
    assert cache.get((0, 0x1000, 16, 4)) is None and len(cache) == 0
    live = _client._Registration(
        {"handle": "g", "size": 64, "device_uuid": "GPU-x", "generation": 1}, "cuda_ipc",
        0x2000, 0, 78,
    )
    for i in range(4):
        cache.put((0, 0x2000 + 4 * i, 4, 4), _client.Buffer(live, 4 * i, 4, 4, 1))
    assert len(cache) == 1 and cache.get((0, 0x200C, 4, 4)) is not None


def test_a_failed_stream_operation_sends_the_stream_to_the_unary_path(fake):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    arrays = [FakeArray(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, arrays[:2], arrays[2])
    native.rings[0].error = ptxd.CudaError("cuStreamBatchMemOp failed: CUDA_ERROR_NOT_SUPPORTED",
                                           reason="CUDA")
    with pytest.raises(ptxd.CudaError):
        session.launch(kernel, arrays[:2], arrays[2])
    session.launch(kernel, arrays[:2], arrays[2])
    assert len(native.rings) == 1 and len(native.unary) == 1


class FakeTensor:
    """What the client reads of a contiguous CUDA float32 torch.Tensor."""

    is_cuda = True

    def __init__(self, ptr: int, count: int) -> None:
        self._ptr, self._count = ptr, count

    def is_contiguous(self) -> bool:
        return True

    def get_device(self) -> int:
        return 0

    def element_size(self) -> int:
        return 4

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return self._count


@pytest.fixture
def fake_torch(monkeypatch):
    import sys
    import types

    torch = types.ModuleType("torch")
    torch.Tensor = FakeTensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda ordinal: 0x7700)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def counting_prepare(session):
    calls = []
    general = session._prepare

    def prepare(*args, **kwargs):
        calls.append(1)
        return general(*args, **kwargs)

    session._prepare = prepare
    return calls


def test_cached_torch_tensors_take_the_lean_path(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    prepares = counting_prepare(session)
    session.launch(kernel, [a, b], out)
    assert prepares == [1] and allocator.locates == 3
    for _ in range(4):
        assert session.launch(kernel, [a, b], out, params=(2,)) == ptxd.Launched(0, False)
    assert prepares == [1], "cached tensors skip the general path"
    ring = native.rings[0]
    index = next(iter(native.registered.values()))
    assert [launch[0] for launch in ring.launches] == [0x7700] * 5
    assert ring.launches[-1][1][1:] == (
        [(index, 0), (index, 4 * count)], (index, 8 * count), count, [2.0], []
    )
    # A check the client makes (here: n past the tensor) sends the launch to
    # the general path, which raises.
    with pytest.raises(ptxd.BufferTooSmall):
        session.launch(kernel, [a, b], out, n=count + 1)
    assert prepares == [1, 1]


def test_numpy_params_take_the_lean_path_as_a_sequence_does(fake, fake_torch):
    # params as a numpy array (two or more values: an array with no truth
    # value) are read as the sequence of numbers they are, on the lean path
    # of launch and of launch_many alike.
    np = pytest.importorskip("numpy")
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], out)  # the general path fills the cache
    prepares = counting_prepare(session)
    ring = native.rings[0]
    for dtype in (np.float32, np.float64):
        values = np.array([RNG.uniform(-8, 8) for _ in range(RNG.randrange(2, 6))], dtype=dtype)
        assert session.launch(kernel, [a, b], out, params=values) == ptxd.Launched(0, False)
        assert ring.launches[-1][1][4] == [pytest.approx(float(v), rel=1e-6) for v in values]
        batch = [(kernel, [a, b], out, None, values), (kernel, [a, b], out, None, values[::-1])]
        assert session.launch_many(batch) == [0, 0]
        assert [item[4] for _, item in ring.launches[-2:]] == [
            [pytest.approx(float(v), rel=1e-6) for v in p] for p in (values, values[::-1])]
    assert prepares == [], "every launch took the lean path"
    assert ring.plans == 6 and native.unary == []


def test_the_lean_path_never_launches_on_a_reused_segment(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, tensors[:2], tensors[2])
    session.launch(kernel, tensors[:2], tensors[2])
    (old_handle, old_index), = native.registered.items()
    allocator.free(base)
    allocator.allocate(base, 1 << 23)
    session.launch(kernel, tensors[:2], tensors[2])
    ring = native.rings[0]
    assert ring.stale_answers == 1 and native.released == [old_handle]
    _, (_, inputs, output, _, _, _) = ring.launches[-1]
    assert old_index not in {index for index, _ in inputs + [output]}
    assert len(ring.launches) == 3


def test_a_refusal_on_the_lean_path_raises_its_class(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, tensors[:2], tensors[2])
    native.rings[0].outcomes = [_from_native(
        "refused", "ABI_MISMATCH", "ring launch 2 was refused: ABI_MISMATCH", "INVALID_ARGUMENT",
        3, {"path": "ring"})]
    with pytest.raises(ptxd.AbiMismatch):
        session.launch(kernel, tensors[:2], tensors[2])


def test_an_awaited_launch_raises_its_own_refusal_on_that_call(fake, fake_torch):
    # An awaited session (defer_errors=False): each lean-path launch reads
    # its own answer; a refusal is raised, exactly typed, by the call that
    # caused it (which was sent), never by a later one.
    session, native, allocator = fake
    assert not session.defer_errors
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, tensors[:2], tensors[2])  # the general path fills the cache
    ring = native.rings[0]
    # Each reason with the gRPC code the native ring raises it with
    # (ring_code), the unary path's own (BUFFER_TOO_SMALL is OUT_OF_RANGE
    # there: test_host.py).
    reasons = [("ABI_MISMATCH", ptxd.AbiMismatch, "INVALID_ARGUMENT", 3),
               ("BUFFER_TOO_SMALL", ptxd.BufferTooSmall, "OUT_OF_RANGE", 11),
               ("STALE_BUFFER", ptxd.StaleBuffer, "FAILED_PRECONDITION", 9),
               ("SCALAR_ARGS_MISMATCH", ptxd.ScalarArgsMismatch, "INVALID_ARGUMENT", 3)]
    for reason, _, code, value in reasons:
        assert _native.ring_code(reason) == (code, value), reason
    prepares = counting_prepare(session)
    refused_rounds = 0
    for round_ in range(32):
        sent = len(ring.launches)
        if RNG.random() < 0.5:
            reason, cls, code, value = RNG.choice(reasons)
            ticket = RNG.randrange(1, 1 << 20)
            ring.outcomes = [_from_native("refused", reason,
                                          f"ring launch {ticket} was refused: {reason}", code,
                                          value, {"path": "ring", "ticket": str(ticket)})]
            with pytest.raises(cls) as raised:
                session.launch(kernel, tensors[:2], tensors[2])
            assert type(raised.value) is cls, round_
            assert (raised.value.reason, raised.value.code, raised.value.code_value) == (
                reason, code, value)
            assert raised.value.metadata == {"path": "ring", "ticket": str(ticket)}
            refused_rounds += 1
        else:
            ring.outcomes = None
            assert session.launch(kernel, tensors[:2], tensors[2]) == ptxd.Launched(0, False)
        assert len(ring.launches) == sent + 1, "each call sent its own launch, once"
        ring.outcomes = None
    assert prepares == [], "every round took the lean path"
    assert ring.plans == 32, "one resolved plan per lean call"
    assert ring.awaited_calls == 32 + 1
    assert native.unary == []
    assert refused_rounds > 0


class FakeTritonKernel(FakeKernel):
    # A kernel ptxd says no ring carries (ring_launchable false), whatever
    # its contract's text: the client launches it unary.
    ring_launchable = False
    contract = ("params(a: ptr read, b: ptr read, out: ptr written, n: count .u32, "
                "scale: .f32, s0: ptr null, s1: ptr null); block 128 (.reqntid); "
                "grid ceil(n / block × 8); a[n × 4] align 4")


def test_a_kernel_the_ring_cannot_carry_takes_the_unary_path(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    scalar = _client.Kernel(FakeKernel())
    session.launch(scalar, [a, b], out)
    assert len(native.rings[0].launches) == 1, "the scalar-ABI kernel rides the ring"
    triton = _client.Kernel(FakeTritonKernel())
    for _ in range(3):
        session.launch(triton, [a, b], out, args=[0.5])
    batches = []
    native.launch_many = lambda wire: (batches.append(wire), [5] * len(wire))[1]
    session.launch_many([(triton, [a, b], out, None, [0.5])] * 2)
    assert len(native.rings[0].launches) == 1, "no launch of it went to the ring"
    assert len(native.unary) == 3 and [len(b) for b in batches] == [2]
    assert all(n == count for _, _, n, _, _ in native.unary)


class FakeIntKernel(FakeKernel):
    # The scalar ABI with an .s32 and an .f32 param after the count.
    contract = ("params(a: ptr read, b: ptr read, out: ptr written, n: count .s64, k: .s32, "
                "scale: .f32); block <= 256; grid ceil(n / block); a[n × 4] align 4; "
                "b[n × 4] align 4; out[n × 4] align 4")


def test_launch_many_carries_each_launchs_typed_args_on_the_ring(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeIntKernel())
    ks = [RNG.randrange(-2**31, 2**31) for _ in range(3)]
    scales = [RNG.uniform(-4, 4) for _ in range(3)]
    items = [{"kernel": kernel, "inputs": [a, b], "output": out, "args": [ptxd.i32(k), s]}
             for k, s in zip(ks[:2], scales[:2])]
    # A plain int takes the contract's .s32.
    items.append({"kernel": kernel, "inputs": [a, b], "output": out, "args": [ks[2], scales[2]]})
    assert session.launch_many(items) == [0, 0, 0]
    ring = native.rings[0]
    assert [launch[1][5] for launch in ring.launches] == [
        [("i32", k), ("f32", s)] for k, s in zip(ks, scales)
    ]
    assert all(launch[1][4] == [] for launch in ring.launches), "no f32 params besides"
    # Out of range, or a float for the .s32: refused before anything is sent.
    with pytest.raises(OverflowError):
        session.launch_many([{"kernel": kernel, "inputs": [a, b], "output": out,
                              "args": [2**31, 1.0]}])
    with pytest.raises(TypeError, match="takes an int"):
        session.launch_many([{"kernel": kernel, "inputs": [a, b], "output": out,
                              "args": [1.5, 1.0]}])
    assert len(ring.launches) == 3


def test_launch_many_carries_typed_args_on_the_unary_path(fake, monkeypatch):
    session, native, allocator = fake
    monkeypatch.setenv(_client.RING_ENV, "0")
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeArray(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeIntKernel())
    plain = _client.Kernel(FakeKernel())
    k, scale = RNG.randrange(-1000, 1000), RNG.uniform(-1, 1)
    session.launch_many([
        {"kernel": kernel, "inputs": [a, b], "output": out, "args": [ptxd.i32(k), scale]},
        (plain, [a, b], out),
    ])
    (wire, args), = native.batches
    assert len(wire) == 2 and args == [[("i32", k), ("f32", scale)], []]
    # A batch without typed args calls the native function as it always did.
    session.launch_many([(plain, [a, b], out)] * 2)
    assert native.batches[-1][1] is None


def deferred_session(fake):
    session, native, allocator = fake
    session.defer_errors = True
    return session, native, allocator


def ring_refusal(reason: str, ticket: int) -> Any:
    # With the gRPC code the native ring gives the reason.
    return _from_native("refused", reason, f"an earlier deferred launch: ring launch {ticket} "
                        f"was refused: {reason}", *_native.ring_code(reason),
                        {"path": "ring", "ticket": str(ticket), "deferred": "true"})


def test_a_deferred_refusal_is_raised_by_the_next_launch_which_is_not_sent(fake, fake_torch):
    session, native, allocator = deferred_session(fake)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    assert session.launch(kernel, tensors[:2], tensors[2]) == ptxd.Launched(0, False)
    ring = native.rings[0]
    assert len(ring.launches) == 1
    # ptxd refused launch 1 after the call returned.
    ticket = RNG.randrange(1, 1000)
    ring.answered = [ring_refusal("ABI_MISMATCH", ticket)]
    with pytest.raises(ptxd.AbiMismatch) as raised:
        session.launch(kernel, tensors[:2], tensors[2])
    assert raised.value.metadata["deferred"] == "true"
    assert raised.value.metadata["ticket"] == str(ticket)
    assert len(ring.launches) == 1, "the launch that raised was not sent"
    assert native.unary == [], "nor sent another way"
    session.launch(kernel, tensors[:2], tensors[2])
    assert len(ring.launches) == 2
    # wait_answers raises what is still unread; then nothing.
    ring.answered = [ring_refusal("BUFFER_TOO_SMALL", ticket + 1),
                     ring_refusal("ABI_MISMATCH", ticket + 2)]
    with pytest.raises(ptxd.BufferTooSmall) as raised:
        session.wait_answers()
    assert [e.reason for e in raised.value.results] == ["BUFFER_TOO_SMALL", "ABI_MISMATCH"]
    session.wait_answers()


def test_a_sync_launch_in_a_deferred_session_reads_the_earlier_answers_first(fake, fake_torch):
    session, native, allocator = deferred_session(fake)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, tensors[:2], tensors[2])
    ring = native.rings[0]
    ring.answered = [ring_refusal("ABI_MISMATCH", 1)]
    with pytest.raises(ptxd.AbiMismatch):
        session.launch(kernel, tensors[:2], tensors[2], sync=True)
    assert len(ring.launches) == 1
    session.launch(kernel, tensors[:2], tensors[2], sync=True)
    assert len(ring.launches) == 2


def test_the_deferred_path_never_launches_on_a_reused_segment(fake, fake_torch):
    session, native, allocator = deferred_session(fake)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, tensors[:2], tensors[2])
    (old_handle, old_index), = native.registered.items()
    allocator.free(base)
    allocator.allocate(base, 1 << 23)
    session.launch(kernel, tensors[:2], tensors[2])
    ring = native.rings[0]
    assert ring.stale_answers == 1 and native.released == [old_handle]
    _, (_, inputs, output, _, _, _) = ring.launches[-1]
    assert old_index not in {index for index, _ in inputs + [output]}


def test_a_segment_reused_by_tensors_of_other_sizes_gets_a_new_registration(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, tensors[:2], tensors[2])
    (old_handle, old_index), = native.registered.items()
    # Freed, and a segment of another size at the same address holds
    # tensors of another length: other cache keys, the same first address.
    allocator.free(base)
    allocator.allocate(base, RNG.choice([1 << 20, 1 << 22]))
    other = count + RNG.randrange(1, 64)
    fresh = [FakeTensor(base + i * 4 * other, other) for i in range(3)]
    session.launch(kernel, fresh[:2], fresh[2])
    ring = native.rings[0]
    assert native.released == [old_handle]
    _, (_, inputs, output, n, _, _) = ring.launches[-1]
    assert n == other
    assert {index for index, _ in inputs + [output]} == set(native.registered.values()) - {old_index}
    # The old tensors' keys are still cached; a launch on them (their memory
    # now the new segment's) resolves them again, never the old registration.
    session.launch(kernel, tensors[:2], tensors[2])
    _, (_, inputs, output, _, _, _) = ring.launches[-1]
    assert old_index not in {index for index, _ in inputs + [output]}


def test_defer_errors_refuses_auto_reload():
    client = object.__new__(ptxd.Client)
    client._native = None
    with pytest.raises(ValueError, match="do not go together"):
        client.session("x", auto_reload=True, defer_errors=True)


# -- the native resolution (OperandTable.resolve and Ring.launch_plan) ------


class FakeStridedTensor(FakeTensor):
    """A CUDA tensor that is not contiguous (a transposed view)."""

    shape = (2, 2)

    def is_contiguous(self) -> bool:
        return False

    def stride(self) -> Tuple[int, int]:
        return (1, 2)


class FakeHalfTensor(FakeTensor):
    """A contiguous CUDA float16 tensor."""

    def element_size(self) -> int:
        return 2


class FakeCpuTensor(FakeTensor):
    is_cuda = False

    def get_device(self) -> int:
        return -1


def test_the_lean_path_is_one_native_resolution_and_one_plan_launch(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    # Operands at random, distinct places of one segment.
    slots = RNG.sample(range(8), 3)
    a, b, out = (FakeTensor(base + slot * 4 * count, count) for slot in slots)
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], out)
    ring = native.rings[0]
    assert ring.plans == 0, "a miss takes the general path"
    index = next(iter(native.registered.values()))
    for round_ in range(1, 6):
        scale = RNG.uniform(-8, 8)
        session.launch(kernel, (a, b), out, params=[scale])
        assert ring.plans == round_
        stream, (_, inputs, output, n, params, args) = ring.launches[-1]
        assert stream == 0x7700
        assert inputs == [(index, slots[0] * 4 * count), (index, slots[1] * 4 * count)]
        assert output == (index, slots[2] * 4 * count) and n == count and args == []
        assert params == [pytest.approx(scale, rel=1e-6)]
    # The plan's checks: one (address, allocation id) per operand (the ring
    # asks the driver about one address per id).
    resolved = session._operands.resolve(kernel._native, kernel._element_sizes(), [a, b], out,
                                         None, (), (), fake_torch.Tensor)
    assert resolved is not None
    ordinal, plan = resolved
    assert ordinal == 0
    assert plan.checks() == [(t.data_ptr(), allocator.find(base)[2]) for t in (a, b, out)]
    assert plan.keys() == [(0, t.data_ptr(), 4 * count, 4) for t in (a, b, out)]
    assert len(ring.launches) == 6 and native.unary == []


def test_the_native_resolution_leaves_every_refusal_to_the_general_path(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], out)
    ring = native.rings[0]
    resolve = session._operands.resolve

    def resolves(*operands: Any, n: Any = None, sizes: Any = None) -> bool:
        return resolve(kernel._native, sizes or kernel._element_sizes(), list(operands[:-1]),
                       operands[-1], n, (), (), fake_torch.Tensor) is not None

    assert resolves(a, b, out)
    assert not resolves(a, b, out, n=count + 1), "past the tensor, inside the segment"
    assert not resolves(a, b, out, n=-1)
    assert not resolves(a, b, out, sizes=(4, 8, 4)), "an element size the kernel does not take"
    assert not resolves(a, b, FakeTensor(base + 3 * 4 * count, count)), "not cached"
    assert not resolves(a, object(), out)
    # The general path raises each one's typed exception, as before.
    with pytest.raises(ptxd.BufferTooSmall):
        session.launch(kernel, [a, b], out, n=count + 1)
    with pytest.raises(ValueError, match="must not be negative"):
        session.launch(kernel, [a, b], out, n=-1)
    # Neither is an int n the lean path took as one (a bool read as 1), nor
    # a float, nor a param past the f32 range (read as an infinity).
    for n in (True, count - 0.5):
        assert not resolves(a, b, out, n=n)
        with pytest.raises(TypeError, match="n must be an int"):
            session.launch(kernel, [a, b], out, n=n)
    huge = RNG.uniform(3.5e38, 1e300)
    assert resolve(kernel._native, kernel._element_sizes(), [a, b], out, None, (huge,), (),
                   fake_torch.Tensor) is None
    with pytest.raises(OverflowError, match="param 0: .* does not fit an f32"):
        session.launch(kernel, [a, b], out, params=(huge,))
    strided = FakeStridedTensor(base, 4)
    assert not resolves(a, strided, out)
    with pytest.raises(ptxd.NotContiguous):
        session.launch(kernel, [a, strided], out)
    # A float16 output in the same segment, cached as the general path
    # caches it: the kernel takes 4-byte elements.
    half = FakeHalfTensor(base + 3 * 4 * count, count)
    registration = session._operands.get((0, out.data_ptr(), 4 * count, 4))._registration
    session._operands.put((0, half.data_ptr(), 2 * count, 2),
                          _client.Buffer(registration, 3 * 4 * count, 2 * count, 2, count))
    assert not resolves(a, b, half)
    with pytest.raises(ptxd.DtypeMismatch):
        session.launch(kernel, [a, b], half)
    cpu = FakeCpuTensor(base, count)
    assert not resolves(a, cpu, out)
    with pytest.raises(TypeError, match="CPU tensor"):
        session.launch(kernel, [a, cpu], out)
    assert ring.plans == 0 and len(ring.launches) == 1


def test_a_released_registration_is_a_miss_of_the_native_resolution(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], out)
    buffer = session._operands.get((0, a.data_ptr(), 4 * count, 4))
    assert buffer is not None and len(session._operands) == 3
    session.release(buffer)
    assert buffer._registration.released
    with pytest.raises(ValueError, match="stays released"):
        buffer._registration.released = False
    assert session._operands.resolve(kernel._native, kernel._element_sizes(), [a, b], out, None,
                                     (), (), fake_torch.Tensor) is None
    # The launch registers the segment again and launches on the new one.
    session.launch(kernel, [a, b], out)
    ring = native.rings[0]
    _, (_, inputs, output, _, _, _) = ring.launches[-1]
    assert {index for index, _ in inputs + [output]} == {native.registered[
        next(h for h in native.registered if h not in native.released)]}
    session.launch(kernel, [a, b], out)
    assert ring.plans == 1


def test_typed_args_ride_the_plan(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeIntKernel())
    session.launch(kernel, [a, b], out, args=[1, 1.0])
    k, scale = RNG.randrange(-2**31, 2**31), RNG.uniform(-4, 4)
    session.launch(kernel, [a, b], out, args=[k, scale])
    ring = native.rings[0]
    assert ring.plans == 1
    assert ring.launches[-1][1][4:] == ([], [("i32", k), ("f32", scale)])
    with pytest.raises(OverflowError):
        session.launch(kernel, [a, b], out, args=[2**31, 1.0])
    assert len(ring.launches) == 2


def test_a_stale_plan_is_forgotten_and_resolved_again(fake, fake_torch):
    session, native, allocator = deferred_session(fake)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    tensors = [FakeTensor(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, tensors[:2], tensors[2])
    allocator.free(base)
    allocator.allocate(base, 1 << 23)
    ring = native.rings[0]
    # The plan resolves (the table cannot know), the ring's check refuses
    # it, nothing of it is sent, and the keys are forgotten.
    session.launch(kernel, tensors[:2], tensors[2])
    assert ring.plans == 1 and ring.stale_answers == 1 and len(ring.launches) == 2
    assert len(native.registered) == 2
    session.launch(kernel, tensors[:2], tensors[2])
    assert ring.plans == 2 and ring.stale_answers == 1


def test_launch_many_on_cached_tensors_is_one_plan_batch(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, c, d = (FakeTensor(base + i * 4 * count, count) for i in range(4))
    kernel = _client.Kernel(FakeKernel())
    batch = [(kernel, [a, b], c), (kernel, [c, a], d, count // 2)]
    prepares = counting_prepare(session)
    assert session.launch_many(batch) == [0, 0]
    assert prepares == [1, 1], "the first batch resolves through the general path"
    ring = native.rings[0]
    assert ring.plans == 0
    index = next(iter(native.registered.values()))
    assert session.launch_many(batch) == [0, 0]
    assert prepares == [1, 1] and ring.plans == 2 and len(ring.launches) == 4
    (_, first), (_, second) = ring.launches[-2:]
    assert first[1:4] == ([(index, 0), (index, 4 * count)], (index, 8 * count), count)
    assert second[1:4] == ([(index, 8 * count), (index, 0)], (index, 12 * count), count // 2)
    # A refusal keeps its class and position.
    ring.outcomes = [None, _from_native(
        "refused", "ABI_MISMATCH", "ring launch 9 was refused: ABI_MISMATCH", "INVALID_ARGUMENT",
        3, {"path": "ring"})]
    with pytest.raises(ptxd.AbiMismatch) as raised:
        session.launch_many(batch)
    assert raised.value.index == 1 and raised.value.results[0] == 0
    ring.outcomes = None
    # A check the client makes sends the batch to the general path, which
    # raises before anything is sent.
    with pytest.raises(ptxd.BufferTooSmall):
        session.launch_many([(kernel, [a, b], c), (kernel, [a, b], c, count + 1)])
    assert len(ring.launches) == 6


def test_a_deferred_session_s_batch_reads_the_earlier_answers_first(fake, fake_torch):
    session, native, allocator = deferred_session(fake)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, c = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], c)
    ring = native.rings[0]
    ring.answered = [ring_refusal("ABI_MISMATCH", 3)]
    with pytest.raises(ptxd.AbiMismatch) as raised:
        session.launch_many([(kernel, [a, b], c)] * 2)
    assert raised.value.metadata["deferred"] == "true"
    assert len(ring.launches) == 1, "the batch that raised was not sent"
    assert session.launch_many([(kernel, [a, b], c)] * 2) == [0, 0]
    assert ring.plans == 4, "both batches came as plans (the first was read refused)"
    assert len(ring.launches) == 3
    # The batch was deferred too: ptxd refuses its second launch after the
    # call returned; the next launch raises it and is not sent.
    ticket = RNG.randrange(1, 1000)
    ring.answered = [ring_refusal("BUFFER_TOO_SMALL", ticket)]
    with pytest.raises(ptxd.BufferTooSmall) as raised:
        session.launch(kernel, [a, b], c)
    assert raised.value.metadata["ticket"] == str(ticket)
    assert len(ring.launches) == 3
    # And wait_answers() raises one still unread.
    assert session.launch_many([(kernel, [a, b], c)] * 3) == [0, 0, 0]
    ring.answered = [ring_refusal("ABI_MISMATCH", ticket + 1)]
    with pytest.raises(ptxd.AbiMismatch):
        session.wait_answers()
    session.wait_answers()
    assert len(ring.launches) == 6


def test_a_deferred_session_s_batch_on_the_general_path_is_deferred_too(fake):
    session, native, allocator = deferred_session(fake)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    arrays = [FakeArray(base + i * 4 * count, count) for i in range(3)]
    kernel = _client.Kernel(FakeKernel())
    assert session.launch_many([(kernel, arrays[:2], arrays[2])] * 3) == [0, 0, 0]
    ring = native.rings[0]
    assert len(ring.launches) == 3 and ring.plans == 0
    ring.answered = [ring_refusal("ABI_MISMATCH", 2)]
    with pytest.raises(ptxd.AbiMismatch) as raised:
        session.launch_many([(kernel, arrays[:2], arrays[2])] * 2)
    assert raised.value.metadata["deferred"] == "true"
    assert len(ring.launches) == 3, "the batch that raised was not sent"
    # A sync batch waits for its own answers (the fake answers none).
    assert session.launch_many([(kernel, arrays[:2], arrays[2])] * 2, sync=True) == [0, 0]
    assert len(ring.launches) == 5


def test_a_failed_ring_call_on_the_lean_path_is_handled_as_on_the_general_path(fake, fake_torch):
    session, native, allocator = fake
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    a, b, out = (FakeTensor(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch(kernel, [a, b], out)
    # An orphaned ring: raised, dropped, and the next launch opens another.
    native.rings[0].error = ptxd.Error("the executor was lost", reason="RING_ORPHANED")
    with pytest.raises(ptxd.Error) as raised:
        session.launch(kernel, [a, b], out)
    assert raised.value.reason == "RING_ORPHANED" and native.rings[0].plans == 1  # it raised
    session.launch(kernel, [a, b], out)
    assert len(native.rings) == 2 and len(native.rings[1].launches) == 1
    session.launch(kernel, [a, b], out)
    assert native.rings[1].plans == 1
    # A failed stream operation: raised, and the stream goes unary.
    native.rings[1].error = ptxd.CudaError("cuStreamBatchMemOp failed", reason="CUDA")
    with pytest.raises(ptxd.CudaError):
        session.launch(kernel, [a, b], out)
    assert session._rings[(0, 0x7700)] is False
    session.launch(kernel, [a, b], out)
    assert len(native.rings) == 2 and len(native.unary) == 1
    # Refusals of an awaited launch keep their class.
    session._rings.clear()
    session.launch(kernel, [a, b], out)
    native.rings[2].outcomes = [_from_native(
        "refused", "STALE_BUFFER", "ring launch 4 was refused: STALE_BUFFER",
        "FAILED_PRECONDITION", 9, {"path": "ring"})]
    with pytest.raises(ptxd.StaleBuffer):
        session.launch(kernel, [a, b], out)
    assert native.rings[2].plans == 1


@pytest.mark.parametrize("lean", [True, False])
def test_a_deferred_session_s_batch_longer_than_the_ring_is_awaited(fake, fake_torch, lean):
    session, native, allocator = deferred_session(fake)
    base = segment(allocator)
    count = RNG.randrange(16, 4096)
    make = FakeTensor if lean else FakeArray
    a, b, c = (make(base + i * 4 * count, count) for i in range(3))
    kernel = _client.Kernel(FakeKernel())
    session.launch_many([(kernel, [a, b], c)] * 2)
    ring = native.rings[0]
    assert ring.awaited_calls == 0, "a short batch is deferred"
    long = _client.RING_SLOTS + RNG.randrange(1, 64)
    refused_at = RNG.randrange(long)
    ring.outcomes = [None] * long
    ring.outcomes[refused_at] = _from_native(
        "refused", "ABI_MISMATCH", "ring launch 9 was refused: ABI_MISMATCH", "INVALID_ARGUMENT",
        3, {"path": "ring"})
    # Its answers are awaited, so its refusal is raised by it, with .index.
    with pytest.raises(ptxd.AbiMismatch) as raised:
        session.launch_many([(kernel, [a, b], c)] * long)
    assert raised.value.index == refused_at and ring.awaited_calls == 1
    assert ring.plans == (long if lean else 0), "the first batch resolved the general way"
