//! The PTX corpus (real nvcc 13.0 and Triton 3.6 output, `tests/corpus/`):
//! exact verifier verdicts, and the host engine run on every scalar kernel
//! against a Rust reference, element by element.
#![allow(clippy::unwrap_used, clippy::panic)]

use half::f16;
use ptxd::ptx::{self, HostKernel, HostLaunch, HostSpan, PtxError, Signature};
use rand::Rng;

fn corpus(name: &str) -> String {
    let path = format!("{}/tests/corpus/{name}.ptx", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

fn sub_reason(r: Result<Signature, PtxError>) -> (&'static str, Option<String>) {
    match r {
        Err(PtxError::NonScalarAbi {
            sub_reason, param, ..
        }) => (sub_reason, param),
        other => panic!("expected NonScalarAbi, got {other:?}"),
    }
}

#[test]
fn corpus_verdicts() {
    let sig = ptx::verify(&corpus("add_f32_scalar"), "add_f32_scalar", None).unwrap();
    assert_eq!(
        sig,
        Signature {
            inputs: 2,
            element_sizes: vec![4, 4, 4],
            scalar_params: 0,
            reqntid: None,
            maxntid: None
        }
    );
    let sig = ptx::verify(&corpus("affine_f32_scalar"), "affine_f32_scalar", None).unwrap();
    assert_eq!(
        sig,
        Signature {
            inputs: 1,
            element_sizes: vec![4, 4],
            scalar_params: 2,
            reqntid: None,
            maxntid: None
        }
    );
    let sig = ptx::verify(&corpus("silu_mul_f16_scalar"), "silu_mul_f16_scalar", None).unwrap();
    assert_eq!(
        sig,
        Signature {
            inputs: 2,
            element_sizes: vec![2, 2, 2],
            scalar_params: 0,
            reqntid: None,
            maxntid: None
        }
    );
    // The Vectorized family: one float4 per thread, n counted in vectors.
    assert_eq!(
        ptx::verify(&corpus("add_f32_vec4"), "add_f32_vec4", None)
            .unwrap()
            .element_sizes,
        vec![16, 16, 16]
    );
    assert_eq!(
        sub_reason(
            ptx::canonicalize_with(
                &corpus("add_f32_vec4"),
                "add_f32_vec4",
                None,
                ptx::Families::SCALAR
            )
            .map(|c| c.signature)
        )
        .0,
        "vectorized_access"
    );
    // The seed's Strided schedule is the Strided family's (`strided.rs`);
    // Inductor's 2-D broadcast kernel the Triton family's (`broadcast.rs`).
    assert!(ptx::verify(&corpus("add_f32_strided"), "add_f32_strided", None).is_ok());
    assert!(ptx::verify(
        &corpus("jit/inductor/bias_gelu_2d_f32_static_0"),
        "triton_poi_fused_add_gelu_0",
        None
    )
    .is_ok());
    // The daemon proves the Triton family (`DAEMON_FAMILIES`); the scalar
    // ABI alone refuses its 32-bit count.
    assert_eq!(
        ptx::verify(&corpus("triton_add"), "add_kernel", None)
            .unwrap()
            .reqntid,
        Some(128)
    );
    assert_eq!(
        sub_reason(
            ptx::canonicalize_with(
                &corpus("triton_add"),
                "add_kernel",
                None,
                ptx::Families::SCALAR
            )
            .map(|c| c.signature)
        ),
        ("count_not_64bit", Some("add_kernel_param_3".to_string()))
    );
}

/// Runs `k` over `n` elements; inputs and the output start `offset` bytes
/// into their buffers; the output buffer is poisoned.
fn launch(
    k: &HostKernel,
    inputs: &mut [Vec<u8>],
    out: &mut [u8],
    n: u64,
    params: &[f32],
    threads: usize,
) {
    let spans: Vec<HostSpan> = inputs
        .iter_mut()
        .map(|b| HostSpan {
            ptr: b.as_mut_ptr(),
            len: b.len(),
        })
        .collect();
    let l = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n,
        params,
        threads,
        checked: threads % 2 == 1,
        control: None,
    };
    // SAFETY: every span is a live Vec/slice of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
}

fn rand_f32(r: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-100.0f32..100.0)).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Sizes around the block (256) and the engine's batch, and n = 0.
const SIZES: &[usize] = &[0, 1, 255, 256, 257, 1000, 4099];

#[test]
fn add_f32_runs_exactly() {
    use rand::SeedableRng;
    let k = HostKernel::compile(&corpus("add_f32_scalar"), "add_f32_scalar").unwrap();
    assert_eq!(k.block_size(), 256);
    let mut r = rand::rngs::StdRng::seed_from_u64(1);
    for &n in SIZES {
        for threads in [1, 2, 4] {
            let (a, b) = (rand_f32(&mut r, n + 3), rand_f32(&mut r, n + 3));
            let mut out = vec![0xFFu8; (n + 3) * 4];
            launch(
                &k,
                &mut [bytes(&a), bytes(&b)],
                &mut out,
                n as u64,
                &[],
                threads,
            );
            let got = floats(&out);
            for i in 0..n {
                assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits(), "n={n} i={i}");
            }
            // Past n nothing is written.
            assert!(out[n * 4..].iter().all(|x| *x == 0xFF), "n={n}");
        }
    }
}

#[test]
fn add_f32_with_offsets_and_in_place() {
    use rand::SeedableRng;
    let k = HostKernel::compile(&corpus("add_f32_scalar"), "add_f32_scalar").unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(2);
    let n = 777usize;
    // Operands at odd byte offsets into their buffers (unaligned).
    let (a, b) = (rand_f32(&mut r, n), rand_f32(&mut r, n));
    let mut ba = vec![7u8; 3];
    ba.extend(bytes(&a));
    let mut bb = vec![9u8; 5];
    bb.extend(bytes(&b));
    let mut out = vec![0xEEu8; 1 + n * 4];
    let spans = [
        HostSpan {
            ptr: ba[3..].as_mut_ptr(),
            len: n * 4,
        },
        HostSpan {
            ptr: bb[5..].as_mut_ptr(),
            len: n * 4,
        },
    ];
    let l = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: out[1..].as_mut_ptr(),
            len: n * 4,
        },
        n: n as u64,
        params: &[],
        threads: 2,
        checked: true,
        control: None,
    };
    // SAFETY: the spans lie inside live Vecs.
    unsafe { k.launch(&l) }.unwrap();
    assert_eq!(out[0], 0xEE);
    let got = floats(&out[1..]);
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits());
    }
    // In place: out aliases in0.
    let mut x = bytes(&a);
    let mut y = bytes(&b);
    let spans = [
        HostSpan {
            ptr: x.as_mut_ptr(),
            len: x.len(),
        },
        HostSpan {
            ptr: y.as_mut_ptr(),
            len: y.len(),
        },
    ];
    let l = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: x.as_mut_ptr(),
            len: x.len(),
        },
        n: n as u64,
        params: &[],
        threads: 3,
        checked: true,
        control: None,
    };
    // SAFETY: as above; aliasing is element-for-element (thread i reads then writes element i).
    unsafe { k.launch(&l) }.unwrap();
    let got = floats(&x);
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (a[i] + b[i]).to_bits());
    }
}

#[test]
fn launch_checks_operand_sizes_and_counts() {
    let k = HostKernel::compile(&corpus("add_f32_scalar"), "add_f32_scalar").unwrap();
    let mut a = vec![0u8; 40];
    let mut b = vec![0u8; 40];
    let mut out = vec![0u8; 36];
    let spans = [
        HostSpan {
            ptr: a.as_mut_ptr(),
            len: 40,
        },
        HostSpan {
            ptr: b.as_mut_ptr(),
            len: 40,
        },
    ];
    for (n, inputs, params) in [
        (10u64, &spans[..], &[][..]),
        (9, &spans[..1], &[][..]),
        (9, &spans[..], &[1.0f32][..]),
    ] {
        let l = HostLaunch {
            inputs,
            args: &[],
            output: HostSpan {
                ptr: out.as_mut_ptr(),
                len: 36,
            },
            n,
            params,
            threads: 1,
            checked: false,
            control: None,
        };
        // SAFETY: the spans are live Vecs of `len` bytes.
        assert!(unsafe { k.launch(&l) }.is_err(), "n={n}");
    }
    assert!(out.iter().all(|x| *x == 0));
}

#[test]
fn affine_f32_runs_exactly() {
    use rand::SeedableRng;
    let k = HostKernel::compile(&corpus("affine_f32_scalar"), "affine_f32_scalar").unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(3);
    for &n in SIZES {
        let a = rand_f32(&mut r, n);
        let (p0, p1) = (r.random_range(-3.0f32..3.0), r.random_range(-3.0f32..3.0));
        let mut out = vec![0xFFu8; n * 4];
        launch(&k, &mut [bytes(&a)], &mut out, n as u64, &[p0, p1], 3);
        let got = floats(&out);
        for i in 0..n {
            assert_eq!(got[i].to_bits(), a[i].mul_add(p0, p1).to_bits(), "i={i}");
        }
    }
}

/// `silu_mul_f16_scalar` uses `ex2.approx.f32`; the engine computes it in
/// f64 and rounds once, so the reference does the same and the f16 results
/// must match exactly (on a GPU they agree to the ISA's 2^-22 tolerance
/// before the f16 rounding).
#[test]
fn silu_mul_f16_runs() {
    use rand::SeedableRng;
    let k = HostKernel::compile(&corpus("silu_mul_f16_scalar"), "silu_mul_f16_scalar").unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(4);
    for &n in SIZES {
        let a: Vec<u16> = (0..n)
            .map(|_| f16::from_f32(r.random_range(-12.0..12.0)).to_bits())
            .collect();
        let b: Vec<u16> = (0..n)
            .map(|_| f16::from_f32(r.random_range(-4.0..4.0)).to_bits())
            .collect();
        let hb = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut out = vec![0xFFu8; n * 2];
        launch(&k, &mut [hb(&a), hb(&b)], &mut out, n as u64, &[], 2);
        for i in 0..n {
            let x = f16::from_bits(a[i]).to_f32();
            let y = f16::from_bits(b[i]).to_f32();
            let t = x * f32::from_bits(0xBFB8AA3B);
            let e = f64::from(t).exp2() as f32;
            let want = f16::from_f32(y * (x / (e + 1.0))).to_bits();
            let got = u16::from_le_bytes([out[2 * i], out[2 * i + 1]]);
            assert_eq!(got, want, "i={i} x={x} y={y}");
        }
    }
}

// ---- Hand-made nvcc-style variants for each refusal ----

/// An nvcc-style kernel: params `params` (`.param` lines), then `body`
/// after the canonical index computation (`%rd1` = i) and guard prologue
/// given by `guard`.
fn nvcc(name: &str, params: &[&str], extra: &str, body: &str) -> String {
    let ps: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(i, t)| format!("\t.param .{t} {name}_param_{i}"))
        .collect();
    format!(
        ".version 9.0\n.target sm_90\n.address_size 64\n{extra}\n.visible .entry {name}(\n{}\n)\n{{\n\t.reg .pred \t%p<4>;\n\t.reg .f32 \t%f<8>;\n\t.reg .b32 \t%r<8>;\n\t.reg .b64 \t%rd<24>;\n{body}\n$L__BB0_2:\n\tret;\n}}\n",
        ps.join(",\n")
    )
}

const PROLOGUE: &str = "\tmov.u32 \t%r1, %ctaid.x;\n\tmov.u32 \t%r2, %ntid.x;\n\tmul.wide.u32 \t%rd6, %r1, %r2;\n\tmov.u32 \t%r3, %tid.x;\n\tcvt.u64.u32 \t%rd7, %r3;\n\tadd.s64 \t%rd1, %rd6, %rd7;";

/// The add kernel body with `load1` replacing the load of in1 and `guard`
/// replacing the bounds check.
fn add_variant(name: &str, guard: &str, load1: &str, store: &str) -> String {
    let body = format!(
        "\tld.param.u64 \t%rd2, [{name}_param_0];\n\tld.param.u64 \t%rd3, [{name}_param_1];\n\tld.param.u64 \t%rd4, [{name}_param_2];\n\tld.param.u64 \t%rd5, [{name}_param_3];\n{PROLOGUE}\n{guard}\n\tcvta.to.global.u64 \t%rd8, %rd2;\n\tshl.b64 \t%rd9, %rd1, 2;\n\tadd.s64 \t%rd10, %rd8, %rd9;\n\tcvta.to.global.u64 \t%rd11, %rd3;\n\tadd.s64 \t%rd12, %rd11, %rd9;\n{load1}\n\tld.global.f32 \t%f2, [%rd10];\n\tadd.f32 \t%f3, %f2, %f1;\n\tcvta.to.global.u64 \t%rd13, %rd4;\n\tadd.s64 \t%rd14, %rd13, %rd9;\n{store}"
    );
    nvcc(name, &["u64", "u64", "u64", "u64"], "", &body)
}

const GUARD: &str = "\tsetp.ge.s64 \t%p1, %rd1, %rd5;\n\t@%p1 bra \t$L__BB0_2;";
const LOAD1: &str = "\tld.global.f32 \t%f1, [%rd12];";
const STORE: &str = "\tst.global.f32 \t[%rd14], %f3;";

fn reason_of(src: &str, name: &str) -> (&'static str, Option<String>) {
    sub_reason(ptx::verify(src, name, None))
}

#[test]
fn hand_made_variants() {
    // The template itself is scalar, and the name is not trusted either way.
    let ok = add_variant("plain_add", GUARD, LOAD1, STORE);
    let sig = ptx::verify(&ok, "plain_add", None).unwrap();
    assert_eq!(
        (sig.inputs, sig.element_sizes.clone(), sig.scalar_params),
        (2, vec![4, 4, 4], 0)
    );
    // `setp.lt` + branch around is the same guard.
    let lt = add_variant(
        "k",
        "\tsetp.lt.s64 \t%p1, %rd1, %rd5;\n\t@!%p1 bra \t$L__BB0_2;",
        LOAD1,
        STORE,
    );
    assert!(ptx::verify(&lt, "k", None).is_ok());
    // Declared ABI is checked.
    assert_eq!(
        ptx::verify(
            &ok,
            "plain_add",
            Some(ptx::DeclaredAbi {
                inputs: 3,
                scalar_params: 0
            })
        ),
        Err(PtxError::AbiMismatch {
            what: "inputs",
            expected: 3,
            found: 2
        })
    );
    assert_eq!(
        ptx::verify(
            &ok,
            "plain_add",
            Some(ptx::DeclaredAbi {
                inputs: 2,
                scalar_params: 1
            })
        ),
        Err(PtxError::AbiMismatch {
            what: "scalar_params",
            expected: 1,
            found: 0
        })
    );
    match ptx::verify(&ok, "nope", None) {
        Err(PtxError::SymbolNotFound { entries, .. }) => {
            assert_eq!(entries, vec!["plain_add".to_string()])
        }
        other => panic!("{other:?}"),
    }
    // Named `_scalar` but broadcasting in1[0].
    let bcast = add_variant(
        "foo_scalar",
        GUARD,
        "\tld.global.f32 \t%f1, [%rd11];",
        STORE,
    );
    assert_eq!(
        reason_of(&bcast, "foo_scalar"),
        ("non_elementwise_address", Some("foo_scalar_param_1".into()))
    );
    // Gather: in0[(int)in1[i]].
    let gather = add_variant("g", GUARD, "\tld.global.u32 \t%r4, [%rd12];\n\tmul.wide.s32 \t%rd15, %r4, 4;\n\tadd.s64 \t%rd16, %rd8, %rd15;\n\tld.global.f32 \t%f1, [%rd16];", STORE);
    assert_eq!(reason_of(&gather, "g").0, "non_elementwise_address");
    // Offset access in1[i+1].
    let off = add_variant("o", GUARD, "\tld.global.f32 \t%f1, [%rd12+4];", STORE);
    assert_eq!(reason_of(&off, "o").0, "non_elementwise_address");
    // Store through an input pointer.
    let st_in = add_variant("s", GUARD, LOAD1, "\tst.global.f32 \t[%rd12], %f3;");
    assert_eq!(
        reason_of(&st_in, "s"),
        ("pointer_misuse", Some("s_param_1".into()))
    );
    // No guard at all / a guard that does not protect (i > n lets i == n through).
    let unguarded = add_variant("u", "", LOAD1, STORE);
    assert_eq!(reason_of(&unguarded, "u").0, "unguarded_access");
    let off_by_one = add_variant(
        "u",
        "\tsetp.gt.s64 \t%p1, %rd1, %rd5;\n\t@%p1 bra \t$L__BB0_2;",
        LOAD1,
        STORE,
    );
    assert_eq!(reason_of(&off_by_one, "u").0, "unguarded_access");
    // An access placed before the guard.
    let early = add_variant("e", "\tcvta.to.global.u64 \t%rd20, %rd2;\n\tshl.b64 \t%rd21, %rd1, 2;\n\tadd.s64 \t%rd22, %rd20, %rd21;\n\tld.global.f32 \t%f5, [%rd22];\n\tsetp.ge.s64 \t%p1, %rd1, %rd5;\n\t@%p1 bra \t$L__BB0_2;", LOAD1, STORE);
    assert_eq!(reason_of(&early, "e").0, "unguarded_access");
    // Shared memory and barriers.
    let shared = add_variant("sh", GUARD, "\tld.shared.f32 \t%f1, [%rd12];", STORE);
    assert_eq!(reason_of(&shared, "sh").0, "shared_memory");
    let shared_var = nvcc(
        "sv",
        &["u64", "u64", "u64"],
        "",
        "\t.shared .align 4 .b8 smem[1024];\n\tret;",
    );
    assert_eq!(reason_of(&shared_var, "sv").0, "shared_memory");
    let bar = add_variant("b", GUARD, &format!("\tbar.sync \t0;\n{LOAD1}"), STORE);
    assert_eq!(reason_of(&bar, "b").0, "barrier");
    // A 32-bit count: the scalar ABI refuses it by name; with the 32-bit
    // index family it may be an `int n`, which a kernel that never guards
    // with it does not make safe.
    let c32 = nvcc("c", &["u64", "u64", "u64", "u32"], "", "\tret;");
    assert_eq!(
        sub_reason(
            ptx::canonicalize_with(&c32, "c", None, ptx::Families::SCALAR).map(|c| c.signature)
        ),
        ("count_not_64bit", Some("c_param_3".into()))
    );
    assert_eq!(reason_of(&c32, "c").0, "unguarded_access");
    // Extra and missing params.
    let extra = add_variant("x", GUARD, LOAD1, STORE).replace(
        "\t.param .u64 x_param_3\n",
        "\t.param .u64 x_param_3,\n\t.param .u64 x_param_4\n",
    );
    let without_strided = ptx::Families {
        strided: false,
        ..ptx::Families::ALL
    };
    assert_eq!(
        sub_reason(ptx::canonicalize_with(&extra, "x", None, without_strided).map(|c| c.signature)),
        ("extra_params", Some("x_param_4".into()))
    );
    // The Strided family takes it: an unused by-value `.u64` arg.
    assert_eq!(ptx::verify(&extra, "x", None).unwrap().scalar_params, 1);
    let missing = nvcc("m", &["u64"], "", "\tret;");
    assert_eq!(reason_of(&missing, "m").0, "missing_params");
    // reqntid: 1-D is fine (and sets the block), 2-D is refused.
    let req = add_variant("r", GUARD, LOAD1, STORE).replace(")\n{", ")\n.reqntid 128, 1, 1\n{");
    assert_eq!(ptx::verify(&req, "r", None).unwrap().reqntid, Some(128));
    assert_eq!(HostKernel::compile(&req, "r").unwrap().block_size(), 128);
    let req2 = add_variant("r", GUARD, LOAD1, STORE).replace(")\n{", ")\n.reqntid 32, 4, 1\n{");
    assert_eq!(reason_of(&req2, "r").0, "reqntid_conflict");
    let max2 = add_variant("r", GUARD, LOAD1, STORE).replace(")\n{", ")\n.maxntid 16, 16, 1\n{");
    assert_eq!(reason_of(&max2, "r").0, "maxntid");
    // The count used as data, a pointer compared, 32-bit index.
    let count_data = add_variant("cd", GUARD, "\tcvt.rn.f32.s64 \t%f1, %rd5;", STORE).replace(
        "\tld.global.f32 \t%f2, [%rd10];",
        "\tld.global.f32 \t%f2, [%rd10];\n\tld.global.f32 \t%f4, [%rd12];",
    );
    assert_eq!(
        reason_of(&count_data, "cd"),
        ("param_misuse", Some("cd_param_3".into()))
    );
    let narrow = add_variant("n", "\tmad.lo.s32 \t%r4, %r1, %r2, %r3;\n\tcvt.s64.s32 \t%rd1, %r4;\n\tsetp.ge.s64 \t%p1, %rd1, %rd5;\n\t@%p1 bra \t$L__BB0_2;", LOAD1, STORE);
    // A 32-bit index: the scalar ABI refuses it; the 32-bit index family
    // accepts it under `index_fits_i32`, which its contract carries.
    assert_eq!(
        sub_reason(
            ptx::canonicalize_with(&narrow, "n", None, ptx::Families::SCALAR).map(|c| c.signature)
        )
        .0,
        "index_not_64bit"
    );
    let contract = ptx::canonicalize(&narrow, "n", None).unwrap().contract;
    assert!(contract
        .preconditions
        .iter()
        .any(|p| p.name == "index_fits_i32"));
    // A vectorized store.
    let v2 = add_variant(
        "v",
        GUARD,
        LOAD1,
        "\tst.global.v2.f32 \t[%rd14], {%f3, %f3};",
    );
    assert_eq!(reason_of(&v2, "v").0, "vectorized_access");
}

/// Parser robustness: every prefix of every corpus file, and thousands of
/// seeded random mutations, must give a result (Ok or a typed error) and
/// never panic; compile (verify + decode) too.
#[test]
fn truncations_and_mutations_never_panic() {
    use rand::SeedableRng;
    let names = [
        "add_f32_scalar",
        "add_f32_strided",
        "add_f32_vec4",
        "affine_f32_scalar",
        "silu_mul_f16_scalar",
        "triton_add",
    ];
    let symbols = [
        "add_f32_scalar",
        "add_f32_strided",
        "add_f32_vec4",
        "affine_f32_scalar",
        "silu_mul_f16_scalar",
        "add_kernel",
    ];
    let mut r = rand::rngs::StdRng::seed_from_u64(0xF022);
    let alphabet: &[u8] = b" \n\t{}[]()<>;,.:@!%|+-0123456789abcdefxyz_$\"/*";
    let mut runs = 0usize;
    for (name, sym) in names.iter().zip(symbols) {
        let text = corpus(name);
        let mut cuts: Vec<usize> = (0..=text.len())
            .filter(|i| text.is_char_boundary(*i))
            .collect();
        if text.len() > 4000 {
            // The Triton file's debug tail is long; every prefix of the
            // kernel part plus a sample of the rest.
            cuts.retain(|i| *i < 4000 || i % 7 == 0);
        }
        for cut in cuts {
            let _ = ptx::verify(&text[..cut], sym, None);
            runs += 1;
        }
        for _ in 0..1500 {
            let mut b = text.clone().into_bytes();
            for _ in 0..r.random_range(1..8) {
                let at = r.random_range(0..b.len());
                match r.random_range(0..4) {
                    0 => b[at] = alphabet[r.random_range(0..alphabet.len())],
                    1 => {
                        b.remove(at);
                    }
                    2 => b.insert(at, alphabet[r.random_range(0..alphabet.len())]),
                    _ => {
                        let end = (at + r.random_range(1..40)).min(b.len());
                        let chunk: Vec<u8> = b[at..end].to_vec();
                        let to = r.random_range(0..b.len());
                        for (k, c) in chunk.into_iter().enumerate() {
                            b.insert((to + k).min(b.len()), c);
                        }
                    }
                }
            }
            let s = String::from_utf8_lossy(&b);
            let _ = ptx::verify(&s, sym, None);
            if let Ok(k) = HostKernel::compile(&s, sym) {
                // A mutant that still verifies must run in bounds.
                let sig = k.signature().clone();
                let n = 300u64;
                let mut bufs: Vec<Vec<u8>> = sig
                    .element_sizes
                    .iter()
                    .map(|e| vec![0x3Cu8; n as usize * *e as usize])
                    .collect();
                let mut out = bufs.pop().unwrap();
                let params = vec![0.5f32; sig.scalar_params as usize];
                let spans: Vec<HostSpan> = bufs
                    .iter_mut()
                    .map(|v| HostSpan {
                        ptr: v.as_mut_ptr(),
                        len: v.len(),
                    })
                    .collect();
                let l = HostLaunch {
                    inputs: &spans,
                    args: &[],
                    output: HostSpan {
                        ptr: out.as_mut_ptr(),
                        len: out.len(),
                    },
                    n,
                    params: &params,
                    threads: 1,
                    checked: true,
                    control: None,
                };
                // SAFETY: live Vecs of `len` bytes.
                let _ = unsafe { k.launch(&l) };
            }
            runs += 1;
        }
    }
    // Pathological inputs.
    for s in [
        "{".repeat(100_000),
        "}".repeat(1000),
        ".entry k(".to_string() + &".param .u64 a,".repeat(10_000),
        ".reg .b32 %r<99999999999999999999>;".to_string(),
        "/*".to_string(),
        "\"".to_string(),
        ".section .x {".repeat(1000),
    ] {
        let _ = ptx::verify(&s, "k", None);
        runs += 1;
    }
    assert!(runs > 9000, "{runs}");
}
