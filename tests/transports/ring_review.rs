//! Review (w32r): the launch ring against the unary path for every kernel
//! of the JIT corpus the daemon accepts (NVRTC's scalar ABI, 32-bit
//! indices, Vectorized, Strided, calls and frames; Triton; Inductor), at
//! hostile launches through the real daemon: counts at every
//! precondition's edge (0, 2^31, 2^32, 2^63, u64::MAX), typed args of the
//! wrong type or number, f32 bits read as a count, negative and huge
//! strides and divisors, f32 params for typed params, offsets near 2^64 or
//! misaligned, and footprints one element past a buffer's end. For every
//! launch the ring's completion names the reason the unary path refuses it
//! with, or both run. A ring that runs what the unary path refuses is a
//! hole.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::ring_completions::{next, refusal};
use crate::support::{f32_buffer, Daemon};
use ptxd::launch::{BoundContract, LaunchTerms, ScalarArg};
use ptxd::ptx::contract::{ParamKind, ScalarType};
use ptxd_client::{Arg, Buffer, Client, Kernel, Launch, Session};
use rand::{Rng, SeedableRng};

/// Bytes of each operand buffer.
const BYTES: u64 = 1 << 16;

/// Every kernel of the JIT corpus's manifests: (file under tests/corpus,
/// entry).
fn jit_corpus() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit");
    let mut out = Vec::new();
    for family in ["nvrtc", "triton", "inductor"] {
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join(family).join("manifest.json")).unwrap(),
        )
        .unwrap();
        for k in manifest["kernels"].as_array().unwrap() {
            out.push((
                format!("jit/{}", k["file"].as_str().unwrap()),
                k["entry"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// The reason the unary path refuses a launch with ("" when it runs).
async fn unary(session: &Session, kernel: &Kernel, launch: Launch) -> String {
    match session.launch(kernel, &launch.sync(true)).await {
        Ok(_) => String::new(),
        Err(e) => e.reason_name().to_string(),
    }
}

/// A hostile arg for a param of type `ty` (mostly its own type, with
/// boundary bits), and its bits as the launch check reads them.
fn hostile_arg(rng: &mut impl Rng, ty: ScalarType) -> (Arg, ScalarArg) {
    let ty = if rng.random_range(0..10) == 0 {
        [
            ScalarType::U32,
            ScalarType::S32,
            ScalarType::U64,
            ScalarType::S64,
            ScalarType::F32,
            ScalarType::F64,
        ][rng.random_range(0..6)]
    } else {
        ty
    };
    let bits: u64 = match rng.random_range(0..9) {
        0 => 0,
        1 => u64::MAX,
        2 => 1 << rng.random_range(0..64),
        3 => (-rng.random_range(1i64..100)) as u64,
        4 => rng.random_range(0..=u64::MAX),
        _ => rng.random_range(1..40),
    };
    match ty {
        ScalarType::U32 => (Arg::U32(bits as u32), ScalarArg::U32(bits as u32)),
        ScalarType::S32 => (Arg::I32(bits as i32), ScalarArg::I32(bits as i32)),
        ScalarType::U64 => (Arg::U64(bits), ScalarArg::U64(bits)),
        ScalarType::S64 => (Arg::I64(bits as i64), ScalarArg::I64(bits as i64)),
        ScalarType::F32 => {
            let v = f32::from_bits(bits as u32);
            (Arg::F32(v), ScalarArg::F32(v))
        }
        ScalarType::F64 => {
            let v = f64::from_bits(bits);
            (Arg::F64(v), ScalarArg::F64(v))
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ring_refuses_what_the_unary_path_refuses_for_every_jit_kernel() {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-review").await.unwrap();
    let mut buffers: Vec<(ptxd_client::HostShm, Buffer)> = Vec::new();
    for _ in 0..6 {
        buffers.push(f32_buffer(&session, None, (BYTES / 4) as usize).await);
    }
    let mut ring = session.open_ring(16, 0).await.unwrap();
    let (mut kernels, mut launches, mut ran, mut limit_first) = (0, 0, 0, 0);
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    for (file, entry) in jit_corpus() {
        let text = crate::support::corpus(&file);
        let Ok(canonical) = ptxd::ptx::canonicalize(&text, &entry, None) else {
            continue;
        };
        let kernel = session
            .load_ptx(0, text, &entry, ptxd_client::LoadOptions::default())
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        if !kernel.signature().ring_launchable {
            continue;
        }
        kernels += 1;
        let contract = &canonical.contract;
        let terms = BoundContract {
            contract,
            block: kernel.signature().block_size,
        };
        let types: Vec<ScalarType> = contract
            .params
            .iter()
            .filter_map(|p| match p.kind {
                ParamKind::Scalar(t) => Some(t),
                _ => None,
            })
            .collect();
        let operands = contract.footprints.len();
        assert!(operands <= buffers.len(), "{file}");
        // The count the ring holds the kernel to, if the front grants it
        // with one (the signature's contract plus count preconditions).
        let limit = ptxd::ring_check::grant_terms(contract, &canonical.signature, terms.block)
            .and_then(|g| g.max_count);
        for _ in 0..24 {
            let mut n: u64 = match rng.random_range(0..8) {
                0 => [0, 1 << 31, 1 << 32, i64::MAX as u64, 1 << 63, u64::MAX]
                    [rng.random_range(0..6)],
                1 => (1u64 << rng.random_range(0..64)).wrapping_sub(rng.random_range(0..2)),
                _ => rng.random_range(0..2048),
            };
            let (mut args, mut bits): (Vec<Arg>, Vec<ScalarArg>) =
                types.iter().map(|t| hostile_arg(&mut rng, *t)).unzip();
            if rng.random_range(0..20) == 0 {
                args.push(Arg::U64(1));
                bits.push(ScalarArg::U64(1));
            }
            let f32_params = !args.is_empty() && rng.random_range(0..10) == 0;
            let arg_bits: Vec<u64> = bits.iter().map(|a| a.bits()).collect();
            // A launch the contract passes at a count past what the host
            // runs quickly (a footprint that does not grow with n) runs
            // small instead: this compares checks, not the engine's speed.
            if n > 4096
                && terms
                    .values(n, if f32_params { &[] } else { &arg_bits })
                    .is_ok()
            {
                n = rng.random_range(0..4096);
            }
            let values = contract.values(n, terms.block);
            // Offsets: at the footprint's edge (the largest that fits, or
            // one element past it), misaligned, near 2^64, or 0.
            let offsets: Vec<u64> = (0..operands)
                .map(|k| {
                    let f = &contract.footprints[k];
                    let align = u64::from(f.alignment.max(1));
                    let need = f
                        .bytes
                        .eval_with(&values, &arg_bits)
                        .and_then(|b| u64::try_from(b).ok());
                    match (rng.random_range(0..6), need) {
                        (0, _) => u64::MAX - rng.random_range(0..16),
                        (1, _) => align * rng.random_range(0..8) + rng.random_range(0..align),
                        (2 | 3, Some(b)) if b <= BYTES => {
                            let edge = (BYTES - b) / align * align;
                            if rng.random() {
                                edge
                            } else {
                                edge + align
                            }
                        }
                        _ => 0,
                    }
                })
                .collect();
            let on = |k: usize| (&buffers[k].1, offsets[k]);
            let inputs: Vec<(&Buffer, u64)> = (0..operands - 1).map(on).collect();
            let output = on(operands - 1);
            let submitted = if f32_params {
                let params: Vec<f32> = (0..args.len()).map(|_| rng.random()).collect();
                let ticket = ring.launch(&kernel, &inputs, output, n, &params);
                let launch = Launch::new(
                    inputs.iter().map(|(b, o)| b.at(*o)),
                    output.0.at(output.1),
                    n,
                )
                .params(params.iter().map(|p| f64::from(*p)));
                (ticket, launch)
            } else {
                let ticket = ring.launch_args(&kernel, &inputs, output, n, &args);
                let launch = Launch::new(
                    inputs.iter().map(|(b, o)| b.at(*o)),
                    output.0.at(output.1),
                    n,
                )
                .args(args.clone());
                (ticket, launch)
            };
            let (ticket, launch) = submitted;
            // A descriptor the client cannot build (more typed args than a
            // slot holds) never reaches the ring.
            if ticket.is_err() {
                continue;
            }
            let on_ring = refusal(&next(&mut ring));
            let on_unary = unary(&session, &kernel, launch).await;
            let what = format!(
                "{file}: n {n}, args {args:?} (f32 params {f32_params}), offsets {offsets:?}"
            );
            // Past a count limit too: the ring checks the whole contract
            // in the unary path's order (see
            // `past_its_count_limit_a_ring_refusal_names_the_launchs_first_mistake`).
            assert_eq!(on_ring, on_unary, "{what}");
            if limit.is_some_and(|max| n > max) {
                limit_first += 1;
            }
            launches += 1;
            ran += usize::from(on_ring.is_empty());
            *reasons.entry(on_ring).or_default() += 1;
        }
    }
    eprintln!(
        "{kernels} kernels, {launches} launches, {ran} ran, {limit_first} past a count limit; {reasons:?}"
    );
    assert!(kernels >= 150, "{kernels}");
    assert!(ran > launches / 20, "{ran} of {launches}");
    for reason in [
        "BUFFER_TOO_SMALL",
        "SCALAR_ARGS_MISMATCH",
        "INVALID_ARGUMENT",
        "",
    ] {
        assert!(reasons.contains_key(reason), "{reason}: {reasons:?}");
    }
}

/// A kernel the front could hold to a count limit (a 32-bit index:
/// `affine_f32_idx32`) was refused past the limit before its scalars and
/// arity were checked, so a launch with two mistakes, a mistyped arg and a
/// count past the limit, was refused `INVALID_ARGUMENT` (the precondition)
/// on the ring and `SCALAR_ARGS_MISMATCH` on the unary path, which checks
/// the scalars first. The front's grant (`ring_check::grant_terms`) now
/// sends a contract the ring can decode whole, without `max_count`, so the
/// ring checks it with `check_with_args` in the unary path's order.
#[tokio::test(flavor = "multi_thread")]
async fn past_its_count_limit_a_ring_refusal_names_the_launchs_first_mistake() {
    let daemon = Daemon::start(&[]);
    let client = Client::connect(&daemon.target()).await.unwrap();
    let session = client.open_session("ring-review-limit").await.unwrap();
    let kernel = crate::support::load(
        &session,
        "jit/nvrtc/affine_f32_idx32_O3.ptx",
        "affine_f32_idx32",
    )
    .await;
    let (_x_shm, x) = f32_buffer(&session, None, 1024).await;
    let (_out_shm, out) = f32_buffer(&session, None, 1024).await;
    let mut ring = session.open_ring(4, 0).await.unwrap();
    for (n, args) in [
        (1u64 << 63, vec![Arg::I64(7), Arg::F32(1.0)]),
        (1 << 32, vec![Arg::F32(1.0)]),
        (u64::MAX, vec![Arg::F32(1.0), Arg::F32(1.0), Arg::F32(1.0)]),
    ] {
        ring.launch_args(&kernel, &[(&x, 0)], (&out, 0), n, &args)
            .unwrap();
        let on_ring = refusal(&next(&mut ring));
        let launch = Launch::new([x.operand()], out.operand(), n).args(args.clone());
        assert_eq!(
            on_ring,
            unary(&session, &kernel, launch).await,
            "n {n}, {args:?}"
        );
        assert_eq!(on_ring, "SCALAR_ARGS_MISMATCH");
    }
}
