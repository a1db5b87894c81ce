"""Launches on torch tensors through the session's launch ring: ordering on
the framework's stream by GPU words, a caching-allocator segment freed and
allocated again at the same address, and refusals.

Run with PTXD_GPU_TESTS=1 (tests/gpu/run.sh does); otherwise every test here
is reported as skipped.
"""

from __future__ import annotations

import gc
import time

import pytest

import ptxd
from support import read_ptx

#: ~50 ms of GPU time before each producer: a launch that does not wait for
#: the stream reads the poisoned inputs long before the producer writes.
SLEEP_CYCLES = 50_000_000


def add_f32(session, device):
    return session.load_ptx(read_ptx("add_f32_scalar"), "add_f32_scalar", device=device)


def ring_keys(session):
    return [key for key, ring in session._rings.items() if ring]


def producer_ptxd_consumer(torch, session, device, rounds):
    """Producer (torch), ptxd's kernel, consumer (torch) on one stream with
    no host synchronization, ``rounds`` times; every element of every
    round's result compared with torch's own arithmetic."""
    kernel = add_f32(session, device)
    count = (1 << 20) + 3
    stream = torch.cuda.Stream(device=device)
    generator = torch.Generator(device=device)
    generator.manual_seed(torch.seed())
    with torch.cuda.stream(stream):
        a = torch.full((count,), float("nan"), device=device)
        b = torch.full((count,), float("nan"), device=device)
        out = torch.full((count,), float("nan"), device=device)
        values = [torch.randn(count, device=device, generator=generator) for _ in range(2)]
        results = []
        for round_ in range(rounds):
            # Producer (torch): a sleep on some rounds, then the inputs.
            if round_ % 4 == 0:
                torch.cuda._sleep(SLEEP_CYCLES)
            a.copy_(values[0] * (round_ + 1))
            b.copy_(values[1] - round_)
            # ptxd's kernel, on the current stream (no stream= given).
            session.launch(kernel, [a, b], out)
            # Consumer (torch): reads ptxd's output, then poisons everything,
            # which must wait for ptxd's kernel too.
            results.append(out * 2)
            a.fill_(float("nan"))
            b.fill_(float("nan"))
            out.fill_(float("nan"))
    stream.synchronize()
    for round_, result in enumerate(results):
        expected = (values[0] * (round_ + 1) + (values[1] - round_)) * 2
        assert torch.equal(result, expected), (
            f"round {round_}: {(result != expected).sum().item()} of {count} elements differ"
        )
    # The launches took the ring ordered on this stream, not the IPC events.
    assert ring_keys(session) == [(device.index, stream.cuda_stream)]
    assert not any(session._events.values())


def test_producer_ptxd_consumer_on_one_stream_through_the_ring(torch, gpu_session, device):
    producer_ptxd_consumer(torch, gpu_session, device, rounds=40)


def test_producer_ptxd_consumer_with_deferred_answers(torch, gpu_client, device):
    # The launch returns before ptxd answers: the order on the stream must
    # come from the GPU words alone. Many rounds, fewer sleeps' worth each.
    with gpu_client.session("pytest-gpu-deferred", defer_errors=True) as session:
        producer_ptxd_consumer(torch, session, device, rounds=120)
        session.wait_answers()


def test_a_deferred_refusal_is_raised_by_the_next_launch(torch, gpu_client, device):
    with gpu_client.session("pytest-gpu-deferred", defer_errors=True) as session:
        affine = session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar",
                                  device=device)
        count = 1 << 12
        a = torch.randn(count, device=device)
        out = torch.full((count,), float("nan"), device=device)
        stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            # Warm: the operands cached, the ring open.
            session.launch(affine, [a], out, params=(2.0, 0.5))
            session.wait_answers()
            out.fill_(float("nan"))
            # It takes two params: ptxd refuses, after the call returned.
            assert session.launch(affine, [a], out, params=(1.0,)) == ptxd.Launched(0, False)
            after = out + 1  # the stream is not left waiting on the refused launch
            # ptxd's answer comes back meanwhile; the next launch reads it.
            time.sleep(0.2)
            with pytest.raises(ptxd.AbiMismatch) as deferred:
                session.launch(affine, [a], out, params=(2.0, 0.5))
            stream.synchronize()
            assert torch.isnan(after).all()
            assert torch.isnan(out).all(), "the launch that raised was not sent"
            assert deferred.value.metadata.get("deferred") == "true"
            assert deferred.value.metadata.get("path") == "ring"
            # Then launches go on.
            session.launch(affine, [a], out, params=(2.0, 0.5))
            result = out.clone()
            session.launch(affine, [a], out, params=(1.0,))
        with pytest.raises(ptxd.AbiMismatch):
            session.wait_answers()
        stream.synchronize()
        assert torch.equal(result, a * 2.0 + 0.5)


def test_without_ordering_the_same_sequence_reads_stale_inputs(torch, gpu_session, device):
    """The control: the sequence above with ptxd's launch unordered (Buffers,
    no stream) reads the producer's inputs before they are written, so the
    ordering test can fail."""
    kernel = add_f32(gpu_session, device)
    count = 1 << 20
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        a = torch.full((count,), float("nan"), device=device)
        b = torch.zeros(count, device=device)
        out = torch.zeros(count, device=device)
        stream.synchronize()
        buffers = [gpu_session.register(t) for t in (a, b, out)]
        torch.cuda._sleep(SLEEP_CYCLES)
        a.fill_(1.0)
        gpu_session.launch(kernel, buffers[:2], buffers[2], sync=True)
    stream.synchronize()
    assert torch.isnan(out).all(), "the unordered launch ran after the producer: no race shown"


def test_launch_many_chain_through_the_ring(torch, gpu_session, device):
    kernel = add_f32(gpu_session, device)
    count = 1 << 18
    steps = 300  # more than the ring's slots would not fit one batch: the 256-slot path too
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        x = torch.full((count,), float("nan"), device=device)
        one = torch.ones(count, device=device)
        start = torch.randn(count, device=device)
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(start)
        # x += 1, `steps` times, each launch reading the previous one's output.
        times = gpu_session.launch_many([(kernel, [x, one], x)] * steps)
        result = x.clone()
        x.fill_(float("nan"))
    stream.synchronize()
    assert times == [0] * steps
    expected = start.clone()
    for _ in range(steps):
        expected += 1  # the same f32 additions, in the same order
    assert torch.equal(result, expected), f"{(result != expected).sum().item()} elements differ"


def test_deferred_launch_many_batches_keep_the_stream_order(torch, gpu_client, device):
    # In a defer_errors session a batch returns before ptxd answers (the
    # first one resolved the general way, the rest through the native lean
    # path): x += 1 per launch, each reading the last one's output, a torch
    # producer before and a consumer between the batches, no host sync.
    with gpu_client.session("pytest-gpu-deferred-batch", defer_errors=True) as session:
        kernel = add_f32(session, device)
        count = (1 << 18) + 5
        batches, per_batch = 24, 7
        stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            x = torch.full((count,), float("nan"), device=device)
            one = torch.ones(count, device=device)
            start = torch.randn(count, device=device)
            torch.cuda._sleep(SLEEP_CYCLES)
            x.copy_(start)
            snapshots = []
            for batch in range(batches):
                times = session.launch_many([(kernel, [x, one], x)] * per_batch)
                assert times == [0] * per_batch
                snapshots.append(x * 1)  # a torch consumer between batches
                if batch % 8 == 0:
                    torch.cuda._sleep(SLEEP_CYCLES // 4)
        session.wait_answers()
        stream.synchronize()
        expected = start.clone()
        for batch, snapshot in enumerate(snapshots):
            for _ in range(per_batch):
                expected += 1  # the same f32 additions, in the same order
            assert torch.equal(snapshot, expected), (
                f"batch {batch}: {(snapshot != expected).sum().item()} elements differ"
            )
        assert ring_keys(session) == [(device.index, stream.cuda_stream)]


def test_a_reused_segment_never_launches_against_the_stale_registration(torch, gpu_session, device):
    kernel = add_f32(gpu_session, device)
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    count = 4 << 20  # 16 MiB per operand: one large-pool segment for the three
    whole = torch.randn(3 * count, device=device)
    a, b, out = whole[:count], whole[count : 2 * count], whole[2 * count :]
    gpu_session.launch(kernel, [a, b], out)
    torch.cuda.synchronize(device)
    assert torch.equal(out, a + b)
    old = gpu_session.register(a)._registration
    base = whole.data_ptr()
    del whole, a, b, out
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # cudaFree: the segment is gone

    # Ask for segments of other sizes (torch rounds large ones to 2 MiB)
    # until the driver places one at the old address (it usually does at
    # once). Tensors at the old addresses with the old lengths are then the
    # operand cache's exact keys, over other memory.
    mib2 = (2 << 20) // 4
    kept = []
    reused = None
    for delta in (mib2, -mib2, 2 * mib2, -2 * mib2, 4 * mib2, -4 * mib2):
        candidate = torch.empty(3 * count + delta, device=device)
        if candidate.data_ptr() == base:
            reused = candidate
            break
        kept.append(candidate)
    if reused is None:
        pytest.skip("the driver never placed a new segment at the freed address")
    a2, b2 = reused[:count], reused[count : 2 * count]
    out2 = reused[2 * count : min(3 * count, reused.numel())]
    a2.copy_(torch.randn(count, device=device))
    b2.copy_(torch.randn(count, device=device))
    out2.fill_(float("nan"))
    gpu_session.launch(kernel, [a2, b2], out2)
    torch.cuda.synchronize(device)
    n = out2.numel()
    assert torch.equal(out2, a2[:n] + b2[:n]), "the launch used the freed segment's registration"
    assert old.released, "the freed segment's registration was not released"
    new = gpu_session.register(a2)._registration
    assert new is not old and new.buffer_id != old.buffer_id
    live = {bu["handle"] for bu in gpu_session.buffers()}
    assert old.handle not in live and new.handle in live


def test_a_refusal_through_the_ring_raises_what_the_unary_path_raises(torch, gpu_session, device):
    affine = gpu_session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar", device=device)
    count = 1 << 12
    a = torch.randn(count, device=device)
    out = torch.full((count,), float("nan"), device=device)
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        with pytest.raises(ptxd.AbiMismatch) as ring:
            gpu_session.launch(affine, [a], out, params=(1.0,))  # it takes two
        after = out + 1  # the stream is not left waiting on the refused launch
    stream.synchronize()
    assert torch.isnan(after).all()
    assert ring.value.metadata.get("path") == "ring"
    buffers = [gpu_session.register(t) for t in (a, out)]
    with pytest.raises(ptxd.AbiMismatch) as unary:
        gpu_session.launch(affine, buffers[:1], buffers[1], params=(1.0,))
    assert "path" not in unary.value.metadata
    assert type(ring.value) is type(unary.value)
    assert (ring.value.reason, ring.value.code, ring.value.code_value) == (
        unary.value.reason, unary.value.code, unary.value.code_value
    )
    # A good launch after both, through the same ring.
    with torch.cuda.stream(stream):
        gpu_session.launch(affine, [a], out, params=(2.0, 0.5))
        result = out.clone()
    stream.synchronize()
    assert not torch.isnan(result).any()


def test_an_awaited_refusal_on_the_lean_path_is_raised_by_its_own_call(torch, gpu_session, device):
    # Cached tensors take the lean path (one native call); with answers
    # awaited (the default), a refused launch raises its exact class on that
    # call, the launches around it are accepted, and the stream never waits
    # on a refused launch. launch_many on the lean path reports the refused
    # item's index.
    assert not gpu_session.defer_errors
    affine = gpu_session.load_ptx(read_ptx("affine_f32_scalar"), "affine_f32_scalar", device=device)
    count = (1 << 14) + 5
    a = torch.randn(count, device=device)
    out = torch.full((count,), float("nan"), device=device)
    stream = torch.cuda.Stream(device=device)
    # What each lean-path call returned (None: it handed the launch to the
    # general path), and every general-path resolution: the lean path ran a
    # launch only where it answered and nothing was resolved again.
    lean = gpu_session._operands.launch
    answers = []
    gpu_session._operands.launch = lambda *args: answers.append(lean(*args)) or answers[-1]
    general = gpu_session._prepare
    prepares = []
    gpu_session._prepare = lambda *args, **kwargs: prepares.append(1) or general(*args, **kwargs)
    results = []
    with torch.cuda.stream(stream):
        gpu_session.launch(affine, [a], out, params=(2.0, 0.5))  # fills the cache
        answers.clear()
        prepares.clear()
        for round_ in range(16):
            out.fill_(float("nan"))
            if round_ % 3 == 1:
                with pytest.raises(ptxd.AbiMismatch) as refused:
                    gpu_session.launch(affine, [a], out, params=(1.0,))  # it takes two
                assert type(refused.value) is ptxd.AbiMismatch
                assert refused.value.metadata.get("path") == "ring"
                assert "deferred" not in refused.value.metadata
                results.append((None, out.clone()))
            else:
                scale = float(round_ + 1)
                assert gpu_session.launch(affine, [a], out, params=(scale, 0.5)) == ptxd.Launched(
                    0, False)
                results.append((scale, out.clone()))
        single_prepares = list(prepares)
        with pytest.raises(ptxd.AbiMismatch) as batch:
            gpu_session.launch_many([(affine, [a], out, None, (3.0, 0.25)),
                                     (affine, [a], out, None, (1.0,)),
                                     (affine, [a], out, None, (4.0, 0.25))])
        after_batch = out.clone()
    stream.synchronize()
    assert len(answers) == 16 and all(answer is not None for answer in answers), (
        "every single launch took the lean path", answers)
    assert single_prepares == [], "no single launch fell back to the general path"
    for round_, (scale, got) in enumerate(results):
        if scale is None:
            assert torch.isnan(got).all(), f"round {round_}: the refused launch ran"
        else:
            expected = a * scale + 0.5
            assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6), f"round {round_}"
    assert batch.value.index == 1 and batch.value.results[0] == 0
    assert torch.allclose(after_batch, a * 4.0 + 0.25, rtol=1e-6, atol=1e-6)
