//! Typed scalar arguments (`LaunchRequest.args`) end to end on the host
//! backend: f32 args launch exactly as f32 params do, over every launch
//! path (the SDK's unary launch, which takes the packet socket; the gRPC
//! unary call; LaunchStream), and every mismatch is refused with its exact
//! reason and metadata on each of them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{f32_buffer, load, meta, random_f32, reason, Daemon};
use ptxd_client::{Arg, Client, Launch};
use ptxd_proto::v1 as pb;

async fn connect(daemon: &Daemon) -> Client {
    Client::connect(&daemon.target()).await.unwrap()
}

/// The names of the contract's f32 scalar params, in order, from its text
/// form (`params(x: ptr read, ..., a: .f32, b: .f32); ...`).
fn f32_param_names(contract: &str) -> Vec<String> {
    let params = contract
        .strip_prefix("params(")
        .and_then(|rest| rest.split(')').next())
        .expect("a contract text starts with its params");
    params
        .split(", ")
        .filter_map(|p| p.strip_suffix(": .f32"))
        .map(str::to_string)
        .collect()
}

/// Metadata a refusal must carry: (key, value) pairs.
type Metadata<'a> = Vec<(&'a str, String)>;

/// The affine kernel (`y = fma(x, a, b)`) with f32 args writes, element for
/// element, what the same launch with f32 params writes, and both are the
/// reference; over the SDK's unary launch, the raw gRPC call and a stream.
#[tokio::test]
async fn f32_args_launch_exactly_as_params_on_every_path() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("typed-args").await.unwrap();
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let n = 4099;
    let x = random_f32(n);
    let (_x_shm, x_buf) = f32_buffer(&session, Some(&x), n).await;
    let (a, b) = (
        rand::random::<f32>() * 4.0 - 2.0,
        rand::random::<f32>() - 0.5,
    );
    let reference: Vec<u32> = x.iter().map(|v| v.mul_add(a, b).to_bits()).collect();
    let check = |what: &str, got: Vec<f32>| {
        assert_eq!(got.len(), n);
        for (i, (got, want)) in got.iter().zip(&reference).enumerate() {
            assert_eq!(got.to_bits(), *want, "{what}: element {i}");
        }
    };

    // The SDK's unary launch: params, then args, each into a poisoned
    // output of its own.
    let (by_params, by_params_buf) = f32_buffer(&session, None, n).await;
    let launch = Launch::new([x_buf.operand()], by_params_buf.operand(), n as u64)
        .params([f64::from(a), f64::from(b)]);
    session.launch(&affine, &launch).await.unwrap();
    check("params", by_params.read_f32(0, n).unwrap());
    let (by_args, by_args_buf) = f32_buffer(&session, None, n).await;
    let launch = Launch::new([x_buf.operand()], by_args_buf.operand(), n as u64)
        .args([Arg::F32(a), Arg::F32(b)]);
    session.launch(&affine, &launch).await.unwrap();
    check("args", by_args.read_f32(0, n).unwrap());

    // The gRPC unary call, spoken directly.
    let (by_grpc, by_grpc_buf) = f32_buffer(&session, None, n).await;
    let launch = Launch::new([x_buf.operand()], by_grpc_buf.operand(), n as u64)
        .args([Arg::F32(a), Arg::F32(b)]);
    session
        .raw()
        .launch(launch.to_proto(session.id(), affine.handle(), 1))
        .await
        .unwrap();
    check("grpc args", by_grpc.read_f32(0, n).unwrap());

    // LaunchStream.
    let (by_stream, by_stream_buf) = f32_buffer(&session, None, n).await;
    let launch = Launch::new([x_buf.operand()], by_stream_buf.operand(), n as u64)
        .args([Arg::F32(a), Arg::F32(b)]);
    let mut stream = session.launch_stream().await.unwrap();
    let tag = stream.send(&affine, &launch).await.unwrap();
    let reply = stream.next().await.unwrap().expect("a reply");
    assert_eq!(reply.tag, tag);
    reply.outcome.unwrap();
    check("stream args", by_stream.read_f32(0, n).unwrap());
}

/// Every mismatch, with its exact reason and metadata, on the SDK's unary
/// launch and on LaunchStream (where the refusal rides in the response);
/// nothing is written.
#[tokio::test]
async fn each_mismatch_is_refused_with_its_reason_on_every_path() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("typed-refusals").await.unwrap();
    let affine = load(&session, "affine_f32_scalar.ptx", "affine_f32_scalar").await;
    let names = f32_param_names(&affine.signature().contract);
    assert_eq!(names.len(), 2, "{}", affine.signature().contract);
    let n = 64;
    let (_x, x_buf) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (y, y_buf) = f32_buffer(&session, None, n).await;
    let base = Launch::new([x_buf.operand()], y_buf.operand(), n as u64);
    // (launch, what, index/param/expected/given for a type mismatch, or
    // expected/given for a count)
    let cases: Vec<(Launch, &str, Metadata)> = vec![
        (
            base.clone().args([Arg::F32(1.0)]),
            "count",
            vec![("expected", "2".into()), ("given", "1".into())],
        ),
        (
            base.clone()
                .args([Arg::F32(1.0), Arg::F32(2.0), Arg::F32(3.0)]),
            "count",
            vec![("expected", "2".into()), ("given", "3".into())],
        ),
        (
            base.clone().args([Arg::I32(1), Arg::F32(2.0)]),
            "type",
            vec![
                ("index", "0".into()),
                ("param", names[0].clone()),
                ("expected", "f32".into()),
                ("given", "i32".into()),
            ],
        ),
        (
            base.clone().args([Arg::F32(1.0), Arg::F64(2.0)]),
            "type",
            vec![
                ("index", "1".into()),
                ("param", names[1].clone()),
                ("expected", "f32".into()),
                ("given", "f64".into()),
            ],
        ),
        (
            base.clone()
                .params([1.0, 2.0])
                .args([Arg::F32(1.0), Arg::F32(2.0)]),
            "both",
            vec![],
        ),
    ];
    let mut stream = session.launch_stream().await.unwrap();
    for (launch, what, metadata) in &cases {
        let unary = session.launch(&affine, launch).await.unwrap_err();
        stream.send(&affine, launch).await.unwrap();
        let streamed = stream
            .next()
            .await
            .unwrap()
            .expect("a reply")
            .outcome
            .unwrap_err();
        for err in [&unary, &streamed] {
            assert_eq!(reason(err), "SCALAR_ARGS_MISMATCH", "{launch:?}: {err}");
            assert_eq!(err.refusal().unwrap().code(), tonic::Code::InvalidArgument);
            assert_eq!(meta(err, "what"), *what, "{err}");
            for (key, value) in metadata {
                assert_eq!(meta(err, key), value, "{key}: {err}");
            }
        }
    }
    // An arg without a value is a malformed request.
    let mut request = base.clone().args([Arg::F32(1.0), Arg::F32(2.0)]).to_proto(
        session.id(),
        affine.handle(),
        0,
    );
    request.args[1] = pb::ScalarArg { value: None };
    let err = ptxd_client::Error::from(session.raw().launch(request).await.unwrap_err());
    assert_eq!(reason(&err), "INVALID_ARGUMENT");
    assert_eq!(meta(&err, "field"), "args");
    // f32 params keep their old refusal for another count.
    let err = session
        .launch(&affine, &base.clone().params([1.0]))
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "what")),
        ("ABI_MISMATCH", "scalar params")
    );
    // A kernel without scalars refuses any arg.
    let add = load(&session, "add_f32_scalar.ptx", "add_f32_scalar").await;
    let err = session
        .launch(
            &add,
            &Launch::new(
                [x_buf.operand(), x_buf.operand()],
                y_buf.operand(),
                n as u64,
            )
            .args([Arg::F32(1.0)]),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "what"), meta(&err, "expected")),
        ("SCALAR_ARGS_MISMATCH", "count", "0")
    );
    // Nothing ran.
    assert!(y.read_f32(0, n).unwrap().iter().all(|v| v.is_nan()));
}

/// A real Triton kernel (Triton 3.6's `scale_shift`, f32, BLOCK_SIZE 1024,
/// 4 warps: `x, out, .u32 n, .f32 scale, .f32 shift, scratch, scratch`)
/// end to end on the host backend with typed args: ptxd computes the grid,
/// passes n as `.u32` and null scratch pointers; every element is compared
/// with the reference, nothing past n is written, and a mistyped arg and a
/// count past the kernel's `.u32` are refused. Needs the verifier that
/// accepts Triton kernels (w27a) and the host engine that runs them (w27b).
#[tokio::test]
async fn a_triton_kernel_runs_with_typed_args_on_the_host() {
    let daemon = Daemon::start(&[]);
    let client = connect(&daemon).await;
    let session = client.open_session("typed-triton").await.unwrap();
    let kernel = load(
        &session,
        "jit/triton/scale_shift_f32_b1024_w4_nodiv.ptx",
        "scale_shift_kernel",
    )
    .await;
    let contract = kernel.signature().contract.clone();
    assert!(contract.contains("count .u32"), "{contract}");
    let names = f32_param_names(&contract);
    assert_eq!(names.len(), 2, "{contract}");
    let n = 5003; // not a multiple of the 1024 elements a block covers
    let x = random_f32(n);
    let (_x_shm, x_buf) = f32_buffer(&session, Some(&x), n + 16).await;
    let (out_shm, out_buf) = f32_buffer(&session, None, n + 16).await;
    let (scale, shift) = (
        rand::random::<f32>() * 4.0 - 2.0,
        rand::random::<f32>() - 0.5,
    );
    let launch = Launch::new([x_buf.operand()], out_buf.operand(), n as u64)
        .args([Arg::F32(scale), Arg::F32(shift)]);
    session.launch(&kernel, &launch).await.unwrap();
    let out = out_shm.read_f32(0, n + 16).unwrap();
    for i in 0..n {
        assert_eq!(
            out[i].to_bits(),
            x[i].mul_add(scale, shift).to_bits(),
            "element {i}"
        );
    }
    assert!(out[n..].iter().all(|v| v.is_nan()), "written past n");
    // The same through params, bit for bit.
    let (again_shm, again_buf) = f32_buffer(&session, None, n + 16).await;
    let launch = Launch::new([x_buf.operand()], again_buf.operand(), n as u64)
        .params([f64::from(scale), f64::from(shift)]);
    session.launch(&kernel, &launch).await.unwrap();
    let again = again_shm.read_f32(0, n + 16).unwrap();
    assert!(out
        .iter()
        .zip(&again)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // A mistyped arg names its param.
    let err = session
        .launch(
            &kernel,
            &Launch::new([x_buf.operand()], out_buf.operand(), n as u64)
                .args([Arg::F32(scale), Arg::U32(1)]),
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "SCALAR_ARGS_MISMATCH");
    assert_eq!(
        (
            meta(&err, "index"),
            meta(&err, "param"),
            meta(&err, "given")
        ),
        ("1", names[1].as_str(), "u32")
    );
    // A count past what the kernel's 32-bit count holds (it compares n as
    // `.s32`) is refused by its named precondition before any footprint.
    let err = session
        .launch(
            &kernel,
            &Launch::new([x_buf.operand()], out_buf.operand(), 1 << 31)
                .args([Arg::F32(scale), Arg::F32(shift)]),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (reason(&err), meta(&err, "field")),
        ("INVALID_ARGUMENT", "launch"),
        "{err}"
    );
    assert_eq!(meta(&err, "precondition"), "count_fits_i32", "{err}");
}
