//! An adversarial review of the Triton family's LAUNCH side through the
//! real daemon on the host backend (issue 21). The verifier-level classes
//! are in `tests/verifier/triton_attacks.rs`; these attack what a session
//! holding a loaded Triton or Inductor kernel can send: counts at the
//! `roundup(n, g) × s` boundary with buffers of exactly `n × s` bytes,
//! offsets inside a buffer, counts at the 32-bit edges, typed args of every
//! wrong shape, operands in the wrong number, static-shape footprints,
//! another session's buffers, a declared ABI that contradicts the contract,
//! two entries of one module, and the launch ring.
//!
//! Every refusal is asserted with its exact reason and metadata on each
//! launch path (the SDK's unary launch, which takes the packet socket; the
//! gRPC unary call; LaunchStream), and must be the same on all three.
//! Every launch that runs writes into poisoned (NaN) buffers larger than
//! its footprint, and every element is compared: what the contract grants
//! may be written, nothing past it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use crate::support::ring_completions::{next, refusal};
use crate::support::{corpus, executor_pid, f32_buffer, load, meta, random_f32, reason, Daemon};
use ptxd_client::{Arg, Client, DeclaredAbi, Kernel, Launch, LoadOptions, Session};
use ptxd_proto::v1 as pb;

/// Triton 3.6's `add_kernel`, f32, BLOCK_SIZE 1024, 4 warps, `n % 16 == 0`
/// specialised: `.v4.b32` accesses, so `[roundup(n, 4) × 4] align 16`.
const ADD_DIV16: &str = "jit/triton/add_f32_b1024_w4_div16.ptx";
/// The same without the divisibility hint.
const ADD_NODIV: &str = "jit/triton/add_f32_b1024_w4_nodiv.ptx";
/// BLOCK_SIZE 4096, 8 warps: 16 elements per thread.
const ADD_B4096: &str = "jit/triton/add_f32_b4096_w8_div16.ptx";
/// BLOCK_SIZE 256, 4 warps: 2 elements per thread.
const ADD_B256: &str = "jit/triton/add_f32_b256_w4_div16.ptx";
/// `x * scale + shift`, f32, with two `.f32` scalars.
const SCALE_SHIFT: &str = "jit/triton/scale_shift_f32_b1024_w4_nodiv.ptx";
/// Inductor's static-shape add: 65553 elements whatever `n`.
const STATIC_ADD: &str = "jit/inductor/add_f32_static_0.ptx";
const STATIC_NUMEL: usize = 65553;

async fn connect(daemon: &Daemon) -> Client {
    Client::connect(&daemon.target()).await.unwrap()
}

/// The refusal of `launch` on every launch path: the SDK's unary launch
/// (the packet socket), the gRPC unary call and a LaunchStream. Asserts
/// the three agree on the reason, the code and every metadata pair, and
/// returns the first.
async fn refused_everywhere(
    session: &Session,
    kernel: &Kernel,
    launch: &Launch,
) -> ptxd_client::Error {
    let unary = session.launch(kernel, launch).await.unwrap_err();
    let grpc = ptxd_client::Error::from(
        session
            .raw()
            .launch(launch.to_proto(session.id(), kernel.handle(), 7))
            .await
            .unwrap_err(),
    );
    let mut stream = session.launch_stream().await.unwrap();
    stream.send(kernel, launch).await.unwrap();
    let streamed = stream
        .next()
        .await
        .unwrap()
        .expect("a reply")
        .outcome
        .unwrap_err();
    let described =
        |e: &ptxd_client::Error| -> (String, Option<tonic::Code>, BTreeMap<String, String>) {
            (
                reason(e).to_string(),
                e.refusal().map(|r| r.code()),
                e.refusal()
                    .map(|r| r.metadata().clone())
                    .unwrap_or_default(),
            )
        };
    let first = described(&unary);
    assert_eq!(
        described(&grpc),
        first,
        "gRPC vs packet socket: {grpc} / {unary}"
    );
    assert_eq!(
        described(&streamed),
        first,
        "LaunchStream vs packet socket: {streamed} / {unary}"
    );
    unary
}

/// Asserts `err` is BUFFER_TOO_SMALL for `operand` needing `needed` of
/// `have` bytes.
fn assert_too_small(err: &ptxd_client::Error, operand: &str, needed: u128, have: usize) {
    assert_eq!(reason(err), "BUFFER_TOO_SMALL", "{err}");
    assert_eq!(err.refusal().unwrap().code(), tonic::Code::OutOfRange);
    assert_eq!(
        (
            meta(err, "operand"),
            meta(err, "needed_bytes"),
            meta(err, "buffer_bytes")
        ),
        (
            operand,
            needed.to_string().as_str(),
            have.to_string().as_str()
        ),
        "{err}"
    );
}

/// Asserts `err` is the named launch precondition refusing `n`.
fn assert_precondition(err: &ptxd_client::Error, precondition: &str, n: u64) {
    assert_eq!(
        (reason(err), meta(err, "field"), meta(err, "precondition")),
        ("INVALID_ARGUMENT", "launch", precondition),
        "{err}"
    );
    assert!(
        meta(err, "values")
            .split(',')
            .any(|v| v == format!("n={n}")),
        "{err}"
    );
}

/// The rounding granule `g` of operand footprints `[roundup(n, g) × s]`
/// (1 for `[n × s]`), read off the contract text, which must name one
/// shape for every operand.
fn granule(contract: &str) -> u64 {
    let mut granules: Vec<u64> = contract
        .split("; ")
        .filter(|t| t.contains(" align "))
        .map(|t| {
            let bytes = t.split_once('[').unwrap().1.split_once(']').unwrap().0;
            match bytes.strip_prefix("roundup(n, ") {
                Some(rest) => rest.split_once(')').unwrap().0.parse().unwrap(),
                None => {
                    assert!(bytes.starts_with("n × "), "{contract}");
                    1
                }
            }
        })
        .collect();
    granules.dedup();
    assert_eq!(granules.len(), 1, "{contract}");
    granules[0]
}

/// Checks `out` (poisoned, `out.len()` elements) after `a + b` over `n`
/// with footprints rounded to `g`: elements below n are exact, those from
/// n to roundup(n, g) either untouched or exact (the contract grants
/// them: a vector masked on its first lane), and none past that touched.
fn check_add(what: &str, out: &[f32], a: &[f32], b: &[f32], n: usize, g: usize) {
    let granted = n.next_multiple_of(g);
    for (i, got) in out.iter().enumerate() {
        let want = (i < a.len()).then(|| (a[i] + b[i]).to_bits());
        if i < n {
            assert_eq!(Some(got.to_bits()), want, "{what}: element {i} of {n}");
        } else if i < granted {
            assert!(
                got.is_nan() || Some(got.to_bits()) == want,
                "{what}: element {i} (granted, n = {n}) holds {got}"
            );
        } else {
            assert!(
                got.is_nan(),
                "{what}: element {i} past the grant ({granted}) written: {got}"
            );
        }
    }
}

/// Boundaries of `roundup(n, g)` and of the block (`k·g - 1, k·g, k·g + 1`
/// for several k), with buffers of exactly `n × 4` bytes: a launch passes
/// exactly when the rounded footprint fits (the first short operand is
/// named, needing `roundup(n, g) × 4`), on every path; with the rounded
/// bytes it runs and writes nothing past the grant.
#[tokio::test]
async fn the_rounded_footprint_is_owed_in_full_at_every_boundary() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-roundup").await.unwrap();
    for file in [ADD_DIV16, ADD_NODIV, ADD_B4096, ADD_B256] {
        let kernel = load(&session, file, "add_kernel").await;
        let contract = kernel.signature().contract.clone();
        let g = granule(&contract) as usize;
        let mut counts = vec![1, 2, 3, 4, 5, 15, 16, 17];
        for k in [256usize, 1024, 4096] {
            counts.extend([k - 1, k, k + 1, 2 * k - 1, 2 * k + 1]);
        }
        counts.push(1 + rand::random::<u32>() as usize % 20_000);
        for n in counts {
            let (a, b) = (random_f32(n), random_f32(n));
            let granted = n.next_multiple_of(g);
            let needed = granted as u128 * 4;
            // Every operand exactly n × 4 bytes.
            let (_a_shm, a_exact) = f32_buffer(&session, Some(&a), n).await;
            let (_b_shm, b_exact) = f32_buffer(&session, Some(&b), n).await;
            let (out_shm, out_exact) = f32_buffer(&session, None, n).await;
            let launch = Launch::new(
                [a_exact.operand(), b_exact.operand()],
                out_exact.operand(),
                n as u64,
            );
            if granted == n {
                session.launch(&kernel, &launch).await.unwrap();
                check_add(file, &out_shm.read_f32(0, n).unwrap(), &a, &b, n, g);
            } else {
                let err = refused_everywhere(&session, &kernel, &launch).await;
                assert_too_small(&err, "input 0", needed, n * 4);
                // Inputs rounded, the output exact: the output is named.
                let mut padded = a.clone();
                padded.resize(granted, 0.0);
                let (_pa, a_full) = f32_buffer(&session, Some(&padded), granted).await;
                let (_pb, b_full) = f32_buffer(&session, Some(&padded), granted).await;
                let launch = Launch::new(
                    [a_full.operand(), b_full.operand()],
                    out_exact.operand(),
                    n as u64,
                );
                let err = refused_everywhere(&session, &kernel, &launch).await;
                assert_too_small(&err, "output", needed, n * 4);
                assert!(
                    out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()),
                    "{file} n={n}: a refused launch wrote"
                );
            }
            // Rounded bytes and 64 poisoned elements more: it runs.
            let room = granted + 64;
            let mut a_room = a.clone();
            let mut b_room = b.clone();
            a_room.resize(room, 1.0);
            b_room.resize(room, 2.0);
            let (_ar, a_buf) = f32_buffer(&session, Some(&a_room), room).await;
            let (_br, b_buf) = f32_buffer(&session, Some(&b_room), room).await;
            let (out_room, out_buf) = f32_buffer(&session, None, room).await;
            session
                .launch(
                    &kernel,
                    &Launch::new(
                        [a_buf.operand(), b_buf.operand()],
                        out_buf.operand(),
                        n as u64,
                    ),
                )
                .await
                .unwrap();
            check_add(
                &format!("{file} n={n}"),
                &out_room.read_f32(0, room).unwrap(),
                &a_room,
                &b_room,
                n,
                g,
            );
        }
    }
}

/// Offsets inside a buffer: one aligned to the element (4) but not to the
/// `.v4.b32` footprint's 16 is refused by name; an aligned one runs and
/// writes from there (the bytes before it untouched); one whose rounded
/// footprint ends a word past the buffer is refused counting the offset;
/// offsets near `u64::MAX` are refused without overflow.
#[tokio::test]
async fn offsets_inside_a_buffer_honour_the_footprint_alignment() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-offsets").await.unwrap();
    let kernel = load(&session, ADD_DIV16, "add_kernel").await;
    assert!(kernel
        .signature()
        .contract
        .contains("[roundup(n, 4) × 4] align 16"));
    let n = 1001; // rounds to 1004
    let total = 1004 + 16;
    let a = random_f32(total);
    let b = random_f32(total);
    let (_a, a_buf) = f32_buffer(&session, Some(&a), total).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), total).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, total).await;
    for offset in [4u64, 8, 12, 20, 1] {
        for (k, launch) in [
            Launch::new([a_buf.at(offset), b_buf.operand()], out_buf.operand(), n),
            Launch::new([a_buf.operand(), b_buf.at(offset)], out_buf.operand(), n),
            Launch::new([a_buf.operand(), b_buf.operand()], out_buf.at(offset), n),
        ]
        .iter()
        .enumerate()
        {
            let err = refused_everywhere(&session, &kernel, launch).await;
            assert_eq!(
                (reason(&err), meta(&err, "field")),
                ("INVALID_ARGUMENT", "offset"),
                "offset {offset} on operand {k}: {err}"
            );
            assert!(err.to_string().contains("16"), "{err}");
        }
    }
    // Aligned: 16 bytes in, the footprint 1004 × 4 ends 48 bytes before
    // the end (total = 1020 elements).
    let at = 64u64;
    session
        .launch(
            &kernel,
            &Launch::new([a_buf.at(at), b_buf.at(at)], out_buf.at(at), n),
        )
        .await
        .unwrap();
    let out = out_shm.read_f32(0, total).unwrap();
    let skip = (at / 4) as usize;
    assert!(
        out[..skip].iter().all(|v| v.is_nan()),
        "written before the offset"
    );
    check_add(
        "offset 64",
        &out[skip..],
        &a[skip..],
        &b[skip..],
        n as usize,
        4,
    );
    // 32 bytes more: the rounded footprint (4016 bytes) ends past 4080.
    let at = 96u64;
    let err = refused_everywhere(
        &session,
        &kernel,
        &Launch::new([a_buf.operand(), b_buf.operand()], out_buf.at(at), n),
    )
    .await;
    assert_too_small(&err, "output", u128::from(at) + 1004 * 4, total * 4);
    // Aligned offsets past the end and near u64::MAX.
    for at in [(total * 4) as u64, (total * 4 + 16) as u64, u64::MAX - 15] {
        let err = refused_everywhere(
            &session,
            &kernel,
            &Launch::new([a_buf.at(at), b_buf.operand()], out_buf.operand(), n),
        )
        .await;
        assert_too_small(&err, "input 0", u128::from(at) + 1004 * 4, total * 4);
    }
    // The refusals wrote nothing past what the one launch wrote.
    let after = out_shm.read_f32(0, total).unwrap();
    assert!(out
        .iter()
        .zip(&after)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// Counts at the 32-bit edges: `2^31 - 1` keeps both preconditions and is
/// refused for its 8 GiB footprint only; `2^31`, `2^32 - 1`, `2^32`,
/// `2^32 + 1` and `u64::MAX` are refused by `count_fits_i32` before any
/// buffer is looked at (a count past `.u32` is never truncated into a
/// small one); 0 runs and writes nothing.
#[tokio::test]
async fn counts_at_the_32_bit_edges_are_refused_by_name() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-counts").await.unwrap();
    let kernel = load(&session, ADD_DIV16, "add_kernel").await;
    let contract = kernel.signature().contract.clone();
    assert!(
        contract.contains("count_fits_i32: n <= 2147483647"),
        "{contract}"
    );
    let n = 64;
    let (_a, a_buf) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let launch =
        |count: u64| Launch::new([a_buf.operand(), a_buf.operand()], out_buf.operand(), count);
    let err = refused_everywhere(&session, &kernel, &launch((1 << 31) - 1)).await;
    assert_too_small(&err, "input 0", (1u128 << 31) * 4, n * 4);
    for count in [
        1u64 << 31,
        (1 << 31) + 1,
        u64::from(u32::MAX),
        1 << 32,
        (1 << 32) + 1,
        (1 << 32) + 64, // truncated to .u32 it would be 64: a fit
        i64::MAX as u64,
        u64::MAX,
    ] {
        let err = refused_everywhere(&session, &kernel, &launch(count)).await;
        assert_precondition(&err, "count_fits_i32", count);
    }
    session.launch(&kernel, &launch(0)).await.unwrap();
    assert!(out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
    // A 4096-element block (16 per thread): index_fits_i32 is
    // `grid × 4096 <= 2^31`, which 2^31 - 1 keeps.
    let big = load(&session, ADD_B4096, "add_kernel").await;
    let contract = big.signature().contract.clone();
    assert!(contract.contains("index_fits_i32"), "{contract}");
    let err = refused_everywhere(
        &session,
        &big,
        &Launch::new(
            [a_buf.operand(), a_buf.operand()],
            out_buf.operand(),
            (1 << 31) - 1,
        ),
    )
    .await;
    assert_too_small(&err, "input 0", (1u128 << 31) * 4, n * 4);
    // The executor did not restart through any of it.
    let pid = executor_pid(&client, 0).await;
    session.launch(&kernel, &launch(n as u64)).await.unwrap();
    assert_eq!(executor_pid(&client, 0).await, pid);
}

/// Typed args of a Triton kernel with two `.f32` scalars (`x, out, n .u32,
/// scale, shift, scratch, scratch`): every wrong count, wrong type (the
/// count passed as an arg, an int or a double for a float), args and
/// params together, and params of another count are refused with their
/// exact reason on every path; NaN, infinities, -0 and subnormals pass
/// bit for bit.
#[tokio::test]
async fn typed_args_of_a_triton_kernel_are_matched_one_for_one() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-args").await.unwrap();
    let kernel = load(&session, SCALE_SHIFT, "scale_shift_kernel").await;
    let contract = kernel.signature().contract.clone();
    let names: Vec<String> = contract
        .strip_prefix("params(")
        .and_then(|r| r.split(')').next())
        .unwrap()
        .split(", ")
        .filter_map(|p| p.strip_suffix(": .f32"))
        .map(str::to_string)
        .collect();
    assert_eq!(names.len(), 2, "{contract}");
    let n = 2051;
    let x = random_f32(n);
    let (_x, x_buf) = f32_buffer(&session, Some(&x), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n + 8).await;
    let base = Launch::new([x_buf.operand()], out_buf.operand(), n as u64);
    let count = |given: usize| {
        vec![
            ("what", "count".to_string()),
            ("expected", "2".into()),
            ("given", given.to_string()),
        ]
    };
    let ty = |index: usize, expected: &str, given: &str| {
        vec![
            ("what", "type".to_string()),
            ("index", index.to_string()),
            ("param", names[index].clone()),
            ("expected", expected.to_string()),
            ("given", given.to_string()),
        ]
    };
    let cases: Vec<(Launch, Vec<(&str, String)>)> = vec![
        (base.clone().args([Arg::F32(1.0)]), count(1)),
        (
            base.clone()
                .args([Arg::U32(n as u32), Arg::F32(1.0), Arg::F32(2.0)]),
            count(3),
        ),
        (
            base.clone()
                .args([Arg::F32(1.0), Arg::F32(2.0), Arg::U64(0), Arg::U64(0)]),
            count(4),
        ),
        (
            base.clone().args([Arg::U32(1), Arg::F32(2.0)]),
            ty(0, "f32", "u32"),
        ),
        (
            base.clone().args([Arg::I32(-1), Arg::F32(2.0)]),
            ty(0, "f32", "i32"),
        ),
        (
            base.clone().args([Arg::F32(1.0), Arg::F64(2.0)]),
            ty(1, "f32", "f64"),
        ),
        (
            base.clone().args([Arg::F32(1.0), Arg::I64(i64::MIN)]),
            ty(1, "f32", "i64"),
        ),
        (
            base.clone().args([Arg::F64(f64::NAN), Arg::U64(u64::MAX)]),
            ty(0, "f32", "f64"),
        ),
        (
            base.clone()
                .params([1.0, 2.0])
                .args([Arg::F32(1.0), Arg::F32(2.0)]),
            vec![("what", "both".to_string())],
        ),
        (
            base.clone().params([1.0]).args([Arg::F32(1.0)]),
            vec![("what", "both".to_string())],
        ),
    ];
    for (launch, metadata) in &cases {
        let err = refused_everywhere(&session, &kernel, launch).await;
        assert_eq!(reason(&err), "SCALAR_ARGS_MISMATCH", "{launch:?}: {err}");
        assert_eq!(err.refusal().unwrap().code(), tonic::Code::InvalidArgument);
        for (key, value) in metadata {
            assert_eq!(meta(&err, key), value, "{key}: {err}");
        }
    }
    for params in [vec![], vec![1.0], vec![1.0, 2.0, 3.0]] {
        let err = refused_everywhere(&session, &kernel, &base.clone().params(params.clone())).await;
        assert_eq!(
            (
                reason(&err),
                meta(&err, "what"),
                meta(&err, "expected"),
                meta(&err, "found")
            ),
            (
                "ABI_MISMATCH",
                "scalar params",
                "2",
                params.len().to_string().as_str()
            ),
            "{err}"
        );
    }
    assert!(out_shm
        .read_f32(0, n + 8)
        .unwrap()
        .iter()
        .all(|v| v.is_nan()));
    // Special floats pass through unchanged.
    let nan_payload = f32::from_bits(0x7fc0_1234);
    for (scale, shift) in [
        (f32::INFINITY, 0.0),
        (f32::NEG_INFINITY, -0.0),
        (nan_payload, 1.0),
        (1.0, f32::NAN),
        (-0.0, -0.0),
        (f32::from_bits(1), f32::MIN_POSITIVE),
        (f32::MAX, f32::MAX),
    ] {
        let (shm, buf) = f32_buffer(&session, None, n + 8).await;
        session
            .launch(
                &kernel,
                &Launch::new([x_buf.operand()], buf.operand(), n as u64)
                    .args([Arg::F32(scale), Arg::F32(shift)]),
            )
            .await
            .unwrap();
        let out = shm.read_f32(0, n + 8).unwrap();
        for i in 0..n {
            let want = x[i].mul_add(scale, shift);
            assert!(
                out[i].to_bits() == want.to_bits() || (out[i].is_nan() && want.is_nan()),
                "scale {scale:e} shift {shift:e}: element {i}: {} vs {want}",
                out[i]
            );
        }
        assert!(out[n..].iter().all(|v| v.is_nan()), "written past n");
    }
}

/// Operands in the wrong number: the null scratch pointers are not
/// operands (passing buffers for them is an arity refusal), nor is a
/// missing input or output accepted.
#[tokio::test]
async fn operands_in_the_wrong_number_are_refused() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-arity").await.unwrap();
    let kernel = load(&session, ADD_DIV16, "add_kernel").await;
    let contract = kernel.signature().contract.clone();
    assert!(
        contract.contains("add_kernel_param_4: ptr null"),
        "{contract}"
    );
    let n = 256;
    let (_a, a_buf) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    for inputs in [0usize, 1, 3, 4, 5] {
        let launch = Launch::new(vec![a_buf.operand(); inputs], out_buf.operand(), n as u64);
        let err = refused_everywhere(&session, &kernel, &launch).await;
        assert_eq!(
            (
                reason(&err),
                meta(&err, "what"),
                meta(&err, "expected"),
                meta(&err, "found")
            ),
            ("ABI_MISMATCH", "inputs", "2", inputs.to_string().as_str()),
            "{err}"
        );
    }
    // No output at all (only the wire can say so).
    let mut request = Launch::new(
        [a_buf.operand(), a_buf.operand()],
        out_buf.operand(),
        n as u64,
    )
    .to_proto(session.id(), kernel.handle(), 1);
    request.output = None;
    let err = ptxd_client::Error::from(session.raw().launch(request).await.unwrap_err());
    assert_eq!(
        (reason(&err), meta(&err, "field")),
        ("INVALID_ARGUMENT", "output"),
        "{err}"
    );
    assert!(out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
}

/// A static-shape Inductor kernel touches `numel` elements whatever `n`:
/// its footprint is the constant `numel × 4`, so a small buffer is refused
/// even for a small n, and with room past `numel` nothing past it is
/// written even when n is larger.
#[tokio::test]
async fn a_static_shape_kernel_owes_its_whole_shape() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("inductor-static").await.unwrap();
    let kernel = load(&session, STATIC_ADD, "triton_poi_fused_add_0").await;
    let contract = kernel.signature().contract.clone();
    let needed = (STATIC_NUMEL * 4) as u128;
    assert!(
        contract.contains(&format!("[{needed}]")),
        "a constant footprint: {contract}"
    );
    for n in [1usize, 16, 1024, STATIC_NUMEL - 1] {
        let (_a, a_buf) = f32_buffer(&session, Some(&random_f32(n)), n).await;
        let (_o, out_buf) = f32_buffer(&session, None, STATIC_NUMEL).await;
        let err = refused_everywhere(
            &session,
            &kernel,
            &Launch::new(
                [a_buf.operand(), a_buf.operand()],
                out_buf.operand(),
                n as u64,
            ),
        )
        .await;
        assert_too_small(&err, "input 0", needed, n * 4);
    }
    let room = STATIC_NUMEL + 4096;
    let (a, b) = (random_f32(room), random_f32(room));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), room).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), room).await;
    for n in [1usize, 1000, STATIC_NUMEL, STATIC_NUMEL + 1, room] {
        let (out_shm, out_buf) = f32_buffer(&session, None, room).await;
        session
            .launch(
                &kernel,
                &Launch::new(
                    [a_buf.operand(), b_buf.operand()],
                    out_buf.operand(),
                    n as u64,
                ),
            )
            .await
            .unwrap();
        let out = out_shm.read_f32(0, room).unwrap();
        for (i, got) in out.iter().enumerate() {
            let want = (a[i] + b[i]).to_bits();
            if i < n.min(STATIC_NUMEL) {
                assert_eq!(got.to_bits(), want, "n={n}: element {i}");
            } else if i < STATIC_NUMEL {
                // Blocks past n's grid may or may not run: granted.
                assert!(got.is_nan() || got.to_bits() == want, "n={n}: element {i}");
            } else {
                assert!(got.is_nan(), "n={n}: element {i} past numel written");
            }
        }
    }
}

/// Another session's buffer is not an operand of a Triton launch, as
/// input or output: refused as a handle the session does not hold, and
/// the other session's data is untouched.
#[tokio::test]
async fn another_sessions_buffer_is_not_an_operand() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let victim = client.open_session("victim").await.unwrap();
    let attacker = client.open_session("attacker").await.unwrap();
    let kernel = load(&attacker, ADD_DIV16, "add_kernel").await;
    let n = 1024;
    let secret = random_f32(n);
    let (secret_shm, secret_buf) = f32_buffer(&victim, Some(&secret), n).await;
    let (_mine, mine) = f32_buffer(&attacker, Some(&random_f32(n)), n).await;
    let (out_shm, out_buf) = f32_buffer(&attacker, None, n).await;
    let mut reasons = Vec::new();
    for launch in [
        Launch::new(
            [secret_buf.operand(), mine.operand()],
            out_buf.operand(),
            n as u64,
        ),
        Launch::new(
            [mine.operand(), mine.operand()],
            secret_buf.operand(),
            n as u64,
        ),
    ] {
        let err = refused_everywhere(&attacker, &kernel, &launch).await;
        reasons.push(reason(&err));
    }
    // A made-up handle is refused the same way.
    let mut fake = secret_buf.operand();
    fake.buffer = fake.buffer.replace(|c: char| c.is_ascii_digit(), "7");
    let err = refused_everywhere(
        &attacker,
        &kernel,
        &Launch::new([fake, mine.operand()], out_buf.operand(), n as u64),
    )
    .await;
    reasons.push(reason(&err));
    assert!(reasons.iter().all(|r| *r == "STALE_BUFFER"), "{reasons:?}");
    let after = secret_shm.read_f32(0, n).unwrap();
    assert!(secret
        .iter()
        .zip(&after)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
}

/// A declared ABI that contradicts the contract is refused at load with
/// what the contract says; one that agrees loads the same contract.
#[tokio::test]
async fn a_declared_abi_cannot_contradict_the_contract() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-declared").await.unwrap();
    let declared = |inputs, scalar_params, element_size| LoadOptions {
        declared: Some(DeclaredAbi {
            inputs,
            scalar_params,
            element_size,
        }),
        ..LoadOptions::default()
    };
    for (file, symbol, inputs, scalars) in [
        (ADD_DIV16, "add_kernel", 2u32, 0u32),
        (SCALE_SHIFT, "scale_shift_kernel", 1, 2),
    ] {
        for (di, ds) in [
            (inputs + 1, scalars),
            (inputs - 1, scalars),
            (inputs, scalars + 1),
            (inputs + 2, 0),       // the null scratch pointers as inputs
            (inputs, scalars + 3), // the count and scratch as scalars
        ] {
            if (di, ds) == (inputs, scalars) {
                continue;
            }
            let err = session
                .load_ptx(0, corpus(file), symbol, declared(di, ds, 0))
                .await
                .unwrap_err();
            assert_eq!(reason(&err), "ABI_MISMATCH", "{file} ({di}, {ds}): {err}");
        }
        let honest = session
            .load_ptx(0, corpus(file), symbol, declared(inputs, scalars, 4))
            .await
            .unwrap();
        let plain = load(&session, file, symbol).await;
        assert_eq!(honest.signature().contract, plain.signature().contract);
    }
}

/// The first entry of `file` (from `.visible .entry` to its closing brace)
/// with every `old` renamed `new`.
fn entry_of(file: &str, old: &str, new: &str) -> String {
    let text = corpus(file);
    let start = text.find(".visible .entry").unwrap();
    let end = start + text[start..].find("\n}\n").unwrap() + 3;
    text[start..end].replace(old, new)
}

/// Two entries of one module, with different contracts and operations
/// (a divisibility-specialised add whose footprint rounds to 4, and a
/// `nodiv` mul whose footprint does not), and a third entry that is the
/// add's body under another name: each symbol is held to its own contract
/// and runs its own code, in either load order and across sessions.
#[tokio::test]
async fn two_entries_of_one_module_keep_their_own_contracts() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-two-entries").await.unwrap();
    let text = corpus(ADD_DIV16);
    let header = &text[..text.find(".visible .entry").unwrap()];
    let module = format!(
        "{header}{}\n{}\n{}",
        entry_of(ADD_DIV16, "add_kernel", "add_v4"),
        entry_of(
            "jit/triton/mul_f32_b1024_w4_nodiv.ptx",
            "mul_kernel",
            "mul_v1"
        ),
        entry_of(ADD_DIV16, "add_kernel", "add_again"),
    );
    let opts = LoadOptions::default;
    let mul = session
        .load_ptx(0, module.clone(), "mul_v1", opts())
        .await
        .unwrap();
    let add = session
        .load_ptx(0, module.clone(), "add_v4", opts())
        .await
        .unwrap();
    let again = session
        .load_ptx(0, module.clone(), "add_again", opts())
        .await
        .unwrap();
    let (cm, ca) = (
        mul.signature().contract.clone(),
        add.signature().contract.clone(),
    );
    assert_eq!(granule(&ca), 4, "{ca}");
    assert_eq!(granule(&cm), 1, "{cm}");
    assert_eq!(
        again.signature().contract,
        ca.replace("add_v4", "add_again")
    );
    let n = 4097; // 4097 × 4 is not a multiple of 16
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let exact = Launch::new(
        [a_buf.operand(), b_buf.operand()],
        out_buf.operand(),
        n as u64,
    );
    for kernel in [&add, &again] {
        let err = refused_everywhere(&session, kernel, &exact).await;
        assert_too_small(&err, "input 0", 4100 * 4, n * 4);
    }
    session.launch(&mul, &exact).await.unwrap();
    let out = out_shm.read_f32(0, n).unwrap();
    for i in 0..n {
        assert_eq!(
            out[i].to_bits(),
            (a[i] * b[i]).to_bits(),
            "mul_v1: element {i}"
        );
    }
    // With room, each add entry adds.
    let room = 4100 + 16;
    let (mut ar, mut br) = (a.clone(), b.clone());
    ar.resize(room, 1.0);
    br.resize(room, 2.0);
    let (_ar, ar_buf) = f32_buffer(&session, Some(&ar), room).await;
    let (_br, br_buf) = f32_buffer(&session, Some(&br), room).await;
    for (what, kernel) in [("add_v4", &add), ("add_again", &again)] {
        let (shm, buf) = f32_buffer(&session, None, room).await;
        session
            .launch(
                kernel,
                &Launch::new(
                    [ar_buf.operand(), br_buf.operand()],
                    buf.operand(),
                    n as u64,
                ),
            )
            .await
            .unwrap();
        check_add(what, &shm.read_f32(0, room).unwrap(), &ar, &br, n, 4);
    }
    // Loaded in the other order in a fresh session (the cache shares slots
    // across sessions): the same contracts.
    let other = client.open_session("triton-two-entries-2").await.unwrap();
    for (symbol, contract) in [
        ("add_again", &again.signature().contract),
        ("add_v4", &ca),
        ("mul_v1", &cm),
    ] {
        let k = other
            .load_ptx(0, module.clone(), symbol, opts())
            .await
            .unwrap();
        assert_eq!(&k.signature().contract, contract, "{symbol}");
    }
}

/// A Triton kernel on a launch ring (granted with its whole contract),
/// loaded before or after the ring opened: each ring launch runs within its
/// contract, every element compared, exactly as its unary launch does.
#[tokio::test(flavor = "multi_thread")]
async fn a_triton_kernel_on_a_ring_runs_within_its_contract() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-ring").await.unwrap();
    // Loaded both before and after the ring opens.
    let before = load(&session, ADD_NODIV, "add_kernel").await;
    let mut ring = session.open_ring(16, 0).await.unwrap();
    let after = load(&session, ADD_DIV16, "add_kernel").await;
    assert!(before.signature().ring_launchable && after.signature().ring_launchable);
    let n = 4096;
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), n).await;
    for kernel in [&before, &after] {
        let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
        ring.launch(
            kernel,
            &[(&a_buf, 0), (&b_buf, 0)],
            (&out_buf, 0),
            n as u64,
            &[],
        )
        .unwrap();
        let completion = next(&mut ring);
        assert_eq!(completion.outcome, Ok(()), "{completion:?}");
        check_add("ring", &out_shm.read_f32(0, n).unwrap(), &a, &b, n, 4);
    }
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    session
        .launch(
            &after,
            &Launch::new(
                [a_buf.operand(), b_buf.operand()],
                out_buf.operand(),
                n as u64,
            ),
        )
        .await
        .unwrap();
    check_add("unary", &out_shm.read_f32(0, n).unwrap(), &a, &b, n, 4);
}

/// The packet socket, the gRPC call and LaunchStream share one decode and
/// one check: a malformed arg (no value) is INVALID_ARGUMENT `args` on
/// the gRPC call, and a launch whose kernel handle is another session's
/// is refused alike on every path.
#[tokio::test]
async fn every_path_refuses_another_sessions_kernel_alike() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let owner = client.open_session("owner").await.unwrap();
    let other = client.open_session("other").await.unwrap();
    let kernel = load(&owner, SCALE_SHIFT, "scale_shift_kernel").await;
    let n = 512;
    let (_x, x_buf) = f32_buffer(&other, Some(&random_f32(n)), n).await;
    let (out_shm, out_buf) = f32_buffer(&other, None, n).await;
    let launch = Launch::new([x_buf.operand()], out_buf.operand(), n as u64)
        .args([Arg::F32(1.0), Arg::F32(0.0)]);
    let err = refused_everywhere(&other, &kernel, &launch).await;
    assert_eq!(reason(&err), "STALE_KERNEL", "{err}");
    let mut request = launch.to_proto(owner.id(), kernel.handle(), 0);
    request.args[0] = pb::ScalarArg { value: None };
    let err = ptxd_client::Error::from(owner.raw().launch(request).await.unwrap_err());
    assert_eq!(
        (reason(&err), meta(&err, "field")),
        ("INVALID_ARGUMENT", "args")
    );
    assert!(out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
}

/// `ADD_NODIV` with `snippet` inserted after the output pointer's load and
/// the output's base address taken from `%rd32` (which the snippet must
/// define) instead of the param.
fn scratch_mutant(snippet: &str) -> String {
    let text = corpus(ADD_NODIV);
    let load_out = "ld.param.b64 \t%rd27, [add_kernel_param_2];";
    let base = "add.s64 \t%rd17, %rd27, %rd28;";
    for needle in ["%p<9>", "%rd<29>", load_out, base] {
        assert_eq!(text.matches(needle).count(), 1, "{needle}");
    }
    text.replace("%p<9>", "%p<12>")
        .replace("%rd<29>", "%rd<40>")
        .replace(load_out, &format!("{load_out}\n{snippet}"))
        .replace(base, "add.s64 \t%rd17, %rd32, %rd28;")
}

/// Triton's scratch pointers are passed null; a kernel that loads one and
/// only compares it (or adds it) to choose where it writes is either
/// refused at load, or, if accepted, writes exactly `[0, n)` of its output
/// and nothing else (ptxd passes exactly 0 on every path). The mutants
/// that shift the output by 4 KiB when the scratch pointer is null (or is
/// not the output) would write `[1024, 1024 + n)`.
#[tokio::test]
async fn a_scratch_pointer_that_is_only_compared_steers_no_store() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-scratch").await.unwrap();
    let load4 = "\tld.param.b64 \t%rd30, [add_kernel_param_4];\n\tadd.s64 \t%rd31, %rd27, 4096;\n";
    let shift = |compare: &str, pick: &str| format!("{load4}\t{compare}\n\t{pick}");
    let mutants = [
        (
            "null selects a shifted output",
            shift(
                "setp.eq.s64 \t%p9, %rd30, 0;",
                "selp.b64 \t%rd32, %rd31, %rd27, %p9;",
            ),
            "pointer_misuse",
        ),
        (
            "null is not the output, which shifts it",
            shift(
                "setp.eq.s64 \t%p9, %rd30, %rd27;",
                "selp.b64 \t%rd32, %rd27, %rd31, %p9;",
            ),
            "pointer_misuse",
        ),
        (
            "a non-null scratch shifts the output",
            shift(
                "setp.ne.s64 \t%p9, %rd30, 0;",
                "selp.b64 \t%rd32, %rd31, %rd27, %p9;",
            ),
            "pointer_misuse",
        ),
        (
            "the scratch pointer added to the output",
            format!("{load4}\tadd.s64 \t%rd32, %rd27, %rd30;"),
            "unbounded_access",
        ),
        (
            "the scratch pointer compared unsigned below the output",
            shift(
                "setp.lt.u64 \t%p9, %rd30, %rd27;",
                "selp.b64 \t%rd32, %rd31, %rd27, %p9;",
            ),
            "pointer_misuse",
        ),
    ];
    let n = 1000;
    let room = n + 2048;
    let (a, b) = (random_f32(room), random_f32(room));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), room).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), room).await;
    let mut verdicts = Vec::new();
    for (what, snippet, sub_reason) in &mutants {
        let text = scratch_mutant(snippet);
        match session
            .load_ptx(0, text, "add_kernel", LoadOptions::default())
            .await
        {
            Err(err) => {
                assert_eq!(reason(&err), "NON_SCALAR_ABI", "{what}: {err}");
                assert_eq!(meta(&err, "sub_reason"), *sub_reason, "{what}: {err}");
                verdicts.push(format!("{what}: refused ({})", meta(&err, "sub_reason")));
            }
            Ok(kernel) => {
                let (out_shm, out_buf) = f32_buffer(&session, None, room).await;
                let launched = session
                    .launch(
                        &kernel,
                        &Launch::new(
                            [a_buf.operand(), b_buf.operand()],
                            out_buf.operand(),
                            n as u64,
                        ),
                    )
                    .await;
                let out = out_shm.read_f32(0, room).unwrap();
                match launched {
                    Ok(_) => check_add(what, &out, &a, &b, n, 1),
                    Err(err) => panic!(
                        "{what}: accepted ({}) but its launch failed: {err}",
                        kernel.signature().contract
                    ),
                }
                verdicts.push(format!("{what}: accepted, in bounds"));
            }
        }
    }
    eprintln!("{verdicts:#?}");
}

/// A static-shape kernel's constant footprint does not let a large `n`
/// reach past the shape: with buffers of exactly `numel × 4` bytes and n
/// up to 2^20 it writes exactly the shape; past the 32-bit edge the
/// preconditions refuse it as they refuse a dynamic kernel.
#[tokio::test]
async fn a_static_shape_kernel_with_a_large_count_stays_in_its_shape() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("inductor-static-large").await.unwrap();
    let kernel = load(&session, STATIC_ADD, "triton_poi_fused_add_0").await;
    let (a, b) = (random_f32(STATIC_NUMEL), random_f32(STATIC_NUMEL));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), STATIC_NUMEL).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), STATIC_NUMEL).await;
    let launch = |out: &ptxd_client::Buffer, n: u64| {
        Launch::new([a_buf.operand(), b_buf.operand()], out.operand(), n)
    };
    for n in [STATIC_NUMEL as u64 * 2 + 5, 1 << 20] {
        let (out_shm, out_buf) = f32_buffer(&session, None, STATIC_NUMEL).await;
        session.launch(&kernel, &launch(&out_buf, n)).await.unwrap();
        check_add(
            &format!("n={n}"),
            &out_shm.read_f32(0, STATIC_NUMEL).unwrap(),
            &a,
            &b,
            STATIC_NUMEL,
            1,
        );
    }
    let (out_shm, out_buf) = f32_buffer(&session, None, STATIC_NUMEL).await;
    for n in [1u64 << 31, 1 << 32, (1 << 32) + 16, u64::MAX] {
        let err = refused_everywhere(&session, &kernel, &launch(&out_buf, n)).await;
        assert_precondition(&err, "count_fits_i32", n);
    }
    assert!(out_shm
        .read_f32(0, STATIC_NUMEL)
        .unwrap()
        .iter()
        .all(|v| v.is_nan()));
}

/// A ring that holds a scalar-ABI kernel and a Triton kernel: each index
/// is checked against its own kernel's terms. The Triton kernel's rounded
/// footprint (1004 elements at n = 1001) does not fit 1001-element buffers
/// and is refused on the ring, writing nothing; the scalar kernel's
/// `n × 4` fits and runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_triton_kernel_and_a_scalar_kernel_on_one_ring_keep_their_own_terms() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-ring-alias").await.unwrap();
    let scalar = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let mut ring = session.open_ring(16, 0).await.unwrap();
    let triton = load(&session, ADD_DIV16, "add_kernel").await;
    assert_ne!(scalar.state().ring_index, triton.state().ring_index);
    let n = 1001; // not a multiple of 4: the Triton footprint needs 1004
    let (a, b) = (random_f32(n), random_f32(n));
    let (_a, a_buf) = f32_buffer(&session, Some(&a), n).await;
    let (_b, b_buf) = f32_buffer(&session, Some(&b), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    ring.launch(
        &triton,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(refusal(&next(&mut ring)), "BUFFER_TOO_SMALL");
    assert!(out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
    ring.launch(
        &scalar,
        &[(&a_buf, 0), (&b_buf, 0)],
        (&out_buf, 0),
        n as u64,
        &[],
    )
    .unwrap();
    assert_eq!(next(&mut ring).outcome, Ok(()));
    check_add(
        "scalar on the ring",
        &out_shm.read_f32(0, n).unwrap(),
        &a,
        &b,
        n,
        1,
    );
}

/// A 16-bit buffer of `n` elements holding `values`, or poisoned with
/// `0xffff` (a NaN in f16 and bf16), registered in `session`.
async fn u16_buffer(
    session: &Session,
    values: Option<&[u16]>,
    n: usize,
) -> (ptxd_client::HostShm, ptxd_client::Buffer) {
    let mut shm = ptxd_client::HostShm::create((n * 2) as u64).unwrap();
    match values {
        Some(v) => shm.write_u16(0, v).unwrap(),
        None => shm.write_u16(0, &vec![POISON16; n]).unwrap(),
    }
    let buffer = session.register_shm(&shm, None).await.unwrap();
    (shm, buffer)
}

const POISON16: u16 = 0xffff;

/// Small integers as f16 or bf16 bits: every sum of two is exact.
fn half_ints(bf16: bool, n: usize) -> (Vec<u16>, Vec<f64>) {
    let ints: Vec<f64> = (0..n)
        .map(|_| f64::from(rand::random::<u8>() % 201) - 100.0)
        .collect();
    (ints.iter().map(|&v| half_bits(bf16, v)).collect(), ints)
}

fn half_bits(bf16: bool, v: f64) -> u16 {
    if bf16 {
        half::bf16::from_f64(v).to_bits()
    } else {
        half::f16::from_f64(v).to_bits()
    }
}

/// The f16 and bf16 adds round their footprints to their vectors
/// (`roundup(n, 8) × 2` for `.v4.b32` of halves, `align 16`) or not at all
/// (`nodiv`): buffers of exactly `n × 2` bytes are refused exactly when the
/// rounded footprint exceeds them, an offset aligned to 2 but not to 16 is
/// refused, and a launch with room writes `[0, n)` exactly, the granted
/// tail at most, nothing past it.
#[tokio::test]
async fn half_precision_footprints_round_to_their_vectors() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-halves").await.unwrap();
    for (file, bf16) in [
        ("jit/triton/add_f16_b1024_w4_div16.ptx", false),
        ("jit/triton/add_bf16_b4096_w8_div16.ptx", true),
        ("jit/triton/add_f16_b1024_w4_nodiv.ptx", false),
        ("jit/triton/add_bf16_b1024_w4_nodiv.ptx", true),
    ] {
        let kernel = load(&session, file, "add_kernel").await;
        let contract = kernel.signature().contract.clone();
        let g = granule(&contract) as usize;
        let align = if g == 1 { 2 } else { 16 };
        assert!(contract.contains(&format!("align {align}")), "{contract}");
        let mut counts = vec![1, 7, 8, 9, 1023, 1024, 1025, 4095, 4097];
        counts.push(1 + rand::random::<u32>() as usize % 9000);
        for n in counts {
            let granted = n.next_multiple_of(g);
            let (a, ai) = half_ints(bf16, n);
            let (b, bi) = half_ints(bf16, n);
            let (_a, a_exact) = u16_buffer(&session, Some(&a), n).await;
            let (_b, b_exact) = u16_buffer(&session, Some(&b), n).await;
            let (out_exact_shm, out_exact) = u16_buffer(&session, None, n).await;
            let exact = Launch::new(
                [a_exact.operand(), b_exact.operand()],
                out_exact.operand(),
                n as u64,
            );
            if granted == n {
                session.launch(&kernel, &exact).await.unwrap();
            } else {
                let err = refused_everywhere(&session, &kernel, &exact).await;
                assert_too_small(&err, "input 0", granted as u128 * 2, n * 2);
                assert!(out_exact_shm
                    .read_u16(0, n)
                    .unwrap()
                    .iter()
                    .all(|v| *v == POISON16));
            }
            let room = granted + 64;
            let (mut a_room, mut b_room) = (a.clone(), b.clone());
            a_room.resize(room, half_bits(bf16, 1.0));
            b_room.resize(room, half_bits(bf16, 2.0));
            let (_ar, a_buf) = u16_buffer(&session, Some(&a_room), room).await;
            let (_br, b_buf) = u16_buffer(&session, Some(&b_room), room).await;
            let (out_shm, out_buf) = u16_buffer(&session, None, room).await;
            session
                .launch(
                    &kernel,
                    &Launch::new(
                        [a_buf.operand(), b_buf.operand()],
                        out_buf.operand(),
                        n as u64,
                    ),
                )
                .await
                .unwrap();
            let out = out_shm.read_u16(0, room).unwrap();
            for (i, got) in out.iter().enumerate() {
                if i < n {
                    assert_eq!(
                        *got,
                        half_bits(bf16, ai[i] + bi[i]),
                        "{file} n={n}: element {i}"
                    );
                } else if i < granted {
                    assert!(
                        *got == POISON16 || *got == half_bits(bf16, 3.0),
                        "{file} n={n}: granted element {i} holds {got:#x}"
                    );
                } else {
                    assert_eq!(*got, POISON16, "{file} n={n}: element {i} past the grant");
                }
            }
        }
        // An offset aligned to the element but not to the footprint.
        if align == 16 {
            let (_x, x) = u16_buffer(&session, None, 4096).await;
            for offset in [2u64, 4, 8, 14] {
                let err = refused_everywhere(
                    &session,
                    &kernel,
                    &Launch::new([x.at(offset), x.operand()], x.operand(), 64),
                )
                .await;
                assert_eq!(
                    (reason(&err), meta(&err, "field")),
                    ("INVALID_ARGUMENT", "offset"),
                    "{file} offset {offset}: {err}"
                );
            }
        }
    }
}

/// `SCALE_SHIFT` with its `scale` param declared `.{ty}` (the body reads
/// it with `ld.param.b32` either way, so it is the same kernel over the
/// same bits).
fn scale_typed(ty: &str) -> String {
    let text = corpus(SCALE_SHIFT);
    let decl = ".param .f32 scale_shift_kernel_param_3";
    assert_eq!(text.matches(decl).count(), 1);
    text.replace(decl, &format!(".param .{ty} scale_shift_kernel_param_3"))
}

/// A Triton kernel whose first scalar is an integer type takes exactly an
/// arg of that type, whose bits reach the kernel unchanged (an i32 with
/// its sign bit set included); f32 `params`, an f32 arg or the other
/// integer type are refused naming the param, on every path.
#[tokio::test]
async fn integer_typed_scalars_take_exactly_their_type_and_bits() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-int-scalars").await.unwrap();
    let n = 3001;
    let x = random_f32(n);
    let (_x, x_buf) = f32_buffer(&session, Some(&x), n).await;
    let param = "scale_shift_kernel_param_3";
    for (ty, wire) in [("u32", "u32"), ("b32", "u32"), ("s32", "i32")] {
        let kernel = session
            .load_ptx(
                0,
                scale_typed(ty),
                "scale_shift_kernel",
                LoadOptions::default(),
            )
            .await
            .unwrap();
        let contract = kernel.signature().contract.clone();
        let want_decl = format!("{param}: .{}", if ty == "s32" { "s32" } else { "u32" });
        assert!(contract.contains(&want_decl), "{contract}");
        // A negative scale: its bits have the sign bit set.
        let (scale, shift) = (-(rand::random::<f32>() * 3.0 + 0.5), rand::random::<f32>());
        let arg = |bits: u32| {
            if wire == "i32" {
                Arg::I32(bits as i32)
            } else {
                Arg::U32(bits)
            }
        };
        let (out_shm, out_buf) = f32_buffer(&session, None, n + 8).await;
        let launch =
            |args: Vec<Arg>| Launch::new([x_buf.operand()], out_buf.operand(), n as u64).args(args);
        session
            .launch(
                &kernel,
                &launch(vec![arg(scale.to_bits()), Arg::F32(shift)]),
            )
            .await
            .unwrap();
        let out = out_shm.read_f32(0, n + 8).unwrap();
        for i in 0..n {
            assert_eq!(
                out[i].to_bits(),
                x[i].mul_add(scale, shift).to_bits(),
                ".{ty}: element {i}"
            );
        }
        assert!(out[n..].iter().all(|v| v.is_nan()));
        let other = if wire == "i32" {
            Arg::U32(scale.to_bits())
        } else {
            Arg::I32(scale.to_bits() as i32)
        };
        for (given, launch) in [
            ("f32", launch(vec![Arg::F32(scale), Arg::F32(shift)])),
            (
                if wire == "i32" { "u32" } else { "i32" },
                launch(vec![other, Arg::F32(shift)]),
            ),
            (
                "u64",
                launch(vec![Arg::U64(u64::from(scale.to_bits())), Arg::F32(shift)]),
            ),
            (
                "f32",
                Launch::new([x_buf.operand()], out_buf.operand(), n as u64)
                    .params([f64::from(scale), f64::from(shift)]),
            ),
        ] {
            let err = refused_everywhere(&session, &kernel, &launch).await;
            assert_eq!(
                (
                    reason(&err),
                    meta(&err, "what"),
                    meta(&err, "index"),
                    meta(&err, "param"),
                    meta(&err, "expected"),
                    meta(&err, "given")
                ),
                ("SCALAR_ARGS_MISMATCH", "type", "0", param, wire, given),
                ".{ty}: {err}"
            );
        }
    }
}

/// A 64-bit first scalar (`.f64` narrowed in the kernel; `.u64`
/// truncated, which the verifier refuses today as a pointer read as
/// data): the arg's 8 bytes reach the kernel whole, an arg of 32 bits is
/// refused, and a launch runs bit for bit against the narrowed reference.
#[tokio::test]
async fn sixty_four_bit_scalars_pass_all_their_bits() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-wide-scalars").await.unwrap();
    let n = 2049;
    let x = random_f32(n);
    let (_x, x_buf) = f32_buffer(&session, Some(&x), n).await;
    let read = "ld.param.b32 \t%r20, [scale_shift_kernel_param_3];";
    for (ty, convert, wire) in [
        ("f64", "cvt.rn.f32.f64 \t%r20, %fd1;", "f64"),
        ("u64", "cvt.u32.u64 \t%r20, %fd1;", "u64"),
    ] {
        let reg = if ty == "f64" {
            ".f64 \t%fd<2>"
        } else {
            ".b64 \t%fd<2>"
        };
        let text = scale_typed(ty)
            .replace(".reg .pred", &format!(".reg {reg};\n\t.reg .pred"))
            .replace(
                read,
                &format!("ld.param.{ty} \t%fd1, [scale_shift_kernel_param_3];\n\t{convert}"),
            );
        let kernel = match session
            .load_ptx(0, text, "scale_shift_kernel", LoadOptions::default())
            .await
        {
            Ok(k) => k,
            // A `.u64` param is read as a pointer today (Triton's i64
            // scalars are refused): a limitation, not a grant.
            Err(err) if ty == "u64" => {
                assert_eq!(
                    (reason(&err), meta(&err, "sub_reason")),
                    ("NON_SCALAR_ABI", "pointer_escape"),
                    "{err}"
                );
                continue;
            }
            Err(err) => panic!(".{ty}: {err}"),
        };
        let contract = kernel.signature().contract.clone();
        assert!(contract.contains(&format!("param_3: .{ty}")), "{contract}");
        let scale = rand::random::<f32>() * 4.0 - 2.0;
        let shift = rand::random::<f32>();
        let arg = if ty == "f64" {
            Arg::F64(f64::from(scale))
        } else {
            // High bits set: the kernel keeps the low 32.
            Arg::U64(0xdead_beef_0000_0000 | u64::from(scale.to_bits()))
        };
        let (out_shm, out_buf) = f32_buffer(&session, None, n + 8).await;
        let base = Launch::new([x_buf.operand()], out_buf.operand(), n as u64);
        session
            .launch(&kernel, &base.clone().args([arg, Arg::F32(shift)]))
            .await
            .unwrap();
        let out = out_shm.read_f32(0, n + 8).unwrap();
        for i in 0..n {
            assert_eq!(
                out[i].to_bits(),
                x[i].mul_add(scale, shift).to_bits(),
                ".{ty}: element {i}"
            );
        }
        assert!(out[n..].iter().all(|v| v.is_nan()));
        for (given, narrow) in [("f32", Arg::F32(scale)), ("u32", Arg::U32(scale.to_bits()))] {
            let err = refused_everywhere(
                &session,
                &kernel,
                &base.clone().args([narrow, Arg::F32(shift)]),
            )
            .await;
            assert_eq!(
                (reason(&err), meta(&err, "expected"), meta(&err, "given")),
                ("SCALAR_ARGS_MISMATCH", wire, given),
                ".{ty}: {err}"
            );
        }
    }
}

/// Thousands of args or operands are refused by count, alike on every
/// path, and the daemon serves on.
#[tokio::test]
async fn thousands_of_args_or_operands_are_refused_by_count() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("triton-many").await.unwrap();
    let kernel = load(&session, SCALE_SHIFT, "scale_shift_kernel").await;
    let n = 64;
    let (_x, x_buf) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n).await;
    let many = 3000;
    let err = refused_everywhere(
        &session,
        &kernel,
        &Launch::new([x_buf.operand()], out_buf.operand(), n as u64)
            .args((0..many).map(|k| Arg::F32(k as f32))),
    )
    .await;
    assert_eq!(
        (reason(&err), meta(&err, "what"), meta(&err, "given")),
        ("SCALAR_ARGS_MISMATCH", "count", many.to_string().as_str()),
        "{err}"
    );
    let err = refused_everywhere(
        &session,
        &kernel,
        &Launch::new(vec![x_buf.operand(); many], out_buf.operand(), n as u64)
            .args([Arg::F32(1.0), Arg::F32(0.0)]),
    )
    .await;
    assert_eq!(
        (reason(&err), meta(&err, "what"), meta(&err, "found")),
        ("ABI_MISMATCH", "inputs", many.to_string().as_str()),
        "{err}"
    );
    assert!(out_shm.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
    session
        .launch(
            &kernel,
            &Launch::new([x_buf.operand()], out_buf.operand(), n as u64)
                .args([Arg::F32(1.0), Arg::F32(0.0)]),
        )
        .await
        .unwrap();
}
