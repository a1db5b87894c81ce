//! Triton-family kernels through the launch ring on the host backend: the
//! ring checks each launch against the kernel's whole contract (a `.u32`
//! count, footprints of several elements per thread, preconditions, typed
//! scalars, null scratch pointers), exactly as the unary path does, and
//! carries typed scalar args in the descriptor. Every element is compared
//! with a reference, the tail past n stays poisoned, and every refusal is
//! the reason the unary path gives for the same launch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::ring_completions::{next, refusal};
use crate::support::{f32_buffer, load, random_f32, Daemon};
use ptxd_client::ring::OperandRef;
use ptxd_client::{Arg, Buffer, Client, Kernel, Launch, Session};
use rand::Rng;

/// The reason the unary path refuses a launch with ("" when it runs).
async fn unary(session: &Session, kernel: &Kernel, launch: Launch) -> String {
    match session.launch(kernel, &launch.sync(true)).await {
        Ok(_) => String::new(),
        Err(e) => e.reason_name().to_string(),
    }
}

const SCALE_SHIFT: (&str, &str) = (
    "jit/triton/scale_shift_f32_b1024_w4_nodiv.ptx",
    "scale_shift_kernel",
);
const ADD: (&str, &str) = ("jit/triton/add_f32_b1024_w4_nodiv.ptx", "add_kernel");

/// Triton's `scale_shift` (x, out, .u32 n, .f32 scale, .f32 shift, two null
/// scratch pointers; 4 elements per thread) and `add` through the ring with
/// typed args, at random counts that are mostly not multiples of the
/// vector width or the block's 1024 elements: every element equals the
/// reference, nothing past n is written.
#[tokio::test(flavor = "multi_thread")]
async fn triton_kernels_run_through_the_ring_with_typed_args() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-triton").await.unwrap();
    let scale_shift = load(&session, SCALE_SHIFT.0, SCALE_SHIFT.1).await;
    let add = load(&session, ADD.0, ADD.1).await;
    for kernel in [&scale_shift, &add] {
        let signature = kernel.signature();
        assert!(
            signature.contract.contains("count .u32"),
            "{}",
            signature.contract
        );
        assert!(signature.ring_launchable, "{}", signature.contract);
    }
    let cap = 9000;
    let (x, y) = (random_f32(cap), random_f32(cap));
    let (_x_shm, x_buf) = f32_buffer(&session, Some(&x), cap + 16).await;
    let (_y_shm, y_buf) = f32_buffer(&session, Some(&y), cap + 16).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, cap + 16).await;
    let mut ring = session.open_ring(64, 0).await.unwrap();
    let mut rng = rand::rng();
    let mut counts: Vec<usize> = vec![0, 1, 3, 4, 5, 1023, 1024, 1025, 4097, cap];
    counts.extend((0..20).map(|_| rng.random_range(1..=cap)));
    for n in counts {
        let (scale, shift) = (
            rng.random_range(-2.0f32..2.0),
            rng.random_range(-0.5f32..0.5),
        );
        out_shm.write_f32(0, &vec![f32::NAN; cap + 16]).unwrap();
        let ticket = ring
            .launch_args(
                &scale_shift,
                &[(&x_buf, 0)],
                (&out_buf, 0),
                n as u64,
                &[Arg::F32(scale), Arg::F32(shift)],
            )
            .unwrap();
        let done = next(&mut ring);
        assert_eq!((done.ticket, done.outcome), (ticket, Ok(())), "n = {n}");
        let out = out_shm.read_f32(0, cap + 16).unwrap();
        for i in 0..n {
            assert_eq!(
                out[i].to_bits(),
                x[i].mul_add(scale, shift).to_bits(),
                "scale_shift n = {n}: element {i}"
            );
        }
        assert!(
            out[n..].iter().all(|v| v.is_nan()),
            "scale_shift n = {n}: written past n"
        );

        out_shm.write_f32(0, &vec![f32::NAN; cap + 16]).unwrap();
        ring.launch_args(
            &add,
            &[(&x_buf, 0), (&y_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[],
        )
        .unwrap();
        assert_eq!(next(&mut ring).outcome, Ok(()), "add n = {n}");
        let out = out_shm.read_f32(0, cap + 16).unwrap();
        for i in 0..n {
            assert_eq!(
                out[i].to_bits(),
                (x[i] + y[i]).to_bits(),
                "add n = {n}: element {i}"
            );
        }
        assert!(
            out[n..].iter().all(|v| v.is_nan()),
            "add n = {n}: written past n"
        );
    }
}

/// The largest count the unary path accepts for `scale_shift` from `x` to
/// `out` at byte offset `offset` (the footprint's edge), searched down from
/// `start`.
async fn largest_unary_count(
    session: &Session,
    kernel: &Kernel,
    x: &Buffer,
    out: &Buffer,
    offset: u64,
    start: u64,
) -> u64 {
    for n in (start.saturating_sub(64)..=start).rev() {
        let launch =
            Launch::new([x.operand()], out.at(offset), n).args([Arg::F32(1.0), Arg::F32(0.0)]);
        if unary(session, kernel, launch).await.is_empty() {
            return n;
        }
    }
    panic!("no count near {start} fits");
}

/// Footprints, preconditions and scalar args are checked on the ring as on
/// the unary path, each refusal in the launch's own completion, and nothing
/// runs: a footprint one element past the buffer, a count past the
/// kernel's 32-bit count, a mistyped arg, a missing arg, f32 scalars and
/// typed args together.
#[tokio::test(flavor = "multi_thread")]
async fn the_ring_refuses_what_the_contract_refuses() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-triton-refusals").await.unwrap();
    let kernel = load(&session, SCALE_SHIFT.0, SCALE_SHIFT.1).await;
    let len = 4096;
    let x = random_f32(len);
    let (_x_shm, x_buf) = f32_buffer(&session, Some(&x), len).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, len).await;
    let mut ring = session.open_ring(16, 0).await.unwrap();
    let args = [Arg::F32(2.0), Arg::F32(0.5)];

    // The footprint's edge, at a 4-byte offset: the largest count the
    // unary path accepts runs on the ring; one more is refused on both.
    let edge = largest_unary_count(&session, &kernel, &x_buf, &out_buf, 4, len as u64 - 1).await;
    out_shm.write_f32(0, &vec![f32::NAN; len]).unwrap();
    ring.launch_args(&kernel, &[(&x_buf, 0)], (&out_buf, 4), edge, &args)
        .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()), "n = {edge} at offset 4");
    let out = out_shm.read_f32(0, len).unwrap();
    assert!(out[0].is_nan(), "written before the offset");
    for i in 0..edge as usize {
        assert_eq!(
            out[i + 1].to_bits(),
            x[i].mul_add(2.0, 0.5).to_bits(),
            "element {i}"
        );
    }
    assert!(out[edge as usize + 1..].iter().all(|v| v.is_nan()));
    out_shm.write_f32(0, &vec![f32::NAN; len]).unwrap();
    ring.launch_args(&kernel, &[(&x_buf, 0)], (&out_buf, 4), edge + 1, &args)
        .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "BUFFER_TOO_SMALL");
    let launch = Launch::new([x_buf.operand()], out_buf.at(4), edge + 1).args(args);
    assert_eq!(unary(&session, &kernel, launch).await, "BUFFER_TOO_SMALL");

    // Counts past the kernel's 32-bit count and its index: refused by the
    // named precondition, on the ring as on the unary path.
    for n in [1u64 << 31, u64::from(u32::MAX) + 1, u64::MAX] {
        ring.launch_args(&kernel, &[(&x_buf, 0)], (&out_buf, 0), n, &args)
            .unwrap();
        let on_ring = refusal(&next(&mut ring));
        let launch = Launch::new([x_buf.operand()], out_buf.operand(), n).args(args);
        let on_unary = unary(&session, &kernel, launch).await;
        assert_eq!(on_ring, on_unary, "n = {n}");
        assert_eq!(on_ring, "INVALID_ARGUMENT", "n = {n}");
    }

    // Scalar args: a wrong type, one too few, one too many, f32 scalars
    // and typed args together.
    for bad in [
        vec![Arg::F32(2.0), Arg::U32(1)],
        vec![Arg::F64(2.0), Arg::F32(0.5)],
        vec![Arg::F32(2.0)],
        vec![Arg::F32(2.0), Arg::F32(0.5), Arg::F32(1.0)],
    ] {
        ring.launch_args(&kernel, &[(&x_buf, 0)], (&out_buf, 0), 100, &bad)
            .unwrap();
        assert_eq!(refusal(&next(&mut ring)), "SCALAR_ARGS_MISMATCH", "{bad:?}");
        let launch = Launch::new([x_buf.operand()], out_buf.operand(), 100).args(bad.clone());
        assert_eq!(
            unary(&session, &kernel, launch).await,
            "SCALAR_ARGS_MISMATCH",
            "{bad:?}"
        );
    }
    let operand = |b: &Buffer| OperandRef {
        buffer: b.ring_index,
        offset: 0,
    };
    let both = ring
        .indexed_descriptor(
            &kernel,
            &[operand(&x_buf)],
            operand(&out_buf),
            100,
            &[2.0, 0.5],
        )
        .unwrap()
        .with_args(&[
            ptxd_client::ring::TypedArg::F32(2.0),
            ptxd_client::ring::TypedArg::F32(0.5),
        ])
        .unwrap();
    ring.submit(&both).unwrap();
    assert_eq!(refusal(&next(&mut ring)), "SCALAR_ARGS_MISMATCH");
    // Nothing of the refused launches ran.
    assert!(out_shm.read_f32(0, len).unwrap().iter().all(|v| v.is_nan()));
    // f32 scalars (the scalar ABI's way) still launch an all-f32 kernel.
    ring.launch(&kernel, &[(&x_buf, 0)], (&out_buf, 0), 100, &[2.0, 0.5])
        .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    let out = out_shm.read_f32(0, len).unwrap();
    for i in 0..100 {
        assert_eq!(out[i].to_bits(), x[i].mul_add(2.0, 0.5).to_bits());
    }
}

/// Inductor's dynamic 2-D broadcast (`gelu(x + bias[i mod ks0])`, `ks0` a
/// `.u64` arg) through the ring: every element against a reference (to the
/// erf approximation's error), nothing past n written; `ks0 = 0` and a bias
/// one element short of `ks0` refused with the unary path's reasons.
#[tokio::test(flavor = "multi_thread")]
async fn a_broadcast_kernel_runs_through_the_ring_with_its_divisor_arg() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-broadcast").await.unwrap();
    let kernel = load(
        &session,
        "jit/inductor/bias_gelu_2d_f32_dyn_0.ptx",
        "triton_poi_fused_add_gelu_0",
    )
    .await;
    assert!(
        kernel.signature().ring_launchable,
        "{}",
        kernel.signature().contract
    );
    let cap = 6000;
    let x = random_f32(cap);
    let (_x_shm, x_buf) = f32_buffer(&session, Some(&x), cap).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, cap + 16).await;
    let mut ring = session.open_ring(64, 0).await.unwrap();
    let mut rng = rand::rng();
    for _ in 0..6 {
        let ks0 = rng.random_range(1..1500usize);
        let n = rng.random_range(0..=cap);
        let bias = random_f32(ks0);
        let (_b_shm, b_buf) = f32_buffer(&session, Some(&bias), ks0).await;
        out_shm.write_f32(0, &vec![f32::NAN; cap + 16]).unwrap();
        ring.launch_args(
            &kernel,
            &[(&x_buf, 0), (&b_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[Arg::U64(ks0 as u64)],
        )
        .unwrap();
        assert_eq!(next(&mut ring).outcome, Ok(()), "ks0 {ks0} n {n}");
        let out = out_shm.read_f32(0, cap + 16).unwrap();
        for i in 0..n {
            let y = f64::from(x[i] + bias[i % ks0]);
            let want = 0.5 * y * (1.0 + libm::erf(y / std::f64::consts::SQRT_2));
            assert!(
                (f64::from(out[i]) - want).abs() <= 1e-5 * (1.0 + y.abs()),
                "ks0 {ks0} n {n}: element {i}"
            );
        }
        assert!(out[n..].iter().all(|v| v.is_nan()), "written past n");
    }
    let (ks0, n) = (64u64, 512u64);
    let (_b_shm, short) = f32_buffer(&session, Some(&random_f32(63)), 63).await;
    let (_f_shm, full) = f32_buffer(&session, Some(&random_f32(64)), 64).await;
    for (bias, arg) in [(&full, 0u64), (&short, ks0)] {
        let launch = Launch::new([x_buf.operand(), bias.operand()], out_buf.operand(), n)
            .args([Arg::U64(arg)]);
        let want = unary(&session, &kernel, launch).await;
        assert!(!want.is_empty(), "ks0 {arg}: the unary path ran it");
        ring.launch_args(
            &kernel,
            &[(&x_buf, 0), (bias, 0)],
            (&out_buf, 0),
            n,
            &[Arg::U64(arg)],
        )
        .unwrap();
        assert_eq!(refusal(&next(&mut ring)), want, "ks0 {arg}");
    }
}
