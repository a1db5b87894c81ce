//! Inductor's 2-D broadcast kernels (`gelu(x + bias[i mod D])`) through the
//! real daemon on the host backend: the dynamic build with its divisor
//! `ks0` as a typed `u64` arg, on the SDK's unary launch and LaunchStream,
//! and the static build (bias of 1024), every element against a Rust
//! reference and nothing past `n` written; `ks0 = 0` refused by its
//! precondition's name, a bias one element short of `ks0` refused
//! `BUFFER_TOO_SMALL`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{f32_buffer, load, meta, random_f32, reason, Daemon};
use ptxd_client::{Arg, Client, Launch};

const ENTRY: &str = "triton_poi_fused_add_gelu_0";

/// Every element below `n` is `gelu(x[i] + bias[i mod d])` (to the erf
/// approximation's error); past `n` nothing is written.
fn check(what: &str, x: &[f32], bias: &[f32], d: usize, n: usize, out: &[f32]) {
    for i in 0..n {
        let y = x[i] + bias[i % d];
        let yf = f64::from(y);
        let want = 0.5 * yf * (1.0 + libm::erf(yf / std::f64::consts::SQRT_2));
        let err = (f64::from(out[i]) - want).abs();
        assert!(
            err <= 1e-5 * (1.0 + yf.abs()),
            "{what}: element {i}: {} != {want}",
            out[i]
        );
    }
    assert!(
        out[n..].iter().all(|v| v.is_nan()),
        "{what}: written past n"
    );
}

#[tokio::test]
async fn the_broadcast_kernels_run_through_the_daemon() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("broadcast").await.unwrap();
    let dynamic = load(&session, "jit/inductor/bias_gelu_2d_f32_dyn_0.ptx", ENTRY).await;
    let contract = dynamic.signature().contract.clone();
    assert!(
        contract.contains("requires divisor_positive: triton_poi_fused_add_gelu_0_param_3 >= 1"),
        "{contract}"
    );
    for (ks0, rows) in [(1024usize, 3usize), (77, 5), (1, 9)] {
        let n = ks0 * rows + ks0 / 2;
        let (x, bias) = (random_f32(n), random_f32(ks0));
        let (_sx, bx) = f32_buffer(&session, Some(&x), n).await;
        let (_sb, bb) = f32_buffer(&session, Some(&bias), ks0).await;
        let launch = |out: &ptxd_client::Buffer| {
            Launch::new([bx.operand(), bb.operand()], out.operand(), n as u64)
                .args([Arg::U64(ks0 as u64)])
        };
        let (out, out_buf) = f32_buffer(&session, None, n + 16).await;
        session.launch(&dynamic, &launch(&out_buf)).await.unwrap();
        check(
            "unary",
            &x,
            &bias,
            ks0,
            n,
            &out.read_f32(0, n + 16).unwrap(),
        );
        let (out, out_buf) = f32_buffer(&session, None, n + 16).await;
        let mut stream = session.launch_stream().await.unwrap();
        stream.send(&dynamic, &launch(&out_buf)).await.unwrap();
        stream
            .next()
            .await
            .unwrap()
            .expect("a reply")
            .outcome
            .unwrap();
        check(
            "stream",
            &x,
            &bias,
            ks0,
            n,
            &out.read_f32(0, n + 16).unwrap(),
        );
    }

    // Outside the contract: a divisor of 0, a bias one element short.
    let (ks0, n) = (64usize, 256usize);
    let (_sx, bx) = f32_buffer(&session, Some(&random_f32(n)), n).await;
    let (_sb, bb) = f32_buffer(&session, Some(&random_f32(ks0 - 1)), ks0 - 1).await;
    let (_so, out_buf) = f32_buffer(&session, None, n).await;
    let with = |ks0: u64| {
        Launch::new([bx.operand(), bb.operand()], out_buf.operand(), n as u64).args([Arg::U64(ks0)])
    };
    let err = session.launch(&dynamic, &with(0)).await.unwrap_err();
    assert_eq!(reason(&err), "INVALID_ARGUMENT", "{err}");
    assert_eq!(meta(&err, "precondition"), "divisor_positive", "{err}");
    assert!(
        meta(&err, "values").contains("triton_poi_fused_add_gelu_0_param_3=0"),
        "{err}"
    );
    let err = session
        .launch(&dynamic, &with(ks0 as u64))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "BUFFER_TOO_SMALL", "{err}");
    assert_eq!(meta(&err, "operand"), "input 1");
    assert_eq!(meta(&err, "needed_bytes"), (ks0 * 4).to_string());

    // The static build: every block full, the bias 1024 elements.
    let fixed = load(
        &session,
        "jit/inductor/bias_gelu_2d_f32_static_0.ptx",
        ENTRY,
    )
    .await;
    let n = 1024 * 3;
    let (x, bias) = (random_f32(n), random_f32(1024));
    let (_sx, bx) = f32_buffer(&session, Some(&x), n).await;
    let (_sb, bb) = f32_buffer(&session, Some(&bias), 1024).await;
    let (out, out_buf) = f32_buffer(&session, None, n + 16).await;
    session
        .launch(
            &fixed,
            &Launch::new([bx.operand(), bb.operand()], out_buf.operand(), n as u64),
        )
        .await
        .unwrap();
    check(
        "static",
        &x,
        &bias,
        1024,
        n,
        &out.read_f32(0, n + 16).unwrap(),
    );
}
