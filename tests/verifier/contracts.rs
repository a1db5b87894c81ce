//! Launch contracts by proof (issue 21): what the verifier proves for each
//! kernel family, as the contract the launch check evaluates, run on the
//! host engine against a Rust reference (every element compared, outputs
//! poisoned first, fresh random inputs), and the attacks each family must
//! refuse with its exact reason, at load or at launch.
//!
//! Families beyond the scalar ABI are verified with [`Families::ALL`]; the
//! daemon's loads use [`ptx::DAEMON_FAMILIES`] (see `docs/verifier.md`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ptxd::handles::DeviceGeneration;
use ptxd::launch::{
    self, BoundContract, BufferCap, Capabilities, CheckedLaunch, EventCap, KernelCap,
    LaunchRefusal, LaunchShape, Placement,
};
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, LaunchContract, PtxError};
use rand::Rng;

use crate::support::mutants;

fn corpus(name: &str) -> String {
    let path = format!("{}/tests/corpus/{name}.ptx", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

fn sub_reason<T: std::fmt::Debug>(r: Result<T, PtxError>) -> &'static str {
    match r {
        Err(PtxError::NonScalarAbi { sub_reason, .. }) => sub_reason,
        other => panic!("expected NonScalarAbi, got {other:?}"),
    }
}

fn contract_of(text: &str, symbol: &str) -> LaunchContract {
    ptx::canonicalize_with(text, symbol, None, Families::ALL)
        .unwrap()
        .contract
}

const HERE: Placement = Placement {
    device_index: 0,
    generation: DeviceGeneration(1),
};

/// Buffers by index, of the given sizes.
struct Table(Vec<u64>);

impl Capabilities for Table {
    type Operand = (usize, u64);
    type Event = usize;
    type Error = LaunchRefusal;
    fn operand(&self, &(i, offset): &(usize, u64)) -> Result<(BufferCap, u64), LaunchRefusal> {
        let size = *self.0.get(i).ok_or(LaunchRefusal::Internal("not held"))?;
        Ok((
            BufferCap {
                id: i as u64,
                size,
                placement: HERE,
            },
            offset,
        ))
    }
    fn event(&self, _: &usize) -> Result<EventCap, LaunchRefusal> {
        Err(LaunchRefusal::Internal("no events"))
    }
    fn describe(&self, _: Placement) -> String {
        "HOST-0@1".into()
    }
}

/// The launch check of `contract` (block `block`) over buffers of `sizes`,
/// the inputs at `offsets` and the output last.
fn check(
    contract: &LaunchContract,
    block: u32,
    sizes: &[u64],
    offsets: &[u64],
    n: u64,
) -> Result<CheckedLaunch, LaunchRefusal> {
    let operands: Vec<(usize, u64)> = offsets.iter().copied().enumerate().collect();
    let (output, inputs) = operands.split_last().unwrap();
    let bound = BoundContract { contract, block };
    launch::check(
        &Table(sizes.to_vec()),
        KernelCap {
            signature: &bound,
            placement: HERE,
        },
        &LaunchShape {
            inputs,
            output: Some(output),
            n,
            scalars: contract.scalar_params(),
            wait: None,
            signal: None,
        },
    )
}

/// Runs `kernel` over `n` elements of `inputs` into a poisoned output of
/// `out_len` bytes; the output's bytes.
fn run_host(kernel: &HostKernel, inputs: &[Vec<u8>], out_len: usize, n: u64) -> Vec<u8> {
    run_host_with(kernel, inputs, out_len, n, &[])
}

/// [`run_host`] with float params.
fn run_host_with(
    kernel: &HostKernel,
    inputs: &[Vec<u8>],
    out_len: usize,
    n: u64,
    params: &[f32],
) -> Vec<u8> {
    let mut out = vec![0xA5u8; out_len];
    let spans: Vec<HostSpan> = inputs
        .iter()
        .map(|b| HostSpan {
            ptr: b.as_ptr() as *mut u8,
            len: b.len(),
        })
        .collect();
    for threads in [1, 3] {
        out.fill(0xA5);
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
            checked: threads == 3,
            control: None,
        };
        // SAFETY: every span is a live Vec of exactly `len` bytes; inputs
        // are only read.
        unsafe { kernel.launch(&l) }.unwrap();
    }
    out
}

fn random_f32s(rng: &mut impl Rng, count: usize) -> Vec<f32> {
    (0..count).map(|_| rng.random_range(-1e3f32..1e3)).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

// ---- the scalar ABI: exactly today's contract --------------------------

#[test]
fn the_scalar_abi_comes_out_as_todays_contract() {
    let text = corpus("add_f32_scalar");
    let (signature, contract) =
        ptx::verify_contract(&text, "add_f32_scalar", None, Families::ALL).unwrap();
    assert_eq!(
        contract,
        LaunchContract::scalar(
            &signature,
            &contract
                .params
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
        )
    );
    assert_eq!(
        contract.to_string(),
        "params(add_f32_scalar_param_0: ptr read, add_f32_scalar_param_1: ptr read, \
         add_f32_scalar_param_2: ptr written, add_f32_scalar_param_3: count .s64); \
         block <= 256; grid ceil(n / block); add_f32_scalar_param_0[n × 4] align 4; \
         add_f32_scalar_param_1[n × 4] align 4; add_f32_scalar_param_2[n × 4] align 4; \
         requires count_fits_i64: n <= 9223372036854775807"
    );
    // The daemon's families give the very same contract.
    assert_eq!(
        ptx::canonicalize(&text, "add_f32_scalar", None)
            .unwrap()
            .contract,
        contract
    );
}

// ---- (b) the seed's Vectorized{2,4} ---------------------------------

/// The seed's Vectorized{2} schedule of `out = in0 + in1` on `float2`, as
/// nvcc writes it (the `float4` one is `tests/corpus/add_f32_vec4.ptx`).
const ADD_F32_VEC2: &str = r#"
.version 9.0
.target sm_90
.address_size 64

.visible .entry add_f32_vec2(
	.param .u64 add_f32_vec2_param_0,
	.param .u64 add_f32_vec2_param_1,
	.param .u64 add_f32_vec2_param_2,
	.param .u64 add_f32_vec2_param_3
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<9>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<15>;

	ld.param.u64 	%rd2, [add_f32_vec2_param_0];
	ld.param.u64 	%rd3, [add_f32_vec2_param_1];
	ld.param.u64 	%rd4, [add_f32_vec2_param_2];
	ld.param.u64 	%rd5, [add_f32_vec2_param_3];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd6, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd7, %r3;
	add.s64 	%rd1, %rd6, %rd7;
	setp.ge.s64 	%p1, %rd1, %rd5;
	@%p1 bra 	$L__BB0_2;

	cvta.to.global.u64 	%rd8, %rd2;
	shl.b64 	%rd9, %rd1, 3;
	add.s64 	%rd10, %rd8, %rd9;
	ld.global.v2.f32 	{%f1, %f2}, [%rd10];
	cvta.to.global.u64 	%rd11, %rd3;
	add.s64 	%rd12, %rd11, %rd9;
	ld.global.v2.f32 	{%f3, %f4}, [%rd12];
	cvta.to.global.u64 	%rd13, %rd4;
	add.s64 	%rd14, %rd13, %rd9;
	add.f32 	%f5, %f1, %f3;
	add.f32 	%f6, %f2, %f4;
	st.global.v2.f32 	[%rd14], {%f5, %f6};

$L__BB0_2:
	ret;

}
"#;

fn vectorized_kernels() -> Vec<(String, &'static str, usize)> {
    vec![
        (corpus("add_f32_vec4"), "add_f32_vec4", 4),
        (ADD_F32_VEC2.to_string(), "add_f32_vec2", 2),
    ]
}

#[test]
fn vectorized_kernels_get_a_contract_in_vectors_and_run_on_the_host() {
    let mut rng = rand::rng();
    for (text, symbol, lanes) in vectorized_kernels() {
        let vector = 4 * lanes as u64;
        let contract = contract_of(&text, symbol);
        let sizes: Vec<u32> = contract.footprints.iter().map(|f| f.alignment).collect();
        assert_eq!(sizes, vec![vector as u32; 3], "{symbol}");
        assert!(
            contract
                .to_string()
                .contains(&format!("[n × {vector}] align {vector}")),
            "{contract}"
        );
        let kernel = HostKernel::compile_with(&text, symbol, Families::ALL).unwrap();
        for n in [1usize, 255, 256, 257, 1000 + rng.random_range(0..100)] {
            let a = random_f32s(&mut rng, n * lanes);
            let b = random_f32s(&mut rng, n * lanes);
            let out = run_host(&kernel, &[bytes(&a), bytes(&b)], n * lanes * 4, n as u64);
            let got = floats(&out);
            for (j, g) in got.iter().enumerate() {
                assert_eq!(g.to_bits(), (a[j] + b[j]).to_bits(), "{symbol} n={n} [{j}]");
            }
        }
    }
}

#[test]
fn the_daemon_accepts_the_families_and_the_scalar_abi_alone_refuses_them() {
    // Every family, Triton's included (both executors pack its params from
    // the contract).
    assert_eq!(ptx::DAEMON_FAMILIES, Families::ALL);
    for (text, symbol, _) in vectorized_kernels() {
        assert!(ptx::verify(&text, symbol, None).is_ok(), "{symbol}");
        assert_eq!(
            sub_reason(ptx::canonicalize_with(
                &text,
                symbol,
                None,
                Families::SCALAR
            )),
            "vectorized_access"
        );
    }
}

#[test]
fn a_vectorized_launch_one_vector_over_its_buffer_or_misaligned_is_refused() {
    for (text, symbol, lanes) in vectorized_kernels() {
        let contract = contract_of(&text, symbol);
        let vector = 4 * lanes as u64;
        let n = 1000u64;
        let fits = n * vector;
        assert!(check(&contract, 256, &[fits, fits, fits], &[0, 0, 0], n).is_ok());
        // One vector over: the output's footprint passes its buffer.
        assert_eq!(
            check(&contract, 256, &[fits, fits, fits], &[0, 0, 0], n + 1),
            Err(LaunchRefusal::BufferTooSmall {
                operand: "input 0".into(),
                needed_bytes: u128::from(fits + vector),
                buffer_bytes: fits,
            })
        );
        // An offset of one float: the vector access would be misaligned.
        let big = fits + vector;
        assert_eq!(
            check(&contract, 256, &[big, big, big], &[0, 4, 0], n),
            Err(LaunchRefusal::Misaligned {
                operand: "input 1".into(),
                offset: 4,
                element_size: vector as u32,
            })
        );
    }
}

/// Attacks on the vectorized family, each refused at load with its exact
/// sub_reason.
#[test]
fn vectorized_attacks_are_refused_at_load() {
    let vec4 = corpus("add_f32_vec4");
    let load = |text: &str| ptx::verify_contract(text, "add_f32_vec4", None, Families::ALL);
    let cases: Vec<(&str, String, &str)> = vec![
        // A float4 access at a float stride: vectors overlap between threads.
        (
            "v4 at stride 4",
            vec4.replace("shl.b64 \t%rd9, %rd1, 4;", "shl.b64 \t%rd9, %rd1, 2;"),
            "vectorized_access",
        ),
        // A float4 access at a stride of two vectors: a footprint of 2n.
        (
            "v4 at stride 32",
            vec4.replace("shl.b64 \t%rd9, %rd1, 4;", "shl.b64 \t%rd9, %rd1, 5;"),
            "vectorized_access",
        ),
        // A float4 store one vector past element i.
        (
            "v4 store at i+1",
            vec4.replace(
                "st.global.v4.f32 \t[%rd14]",
                "st.global.v4.f32 \t[%rd14+16]",
            ),
            "non_elementwise_address",
        ),
        // A list that does not match its vector width.
        (
            "v4 with two registers",
            vec4.replace(
                "ld.global.v4.f32 \t{%f1, %f2, %f3, %f4}, [%rd10];",
                "ld.global.v4.f32 \t{%f1, %f2}, [%rd10];",
            ),
            "operand_type",
        ),
        // A vector of the param space reads past its param.
        (
            "ld.param.v2",
            vec4.replace(
                "ld.param.u64 \t%rd2, [add_f32_vec4_param_0];",
                "ld.param.v2.u64 \t{%rd2, %rd14}, [add_f32_vec4_param_0];",
            ),
            "vectorized_access",
        ),
        // Eight lanes are never the family's.
        (
            "v8",
            vec4.replace(
                "ld.global.v4.f32 \t{%f1, %f2, %f3, %f4}, [%rd10];",
                "ld.global.v8.f32 \t{%f1, %f2, %f3, %f4, %f5, %f6, %f7, %f8}, [%rd10];",
            ),
            "vectorized_access",
        ),
        // A store through an input pointer, as a vector.
        (
            "v4 store through an input",
            vec4.replace("st.global.v4.f32 \t[%rd14]", "st.global.v4.f32 \t[%rd10]"),
            "pointer_misuse",
        ),
        // A vector load of the output's pointer bits stored as data.
        (
            "pointer stored in a vector",
            vec4.replace(
                "st.global.v4.f32 \t[%rd14], {%f20, %f19, %f18, %f17};",
                "st.global.v2.u64 \t[%rd14], {%rd2, %rd2};",
            ),
            "pointer_escape",
        ),
    ];
    for (what, text, want) in cases {
        assert_ne!(text, vec4, "{what}: the mutation did not apply");
        assert_eq!(sub_reason(load(&text)), want, "{what}");
    }
}

// ---- (a) the 32-bit index ------------------------------------------------

/// `int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] =
/// a[i] + b[i];` with `long long n`, as nvcc writes it; `INDEX` and `SCALE`
/// are the lines that compute `i` and `i × 4`.
const ADD_I32_TEMPLATE: &str = r#"
.version 9.0
.target sm_90
.address_size 64

.visible .entry add_i32(
	.param .u64 add_i32_param_0,
	.param .u64 add_i32_param_1,
	.param .u64 add_i32_param_2,
	.param .u64 add_i32_param_3
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<4>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<15>;

	ld.param.u64 	%rd2, [add_i32_param_0];
	ld.param.u64 	%rd3, [add_i32_param_1];
	ld.param.u64 	%rd4, [add_i32_param_2];
	ld.param.u64 	%rd5, [add_i32_param_3];
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %tid.x;
INDEX
	setp.ge.s64 	%p1, %rd6, %rd5;
	@%p1 bra 	$L__BB0_2;

	cvta.to.global.u64 	%rd7, %rd2;
SCALE
	add.s64 	%rd9, %rd7, %rd8;
	cvta.to.global.u64 	%rd10, %rd3;
	add.s64 	%rd11, %rd10, %rd8;
	ld.global.f32 	%f1, [%rd11];
	ld.global.f32 	%f2, [%rd9];
	add.f32 	%f3, %f2, %f1;
	cvta.to.global.u64 	%rd12, %rd4;
	add.s64 	%rd13, %rd12, %rd8;
	st.global.f32 	[%rd13], %f3;

$L__BB0_2:
	ret;

}
"#;

const SIGNED_INDEX: &str = "\tmad.lo.s32 \t%r1, %r3, %r2, %r4;\n\tcvt.s64.s32 \t%rd6, %r1;";
const SIGNED_SCALE: &str = "\tmul.wide.s32 \t%rd8, %r1, 4;";

fn add_i32(index: &str, scale: &str) -> String {
    ADD_I32_TEMPLATE
        .replace("INDEX", index)
        .replace("SCALE", scale)
}

/// The forms nvcc gives a 32-bit index: `int` and `unsigned`, `mad` or
/// `mul` + `add`, the scale by `mul.wide` (`i` widened once or twice).
fn index32_kernels() -> Vec<(&'static str, String)> {
    vec![
        ("int, mad", add_i32(SIGNED_INDEX, SIGNED_SCALE)),
        (
            "unsigned, mad",
            add_i32(
                "\tmad.lo.s32 \t%r1, %r3, %r2, %r4;\n\tcvt.u64.u32 \t%rd6, %r1;",
                "\tmul.wide.u32 \t%rd8, %r1, 4;",
            ),
        ),
        (
            "int, mul + add",
            add_i32(
                "\tmul.lo.s32 \t%r5, %r3, %r2;\n\tadd.s32 \t%r1, %r5, %r4;\n\tcvt.s64.s32 \t%rd6, %r1;",
                SIGNED_SCALE,
            ),
        ),
        (
            "int, widened once",
            add_i32(
                "\tmad.lo.s32 \t%r1, %r3, %r2, %r4;\n\tcvt.s64.s32 \t%rd6, %r1;",
                "\tshl.b64 \t%rd8, %rd6, 2;",
            ),
        ),
        (
            "block in 32 bits, index in 64",
            add_i32(
                "\tmul.lo.s32 \t%r5, %r3, %r2;\n\tcvt.s64.s32 \t%rd14, %r5;\n\tcvt.u64.u32 \t%rd1, %r4;\n\tadd.s64 \t%rd6, %rd14, %rd1;",
                "\tshl.b64 \t%rd8, %rd6, 2;",
            ),
        ),
    ]
}

#[test]
fn a_32_bit_index_is_accepted_with_the_precondition_that_makes_it_exact() {
    for (what, text) in index32_kernels() {
        let contract = contract_of(&text, "add_i32");
        assert_eq!(
            contract.preconditions.last().map(|p| p.to_string()),
            Some("index_fits_i32: grid × block <= 2^31".to_string()),
            "{what}"
        );
        let sizes: Vec<u32> = contract.footprints.iter().map(|f| f.alignment).collect();
        assert_eq!(sizes, vec![4, 4, 4], "{what}");
        // Without the family it is refused as before (a 32-bit block
        // offset widened before `tid` is added has no guard at all then).
        let before = if what.starts_with("block in 32 bits") {
            "unguarded_access"
        } else {
            "index_not_64bit"
        };
        assert_eq!(
            sub_reason(ptx::canonicalize_with(
                &text,
                "add_i32",
                None,
                Families::SCALAR
            )),
            before,
            "{what}"
        );
    }
    // The 64-bit index needs no such precondition.
    let scalar = contract_of(&corpus("add_f32_scalar"), "add_f32_scalar");
    assert!(scalar
        .preconditions
        .iter()
        .all(|p| p.name != "index_fits_i32"));
}

#[test]
fn a_32_bit_index_runs_on_the_host_against_a_reference() {
    let mut rng = rand::rng();
    for (what, text) in index32_kernels() {
        let kernel = HostKernel::compile_with(&text, "add_i32", Families::ALL).unwrap();
        for n in [1usize, 255, 256, 257, 3000 + rng.random_range(0..100)] {
            let a = random_f32s(&mut rng, n);
            let b = random_f32s(&mut rng, n);
            let out = floats(&run_host(&kernel, &[bytes(&a), bytes(&b)], n * 4, n as u64));
            for j in 0..n {
                assert_eq!(
                    out[j].to_bits(),
                    (a[j] + b[j]).to_bits(),
                    "{what} n={n} [{j}]"
                );
            }
        }
    }
}

#[test]
fn a_launch_whose_index_would_wrap_is_refused_naming_the_precondition() {
    let contract = contract_of(&add_i32(SIGNED_INDEX, SIGNED_SCALE), "add_i32");
    let big = 1u64 << 40;
    let sizes = [big, big, big];
    // The last block ends exactly at 2^31 threads: every index fits.
    let at_limit = (1u64 << 31) - 1000;
    assert!(check(&contract, 1024, &sizes, &[0, 0, 0], at_limit).is_ok());
    assert!(check(&contract, 256, &sizes, &[0, 0, 0], 1 << 31).is_ok());
    // One element more: the last block's threads reach 2^31.
    assert_eq!(
        check(&contract, 256, &sizes, &[0, 0, 0], (1 << 31) + 1),
        Err(LaunchRefusal::PreconditionFailed {
            precondition: "index_fits_i32",
            condition: "index_fits_i32: grid × block <= 2^31".into(),
            values: "grid=8388609,block=256".into(),
        })
    );
    // The block size is the executor's: 1024-thread blocks reach 2^31
    // threads sooner.
    assert!(matches!(
        check(&contract, 1024, &sizes, &[0, 0, 0], 1 << 31 | 1),
        Err(LaunchRefusal::PreconditionFailed { .. })
    ));
    // One element over its buffer is today's refusal.
    assert_eq!(
        check(&contract, 256, &[400, 400, 400], &[0, 0, 4], 100),
        Err(LaunchRefusal::BufferTooSmall {
            operand: "output".into(),
            needed_bytes: 404,
            buffer_bytes: 400,
        })
    );
    // The host engine holds its launches to the precondition too, before
    // it looks at a span.
    let kernel = HostKernel::compile_with(
        &add_i32(SIGNED_INDEX, SIGNED_SCALE),
        "add_i32",
        Families::ALL,
    )
    .unwrap();
    let mut one = [0u8; 4];
    let span = HostSpan {
        ptr: one.as_mut_ptr(),
        len: 4,
    };
    let l = HostLaunch {
        inputs: &[span, span],
        args: &[],
        output: span,
        n: (1 << 31) + 1,
        params: &[],
        threads: 1,
        checked: true,
        control: None,
    };
    // SAFETY: the spans are a live 4-byte array; the launch is refused
    // before any thread runs.
    let fault = unsafe { kernel.launch(&l) }.unwrap_err();
    assert!(
        fault.message.contains("index_fits_i32"),
        "{}",
        fault.message
    );
}

/// Attacks on the 32-bit index, each refused at load with its exact
/// sub_reason: 32-bit arithmetic after the index is no longer exact.
#[test]
fn index32_attacks_are_refused_at_load() {
    let load = |text: &str| ptx::verify_contract(text, "add_i32", None, Families::ALL);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "i + 1 in 32 bits",
            add_i32(
                "\tmad.lo.s32 \t%r1, %r3, %r2, %r4;\n\tadd.s32 \t%r1, %r1, 1;\n\tcvt.s64.s32 \t%rd6, %r1;",
                SIGNED_SCALE,
            ),
            "index_not_64bit",
        ),
        (
            "i × 4 in 32 bits",
            add_i32(
                SIGNED_INDEX,
                "\tshl.b32 \t%r5, %r1, 2;\n\tcvt.s64.s32 \t%rd8, %r5;",
            ),
            "index_not_64bit",
        ),
        (
            "a float at a stride of 8",
            add_i32(SIGNED_INDEX, "\tmul.wide.s32 \t%rd8, %r1, 8;"),
            "non_elementwise_address",
        ),
        (
            "ctaid × ctaid",
            add_i32(
                "\tmad.lo.s32 \t%r1, %r3, %r3, %r4;\n\tcvt.s64.s32 \t%rd6, %r1;",
                SIGNED_SCALE,
            ),
            "unguarded_access",
        ),
        (
            "tid twice",
            add_i32(
                "\tmad.lo.s32 \t%r1, %r3, %r2, %r4;\n\tadd.s32 \t%r1, %r1, %r4;\n\tcvt.s64.s32 \t%rd6, %r1;",
                SIGNED_SCALE,
            ),
            "index_not_64bit",
        ),
        (
            "the guard on the 64-bit index, the access on another",
            add_i32(SIGNED_INDEX, "\tmul.wide.s32 \t%rd8, %r4, 4;"),
            "index_not_64bit",
        ),
    ];
    for (what, text, want) in cases {
        assert_eq!(sub_reason(load(&text)), want, "{what}");
    }
}

// ---- the corpora: families only add acceptance ------------------------

/// Every `.ptx` under `dir`, recursively.
fn ptx_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            ptx_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "ptx") {
            out.push(path);
        }
    }
}

/// The names of a module's `.entry` functions.
fn entries(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split(".entry").nth(1))
        .filter_map(|rest| {
            let name = rest.trim().split(['(', ' ', '\t']).next()?;
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// Over every kernel of `tests/corpus/` (the lead's `jit/` corpus
/// included, when present): a kernel the scalar ABI accepts is accepted
/// with every family and the very same contract, and whatever the
/// families accept, the host engine can decode. Prints the acceptance per
/// folder, with the first refusals' sub_reasons.
#[test]
fn families_only_add_acceptance_and_keep_every_scalar_contract() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files = Vec::new();
    ptx_files(&root, &mut files);
    assert!(
        files.len() > 50,
        "the corpus is missing ({} files)",
        files.len()
    );
    let mut table: std::collections::BTreeMap<String, (u32, u32, u32, Vec<&'static str>)> =
        Default::default();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let folder = path
            .parent()
            .and_then(|p| p.strip_prefix(&root).ok())
            .map_or(String::new(), |p| p.display().to_string());
        for symbol in entries(&text) {
            let scalar = ptx::canonicalize_with(&text, &symbol, None, Families::SCALAR);
            let all = ptx::canonicalize_with(&text, &symbol, None, Families::ALL);
            let row = table.entry(folder.clone()).or_default();
            row.0 += 1;
            if let Ok(s) = &scalar {
                let a = all
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{}:{symbol}: {e}", path.display()));
                assert_eq!(a.contract, s.contract, "{}:{symbol}", path.display());
                assert_eq!(a.text, s.text, "{}:{symbol}", path.display());
                row.1 += 1;
            }
            match &all {
                Ok(c) => {
                    row.2 += 1;
                    if let Err(e) = HostKernel::compile_with(&c.text, &symbol, Families::ALL) {
                        // The host engine may lack an instruction; never the
                        // verifier's verdict.
                        assert!(
                            matches!(e, PtxError::UnsupportedOnHost { .. }),
                            "{}:{symbol}: {e}",
                            path.display()
                        );
                    }
                }
                Err(PtxError::NonScalarAbi { sub_reason, .. }) => {
                    if !row.3.contains(sub_reason) {
                        row.3.push(sub_reason);
                    }
                }
                Err(_) => {}
            }
        }
    }
    for (folder, (kernels, scalar, all, reasons)) in &table {
        eprintln!(
            "{folder:>24}: {kernels:4} kernels, scalar ABI {scalar:4}, with the families {all:4}; refused: {reasons:?}"
        );
    }
    // The samples the issue names.
    let verdict = |name: &str, families| {
        ptx::verify_contract(&corpus(name), name, None, families).map(|_| ())
    };
    assert!(verdict("add_f32_vec4", Families::ALL).is_ok());
    assert!(verdict("add_f32_strided", Families::ALL).is_ok());
    let without_strided = Families {
        strided: false,
        ..Families::ALL
    };
    assert_eq!(
        sub_reason(verdict("add_f32_strided", without_strided)),
        "extra_params"
    );
}

/// The lead's JIT corpus (`tests/corpus/jit/`, generated on an H200), by
/// family and ABI: how many the daemon accepts today and with every
/// family, with the sub_reasons of what stays refused. The seed's
/// Vectorized{2,4} kernels nvrtc builds without `-G` are all accepted with
/// the families; every kernel the scalar ABI accepts keeps its contract.
#[test]
fn the_jit_corpus_by_family() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit");
    if !root.exists() {
        eprintln!("no tests/corpus/jit: nothing to measure");
        return;
    }
    type Row = (u32, u32, u32, std::collections::BTreeMap<&'static str, u32>);
    let mut rows: std::collections::BTreeMap<String, Row> = Default::default();
    for family in ["nvrtc", "triton", "inductor"] {
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root.join(family).join("manifest.json")).unwrap(),
        )
        .unwrap();
        for k in manifest["kernels"].as_array().unwrap() {
            let file = k["file"].as_str().unwrap();
            let entry = k["entry"].as_str().unwrap();
            let options: Vec<&str> = k["options"]
                .as_array()
                .map(|o| o.iter().filter_map(|x| x.as_str()).collect())
                .unwrap_or_default();
            let key = match family {
                "nvrtc" => format!(
                    "nvrtc {}{}",
                    k["abi"].as_str().unwrap_or("?"),
                    if options.contains(&"-G") { " -G" } else { "" }
                ),
                "inductor" if k["dynamic"].as_bool() == Some(true) => "inductor dynamic".into(),
                "inductor" => "inductor static".into(),
                other => other.to_string(),
            };
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            let scalar = ptx::canonicalize_with(&text, entry, None, Families::SCALAR);
            let all = ptx::canonicalize_with(&text, entry, None, Families::ALL);
            let row = rows.entry(key.clone()).or_default();
            row.0 += 1;
            if let Ok(s) = &scalar {
                assert_eq!(all.as_ref().unwrap().contract, s.contract, "{file}");
                row.1 += 1;
            }
            match &all {
                Ok(_) => row.2 += 1,
                Err(PtxError::NonScalarAbi { sub_reason, .. }) => {
                    *row.3.entry(sub_reason).or_default() += 1
                }
                Err(e) => panic!("{file}: {e}"),
            }
            if key.starts_with("nvrtc vectorized") && !key.ends_with("-G") {
                assert!(all.is_ok(), "{file}: {:?}", all.err());
            }
        }
    }
    // The Triton family proves every Triton and every Inductor kernel,
    // the 2-D broadcast ones (`x mod D`) included.
    let accepted = |key: &str| rows.get(key).map(|r| (r.2, r.0));
    assert_eq!(accepted("triton"), Some((60, 60)));
    assert_eq!(accepted("inductor static"), Some((40, 40)));
    assert_eq!(accepted("inductor dynamic"), Some((40, 40)));
    // `.func` calls are inlined (struct returns as one register per
    // field), local frames proved and carry chains lowered (issue 21):
    // NVRTC's scalar ABI is accepted whole, double `sin` included.
    assert_eq!(accepted("nvrtc scalar"), Some((50, 50)));
    assert_eq!(accepted("nvrtc scalar -G"), Some((25, 25)));
    // The seed's Vectorized schedule, -G builds included (`add_f16_vec2`
    // keeps its `__half2` temporaries' `this` pointers in frame slots).
    assert_eq!(accepted("nvrtc vectorized2 -G"), Some((3, 3)));
    assert_eq!(accepted("nvrtc vectorized4 -G"), Some((2, 2)));
    // The seed's Strided schedule, every build (the Strided family).
    assert_eq!(accepted("nvrtc strided"), Some((6, 6)));
    assert_eq!(accepted("nvrtc strided -G"), Some((3, 3)));
    for (key, (kernels, today, families, reasons)) in &rows {
        eprintln!(
            "| {key} | {today} of {kernels} | {families} of {kernels} | {} |",
            reasons
                .iter()
                .map(|(r, c)| format!("`{r}` {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The JIT corpus's Vectorized{2,4} and 32-bit-index f32 kernels (nvrtc,
/// default options and `--use_fast_math`) run on the host engine against a
/// Rust reference, every element: `add` bit for bit, `affine` with the
/// rounding the PTX asks for (`fma` when the compiler contracted it).
#[test]
fn the_jit_vectorized_and_index32_kernels_run_on_the_host_against_a_reference() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit/nvrtc");
    if !root.exists() {
        eprintln!("no tests/corpus/jit: nothing to run");
        return;
    }
    let mut rng = rand::rng();
    let mut ran = 0;
    for (entry, lanes) in [
        ("add_f32_vec4", 4),
        ("add_f32_vec2", 2),
        ("affine_f32_vec4", 4),
        ("affine_f32_vec2", 2),
        ("add_f32_idx32", 1),
        ("affine_f32_idx32", 1),
        ("add_f32_idx32_n32", 1),
    ] {
        for build in ["O3", "fast"] {
            let text = std::fs::read_to_string(root.join(format!("{entry}_{build}.ptx"))).unwrap();
            let contract = contract_of(&text, entry);
            let kernel = HostKernel::compile_with(&text, entry, Families::ALL).unwrap();
            let fused = text.contains("fma.rn.f32") || text.contains("fma.rn.ftz.f32");
            let affine = entry.starts_with("affine");
            for n in [1usize, 129, 1000 + rng.random_range(0..64)] {
                let count = n * lanes;
                let a = random_f32s(&mut rng, count);
                let b = random_f32s(&mut rng, count);
                let (p0, p1) = (rng.random_range(-4f32..4.0), rng.random_range(-4f32..4.0));
                let (inputs, params) = if affine {
                    (vec![bytes(&a)], vec![p0, p1])
                } else {
                    (vec![bytes(&a), bytes(&b)], vec![])
                };
                let out = floats(&run_host_with(
                    &kernel,
                    &inputs,
                    count * 4,
                    n as u64,
                    &params,
                ));
                for j in 0..count {
                    let want = match (affine, fused) {
                        (false, _) => a[j] + b[j],
                        (true, true) => a[j].mul_add(p0, p1),
                        (true, false) => a[j] * p0 + p1,
                    };
                    assert_eq!(
                        out[j].to_bits(),
                        want.to_bits(),
                        "{entry}_{build} n={n} [{j}]"
                    );
                }
            }
            let index32 = contract
                .preconditions
                .iter()
                .any(|p| p.name == "index_fits_i32");
            assert_eq!(index32, lanes == 1, "{entry}_{build}: {contract}");
            ran += 1;
        }
    }
    assert_eq!(ran, 14);
}

/// The families' own mutant oracle: random mutants of the vectorized and
/// 32-bit-index kernels (the shared mutator of `tests/support/mutants.rs`);
/// whatever the verifier still accepts with the families must, on the host
/// engine in checked mode, touch nothing outside operands of exactly its
/// contract's footprints (random `n`, every precondition holding), and
/// write the same output whatever its registers held before it wrote them.
#[test]
fn accepted_mutants_of_the_families_stay_inside_their_contract() {
    let mut r = mutants::seeded_rng("PTXD_MUTANT_SEED");
    let mut seeds: Vec<(String, String)> = vec![
        (corpus("add_f32_vec4"), "add_f32_vec4".into()),
        (ADD_F32_VEC2.into(), "add_f32_vec2".into()),
    ];
    seeds.extend(
        index32_kernels()
            .into_iter()
            .map(|(_, text)| (text, "add_i32".to_string())),
    );
    let jit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/jit/nvrtc");
    for entry in [
        "add_f32_vec4",
        "affine_f32_vec4",
        "add_f32_vec2",
        "add_f16_vec2",
        "add_f32_idx32",
        "affine_f32_idx32",
        "add_f32_idx32_n32",
    ] {
        if let Ok(text) = std::fs::read_to_string(jit.join(format!("{entry}_O3.ptx"))) {
            seeds.push((text, entry.into()));
        }
    }
    let seeds: Vec<(String, String)> = seeds
        .into_iter()
        .map(|(text, symbol)| {
            let c = ptx::canonicalize_with(&text, &symbol, None, Families::ALL).unwrap();
            (c.text, symbol)
        })
        .collect();
    let rounds: usize = mutants::count_from("PTXD_MUTANTS").unwrap_or(1500);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..rounds {
        let (text, symbol) = &seeds[r.random_range(0..seeds.len())];
        let mutant = mutants::mutate(text, &mut r);
        let Ok(c) = ptx::canonicalize_with(&mutant, symbol, None, Families::ALL) else {
            refused += 1;
            continue;
        };
        let kernel = match HostKernel::compile_with(&c.text, symbol, Families::ALL) {
            Ok(k) => k,
            Err(PtxError::UnsupportedOnHost { .. }) => continue,
            Err(e) => panic!("accepted but the host engine refuses it: {e}\n{mutant}"),
        };
        let n: u64 = r.random_range(0..3000);
        let values = c.contract.values(n, kernel.block_size());
        assert!(
            c.contract.preconditions.iter().all(|p| p.holds(&values)),
            "{}",
            c.contract
        );
        let lens: Vec<usize> = c
            .contract
            .footprints
            .iter()
            .map(|f| usize::try_from(f.bytes.eval(&values).unwrap()).unwrap())
            .collect();
        let (out_len, in_lens) = lens.split_last().unwrap();
        let inputs: Vec<Vec<u8>> = in_lens
            .iter()
            .map(|&len| (0..len).map(|_| r.random()).collect())
            .collect();
        let spans: Vec<HostSpan> = inputs
            .iter()
            .map(|b| HostSpan {
                ptr: b.as_ptr() as *mut u8,
                len: b.len(),
            })
            .collect();
        let params: Vec<f32> = (0..c.contract.scalar_params())
            .map(|_| r.random_range(-4.0..4.0))
            .collect();
        // Twice, the registers starting at two fills: the output may not
        // depend on a register the kernel never wrote.
        let run = |fill: u64| {
            let mut out = vec![0xA5u8; *out_len];
            let launch = HostLaunch {
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
            // SAFETY: every span is a live Vec of exactly `len` bytes; inputs
            // are only read (checked mode faults on any other access).
            if let Err(f) = unsafe { kernel.launch_filled(&launch, fill) } {
                panic!(
                    "an accepted mutant left its contract ({}) with n = {n}: {f}\n{mutant}",
                    c.contract
                );
            }
            out
        };
        let fill: u64 = r.random();
        assert!(
            run(fill) == run(!fill),
            "an accepted mutant's output depends on registers it never wrote \
             (n = {n}, fill {fill:#x})\n{mutant}"
        );
        accepted += 1;
    }
    eprintln!("{accepted} mutants accepted and ran inside their contract, {refused} refused");
    assert!(
        accepted > rounds / 20 && refused > rounds / 20,
        "{accepted} accepted, {refused} refused"
    );
}

/// What a path that knows only the signature (the launch ring) may launch:
/// the scalar ABI and the vectorized family (its element is the vector),
/// never a kernel whose contract has a precondition the signature lacks.
#[test]
fn only_contracts_the_signature_states_whole_are_checked_by_it() {
    let check = |text: &str, symbol: &str| {
        let (signature, contract) =
            ptx::verify_contract(text, symbol, None, Families::ALL).unwrap();
        contract.checked_by_signature(&signature)
    };
    assert!(check(&corpus("add_f32_scalar"), "add_f32_scalar"));
    assert!(check(&corpus("add_f32_vec4"), "add_f32_vec4"));
    assert!(check(ADD_F32_VEC2, "add_f32_vec2"));
    for (what, text) in index32_kernels() {
        assert!(!check(&text, "add_i32"), "{what}");
    }
}

/// The host engine holds a launch to its contract's footprints itself: a
/// span one vector short is refused before any thread runs, naming the
/// footprint.
#[test]
fn the_host_engine_refuses_a_span_short_of_its_footprint() {
    let kernel =
        HostKernel::compile_with(&corpus("add_f32_vec4"), "add_f32_vec4", Families::ALL).unwrap();
    let n = 64usize;
    let a = vec![0u8; n * 16];
    let short = vec![0u8; n * 16 - 16];
    let mut out = vec![0u8; n * 16];
    let span = |b: &Vec<u8>| HostSpan {
        ptr: b.as_ptr() as *mut u8,
        len: b.len(),
    };
    let l = HostLaunch {
        inputs: &[span(&a), span(&short)],
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n: n as u64,
        params: &[],
        threads: 1,
        checked: false,
        control: None,
    };
    // SAFETY: every span is a live Vec of exactly `len` bytes; the launch
    // is refused before any thread runs.
    let fault = unsafe { kernel.launch(&l) }.unwrap_err();
    assert_eq!(
        fault.message,
        "operand 1 holds 1008 bytes, fewer than its footprint n × 16 at n = 64"
    );
}

/// `int i` with `int n` (nvrtc's `add_f32_idx32_n32`): the count is a
/// 32-bit param, the guard a 32-bit comparison; the contract names the
/// count's type and both preconditions, and a count past `int` is refused
/// by name. Misuses of the 32-bit count are refused at load.
#[test]
fn an_int_count_is_accepted_with_the_preconditions_it_needs() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus/jit/nvrtc/add_f32_idx32_n32_O3.ptx");
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("no tests/corpus/jit: nothing to check");
        return;
    };
    let entry = "add_f32_idx32_n32";
    let contract = contract_of(&text, entry);
    let shown = contract.to_string();
    assert!(
        shown.contains("add_f32_idx32_n32_param_3: count .u32"),
        "{shown}"
    );
    assert!(
        shown.contains("requires count_fits_i32: n <= 2147483647"),
        "{shown}"
    );
    assert!(
        shown.contains("requires index_fits_i32: grid × block <= 2^31"),
        "{shown}"
    );
    // Without the family: refused as before.
    assert_eq!(
        sub_reason(ptx::canonicalize_with(&text, entry, None, Families::SCALAR)),
        "count_not_64bit"
    );
    let big = 1u64 << 40;
    let sizes = [big, big, big];
    assert!(check(&contract, 128, &sizes, &[0, 0, 0], (1 << 31) - 1).is_ok());
    assert_eq!(
        check(&contract, 128, &sizes, &[0, 0, 0], 1 << 31),
        Err(LaunchRefusal::PreconditionFailed {
            precondition: "count_fits_i32",
            condition: "count_fits_i32: n <= 2147483647".into(),
            values: "n=2147483648".into(),
        })
    );
    let load = |t: &str| ptx::verify_contract(t, entry, None, Families::ALL);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "the count widened and compared in 64 bits",
            text.replace(
                "setp.ge.s32 \t%p1, %r1, %r2;",
                "cvt.s64.s32 \t%rd9, %r2;\n\tcvt.s64.s32 \t%rd10, %r1;\n\tsetp.ge.s64 \t%p1, %rd10, %rd9;",
            ),
            // No guard is left: what the verdict reports first.
            "unguarded_access",
        ),
        (
            "the count as an index bound other than i < n",
            text.replace("setp.ge.s32 \t%p1, %r1, %r2;", "setp.gt.s32 \t%p1, %r1, %r2;"),
            "unguarded_access",
        ),
        (
            "a wrapped index against the count",
            text.replace(
                "setp.ge.s32 \t%p1, %r1, %r2;",
                "add.s32 \t%r5, %r1, 1;\n\tsetp.ge.s32 \t%p1, %r5, %r2;",
            ),
            "index_not_64bit",
        ),
        (
            "the count read as 16 bits",
            text.replace(
                "ld.param.u32 \t%r2, [add_f32_idx32_n32_param_3];",
                "ld.param.u16 \t%rs1, [add_f32_idx32_n32_param_3];\n\tcvt.u32.u16 \t%r2, %rs1;",
            )
            .replace(".reg .pred \t%p<2>;", ".reg .pred \t%p<2>;\n\t.reg .b16 \t%rs<2>;"),
            "unguarded_access",
        ),
        (
            "a 32-bit count before the output",
            text.replace(
                ".param .u64 add_f32_idx32_n32_param_2,\n\t.param .u32 add_f32_idx32_n32_param_3",
                ".param .u32 add_f32_idx32_n32_param_2,\n\t.param .u64 add_f32_idx32_n32_param_3",
            ),
            "count_not_64bit",
        ),
    ];
    for (what, mutated, want) in cases {
        assert_ne!(mutated, text, "{what}: the mutation did not apply");
        assert_eq!(sub_reason(load(&mutated)), want, "{what}");
    }
}
