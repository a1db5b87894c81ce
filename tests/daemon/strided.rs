//! The Strided family (the seed's Strided schedule, NVRTC's
//! `add_f32_strided`) through the real daemon on the host backend, with its
//! shape and stride args as typed `u64` args: on the SDK's unary launch
//! (the packet socket), the raw gRPC call and LaunchStream, every element
//! against a Rust reference and nothing past `n` written; each launch
//! precondition refused with its name and values in the metadata, a
//! buffer one element short of the contract's footprint refused
//! `BUFFER_TOO_SMALL`, mistyped args refused. The kernel is ring-launchable
//! (its ring launches: tests/transports/ring_strided.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{f32_buffer, load, meta, random_f32, reason, Daemon};
use ptxd_client::{Arg, Client, Launch};

const FILE: &str = "jit/nvrtc/add_f32_strided_O3.ptx";
const ENTRY: &str = "add_f32_strided";

/// A 2-D shape: `n = d0 × d1` elements, `in0` rows `s0` apart, `in1` a
/// row broadcast with stride `s1`.
struct Shape {
    d0: u64,
    d1: u64,
    s0: u64,
    s1: u64,
}

impl Shape {
    fn n(&self) -> usize {
        (self.d0 * self.d1) as usize
    }

    fn args(&self) -> [Arg; 4] {
        [
            Arg::U64(self.s0),
            Arg::U64(self.s1),
            Arg::U64(self.d0),
            Arg::U64(self.d1),
        ]
    }

    /// Elements `in0` and `in1` need: the contract's footprints.
    fn footprints(&self) -> (usize, usize) {
        let n = self.d0 * self.d1;
        let in0 = (n - 1) / self.d1 * self.s0 + self.d1.min(n);
        let in1 = (self.d1.min(n) - 1) * self.s1 + 1;
        (in0 as usize, in1 as usize)
    }

    fn reference(&self, in0: &[f32], in1: &[f32]) -> Vec<u32> {
        (0..self.n() as u64)
            .map(|i| {
                let (r, c) = (i / self.d1, i % self.d1);
                (in0[(r * self.s0 + c) as usize] + in1[(c * self.s1) as usize]).to_bits()
            })
            .collect()
    }
}

#[tokio::test]
async fn a_strided_kernel_runs_with_typed_args_on_every_path() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("strided").await.unwrap();
    let kernel = load(&session, FILE, ENTRY).await;
    let contract = kernel.signature().contract.clone();
    assert!(contract.contains("requires divisor_positive"), "{contract}");
    assert!(kernel.signature().ring_launchable, "{contract}");
    // Padded rows, a broadcast row, and a plain contiguous one.
    let shapes = [
        Shape {
            d0: 37,
            d1: 53,
            s0: 56,
            s1: 1,
        },
        Shape {
            d0: 29,
            d1: 64,
            s0: 0,
            s1: 0,
        },
        Shape {
            d0: 3,
            d1: 1000,
            s0: 1000,
            s1: 1,
        },
    ];
    for shape in &shapes {
        let n = shape.n();
        let (f0, f1) = shape.footprints();
        let (in0, in1) = (random_f32(f0), random_f32(f1));
        let (_s0, b0) = f32_buffer(&session, Some(&in0), f0).await;
        let (_s1, b1) = f32_buffer(&session, Some(&in1), f1).await;
        let want = shape.reference(&in0, &in1);
        let check = |what: &str, out: Vec<f32>| {
            for (i, w) in want.iter().enumerate() {
                assert_eq!(out[i].to_bits(), *w, "{what}: element {i}");
            }
            assert!(
                out[n..].iter().all(|v| v.is_nan()),
                "{what}: written past n"
            );
        };
        let launch = |out: &ptxd_client::Buffer| {
            Launch::new([b0.operand(), b1.operand()], out.operand(), n as u64).args(shape.args())
        };
        // The SDK's unary launch (the packet socket).
        let (out, out_buf) = f32_buffer(&session, None, n + 16).await;
        session.launch(&kernel, &launch(&out_buf)).await.unwrap();
        check("unary", out.read_f32(0, n + 16).unwrap());
        // The gRPC call, spoken directly.
        let (out, out_buf) = f32_buffer(&session, None, n + 16).await;
        session
            .raw()
            .launch(launch(&out_buf).to_proto(session.id(), kernel.handle(), 1))
            .await
            .unwrap();
        check("grpc", out.read_f32(0, n + 16).unwrap());
        // LaunchStream.
        let (out, out_buf) = f32_buffer(&session, None, n + 16).await;
        let mut stream = session.launch_stream().await.unwrap();
        stream.send(&kernel, &launch(&out_buf)).await.unwrap();
        stream
            .next()
            .await
            .unwrap()
            .expect("a reply")
            .outcome
            .unwrap();
        check("stream", out.read_f32(0, n + 16).unwrap());
    }
}

#[tokio::test]
async fn a_strided_launch_outside_its_contract_is_refused_by_name() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("strided-refusals").await.unwrap();
    let kernel = load(&session, FILE, ENTRY).await;
    let shape = Shape {
        d0: 16,
        d1: 24,
        s0: 30,
        s1: 1,
    };
    let n = shape.n();
    let (f0, f1) = shape.footprints();
    let (_s0, b0) = f32_buffer(&session, Some(&random_f32(f0)), f0).await;
    let (_s1, b1) = f32_buffer(&session, Some(&random_f32(f1)), f1).await;
    let (_short, short) = f32_buffer(&session, Some(&random_f32(f0 - 1)), f0 - 1).await;
    let (out, out_buf) = f32_buffer(&session, None, n).await;
    let with = |in0: &ptxd_client::Buffer, args: [Arg; 4]| {
        Launch::new([in0.operand(), b1.operand()], out_buf.operand(), n as u64).args(args)
    };
    let [s0, s1, d0, d1] = shape.args();
    // (args, precondition, the value its metadata names)
    let preconditions = [
        (
            [s0, s1, d0, Arg::U64(0)],
            "divisor_positive",
            "add_f32_strided_param_7=0",
        ),
        (
            [Arg::U64(u64::MAX), s1, d0, d1],
            "arg_nonnegative",
            "add_f32_strided_param_4=-1",
        ),
        (
            [Arg::U64(1 << 60), s1, d0, d1],
            "strided_index_fits_i64",
            "add_f32_strided_param_4=1152921504606846976",
        ),
    ];
    let mut stream = session.launch_stream().await.unwrap();
    for (args, name, value) in preconditions {
        let unary = session.launch(&kernel, &with(&b0, args)).await.unwrap_err();
        stream.send(&kernel, &with(&b0, args)).await.unwrap();
        let streamed = stream
            .next()
            .await
            .unwrap()
            .expect("a reply")
            .outcome
            .unwrap_err();
        for err in [&unary, &streamed] {
            assert_eq!(reason(err), "INVALID_ARGUMENT", "{name}: {err}");
            assert_eq!(meta(err, "precondition"), name, "{err}");
            assert!(meta(err, "values").contains(value), "{name}: {err}");
            assert!(meta(err, "condition").starts_with(name), "{err}");
        }
    }
    // One element short of in0's footprint.
    let err = session
        .launch(&kernel, &with(&short, shape.args()))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "BUFFER_TOO_SMALL", "{err}");
    assert_eq!(meta(&err, "operand"), "input 0");
    assert_eq!(meta(&err, "needed_bytes"), (f0 * 4).to_string());
    // The args are `.u64` params: an i64 is refused, nothing converted.
    let err = session
        .launch(&kernel, &with(&b0, [Arg::I64(30), s1, d0, d1]))
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "expected"), meta(&err, "given")),
        ("SCALAR_ARGS_MISMATCH", "u64", "i64")
    );
    // Nothing ran.
    assert!(out.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
    // The exact footprint runs.
    session
        .launch(&kernel, &with(&b0, shape.args()))
        .await
        .unwrap();
    assert!(out.read_f32(0, n).unwrap().iter().all(|v| !v.is_nan()));
}
