//! Host engine throughput on the corpus scalar kernels vs a plain Rust loop
//! doing the same math, 16M elements. Run: `cargo bench --bench host_engine`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Instant;

use half::f16;
use ptxd::ptx::{HostKernel, HostLaunch, HostSpan};

const N: usize = 16 << 20;

fn corpus(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/corpus/{name}.ptx",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn best(mut f: impl FnMut()) -> f64 {
    f();
    (0..3)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn engine(name: &str, ins: &mut [Vec<u8>], out: &mut [u8], params: &[f32], threads: usize) -> f64 {
    let k = HostKernel::compile(&corpus(name), name).unwrap();
    launch_time(&k, ins, out, params, threads)
}

/// A JIT corpus kernel (`tests/corpus/jit/<file>`), when the verifier
/// accepts it; else the refusal, printed in place of its row.
fn jit_kernel(file: &str, entry: &str) -> Result<HostKernel, String> {
    let text = std::fs::read_to_string(format!(
        "{}/tests/corpus/jit/{file}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    HostKernel::compile(&text, entry).map_err(|e| e.to_string())
}

fn launch_time(
    k: &HostKernel,
    ins: &mut [Vec<u8>],
    out: &mut [u8],
    params: &[f32],
    threads: usize,
) -> f64 {
    let spans: Vec<HostSpan> = ins
        .iter_mut()
        .map(|b| HostSpan {
            ptr: b.as_mut_ptr(),
            len: b.len(),
        })
        .collect();
    let output = HostSpan {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    best(|| {
        let l = HostLaunch {
            inputs: &spans,
            args: &[],
            output,
            n: N as u64,
            params,
            threads,
            checked: false,
            control: None,
        };
        // SAFETY: spans are live Vecs of `len` bytes for the whole run.
        unsafe { k.launch(&l) }.unwrap();
    })
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let a: Vec<u8> = (0..N)
        .flat_map(|i| ((i % 1000) as f32 * 0.01).to_le_bytes())
        .collect();
    let b: Vec<u8> = (0..N)
        .flat_map(|i| ((i % 777) as f32 * -0.02).to_le_bytes())
        .collect();
    let mut out = vec![0u8; N * 4];
    let fa: Vec<f32> = a
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let fb: Vec<f32> = b
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut fo = vec![0f32; N];
    let h: Vec<u16> = fa.iter().map(|x| f16::from_f32(*x).to_bits()).collect();
    let h2: Vec<u16> = fb.iter().map(|x| f16::from_f32(*x).to_bits()).collect();
    let mut ho = vec![0u16; N];

    println!("host engine vs plain Rust loop, n = {N} elements, engine threads = {threads}");
    println!(
        "{:<22} {:>16} {:>16} {:>16} {:>10}",
        "kernel", "engine 1T el/s", "engine NT el/s", "rust loop el/s", "loop/1T"
    );
    let row = |name: &str, e1: f64, en: f64, r: f64| {
        let n = N as f64;
        println!(
            "{name:<22} {:>16.3e} {:>16.3e} {:>16.3e} {:>9.1}x",
            n / e1,
            n / en,
            n / r,
            e1 / r
        );
    };

    let e1 = engine(
        "add_f32_scalar",
        &mut [a.clone(), b.clone()],
        &mut out,
        &[],
        1,
    );
    let en = engine(
        "add_f32_scalar",
        &mut [a.clone(), b.clone()],
        &mut out,
        &[],
        threads,
    );
    let r = best(|| {
        for i in 0..N {
            fo[i] = fa[i] + fb[i];
        }
        std::hint::black_box(&fo);
    });
    row("add_f32_scalar", e1, en, r);

    let e1 = engine(
        "affine_f32_scalar",
        &mut [a.clone()],
        &mut out,
        &[1.5, -0.25],
        1,
    );
    let en = engine(
        "affine_f32_scalar",
        &mut [a.clone()],
        &mut out,
        &[1.5, -0.25],
        threads,
    );
    let r = best(|| {
        for i in 0..N {
            fo[i] = fa[i].mul_add(1.5, -0.25);
        }
        std::hint::black_box(&fo);
    });
    row("affine_f32_scalar", e1, en, r);

    let hb = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut out16 = vec![0u8; N * 2];
    let e1 = engine(
        "silu_mul_f16_scalar",
        &mut [hb(&h), hb(&h2)],
        &mut out16,
        &[],
        1,
    );
    let en = engine(
        "silu_mul_f16_scalar",
        &mut [hb(&h), hb(&h2)],
        &mut out16,
        &[],
        threads,
    );
    let r = best(|| {
        for i in 0..N {
            let x = f16::from_bits(h[i]).to_f32();
            let e = f64::from(x * -std::f32::consts::LOG2_E).exp2() as f32;
            ho[i] = f16::from_f32(f16::from_bits(h2[i]).to_f32() * (x / (e + 1.0))).to_bits();
        }
        std::hint::black_box(&ho);
    });
    row("silu_mul_f16_scalar", e1, en, r);

    // Triton's own `add` (BLOCK_SIZE 1024, 4 warps, masked tail): 8
    // elements per thread, its grid from the contract.
    match jit_kernel("triton/add_f32_b1024_w4_nodiv.ptx", "add_kernel") {
        Ok(k) => {
            let e1 = launch_time(&k, &mut [a.clone(), b.clone()], &mut out, &[], 1);
            let en = launch_time(&k, &mut [a.clone(), b.clone()], &mut out, &[], threads);
            let r = best(|| {
                for i in 0..N {
                    fo[i] = fa[i] + fb[i];
                }
                std::hint::black_box(&fo);
            });
            row("triton add_f32 b1024", e1, en, r);
        }
        Err(e) => println!(
            "{:<22} not run: the verifier refuses it ({e})",
            "triton add_f32 b1024"
        ),
    }
}
