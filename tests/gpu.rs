//! GPU tests, stage 1: the CUDA executor driven directly over the executor
//! protocol (no daemon front). The test process plays the session: it owns
//! the GPU memory (cuMemAlloc through the SDK's `cuda` module), exports IPC
//! handles and events, and spawns `ptxd executor --backend cuda` as the
//! other process that opens them.
//!
//! Gated by the `gpu-tests` feature (off by default), so machines without a
//! GPU skip the suite by configuration; with the feature on, every test needs
//! a GPU and fails without one. Build and pack with `tests/gpu/build.sh`,
//! run on the GPU machine with `bash .gpu/run.sh`.
//!
//! Tolerances: add and affine are compared bit-exactly (the kernels compute
//! one `add.f32` / one `fma.rn.f32`, and the reference uses `+` /
//! `f32::mul_add`). silu_mul uses `ex2.approx.f32` for the exponential and
//! rounds to half: the reference computes in f32 with `exp` and the result
//! must be within 2 half-precision ulps (relative 2^-9, absolute 2^-23 near
//! zero) of it.

#![cfg(feature = "gpu-tests")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/daemon.rs"]
mod daemon_support;

#[path = "gpu/executor_client.rs"]
mod executor_client;

#[path = "gpu/daemon.rs"]
mod daemon;

#[path = "gpu/fd_mapping.rs"]
mod fd_mapping;

#[path = "gpu/ring.rs"]
mod ring;

#[path = "gpu/ring_timeout.rs"]
mod ring_timeout;

#[path = "gpu/fd.rs"]
mod fd;

#[path = "support/ring_completions.rs"]
mod ring_completions;

#[path = "support/nvcc_ref.rs"]
mod nvcc_ref;

#[path = "gpu/nvcc.rs"]
mod nvcc;

#[path = "support/mutants.rs"]
mod mutants;

#[path = "gpu/canonical.rs"]
mod canonical;

#[path = "gpu/oracle.rs"]
mod oracle;

#[path = "gpu/mps.rs"]
mod mps;

#[path = "gpu/raw_stream.rs"]
mod raw_stream;

#[path = "gpu/recovery.rs"]
mod recovery;

#[path = "support/processes.rs"]
mod processes;

#[path = "gpu/fault_memory.rs"]
mod fault_memory;

use executor_client::*;
use half::f16;
use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use ptxd_proto::executor::{
    request::Op, ArtifactKind, CloseBuffer, CloseStream, FailureKind, Launch, OpenBuffer,
    UnloadModule,
};
use rand::{Rng, SeedableRng};

const POISON_F32: u32 = 0x7fc0_dead;
const POISON_F16: u16 = 0x7e5a;

fn device() -> CudaDevice {
    CudaDevice::open(0).expect("the GPU suite needs a CUDA device")
}

fn rng() -> rand::rngs::StdRng {
    let seed: u64 = rand::rng().random();
    eprintln!("rng seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn upload_f32(dev: &CudaDevice, data: &[f32]) -> DeviceAllocation {
    let mem = dev.alloc(data.len() * 4).unwrap();
    mem.upload(0, data).unwrap();
    mem
}

fn poisoned_f32(dev: &CudaDevice, len: usize) -> DeviceAllocation {
    let mem = dev.alloc(len * 4).unwrap();
    mem.upload(0, &vec![POISON_F32; len]).unwrap();
    mem
}

fn download_u32(mem: &DeviceAllocation, len: usize) -> Vec<u32> {
    let mut out = vec![0u32; len];
    mem.download(0, &mut out).unwrap();
    out
}

/// One session: a device, an executor, and the add/affine/silu modules.
struct Session {
    dev: CudaDevice,
    exec: Executor,
    next_buffer: u64,
}

const ADD: u64 = 1;
const AFFINE: u64 = 2;
const SILU: u64 = 3;

impl Session {
    fn new() -> Self {
        let dev = device();
        let exec = Executor::spawn_cuda(dev.uuid());
        Session {
            dev,
            exec,
            next_buffer: 1,
        }
    }

    fn load_corpus(&mut self) {
        let add = load_op(
            ADD,
            ArtifactKind::Ptx,
            corpus("add_f32_scalar.ptx"),
            "add_f32_scalar",
            2,
            0,
            4,
        );
        assert_eq!(load(&mut self.exec, add), 256);
        let affine = load_op(
            AFFINE,
            ArtifactKind::Ptx,
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            1,
            2,
            4,
        );
        assert_eq!(load(&mut self.exec, affine), 256);
        let silu = load_op(
            SILU,
            ArtifactKind::Ptx,
            corpus("silu_mul_f16_scalar.ptx"),
            "silu_mul_f16_scalar",
            2,
            0,
            2,
        );
        assert_eq!(load(&mut self.exec, silu), 256);
    }

    fn register(&mut self, mem: &DeviceAllocation) -> u64 {
        let id = self.next_buffer;
        self.next_buffer += 1;
        open_buffer(
            &mut self.exec,
            id,
            mem.ipc_handle().unwrap(),
            mem.size() as u64,
            mem.device_uuid(),
        );
        id
    }
}

#[test]
fn probe_lists_the_device_the_sdk_sees() {
    let out = std::process::Command::new(ptxd_bin())
        .args(ptxd::executor::child::ExecutorArgs::cuda_probe().to_args())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let message: ptxd_proto::executor::ExecutorMessage =
        ptxd::executor::protocol::read_frame(&mut out.stdout.as_slice()).unwrap();
    let Some(ptxd_proto::executor::executor_message::Body::Hello(hello)) = message.body else {
        panic!("probe did not write Hello");
    };
    let sdk: Vec<String> = ptxd_client::cuda::devices()
        .unwrap()
        .into_iter()
        .map(|d| d.uuid)
        .collect();
    let probed: Vec<String> = hello.devices.iter().map(|d| d.uuid.clone()).collect();
    assert_eq!(probed, sdk);
    let d0 = &hello.devices[0];
    assert!(
        d0.compute_major >= 7 && d0.total_memory > (1 << 30),
        "{d0:?}"
    );
    eprintln!("probed {d0:?}");
}

#[test]
fn every_scalar_corpus_kernel_matches_the_cpu_reference() {
    let mut s = Session::new();
    assert_eq!(s.exec.hello.backend, "cuda");
    assert_eq!(s.exec.hello.devices[0].uuid, s.dev.uuid());
    s.load_corpus();
    let mut rng = rng();
    // Not a multiple of the block, plus a poisoned tail past n that must
    // survive (the kernel's `i < n` guard).
    let n = 1_000_003usize;
    let tail = 77usize;

    // add_f32_scalar
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3..1e3)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3..1e3)).collect();
    let (da, db, dout) = (
        upload_f32(&s.dev, &a),
        upload_f32(&s.dev, &b),
        poisoned_f32(&s.dev, n + tail),
    );
    let (ia, ib, iout) = (s.register(&da), s.register(&db), s.register(&dout));
    expect_ok(s.exec.call(launch_op(
        ADD,
        vec![operand(ia, 0), operand(ib, 0)],
        operand(iout, 0),
        n as u64,
        vec![],
        1,
        true,
    )));
    let got = download_u32(&dout, n + tail);
    for i in 0..n {
        assert_eq!(got[i], (a[i] + b[i]).to_bits(), "add element {i}");
    }
    assert!(
        got[n..].iter().all(|&x| x == POISON_F32),
        "add wrote past n"
    );

    // affine_f32_scalar: out = in0 * p0 + p1 (one fma)
    let (p0, p1): (f32, f32) = (rng.random_range(-4.0..4.0), rng.random_range(-4.0..4.0));
    let dout2 = poisoned_f32(&s.dev, n + tail);
    let iout2 = s.register(&dout2);
    expect_ok(s.exec.call(launch_op(
        AFFINE,
        vec![operand(ia, 0)],
        operand(iout2, 0),
        n as u64,
        vec![p0, p1],
        1,
        true,
    )));
    let got = download_u32(&dout2, n + tail);
    for i in 0..n {
        assert_eq!(got[i], a[i].mul_add(p0, p1).to_bits(), "affine element {i}");
    }
    assert!(
        got[n..].iter().all(|&x| x == POISON_F32),
        "affine wrote past n"
    );

    // silu_mul_f16_scalar
    let x: Vec<u16> = (0..n)
        .map(|_| f16::from_f32(rng.random_range(-8.0..8.0)).to_bits())
        .collect();
    let y: Vec<u16> = (0..n)
        .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)).to_bits())
        .collect();
    let (dx, dy, dz) = (
        s.dev.alloc(n * 2).unwrap(),
        s.dev.alloc(n * 2).unwrap(),
        s.dev.alloc((n + tail) * 2).unwrap(),
    );
    dx.upload(0, &x).unwrap();
    dy.upload(0, &y).unwrap();
    dz.upload(0, &vec![POISON_F16; n + tail]).unwrap();
    let (ix, iy, iz) = (s.register(&dx), s.register(&dy), s.register(&dz));
    expect_ok(s.exec.call(launch_op(
        SILU,
        vec![operand(ix, 0), operand(iy, 0)],
        operand(iz, 0),
        n as u64,
        vec![],
        1,
        true,
    )));
    let mut z = vec![0u16; n + tail];
    dz.download(0, &mut z).unwrap();
    let mut worst = 0f32;
    for i in 0..n {
        let a = f16::from_bits(x[i]).to_f32();
        let reference = a / (1.0 + (-a).exp()) * f16::from_bits(y[i]).to_f32();
        let got = f16::from_bits(z[i]).to_f32();
        let error = (got - reference).abs();
        let allowed = (reference.abs() * 2f32.powi(-9)).max(2f32.powi(-23));
        assert!(
            error <= allowed,
            "silu element {i}: x={a} y={} got {got} want {reference}",
            f16::from_bits(y[i]).to_f32()
        );
        worst = worst.max(error / allowed);
    }
    assert!(z[n..].iter().all(|&h| h == POISON_F16), "silu wrote past n");
    eprintln!("silu worst error / allowed = {worst}");
    s.exec.shutdown();
}

#[test]
fn n_zero_is_a_successful_no_op() {
    let mut s = Session::new();
    s.load_corpus();
    let (a, out) = (upload_f32(&s.dev, &[1.0; 256]), poisoned_f32(&s.dev, 256));
    let (ia, iout) = (s.register(&a), s.register(&out));
    for sync in [false, true] {
        expect_ok(s.exec.call(launch_op(
            ADD,
            vec![operand(ia, 0), operand(ia, 0)],
            operand(iout, 0),
            0,
            vec![],
            7,
            sync,
        )));
    }
    assert!(download_u32(&out, 256).iter().all(|&x| x == POISON_F32));
    s.exec.shutdown();
}

#[test]
fn operands_at_offsets_inside_one_allocation() {
    let mut s = Session::new();
    s.load_corpus();
    let mut rng = rng();
    // One allocation: [pad | a (n) | pad | b (n) | out (n) | pad], in floats.
    let n = 4099usize;
    let (off_a, off_b, off_out, total) =
        (64usize, 64 + n + 36, 64 + 2 * n + 36, 64 + 3 * n + 36 + 64);
    let mut host = vec![f32::from_bits(POISON_F32); total];
    for i in 0..n {
        host[off_a + i] = rng.random_range(-10.0..10.0);
        host[off_b + i] = rng.random_range(-10.0..10.0);
    }
    let mem = upload_f32(&s.dev, &host);
    let id = s.register(&mem);
    let op = |o: usize| operand(id, (o * 4) as u64);
    expect_ok(s.exec.call(launch_op(
        ADD,
        vec![op(off_a), op(off_b)],
        op(off_out),
        n as u64,
        vec![],
        1,
        true,
    )));
    let got = download_u32(&mem, total);
    for (i, &word) in got.iter().enumerate() {
        let want = if (off_out..off_out + n).contains(&i) {
            (host[off_a + i - off_out] + host[off_b + i - off_out]).to_bits()
        } else {
            host[i].to_bits()
        };
        assert_eq!(word, want, "word {i}");
    }
    // The executor re-checks bounds and alignment instead of faulting.
    let r = s.exec.call(launch_op(
        ADD,
        vec![op(off_a), op(off_b)],
        op(total - n + 1),
        n as u64,
        vec![],
        1,
        true,
    ));
    expect_failure(r, FailureKind::OutOfBounds);
    let r = s.exec.call(launch_op(
        ADD,
        vec![operand(id, 2), op(off_b)],
        op(off_out),
        8,
        vec![],
        1,
        true,
    ));
    expect_failure(r, FailureKind::OutOfBounds);
    s.exec.shutdown();
}

/// Spins one thread for `ns` nanoseconds of %globaltimer.
const SPIN_PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry spin(.param .u64 ns)
{
    .reg .u64 %rd<5>;
    .reg .pred %p;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
    add.u64 %rd3, %rd2, %rd1;
WAIT:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p, %rd4, %rd3;
    @%p bra WAIT;
    ret;
}
"#;

#[test]
fn a_launch_waits_for_the_clients_event() {
    let mut s = Session::new();
    s.load_corpus();
    let n = 1 << 20;
    let (a, b, out) = (
        upload_f32(&s.dev, &vec![1.0; n]),
        upload_f32(&s.dev, &vec![0.5; n]),
        poisoned_f32(&s.dev, n),
    );
    let (ia, ib, iout) = (s.register(&a), s.register(&b), s.register(&out));
    let event = s.dev.ipc_event().unwrap();
    expect_ok(s.exec.call(open_event_op(1, event.ipc_handle().unwrap())));
    let spin_module = s.dev.load_module(SPIN_PTX.as_bytes()).unwrap();
    let spin = spin_module.function("spin").unwrap();
    let stream = s.dev.stream().unwrap();
    let launch_with = |wait_event: u64| {
        Op::Launch(Launch {
            module_id: ADD,
            inputs: vec![operand(ia, 0), operand(ib, 0)],
            output: Some(operand(iout, 0)),
            n: n as u64,
            params: vec![],
            stream: 1,
            wait_event,
            signal_event: 0,
            sync: true,
            ..Default::default()
        })
    };

    // The client's stream: spin 300 ms, then overwrite `a` with 2.0, then
    // record the event.
    let enqueue_update = |value: f32| {
        let mut ns: u64 = 300_000_000;
        let mut params = [(&mut ns as *mut u64).cast::<std::ffi::c_void>()];
        // SAFETY: one u64 parameter, as SPIN_PTX declares; it touches no memory.
        unsafe { spin.launch(&stream, 1, 1, &mut params) }.unwrap();
        stream.fill_u32(&a, 0, value.to_bits(), n).unwrap();
        stream.record(&event).unwrap();
    };

    // Control: without the wait, the launch runs during the spin and sees
    // the old input, so this test can tell waiting from not waiting.
    enqueue_update(2.0);
    expect_ok(s.exec.call(launch_with(0)));
    assert!(
        download_u32(&out, n).iter().all(|&x| x == 1.5f32.to_bits()),
        "control launch did not see the old input"
    );
    stream.synchronize().unwrap();

    enqueue_update(3.0);
    expect_ok(s.exec.call(launch_with(1)));
    assert!(
        download_u32(&out, n).iter().all(|&x| x == 3.5f32.to_bits()),
        "the launch did not wait for the event"
    );

    // Signal: the executor records the (shared) event after its async
    // launch; the client synchronizes on it.
    let mut signalled = launch_with(0);
    if let Op::Launch(l) = &mut signalled {
        l.inputs = vec![operand(ib, 0), operand(ib, 0)];
        l.signal_event = 1;
        l.sync = false;
    }
    expect_ok(s.exec.call(signalled));
    event.synchronize().unwrap();
    assert!(download_u32(&out, n).iter().all(|&x| x == 1.0f32.to_bits()));
    s.exec.shutdown();
}

#[test]
fn bad_registrations_are_refused_with_the_right_kind() {
    let mut s = Session::new();
    let mut rng = rng();
    let garbage: [u8; 64] = std::array::from_fn(|_| rng.random());
    let f = expect_failure(
        s.exec.call(open_ipc_op(1, garbage, 1024, s.dev.uuid())),
        FailureKind::InvalidHandle,
    );
    let cuda_error = f.metadata.get("cuda_error").expect("cuda_error metadata");
    assert!(cuda_error.starts_with("CUDA_ERROR_"), "{f:?}");
    eprintln!("garbage handle: {cuda_error}");

    let mem = s.dev.alloc(1 << 20).unwrap();
    let handle = mem.ipc_handle().unwrap();
    // Larger than the allocation behind the handle.
    let f = expect_failure(
        s.exec.call(open_ipc_op(2, handle, 64 << 20, s.dev.uuid())),
        FailureKind::InvalidHandle,
    );
    assert!(f.metadata.contains_key("allocation_size"), "{f:?}");
    // The claimed device is not the one the memory lives on.
    let other = "GPU-00000000-0000-0000-0000-000000000000";
    let f = expect_failure(
        s.exec.call(open_ipc_op(3, handle, 1024, other)),
        FailureKind::DeviceMismatch,
    );
    assert_eq!(
        f.metadata.get("actual_device").map(String::as_str),
        Some(s.dev.uuid())
    );
    // Host shared memory is not for the CUDA backend.
    let shm = Op::OpenBuffer(OpenBuffer {
        buffer_id: 4,
        source: Some(ptxd_proto::executor::open_buffer::Source::ShmName(
            "/ptxd-x".into(),
        )),
        size: 64,
        claimed_device_uuid: s.dev.uuid().into(),
        owner_uid: None,
        offset: 0,
        allocation_size: 0,
    });
    expect_failure(s.exec.call(shm), FailureKind::InvalidHandle);
    // A short handle.
    let short = Op::OpenBuffer(OpenBuffer {
        buffer_id: 5,
        source: Some(ptxd_proto::executor::open_buffer::Source::CudaIpc(vec![
            0;
            10
        ])),
        size: 64,
        claimed_device_uuid: s.dev.uuid().into(),
        owner_uid: None,
        offset: 0,
        allocation_size: 0,
    });
    expect_failure(s.exec.call(short), FailureKind::InvalidHandle);
    let f = expect_failure(
        s.exec.call(open_event_op(1, garbage)),
        FailureKind::InvalidHandle,
    );
    assert!(f.metadata.contains_key("cuda_error"));
    // Unknown objects.
    expect_failure(
        s.exec.call(Op::CloseBuffer(CloseBuffer { buffer_id: 99 })),
        FailureKind::UnknownObject,
    );
    expect_failure(
        s.exec
            .call(Op::UnloadModule(UnloadModule { module_id: 99 })),
        FailureKind::UnknownObject,
    );
    expect_failure(
        s.exec
            .call(launch_op(99, vec![], operand(1, 0), 1, vec![], 1, true)),
        FailureKind::UnknownObject,
    );
    // The same handle registered twice shares one mapping; closing one
    // registration leaves the other usable.
    s.load_corpus();
    let (a, out) = (upload_f32(&s.dev, &[2.0; 1000]), poisoned_f32(&s.dev, 1000));
    let (ia1, ia2, iout) = (s.register(&a), s.register(&a), s.register(&out));
    expect_ok(s.exec.call(Op::CloseBuffer(CloseBuffer { buffer_id: ia1 })));
    expect_ok(s.exec.call(launch_op(
        ADD,
        vec![operand(ia2, 0), operand(ia2, 0)],
        operand(iout, 0),
        1000,
        vec![],
        3,
        true,
    )));
    assert!(download_u32(&out, 1000)
        .iter()
        .all(|&x| x == 4.0f32.to_bits()));
    expect_ok(s.exec.call(Op::CloseStream(CloseStream { stream: 3 })));
    expect_ok(s.exec.call(Op::CloseBuffer(CloseBuffer { buffer_id: ia2 })));
    s.exec.shutdown();
}

#[test]
fn artifacts_load_with_their_abi_checked() {
    let mut s = Session::new();
    // Malformed PTX: the JIT's error log comes back.
    let bad = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 a) { bogus.instruction; }\n".to_vec();
    let f = expect_failure(
        s.exec
            .call(load_op(1, ArtifactKind::Ptx, bad, "k", 0, 0, 4)),
        FailureKind::InvalidArtifact,
    );
    assert!(
        !f.metadata
            .get("jit_log")
            .map(String::is_empty)
            .unwrap_or(true),
        "{f:?}"
    );
    eprintln!("JIT log: {}", f.metadata["jit_log"]);
    // Missing symbol.
    let add = corpus("add_f32_scalar.ptx");
    expect_failure(
        s.exec
            .call(load_op(2, ArtifactKind::Ptx, add.clone(), "nope", 2, 0, 4)),
        FailureKind::SymbolNotFound,
    );
    // Declared ABI that the compiled parameters contradict.
    expect_failure(
        s.exec.call(load_op(
            3,
            ArtifactKind::Ptx,
            add.clone(),
            "add_f32_scalar",
            1,
            0,
            4,
        )),
        FailureKind::AbiMismatch,
    );
    expect_failure(
        s.exec.call(load_op(
            3,
            ArtifactKind::Ptx,
            add,
            "add_f32_scalar",
            2,
            1,
            4,
        )),
        FailureKind::AbiMismatch,
    );
    // Garbage claiming to be cubin / fatbin never reaches the driver.
    expect_failure(
        s.exec.call(load_op(
            4,
            ArtifactKind::Cubin,
            vec![0x7f, b'E', b'L', b'F'],
            "k",
            0,
            0,
            4,
        )),
        FailureKind::InvalidArtifact,
    );
    expect_failure(
        s.exec.call(load_op(
            4,
            ArtifactKind::Fatbin,
            vec![1, 2, 3],
            "k",
            0,
            0,
            4,
        )),
        FailureKind::InvalidArtifact,
    );

    // cubin and fatbin built on the GPU machine by run.sh (ptxas / nvcc).
    let n = 70_001usize;
    let mut rng = rng();
    let a: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let (da, db) = (upload_f32(&s.dev, &a), upload_f32(&s.dev, &b));
    let (ia, ib) = (s.register(&da), s.register(&db));
    for (module_id, kind, file) in [
        (10, ArtifactKind::Cubin, "add_f32_scalar.cubin"),
        (11, ArtifactKind::Fatbin, "add_f32_scalar.fatbin"),
    ] {
        let image = corpus(file);
        expect_failure(
            s.exec.call(load_op(
                module_id + 100,
                kind,
                image.clone(),
                "add_f32_scalar",
                3,
                0,
                4,
            )),
            FailureKind::AbiMismatch,
        );
        assert_eq!(
            load(
                &mut s.exec,
                load_op(module_id, kind, image, "add_f32_scalar", 2, 0, 4)
            ),
            256
        );
        let out = poisoned_f32(&s.dev, n);
        let iout = s.register(&out);
        expect_ok(s.exec.call(launch_op(
            module_id,
            vec![operand(ia, 0), operand(ib, 0)],
            operand(iout, 0),
            n as u64,
            vec![],
            1,
            true,
        )));
        let got = download_u32(&out, n);
        for i in 0..n {
            assert_eq!(got[i], (a[i] + b[i]).to_bits(), "{file} element {i}");
        }
        expect_ok(s.exec.call(Op::UnloadModule(UnloadModule { module_id })));
        expect_failure(
            s.exec.call(launch_op(
                module_id,
                vec![operand(ia, 0), operand(ib, 0)],
                operand(iout, 0),
                1,
                vec![],
                1,
                true,
            )),
            FailureKind::UnknownObject,
        );
    }
    // reqntid is honoured, and refused when the kernel cannot run it.
    let mut with_req = load_op(
        20,
        ArtifactKind::Ptx,
        corpus("add_f32_scalar.ptx"),
        "add_f32_scalar",
        2,
        0,
        4,
    );
    if let Op::LoadModule(l) = &mut with_req {
        l.reqntid = 128;
    }
    assert_eq!(load(&mut s.exec, with_req), 128);
    s.exec.shutdown();
}

/// Stores to address 0: scalar ABI with one input, faults when launched.
/// (run.sh also builds it into `store_to_null.cubin` for the daemon test.)
const FAULT_PTX: &str = include_str!("gpu/store_to_null.ptx");

fn faulting_session() -> (Session, u64, u64) {
    let mut s = Session::new();
    s.load_corpus();
    let fault = load_op(
        9,
        ArtifactKind::Ptx,
        FAULT_PTX.as_bytes().to_vec(),
        "store_to_null",
        1,
        0,
        4,
    );
    load(&mut s.exec, fault);
    (s, 9, 0)
}

fn client_still_healthy(dev: &CudaDevice) {
    let mut rng = rng();
    let a: Vec<f32> = (0..4096).map(|_| rng.random()).collect();
    let mem = upload_f32(dev, &a);
    let mut back = vec![0f32; 4096];
    mem.download(0, &mut back).unwrap();
    assert_eq!(a, back);
    // And a fresh executor works.
    let mut s = Session::new();
    s.load_corpus();
    let out = poisoned_f32(dev, 4096);
    let (ia, iout) = (s.register(&mem), s.register(&out));
    expect_ok(s.exec.call(launch_op(
        ADD,
        vec![operand(ia, 0), operand(ia, 0)],
        operand(iout, 0),
        4096,
        vec![],
        1,
        true,
    )));
    let got = download_u32(&out, 4096);
    for i in 0..4096 {
        assert_eq!(got[i], (a[i] + a[i]).to_bits());
    }
    s.exec.shutdown();
}

#[test]
fn a_faulting_kernel_ends_only_the_executor() {
    let (mut s, fault, _) = faulting_session();
    let mem = poisoned_f32(&s.dev, 1024);
    let id = s.register(&mem);
    let r = s.exec.call(launch_op(
        fault,
        vec![operand(id, 0)],
        operand(id, 0),
        1024,
        vec![],
        1,
        true,
    ));
    let f = expect_failure(r, FailureKind::KernelFault);
    assert_eq!(
        f.metadata.get("cuda_error").map(String::as_str),
        Some("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{f:?}"
    );
    let (status, fault_message) = s.exec.wait_exit();
    assert_eq!(status.code(), Some(ptxd::executor::child::EXIT_FAULT));
    assert_eq!(
        fault_message.expect("a Fault message").error_name,
        "CUDA_ERROR_ILLEGAL_ADDRESS"
    );
    client_still_healthy(&s.dev);
}

#[test]
fn an_async_fault_is_fatal_at_the_next_call() {
    let (mut s, fault, _) = faulting_session();
    let mem = poisoned_f32(&s.dev, 1024);
    let id = s.register(&mem);
    expect_ok(s.exec.call(launch_op(
        fault,
        vec![operand(id, 0)],
        operand(id, 0),
        1024,
        vec![],
        1,
        false,
    )));
    // Give the kernel time to fault before the next request.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let r = s.exec.call(launch_op(
        ADD,
        vec![operand(id, 0), operand(id, 0)],
        operand(id, 0),
        1024,
        vec![],
        2,
        true,
    ));
    let f = expect_failure(r, FailureKind::KernelFault);
    assert!(f.metadata["cuda_error"].starts_with("CUDA_ERROR_"), "{f:?}");
    let (status, fault_message) = s.exec.wait_exit();
    assert_eq!(status.code(), Some(ptxd::executor::child::EXIT_FAULT));
    assert!(fault_message.is_some());
    client_still_healthy(&s.dev);
}

#[test]
fn sync_launches_of_other_sessions_do_not_block_each_other() {
    let mut s = Session::new();
    s.load_corpus();
    let n = 1 << 16;
    let (a, out1, out2) = (
        upload_f32(&s.dev, &vec![1.25; n]),
        poisoned_f32(&s.dev, n),
        poisoned_f32(&s.dev, n),
    );
    let (ia, i1, i2) = (s.register(&a), s.register(&out1), s.register(&out2));
    // Many sync launches on two streams in flight at once; every reply
    // arrives (in whatever order) and both outputs are right.
    let mut ids = Vec::new();
    for k in 0..50u64 {
        let (stream, out) = if k % 2 == 0 { (1, i1) } else { (2, i2) };
        ids.push(s.exec.send(launch_op(
            ADD,
            vec![operand(ia, 0), operand(ia, 0)],
            operand(out, 0),
            n as u64,
            vec![],
            stream,
            true,
        )));
    }
    for id in ids.into_iter().rev() {
        expect_ok(s.exec.reply(id).expect("reply"));
    }
    for out in [&out1, &out2] {
        assert!(download_u32(out, n).iter().all(|&x| x == 2.5f32.to_bits()));
    }
    expect_ok(s.exec.call(Op::CloseStream(CloseStream { stream: 1 })));
    expect_ok(s.exec.call(Op::CloseStream(CloseStream { stream: 2 })));
    // A launch after CloseStream gets a fresh stream.
    expect_ok(s.exec.call(launch_op(
        ADD,
        vec![operand(ia, 0), operand(ia, 0)],
        operand(i1, 0),
        n as u64,
        vec![],
        1,
        true,
    )));
    s.exec.shutdown();
}
