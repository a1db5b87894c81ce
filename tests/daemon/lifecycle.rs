//! The real `ptxd` binary on a temporary socket, driven through the SDK on
//! the host backend: corpus kernels end to end, every refusal reachable
//! without a GPU, sharing and caching, executor death and respawn, bank-full
//! reclamation, client SIGKILL clean-up, drain, and many sessions at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::support::{corpus, executor_pid, f32_buffer, load, meta, random_f32, reason, Daemon};
use half::f16;
use ptxd_client::{
    Client, DeclaredAbi, HostShm, Launch, LoadOptions, SessionEvent, SessionOptions,
};

async fn connect(daemon: &Daemon) -> Client {
    Client::connect(&daemon.target()).await.unwrap()
}

/// How long a test waits for something the daemon does by itself (an
/// executor respawned, a dead client's session closed): far longer than it
/// takes, since a debug daemon on a loaded machine can take seconds.
const SETTLE: Duration = Duration::from_secs(30);

/// Waits (up to [`SETTLE`]) until device 0 is available in a generation
/// other than `old`, and returns it.
async fn new_generation(client: &Client, old: u64) -> ptxd_client::DeviceInfo {
    let deadline = std::time::Instant::now() + SETTLE;
    while std::time::Instant::now() < deadline {
        let device = client.info().await.unwrap().devices[0].clone();
        if device.available && device.generation != old {
            return device;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("device 0 did not come back in a new generation within {SETTLE:?}");
}

#[tokio::test]
async fn add_and_affine_run_on_shared_memory_and_match_the_reference() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("corpus").await.unwrap();

    // add_f32: n not a multiple of any block size, inputs at offsets.
    let n = 10_007;
    let (a, b) = (random_f32(n + 3), random_f32(n + 5));
    let (_a_shm, a_buf) = f32_buffer(&session, Some(&a), n + 3).await;
    let (_b_shm, b_buf) = f32_buffer(&session, Some(&b), n + 5).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n + 1).await;
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    assert_eq!(add.signature().inputs, 2);
    assert_eq!(add.signature().element_sizes, vec![4, 4, 4]);
    let launch = Launch::new([a_buf.at(12), b_buf.at(20)], out_buf.at(4), n as u64).sync(true);
    session.launch(&add, &launch).await.unwrap();
    let out = out_shm.read_f32(0, n + 1).unwrap();
    assert!(
        out[0].is_nan(),
        "the element before the output offset was written"
    );
    for i in 0..n {
        assert_eq!(
            out[i + 1].to_bits(),
            (a[i + 3] + b[i + 5]).to_bits(),
            "element {i}"
        );
    }

    // affine_f32: two float params, narrowed from f64.
    let (x_shm, x_buf) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (y_shm, y_buf) = f32_buffer(&session, None, n).await;
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let (p0, p1) = (
        rand::random::<f64>() * 4.0 - 2.0,
        rand::random::<f64>() - 0.5,
    );
    session
        .launch(
            &affine,
            &Launch::new([x_buf.operand()], y_buf.operand(), n as u64)
                .params([p0, p1])
                .sync(true),
        )
        .await
        .unwrap();
    let (x, y) = (x_shm.read_f32(0, n).unwrap(), y_shm.read_f32(0, n).unwrap());
    for i in 0..n {
        let expected = x[i].mul_add(p0 as f32, p1 as f32);
        assert_eq!(y[i].to_bits(), expected.to_bits(), "element {i}: fma");
    }

    // n = 0 is a successful no-op.
    let (z_shm, z_buf) = f32_buffer(&session, None, 4).await;
    session
        .launch(
            &add,
            &Launch::new([a_buf.operand(), b_buf.operand()], z_buf.operand(), 0).sync(true),
        )
        .await
        .unwrap();
    assert!(z_shm.read_f32(0, 4).unwrap().iter().all(|v| v.is_nan()));
}

#[tokio::test]
async fn silu_mul_f16_matches_the_reference_within_the_approx_tolerance() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("f16").await.unwrap();
    let n = 4099;
    let a: Vec<u16> = (0..n)
        .map(|_| f16::from_f32(rand::random::<f32>() * 16.0 - 8.0).to_bits())
        .collect();
    let b: Vec<u16> = (0..n)
        .map(|_| f16::from_f32(rand::random::<f32>() * 4.0 - 2.0).to_bits())
        .collect();
    let mut shms = Vec::new();
    let mut bufs = Vec::new();
    for data in [&a, &b, &vec![0x7e00u16; n]] {
        let mut shm = HostShm::create((n * 2) as u64).unwrap();
        shm.write_u16(0, data).unwrap();
        bufs.push(session.register_shm(&shm, None).await.unwrap());
        shms.push(shm);
    }
    let kernel = load(&session, "silu_mul_f16_scalar.ptx", "silu_mul_f16_scalar").await;
    assert_eq!(kernel.signature().element_sizes, vec![2, 2, 2]);
    session
        .launch(
            &kernel,
            &Launch::new(
                [bufs[0].operand(), bufs[1].operand()],
                bufs[2].operand(),
                n as u64,
            )
            .sync(true),
        )
        .await
        .unwrap();
    let out = shms[2].read_u16(0, n).unwrap();
    for i in 0..n {
        let x = f64::from(f16::from_bits(a[i]).to_f32());
        let expected = x / (1.0 + (-x).exp()) * f64::from(f16::from_bits(b[i]).to_f32());
        let got = f64::from(f16::from_bits(out[i]).to_f32());
        // One f16 ulp of the result plus ex2.approx's 2^-22 relative error.
        let tolerance = expected.abs() * 2f64.powi(-10) + 2f64.powi(-24);
        assert!(
            (got - expected).abs() <= tolerance,
            "element {i}: {got} vs {expected}"
        );
    }
}

#[tokio::test]
async fn one_compile_is_shared_between_sessions_and_freed_by_the_last() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let (s1, s2, s3) = (
        client.open_session("one").await.unwrap(),
        client.open_session("two").await.unwrap(),
        client.open_session("three").await.unwrap(),
    );
    let k1 = load(&s1, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let k2 = load(&s2, "add_f32_scalar.ptx", "add_f32_scalar").await;
    assert!(!k1.state().cache_hit && k2.state().cache_hit);
    assert_ne!(
        k1.handle(),
        k2.handle(),
        "a cache hit gives the session its own handle"
    );
    assert_eq!(client.info().await.unwrap().slots_used, 1);
    assert_eq!(s2.list_kernels().await.unwrap()[0].references, 2);

    // A session that never loaded it cannot launch it, even with the handle:
    // it is as unknown there as a made-up handle.
    let (_a, a) = f32_buffer(&s3, Some(&[1.0; 8]), 8).await;
    let (_o, o) = f32_buffer(&s3, None, 8).await;
    let err = s3
        .launch(
            &k1,
            &Launch::new([a.operand(), a.operand()], o.operand(), 8),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "STALE_KERNEL");

    assert!(
        !s1.unload(&k1).await.unwrap(),
        "the slot is still held by the other session"
    );
    assert!(
        s2.unload(&k2).await.unwrap(),
        "the last holder frees the slot"
    );
    assert_eq!(client.info().await.unwrap().slots_used, 0);
    let err = s2
        .launch(
            &k2,
            &Launch::new([a.operand(), a.operand()], o.operand(), 8),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "STALE_KERNEL");
}

#[tokio::test]
async fn load_refusals_carry_their_exact_reasons() {
    // Trusted with machine code, so that the host executor's own refusal of
    // a cubin shows (tests/daemon/tenants.rs covers the untrusted refusal).
    let trust = format!("uid:{}", nix::unistd::getuid());
    let daemon = Daemon::start(&[
        "--max-artifact-bytes",
        "65536",
        "--trust-unverified-artifacts",
        &trust,
    ]);
    let client = connect(&daemon).await;
    let session = client.open_session("refusals").await.unwrap();
    let opts = LoadOptions::default;

    // The Vectorized family loads (elements of 16 bytes, n in vectors).
    let vec4 = session
        .load_ptx(0, corpus("add_f32_vec4.ptx"), "add_f32_vec4", opts())
        .await
        .unwrap();
    assert_eq!(vec4.state().signature.element_sizes, vec![16, 16, 16]);
    let contract = vec4.state().signature.contract;
    assert!(
        contract.contains("grid ceil(n / block)") && contract.contains("[n × 16] align 16"),
        "{contract}"
    );
    // A 32-bit index (NVRTC's `int i`): its contract names the
    // precondition every launch is checked against.
    let idx32 = session
        .load_ptx(
            0,
            corpus("jit/nvrtc/add_f32_idx32_O3.ptx"),
            "add_f32_idx32",
            opts(),
        )
        .await
        .unwrap();
    let contract = idx32.state().signature.contract;
    assert!(
        contract.contains("requires index_fits_i32: grid × block <= 2^31"),
        "{contract}"
    );
    // ListKernels shows the same contract.
    let listed = session.list_kernels().await.unwrap();
    assert!(listed
        .iter()
        .any(|k| k.symbol == "add_f32_idx32" && k.signature.contract == contract));
    // A Triton kernel loads with the Triton family's contract: its `.u32`
    // count, its null scratch pointers and 8 elements per thread.
    let triton = session
        .load_ptx(0, corpus("triton_add.ptx"), "add_kernel", opts())
        .await
        .unwrap();
    let contract = &triton.signature().contract;
    for term in [
        "add_kernel_param_3: count .u32",
        "add_kernel_param_4: ptr null",
        "grid ceil(n / block × 8)",
        "add_kernel_param_2[roundup(n, 4) × 4] align 16",
        "requires index_fits_i32: grid × 1024 <= 2^31",
    ] {
        assert!(contract.contains(term), "{term} in {contract}");
    }
    for (file, symbol) in [(
        "nvcc/refused-ptx/grid_stride.sm_90.ptx",
        "grid_stride_scale_f32",
    )] {
        let err = session
            .load_ptx(0, corpus(file), symbol, opts())
            .await
            .unwrap_err();
        assert_eq!(reason(&err), "NON_SCALAR_ABI", "{file}");
        assert!(!meta(&err, "sub_reason").is_empty(), "{file}");
    }

    let missing = session
        .load_ptx(0, corpus("add_f32_scalar.ptx"), "nope", opts())
        .await
        .unwrap_err();
    assert_eq!(reason(&missing), "SYMBOL_NOT_FOUND");
    assert!(meta(&missing, "entries").contains("add_f32_scalar"));

    let garbage = session
        .load_ptx(0, "this is not ptx {", "k", opts())
        .await
        .unwrap_err();
    assert_eq!(reason(&garbage), "INVALID_ARTIFACT");

    let declared = LoadOptions {
        declared: Some(DeclaredAbi {
            inputs: 3,
            scalar_params: 0,
            element_size: 0,
        }),
        ..opts()
    };
    let mismatch = session
        .load_ptx(0, corpus("add_f32_scalar.ptx"), "add_f32_scalar", declared)
        .await
        .unwrap_err();
    assert_eq!(reason(&mismatch), "ABI_MISMATCH");
    assert_eq!(
        (meta(&mismatch, "expected"), meta(&mismatch, "found")),
        ("3", "2")
    );

    let cubin = session
        .load_cubin(
            0,
            vec![0x7f, b'E', b'L', b'F'],
            "k",
            DeclaredAbi {
                inputs: 1,
                scalar_params: 0,
                element_size: 4,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&cubin), "UNSUPPORTED_ARTIFACT");

    // The declared ABI is validated before anything is allocated for it.
    let absurd = session
        .load_cubin(
            0,
            vec![0x7f, b'E', b'L', b'F'],
            "k",
            DeclaredAbi {
                inputs: 4_000_000_000,
                scalar_params: 0,
                element_size: 4,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&absurd), meta(&absurd, "limit")),
        ("LIMIT_EXCEEDED", "kernel_operands")
    );

    let unknown = session
        .load_ptx(7, corpus("add_f32_scalar.ptx"), "add_f32_scalar", opts())
        .await
        .unwrap_err();
    assert_eq!(reason(&unknown), "UNKNOWN_DEVICE");

    let huge = format!("{}\n{}", corpus("add_f32_scalar.ptx"), "//".repeat(40_000));
    let too_big = session
        .load_ptx(0, huge, "add_f32_scalar", opts())
        .await
        .unwrap_err();
    assert_eq!(reason(&too_big), "LIMIT_EXCEEDED");
    assert_eq!(meta(&too_big, "limit"), "max_artifact_bytes");
}

#[tokio::test]
async fn launch_refusals_check_every_operand() {
    let daemon = Daemon::start(&["--host-devices", "2"]);
    let client = connect(&daemon).await;
    let session = client.open_session("launch refusals").await.unwrap();
    let other = client.open_session("other").await.unwrap();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let n = 256usize;
    let (_a, a) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (_b, b) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (out_shm, out) = f32_buffer(&session, None, n).await;
    let (_s, small) = f32_buffer(&session, None, n - 1).await;

    // Bounds: each operand is checked, not just the first.
    for (inputs, output, operand) in [
        ([small.operand(), b.operand()], out.operand(), "input 0"),
        ([a.operand(), small.operand()], out.operand(), "input 1"),
        ([a.operand(), b.operand()], small.operand(), "output"),
        ([a.operand(), b.at(8)], out.operand(), "input 1"),
    ] {
        let err = session
            .launch(&add, &Launch::new(inputs, output, n as u64))
            .await
            .unwrap_err();
        assert_eq!(reason(&err), "BUFFER_TOO_SMALL");
        assert_eq!(meta(&err, "operand"), operand);
    }
    // Misaligned offsets would fault on a GPU.
    let err = session
        .launch(&add, &Launch::new([a.at(2), b.operand()], out.operand(), 8))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "INVALID_ARGUMENT");
    assert_eq!(meta(&err, "field"), "offset");

    // Arity.
    let err = session
        .launch(&add, &Launch::new([a.operand()], out.operand(), 8))
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "what")),
        ("ABI_MISMATCH", "inputs")
    );
    let err = session
        .launch(
            &add,
            &Launch::new([a.operand(), b.operand()], out.operand(), 8).params([1.0]),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "what")),
        ("ABI_MISMATCH", "scalar params")
    );

    // Device mismatch: only the output sits on the second host device.
    let mut far_shm = HostShm::create((n * 4) as u64).unwrap();
    far_shm.write_f32(0, &vec![f32::NAN; n]).unwrap();
    let far = session
        .register_shm(&far_shm, Some("HOST-1"))
        .await
        .unwrap();
    let err = session
        .launch(
            &add,
            &Launch::new([a.operand(), b.operand()], far.operand(), n as u64),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "DEVICE_MISMATCH");
    assert_eq!(meta(&err, "operand"), "output");
    assert!(meta(&err, "operand_device").starts_with("HOST-1@"));
    assert!(
        far_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()),
        "nothing ran"
    );

    // Another session's buffer: as unknown here as one never registered.
    let (_x, theirs) = f32_buffer(&other, Some(&random_f32(n)), n).await;
    let err = session
        .launch(
            &add,
            &Launch::new([a.operand(), theirs.operand()], out.operand(), 8),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "STALE_BUFFER");
    let err = other.release_buffer(&a).await.unwrap_err();
    assert_eq!(reason(&err), "STALE_BUFFER");

    // A released buffer is stale.
    session.release_buffer(&b).await.unwrap();
    let err = session
        .launch(
            &add,
            &Launch::new([a.operand(), b.operand()], out.operand(), 8),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "STALE_BUFFER");
    assert!(
        out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()),
        "no refused launch ran"
    );

    // Registration refusals.
    let err = session
        .register_host_shm("/ptxd-test-does-not-exist", 64, None)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "INVALID_HANDLE");
    let err = session
        .register_cuda_ipc([7u8; 64], "HOST-0", 64)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "UNSUPPORTED_ON_HOST");
    let err = session
        .register_host_shm("/x", 64, Some("GPU-nope"))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "UNKNOWN_DEVICE");
    let shm = HostShm::create(64).unwrap();
    let err = session
        .register_host_shm(shm.name(), 65, None)
        .await
        .unwrap_err();
    assert_eq!(
        reason(&err),
        "INVALID_HANDLE",
        "registering more bytes than the object holds"
    );

    // A closed session is unknown.
    let closed_id = other.id().to_string();
    other.close().await.unwrap();
    let err = client
        .raw()
        .list_buffers(ptxd_proto::v1::ListBuffersRequest { session: closed_id })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn limits_refuse_with_the_limit_named() {
    let daemon = Daemon::start(&[
        "--max-buffers-per-session",
        "2",
        "--max-sessions",
        "2",
        "--max-sessions-per-uid",
        "100%",
    ]);
    let client = connect(&daemon).await;
    let session = client.open_session("limits").await.unwrap();
    let _b1 = f32_buffer(&session, None, 4).await;
    let _b2 = f32_buffer(&session, None, 4).await;
    let shm = HostShm::create(16).unwrap();
    let err = session.register_shm(&shm, None).await.unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "limit")),
        ("LIMIT_EXCEEDED", "max_buffers_per_session")
    );
    let _second = client.open_session("second").await.unwrap();
    let err = client.open_session("third").await.unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "limit")),
        ("LIMIT_EXCEEDED", "max_sessions")
    );
}

#[tokio::test]
async fn an_executor_killed_is_restarted_with_a_new_generation_and_old_kernels_are_stale() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("restart").await.unwrap();
    let mut events = session.events();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let n = 1000;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let before = client.info().await.unwrap().devices[0].clone();
    let pid = executor_pid(&client, 0).await;
    assert!(
        crate::support::shm_mappings(pid, "ptxd") >= 3,
        "the executor maps the registered buffers"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let restarted = tokio::time::timeout(SETTLE, async {
        loop {
            if let Ok(SessionEvent::ExecutorRestarted {
                old_generation,
                new_generation,
                ..
            }) = events.recv().await
            {
                return (old_generation, new_generation);
            }
        }
    })
    .await
    .expect("an ExecutorRestarted event");
    assert_eq!(restarted.0, before.generation);
    let after = client.info().await.unwrap().devices[0].clone();
    assert_eq!(after.generation, restarted.1);
    assert_ne!(after.generation, before.generation);
    assert_eq!(after.restarts, 1);
    assert!(after.available);

    let launch = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64,
    )
    .sync(true);
    let err = session.launch(&add, &launch).await.unwrap_err();
    assert_eq!(reason(&err), "STALE_KERNEL");
    assert!(meta(&err, "why").contains("generation"), "{err}");

    // The buffers were re-opened in the new executor: reload and launch on them.
    let fresh = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    assert!(!fresh.state().cache_hit, "a new generation compiles again");
    session.launch(&fresh, &launch).await.unwrap();
    let out = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "element {i}");
    }
    let new_pid = executor_pid(&client, 0).await;
    assert_ne!(new_pid, pid);
    assert_eq!(crate::support::shm_mappings(new_pid, "ptxd"), 3);
}

#[tokio::test]
async fn the_sdk_reloads_a_stale_kernel_when_asked_to() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client
        .open_session_with(SessionOptions::new("auto").auto_reload_stale(true))
        .await
        .unwrap();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let n = 64;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let pid = executor_pid(&client, 0).await;
    let generation = client.info().await.unwrap().devices[0].generation;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    new_generation(&client, generation).await;
    let launched = session
        .launch(
            &add,
            &Launch::new(
                [a_buf.operand(), b_buf.operand()],
                out_buf.operand(),
                n as u64,
            )
            .sync(true),
        )
        .await
        .unwrap();
    assert!(launched.reloaded);
    let out = out_shm.read_f32(0, n).unwrap();
    assert!((0..n).all(|i| out[i].to_bits() == (a[i] + b[i]).to_bits()));
}

#[tokio::test]
async fn a_full_bank_reclaims_dead_generations_before_refusing() {
    let daemon = Daemon::start(&["--slots", "1"]);
    let client = connect(&daemon).await;
    let session = client.open_session("bank").await.unwrap();
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let err = session
        .load_ptx(
            0,
            corpus("affine_f32_scalar.ptx"),
            "affine_f32_scalar",
            LoadOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "capacity")),
        ("SLOT_BANK_FULL", "1")
    );

    let generation = client.info().await.unwrap().devices[0].generation;
    let pid = executor_pid(&client, 0).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    new_generation(&client, generation).await;
    // The only slot holds a dead generation's kernel: it is reclaimed.
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    assert_eq!(client.info().await.unwrap().slots_used, 1);
    let (_x, x) = f32_buffer(&session, Some(&[1.0; 4]), 4).await;
    let (_y, y) = f32_buffer(&session, None, 4).await;
    let err = session
        .launch(
            &add,
            &Launch::new([x.operand(), x.operand()], y.operand(), 4),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "STALE_KERNEL");
    session
        .launch(
            &affine,
            &Launch::new([x.operand()], y.operand(), 4)
                .params([2.0, 1.0])
                .sync(true),
        )
        .await
        .unwrap();
}

/// Runs only as the child process of `a_killed_client_leaves_nothing_behind`.
#[tokio::test]
async fn client_process_main() {
    let Ok(target) = std::env::var("PTXD_TEST_CLIENT_TARGET") else {
        return;
    };
    let client = Client::connect(&target).await.unwrap();
    let session = client.open_session("doomed").await.unwrap();
    let _kernel = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let mut keep = Vec::new();
    for _ in 0..3 {
        let shm = HostShm::create_named(
            &format!("/ptxd-doomed-{}-{}", std::process::id(), keep.len()),
            4096,
        )
        .unwrap();
        session.register_shm(&shm, None).await.unwrap();
        keep.push(shm);
    }
    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[tokio::test]
async fn a_killed_client_leaves_nothing_behind() {
    use std::io::{BufRead, BufReader};
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let pid = executor_pid(&client, 0).await;
    let baseline = crate::support::shm_mappings(pid, "ptxd-doomed");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            crate::support::test_name(module_path!(), "client_process_main").as_str(),
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("PTXD_TEST_CLIENT_TARGET", daemon.target())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .any(|l| l.map(|l| l.contains("READY")).unwrap_or(false));
    assert!(ready, "the client process did not get ready");
    let info = client.info().await.unwrap();
    assert_eq!((info.sessions, info.slots_used), (1, 1));
    assert_eq!(
        crate::support::shm_mappings(pid, "ptxd-doomed"),
        baseline + 3
    );

    let client_pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    // The killed client could not unlink its shared memory; the daemon's
    // mappings are what this test is about, so tidy the names up here.
    for i in 0..3 {
        let _ = std::fs::remove_file(format!("/dev/shm/ptxd-doomed-{client_pid}-{i}"));
    }
    let started = std::time::Instant::now();
    loop {
        let info = client.info().await.unwrap();
        if info.sessions == 0
            && info.slots_used == 0
            && crate::support::shm_mappings(pid, "ptxd-doomed") == baseline
        {
            break;
        }
        assert!(started.elapsed() < SETTLE, "resources still held: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn many_concurrent_sessions_share_one_compile_and_get_their_own_results() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let mut tasks = Vec::new();
    for task in 0..24 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let session = client.open_session(&format!("s{task}")).await.unwrap();
            let kernel = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
            let n = 513 + task;
            let (a, b) = (random_f32(n), random_f32(n));
            let (_a, a_buf) = f32_buffer(&session, Some(&a), n).await;
            let (_b, b_buf) = f32_buffer(&session, Some(&b), n).await;
            let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
            for _ in 0..5 {
                session
                    .launch(
                        &kernel,
                        &Launch::new(
                            [a_buf.operand(), b_buf.operand()],
                            out_buf.operand(),
                            n as u64,
                        )
                        .sync(true),
                    )
                    .await
                    .unwrap();
            }
            let out = out_shm.read_f32(0, n).unwrap();
            assert!(
                (0..n).all(|i| out[i].to_bits() == (a[i] + b[i]).to_bits()),
                "session {task}"
            );
            (kernel.state().cache_hit, kernel.handle(), session)
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    assert_eq!(
        results.iter().filter(|(hit, _, _)| !hit).count(),
        1,
        "exactly one compile"
    );
    let handles: std::collections::HashSet<_> = results.iter().map(|(_, h, _)| h).collect();
    assert_eq!(handles.len(), results.len(), "every session its own handle");
    assert_eq!(client.info().await.unwrap().slots_used, 1);
    assert_eq!(client.info().await.unwrap().sessions, 24);
    drop(results);
    let started = std::time::Instant::now();
    loop {
        let info = client.info().await.unwrap();
        if info.sessions == 0 && info.slots_used == 0 {
            break;
        }
        assert!(started.elapsed() < SETTLE, "sessions still open: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn launch_stream_answers_in_order_and_survives_a_refusal() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("stream").await.unwrap();
    let kernel = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let n = 128;
    let x = random_f32(n);
    let (_x, x_buf) = f32_buffer(&session, Some(&x), n).await;
    let (y_shm, y_buf) = f32_buffer(&session, None, n).await;
    let (_s, small) = f32_buffer(&session, None, 1).await;
    let mut stream = session.launch_stream().await.unwrap();
    let count = 100u64;
    let mut tags = Vec::new();
    for i in 0..count {
        let output = if i == 50 {
            small.operand()
        } else {
            y_buf.operand()
        };
        let launch = Launch::new([x_buf.operand()], output, n as u64).params([i as f64, 0.0]);
        tags.push(stream.send(&kernel, &launch).await.unwrap());
    }
    for (i, tag) in tags.iter().enumerate() {
        let reply = stream.next().await.unwrap().expect("a reply per request");
        assert_eq!(reply.tag, *tag, "replies in request order");
        if i == 50 {
            assert_eq!(
                reply.outcome.as_ref().err().map(|e| e.reason_name()),
                Some("BUFFER_TOO_SMALL")
            );
        } else {
            assert!(reply.outcome.is_ok(), "launch {i}: {:?}", reply.outcome);
        }
    }
    // The last launch (p0 = 99) ran last on the session's stream.
    let y = y_shm.read_f32(0, n).unwrap();
    assert!((0..n).all(|i| y[i].to_bits() == (x[i] * 99.0).to_bits()));
}

#[tokio::test]
async fn sigterm_drains_sessions_and_removes_the_socket() {
    let mut daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("drain").await.unwrap();
    let mut events = session.events();
    let _buf = f32_buffer(&session, None, 16).await;
    let pid = executor_pid(&client, 0).await;
    let status = daemon.terminate();
    assert!(status.success(), "{status}");
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await {
                Ok(SessionEvent::Draining { .. }) => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    assert!(drained, "the session was told about the drain");
    assert!(!daemon.socket.exists(), "the socket file is removed");
    assert!(
        !crate::support::process_alive(pid as i32),
        "the executor stopped"
    );
}

#[test]
fn a_second_daemon_refuses_a_live_socket() {
    let daemon = Daemon::start(&[]);
    let second = crate::support::run_to_exit(
        crate::support::serve_command("host", &daemon.socket, &[]),
        Duration::from_secs(15),
    );
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("already answers"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // The first daemon still serves.
    assert!(std::os::unix::net::UnixStream::connect(&daemon.socket).is_ok());
}

#[tokio::test]
async fn a_unix_session_cannot_be_used_over_tcp() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let daemon = Daemon::start(&["--tcp", &addr]);
    let unix = connect(&daemon).await;
    let session = unix.open_session("unix").await.unwrap();
    let tcp = Client::connect(&format!("http://{addr}")).await.unwrap();
    assert_eq!(
        tcp.info().await.unwrap().sessions,
        1,
        "TCP reaches the same daemon"
    );
    let err = tcp
        .raw()
        .list_buffers(ptxd_proto::v1::ListBuffersRequest {
            session: session.id().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    // Decoded through the SDK's error type; it names no uid.
    let refused = ptxd_client::Error::from(err);
    assert_eq!(reason(&refused), "NOT_OWNER");
    assert_eq!(meta(&refused, "owner_uid"), "");
    assert_eq!(meta(&refused, "session"), session.id());
    // A TCP session works over TCP.
    let over_tcp = tcp.open_session("tcp").await.unwrap();
    assert!(over_tcp.list_buffers().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_executor_that_does_not_answer_is_killed_and_replaced() {
    let daemon = Daemon::start(&["--executor-timeout", "1s"]);
    let client = connect(&daemon).await;
    let session = client.open_session("hung").await.unwrap();
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let (_x, x) = f32_buffer(&session, Some(&[0.0; 256]), 256).await;
    let (y_shm, y) = f32_buffer(&session, None, 256).await;
    let before = client.info().await.unwrap().devices[0].clone();
    // A hung executor (a stuck driver, say): it answers neither the launch
    // nor the ping that follows the timeout.
    let pid = nix::unistd::Pid::from_raw(executor_pid(&client, 0).await as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let started = std::time::Instant::now();
    let err = session
        .launch(
            &affine,
            &Launch::new([x.operand()], y.operand(), 256)
                .params([1.0, 2.0])
                .sync(true),
        )
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the launch was not cut off"
    );
    assert_eq!(reason(&err), "EXECUTOR_UNAVAILABLE");
    assert!(meta(&err, "cause").contains("did not answer"), "{err}");
    // A new generation serves the same buffers.
    let after = new_generation(&client, before.generation).await;
    assert_ne!(after.generation, before.generation);
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    session
        .launch(
            &affine,
            &Launch::new([x.operand()], y.operand(), 256)
                .params([1.0, 3.0])
                .sync(true),
        )
        .await
        .unwrap();
    assert!(y_shm.read_f32(0, 256).unwrap().iter().all(|v| *v == 3.0));
}
