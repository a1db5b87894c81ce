//! The Strided family (the seed's Strided schedule: NVRTC's
//! `add_f32_strided`, `bias_add_f32_strided`, `transpose_copy_f32_strided`,
//! with by-value `u64` shape and stride args) through the launch ring on
//! the host backend. The ring checks each launch against the kernel's whole
//! contract, its footprints and preconditions reading the descriptor's
//! typed args, exactly as the unary path does: random shapes run with every
//! element compared against a Rust reference and nothing past `n` written,
//! and each Strided precondition violated on the ring is refused with the
//! reason the unary path gives (whose metadata names it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::ring_completions::{next, refusal};
use crate::support::{f32_buffer, load, meta, random_f32, Daemon};
use ptxd_client::{Arg, Buffer, Client, Kernel, Launch, Session};
use rand::Rng;

/// The elements each input buffer holds (every shape below fits).
const CAP: usize = 16384;

/// Which Strided kernel: its corpus file, entry, inputs, and the reference.
#[derive(Clone, Copy)]
enum Which {
    /// `out[i] = in0[r × s0 + c] + in1[c × s1]`, args `(s0, s1, d0, d1)`.
    Add,
    /// `out[i] = in0[i] + in1[c × s1]`, args `(s0, s1, d0, d1)`.
    BiasAdd,
    /// `out[i] = in0[c × s0 + r]`, args `(s0, d0, d1)`.
    Transpose,
}

impl Which {
    fn file(self, build: &str) -> String {
        let stem = match self {
            Which::Add => "add_f32_strided",
            Which::BiasAdd => "bias_add_f32_strided",
            Which::Transpose => "transpose_copy_f32_strided",
        };
        format!("jit/nvrtc/{stem}_{build}.ptx")
    }

    fn entry(self) -> &'static str {
        match self {
            Which::Add => "add_f32_strided",
            Which::BiasAdd => "bias_add_f32_strided",
            Which::Transpose => "transpose_copy_f32_strided",
        }
    }

    fn inputs(self) -> usize {
        match self {
            Which::Transpose => 1,
            Which::Add | Which::BiasAdd => 2,
        }
    }

    /// The args a launch passes for strides `s0`, `s1` and shape `d0 × d1`.
    fn args(self, s0: u64, s1: u64, d0: u64, d1: u64) -> Vec<Arg> {
        match self {
            Which::Transpose => vec![Arg::U64(s0), Arg::U64(d0), Arg::U64(d1)],
            Which::Add | Which::BiasAdd => {
                vec![Arg::U64(s0), Arg::U64(s1), Arg::U64(d0), Arg::U64(d1)]
            }
        }
    }

    /// Element `i`'s bits, as the kernel computes it.
    fn reference(self, i: u64, x: &[f32], y: &[f32], s: (u64, u64, u64)) -> u32 {
        let (s0, s1, d1) = s;
        let (r, c) = (i / d1, i % d1);
        let at = |v: &[f32], k: u64| v[usize::try_from(k).unwrap()];
        match self {
            Which::Add => (at(x, r * s0 + c) + at(y, c * s1)).to_bits(),
            Which::BiasAdd => (at(x, i) + at(y, c * s1)).to_bits(),
            Which::Transpose => at(x, c * s0 + r).to_bits(),
        }
    }
}

/// The reason the unary path refuses a launch with ("" when it runs), and
/// the precondition its metadata names.
async fn unary(session: &Session, kernel: &Kernel, launch: Launch) -> (String, String) {
    match session.launch(kernel, &launch.sync(true)).await {
        Ok(_) => (String::new(), String::new()),
        Err(e) => (
            e.reason_name().to_string(),
            meta(&e, "precondition").to_string(),
        ),
    }
}

/// Every corpus Strided kernel (-O3, -G, fast math) through the ring with
/// typed args at random shapes: padded rows, broadcasts (stride 0), a
/// count short of the full shape. Every element equals the reference and
/// the tail past n stays poisoned.
#[tokio::test(flavor = "multi_thread")]
async fn strided_kernels_run_through_the_ring_at_random_shapes() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-strided").await.unwrap();
    let (x, y) = (random_f32(CAP), random_f32(CAP));
    let (_x_shm, x_buf) = f32_buffer(&session, Some(&x), CAP).await;
    let (_y_shm, y_buf) = f32_buffer(&session, Some(&y), CAP).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, CAP + 16).await;
    let mut ring = session.open_ring(64, 0).await.unwrap();
    let mut rng = rand::rng();
    for which in [Which::Add, Which::BiasAdd, Which::Transpose] {
        for build in ["O3", "G", "fast"] {
            let kernel = load(&session, &which.file(build), which.entry()).await;
            assert!(
                kernel.signature().ring_launchable,
                "{}",
                kernel.signature().contract
            );
            for _ in 0..12 {
                let (d0, d1) = (rng.random_range(1..=64u64), rng.random_range(1..=96u64));
                let (s0, s1) = match which {
                    Which::Transpose => (d0 + rng.random_range(0..16), 0),
                    Which::Add | Which::BiasAdd => (
                        if rng.random_bool(0.2) {
                            0
                        } else {
                            d1 + rng.random_range(0..16)
                        },
                        rng.random_range(0..=2),
                    ),
                };
                let n = d0 * d1 - rng.random_range(0..d1);
                let inputs: Vec<(&Buffer, u64)> =
                    [(&x_buf, 0), (&y_buf, 0)][..which.inputs()].to_vec();
                out_shm.write_f32(0, &vec![f32::NAN; CAP + 16]).unwrap();
                let ticket = ring
                    .launch_args(
                        &kernel,
                        &inputs,
                        (&out_buf, 0),
                        n,
                        &which.args(s0, s1, d0, d1),
                    )
                    .unwrap();
                let done = next(&mut ring);
                let what = format!("{} {build}: n {n}, {d0}×{d1}, s {s0},{s1}", which.entry());
                assert_eq!((done.ticket, done.outcome), (ticket, Ok(())), "{what}");
                let out = out_shm.read_f32(0, CAP + 16).unwrap();
                for i in 0..n {
                    assert_eq!(
                        out[i as usize].to_bits(),
                        which.reference(i, &x, &y, (s0, s1, d1)),
                        "{what}: element {i}"
                    );
                }
                assert!(
                    out[n as usize..].iter().all(|v| v.is_nan()),
                    "{what}: written past n"
                );
            }
        }
    }
}

/// Each Strided precondition violated on the ring (a divisor 0, a
/// negative stride, an index past i64) and a buffer one element short of
/// the footprint: the ring refuses with the reason the unary path gives
/// for the same launch, the unary refusal names the precondition, nothing
/// is written, and the ring keeps serving (a good launch after runs).
#[tokio::test(flavor = "multi_thread")]
async fn a_strided_launch_outside_its_contract_is_refused_on_the_ring_as_on_the_unary_path() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-strided-refusals").await.unwrap();
    let which = Which::Add;
    let kernel = load(&session, &which.file("O3"), which.entry()).await;
    let (d0, d1, s0, s1) = (16u64, 24u64, 30u64, 1u64);
    let n = d0 * d1;
    // in0's footprint: (n - 1) / d1 × s0 + d1 elements.
    let f0 = ((n - 1) / d1 * s0 + d1) as usize;
    let (x, y) = (random_f32(f0), random_f32(CAP));
    let (_x_shm, x_buf) = f32_buffer(&session, Some(&x), f0).await;
    let (_short_shm, short) = f32_buffer(&session, Some(&x[..f0 - 1]), f0 - 1).await;
    let (_y_shm, y_buf) = f32_buffer(&session, Some(&y), CAP).await;
    let (mut out_shm, out_buf) = f32_buffer(&session, None, n as usize).await;
    let mut ring = session.open_ring(16, 0).await.unwrap();
    let cases: [(&Buffer, [u64; 4], &str, &str); 6] = [
        (
            &x_buf,
            [s0, s1, d0, 0],
            "INVALID_ARGUMENT",
            "divisor_positive",
        ),
        (
            &x_buf,
            [u64::MAX, s1, d0, d1],
            "INVALID_ARGUMENT",
            "arg_nonnegative",
        ),
        (
            &x_buf,
            [s0, (-7i64) as u64, d0, d1],
            "INVALID_ARGUMENT",
            "arg_nonnegative",
        ),
        (
            &x_buf,
            [1 << 60, s1, d0, d1],
            "INVALID_ARGUMENT",
            "strided_index_fits_i64",
        ),
        (&short, [s0, s1, d0, d1], "BUFFER_TOO_SMALL", ""),
        (&x_buf, [s0, s1, d0, d1], "", ""),
    ];
    for (in0, [a, b, c, d], reason, precondition) in cases {
        let args = which.args(a, b, c, d);
        let launch =
            Launch::new([in0.operand(), y_buf.operand()], out_buf.operand(), n).args(args.clone());
        assert_eq!(
            unary(&session, &kernel, launch).await,
            (reason.to_string(), precondition.to_string()),
            "unary, args {a},{b},{c},{d}"
        );
        out_shm.write_f32(0, &vec![f32::NAN; n as usize]).unwrap();
        let ticket = ring
            .launch_args(&kernel, &[(in0, 0), (&y_buf, 0)], (&out_buf, 0), n, &args)
            .unwrap();
        let done = next(&mut ring);
        assert_eq!(done.ticket, ticket);
        assert_eq!(refusal(&done), reason, "ring, args {a},{b},{c},{d}");
        let out = out_shm.read_f32(0, n as usize).unwrap();
        if reason.is_empty() {
            for i in 0..n {
                assert_eq!(
                    out[i as usize].to_bits(),
                    which.reference(i, &x, &y, (s0, s1, d1)),
                    "element {i}"
                );
            }
        } else {
            assert!(out.iter().all(|v| v.is_nan()), "a refused launch wrote");
        }
    }
}

/// `ptxd verify` shows a Strided kernel's by-value params by their kinds
/// (four `u64` shapes and strides, not "4 float params"), and a float
/// kernel's as `f32`.
#[test]
fn ptxd_verify_shows_the_strided_args_by_kind() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let verify = |file: &str, symbol: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ptxd"))
            .arg("verify")
            .arg(corpus.join(file))
            .args(["--symbol", symbol])
            .output()
            .unwrap();
        assert!(out.status.success(), "{file}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = verify(&Which::Add.file("O3"), "add_f32_strided");
    let args: String = (4..8)
        .map(|k| format!("u64 add_f32_strided_param_{k}"))
        .collect::<Vec<_>>()
        .join(", ");
    assert!(
        shown.starts_with(&format!(
            "accepted: add_f32_strided: 2 inputs, element sizes [4, 4, 4], 4 scalar params: {args}\n"
        )),
        "{shown}"
    );
    assert!(!shown.contains("float params"), "{shown}");
    let shown = verify("affine_f32_scalar.ptx", "affine_f32_scalar");
    assert!(
        shown.contains(
            ", 2 scalar params: f32 affine_f32_scalar_param_3, f32 affine_f32_scalar_param_4"
        ),
        "{shown}"
    );
    let shown = verify("add_f32_scalar.ptx", "add_f32_scalar");
    assert!(shown.contains(", no scalar params"), "{shown}");
}
