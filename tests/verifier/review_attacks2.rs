//! The outside attack set (w30r): an adversarial review of the whole
//! verifier and the launch check, from real corpus kernels mutated as an
//! attacker would. Each attack asserts the exact refusal; each finding's
//! test failed before its fix (the note, /work/notes/w30r.md, lists them).
#![allow(clippy::unwrap_used, clippy::panic)]

use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::{Rng, SeedableRng};

fn corpus(file: &str) -> String {
    let path = format!("{}/tests/corpus/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

/// The verdict as (sub_reason, explanation), "accepted" for an acceptance.
fn verdict(text: &str, entry: &str) -> (&'static str, String) {
    match ptx::canonicalize_with(text, entry, None, Families::ALL) {
        Ok(c) => ("accepted", format!("{}\n{}", c.contract, c.text)),
        Err(PtxError::NonScalarAbi {
            sub_reason,
            explanation,
            ..
        }) => (sub_reason, explanation),
        Err(e) => ("other", e.to_string()),
    }
}

/// `text` with `from` replaced by `to`, which must occur.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the corpus kernel has no `{from}`");
    text.replacen(from, to, 1)
}

fn assert_verdict(text: &str, entry: &str, want: &str, what: &str) {
    let (got, why) = verdict(text, entry);
    assert_eq!(got, want, "{what}: {why}");
}

/// The scalar ABI's corpus kernel, `out[i] = a[i] + b[i]`.
const SCALAR: &str = "add_f32_scalar.ptx";
const SCALAR_ENTRY: &str = "add_f32_scalar";
const SCALAR_STORE: &str = "st.global.f32 \t[%rd14], %f3;";
const SCALAR_ADD: &str = "add.f32 \t%f3, %f2, %f1;";

/// Triton's `add_kernel` (BLOCK_SIZE 1024, num_warps 4, count divisible by 16).
const TRITON: &str = "jit/triton/add_f32_b1024_w4_div16.ptx";
const TRITON_ADD: &str = "add.f32 \t%r17, %r1, %r9;";

// ---------------------------------------------------------------------
// (b) A constant read at the wrong width (scalar ABI: a memory escape)
// ---------------------------------------------------------------------

/// `mov.u32 %r, -8` leaves 0xfffffff8 in the register; `cvt.u64.u32`
/// zero-extends it to 4294967288. The scalar ABI's domain kept the literal's
/// 64-bit value, -8, so `out + 4i + (-8)` then `[.. + 8]` read as element i,
/// while the GPU stores at `out + 4i + 2^32`: 4 GiB past the output, in
/// whatever another tenant has mapped there. Likewise `0xfffffff8`
/// sign-extended by `cvt.s64.s32` is -8, not 4294967288. Class: a constant
/// is its bits at the width of the type that reads it.
#[test]
fn a_32_bit_constant_is_widened_at_its_width() {
    let text = corpus(SCALAR);
    let zero_extended = edit(
        &text,
        SCALAR_STORE,
        "mov.u32 \t%r1, -8;\n\tcvt.u64.u32 \t%rd1, %r1;\n\tadd.s64 \t%rd14, %rd14, %rd1;\n\tst.global.f32 \t[%rd14+8], %f3;",
    );
    if verdict(&zero_extended, SCALAR_ENTRY).0 == "accepted" {
        // The escape, shown where it was accepted: the host engine's
        // bounds check faults on the store 4 GiB past the output.
        let mut r = rand::rngs::StdRng::seed_from_u64(8);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            scalar_oracle(&zero_extended, SCALAR_ENTRY, &mut r)
        }));
        assert!(ran.is_err(), "the store stayed inside the output");
    }
    assert_verdict(
        &zero_extended,
        SCALAR_ENTRY,
        "non_elementwise_address",
        "-8 zero-extended",
    );
    let sign_extended = edit(
        &text,
        SCALAR_STORE,
        "mov.b32 \t%r1, 0xFFFFFFF8;\n\tcvt.s64.s32 \t%rd1, %r1;\n\tadd.s64 \t%rd14, %rd14, %rd1;\n\tadd.s64 \t%rd14, %rd14, -4294967288;\n\tst.global.f32 \t[%rd14], %f3;",
    );
    assert_verdict(
        &sign_extended,
        SCALAR_ENTRY,
        "non_elementwise_address",
        "0xfffffff8 sign-extended",
    );
    // A literal wider than its type: the register keeps its low 32 bits.
    let too_wide = edit(
        &text,
        SCALAR_STORE,
        "mov.u32 \t%r1, 4294967304;\n\tcvt.u64.u32 \t%rd1, %r1;\n\tadd.s64 \t%rd14, %rd14, %rd1;\n\tadd.s64 \t%rd14, %rd14, -4294967304;\n\tst.global.f32 \t[%rd14], %f3;",
    );
    assert_verdict(
        &too_wide,
        SCALAR_ENTRY,
        "non_elementwise_address",
        "2^32 + 8 in 32 bits",
    );
    // Controls: the same moves at values that survive the widening are
    // still element i (the domain still follows constants).
    for (mov, cvt, off) in [
        ("mov.u32 \t%r1, 8;", "cvt.u64.u32", "-8"),
        ("mov.u32 \t%r1, -8;", "cvt.s64.s32", "8"),
        ("mov.b32 \t%r1, 0xFFFFFFF8;", "cvt.u64.u32", "-4294967288"),
    ] {
        let ok = edit(
            &text,
            SCALAR_STORE,
            &format!("{mov}\n\t{cvt} \t%rd1, %r1;\n\tadd.s64 \t%rd14, %rd14, %rd1;\n\tadd.s64 \t%rd14, %rd14, {off};\n\tst.global.f32 \t[%rd14], %f3;"),
        );
        assert_verdict(&ok, SCALAR_ENTRY, "accepted", &format!("{mov} {cvt}"));
    }
}

// ---------------------------------------------------------------------
// (a) Special registers: the policy
// ---------------------------------------------------------------------

/// A kernel may read its launch geometry (`%tid`, `%ntid`, `%ctaid`,
/// `%nctaid`, any dimension) and no other special register: timers
/// (`%clock`, `%clock64`, `%globaltimer`) measure other tenants' work on
/// the same GPU and differ run to run; placement (`%smid`, `%nsmid`,
/// `%warpid`, `%nwarpid`) and `%gridid` (grids launched so far) are decided
/// by other tenants' work; the shared-memory sizes by the executor's
/// configuration. The lane registers (`%laneid`, `%lanemask_*`) are
/// functions of `%tid` and stay data. Every family took them all as data
/// and wrote them to the output.
#[test]
fn special_registers_other_than_the_launch_geometry_are_refused() {
    let text = corpus(SCALAR);
    for s in [
        "clock",
        "clock64",
        "globaltimer",
        "smid",
        "nsmid",
        "warpid",
        "nwarpid",
        "gridid",
        "dynamic_smem_size",
        "total_smem_size",
    ] {
        let wide = matches!(s, "clock64" | "globaltimer" | "gridid");
        let read = if wide {
            format!("mov.u64 \t%rd1, %{s};\n\tcvt.rn.f32.u64 \t%f3, %rd1;")
        } else {
            format!("mov.u32 \t%r1, %{s};\n\tcvt.rn.f32.u32 \t%f3, %r1;")
        };
        let attack = edit(&text, SCALAR_ADD, &read);
        let (got, why) = verdict(&attack, SCALAR_ENTRY);
        assert_eq!(got, "unmodelled_operand", "%{s}: {why}");
        assert!(why.contains(&format!("%{s}`")), "%{s}: {why}");
    }
    // Registers no PTX special register list holds are undeclared names.
    for s in ["envreg3", "pm0"] {
        let attack = edit(
            &text,
            SCALAR_ADD,
            &format!("mov.u32 \t%r1, %{s};\n\tcvt.rn.f32.u32 \t%f3, %r1;"),
        );
        assert_eq!(verdict(&attack, SCALAR_ENTRY).0, "other", "%{s}");
    }
    // The launch geometry stays data a kernel may read.
    for s in [
        "nctaid.x",
        "tid.y",
        "ctaid.z",
        "ntid.y",
        "laneid",
        "lanemask_eq",
        "lanemask_lt",
        "lanemask_le",
        "lanemask_gt",
        "lanemask_ge",
    ] {
        let ok = edit(
            &text,
            SCALAR_ADD,
            &format!("mov.u32 \t%r1, %{s};\n\tcvt.rn.f32.u32 \t%f3, %r1;"),
        );
        assert_verdict(&ok, SCALAR_ENTRY, "accepted", s);
    }
    // The Triton family too.
    let triton = corpus(TRITON);
    for s in ["clock", "smid", "globaltimer"] {
        let read = if s == "globaltimer" {
            "mov.u64 \t%rd0, %globaltimer;\n\tcvt.u32.u64 \t%r17, %rd0;".to_string()
        } else {
            format!("mov.u32 \t%r17, %{s};")
        };
        let attack = edit(&triton, TRITON_ADD, &read);
        assert_verdict(&attack, "add_kernel", "unmodelled_operand", s);
    }
}

// ---------------------------------------------------------------------
// (d) The brute-force oracle: accepted kernels stay inside their contract
// ---------------------------------------------------------------------

/// Runs the scalar kernel `out[i] = a[i] + b[i]` (`text`, `entry`) on the
/// host engine, its bounds checks on, at random counts: each buffer is
/// exactly the contract's footprint then 64 canary bytes (and the
/// footprint is checked against the brute-force maximum `4 × n`); no
/// launch faults, no canary changes, every element is the reference's.
fn scalar_oracle(text: &str, entry: &str, r: &mut impl Rng) {
    const CANARY: usize = 64;
    let k = HostKernel::compile_with(text, entry, Families::ALL).unwrap();
    for _ in 0..12 {
        let n: u64 = if r.random_bool(0.2) {
            0
        } else {
            r.random_range(1..700)
        };
        let c = k.contract();
        let values = c.values(n, k.block_size());
        let fps: Vec<usize> = c
            .footprints
            .iter()
            .map(|f| usize::try_from(f.bytes.eval(&values).unwrap()).unwrap())
            .collect();
        for fp in &fps {
            assert!(
                *fp as u64 >= 4 * n,
                "{entry} n={n}: footprint {fp} < {}",
                4 * n
            );
        }
        let mut bufs: Vec<Vec<u8>> = fps
            .iter()
            .map(|fp| {
                let mut v: Vec<u8> = (0..fp / 4)
                    .flat_map(|_| r.random_range(-8.0f32..8.0).to_le_bytes())
                    .collect();
                v.extend([0xC5; CANARY]);
                v
            })
            .collect();
        let before = bufs.clone();
        let (ins, out) = bufs.split_at_mut(2);
        let spans: Vec<HostSpan> = ins
            .iter_mut()
            .map(|b| HostSpan {
                ptr: b.as_mut_ptr(),
                len: b.len() - CANARY,
            })
            .collect();
        let out = &mut out[0];
        let launch = HostLaunch {
            inputs: &spans,
            args: &[],
            output: HostSpan {
                ptr: out.as_mut_ptr(),
                len: out.len() - CANARY,
            },
            n,
            params: &[],
            threads: 2,
            checked: true,
            control: None,
        };
        // SAFETY: every span is a prefix of a live Vec, which outlives the
        // launch.
        let ran = unsafe { k.launch(&launch) };
        ran.unwrap_or_else(|e| panic!("{entry} n={n}: {e}"));
        for (b, was) in bufs.iter().zip(&before) {
            assert_eq!(
                b[b.len() - CANARY..],
                was[was.len() - CANARY..],
                "{entry} n={n}: canary"
            );
        }
        let f = |b: &[u8], i: usize| f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
        for i in 0..n as usize {
            let want = f(&bufs[0], i) + f(&bufs[1], i);
            assert_eq!(
                f(&bufs[2], i).to_bits(),
                want.to_bits(),
                "{entry} n={n} at {i}"
            );
        }
    }
}

/// The corpus kernel and the accepted constant mutants (a constant moved
/// through a 32-bit register and widened, then cancelled by an offset)
/// touch only the bytes their contract grants.
#[test]
fn accepted_constant_mutants_stay_inside_their_footprints() {
    let mut r = rand::rngs::StdRng::seed_from_u64(0x30e);
    let text = corpus(SCALAR);
    scalar_oracle(&text, SCALAR_ENTRY, &mut r);
    for (mov, cvt, off) in [
        ("mov.u32 \t%r1, 8;", "cvt.u64.u32", "-8"),
        ("mov.u32 \t%r1, -8;", "cvt.s64.s32", "8"),
        ("mov.b32 \t%r1, 0xFFFFFFF8;", "cvt.u64.u32", "-4294967288"),
    ] {
        let ok = edit(
            &text,
            SCALAR_STORE,
            &format!("{mov}\n\t{cvt} \t%rd1, %r1;\n\tadd.s64 \t%rd14, %rd14, %rd1;\n\tadd.s64 \t%rd14, %rd14, {off};\n\tst.global.f32 \t[%rd14], %f3;"),
        );
        scalar_oracle(&ok, SCALAR_ENTRY, &mut r);
    }
}

/// The class, fuzzed: random literals moved into a 32-bit register at a
/// random type, widened by a random `cvt` (the source type decides zero- or
/// sign-extension), added to the output address, then cancelled by a
/// random 64-bit offset and address offset. Every mutant the verifier
/// accepts must store exactly element i (the oracle, canaries and every
/// element); before the fix, this found the escape within a few mutants.
#[test]
fn random_constant_mutants_the_verifier_accepts_store_element_i() {
    let mut r = rand::rngs::StdRng::seed_from_u64(0x30c0);
    let text = corpus(SCALAR);
    let literals: [i64; 10] = [
        0,
        4,
        8,
        -8,
        0xFFFF_FFF8,
        0x7FFF_FFFF,
        0x8000_0000,
        -0x8000_0000,
        0x1_0000_0008,
        -0x1_0000_0000,
    ];
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..300 {
        let lit = literals[r.random_range(0..literals.len())];
        let mov = ["mov.u32", "mov.b32", "mov.s32"][r.random_range(0..3)];
        let cvt =
            ["cvt.u64.u32", "cvt.s64.s32", "cvt.u64.s32", "cvt.s64.u32"][r.random_range(0..4)];
        // The 64-bit value each widening gives, and an offset that cancels
        // it, or one that a domain reading the literal as i64 would take.
        let low = lit as u32;
        let widened = if cvt.ends_with("s32") {
            i64::from(low as i32)
        } else {
            i64::from(low)
        };
        let cancel = if r.random_bool(0.5) { -widened } else { -lit };
        let split = r.random_range(-2i64..=2) * 4;
        let mutant = edit(
            &text,
            SCALAR_STORE,
            &format!(
                "{mov} \t%r1, {lit};\n\t{cvt} \t%rd1, %r1;\n\tadd.s64 \t%rd14, %rd14, %rd1;\n\tadd.s64 \t%rd14, %rd14, {};\n\tst.global.f32 \t[%rd14+{split}], %f3;",
                cancel - split
            ),
        );
        match verdict(&mutant, SCALAR_ENTRY).0 {
            "accepted" => {
                accepted += 1;
                assert_eq!(
                    cancel, -widened,
                    "{mov} {lit} {cvt}: accepted a store off element i"
                );
                scalar_oracle(&mutant, SCALAR_ENTRY, &mut r);
            }
            _ => refused += 1,
        }
    }
    // Both verdicts were exercised.
    assert!(
        accepted > 20 && refused > 20,
        "{accepted} accepted, {refused} refused"
    );
}

// ---------------------------------------------------------------------
// What held: refused at load with its exact reason
// ---------------------------------------------------------------------

/// Instructions outside the elementwise model, each inserted after the
/// scalar kernel's `add.f32`: control the GPU (`trap`, `brkpt`,
/// `nanosleep`, `pmevent`, `setmaxnreg`), synchronize (`bar.sync` with a
/// register count, fences), reach other memory or other address spaces
/// (`prefetch`, `isspacep`, `cp.async`, `mbarrier`, `discard`,
/// `applypriority`, `createpolicy`, `st.async`, `multimem`, `tensormap`,
/// `alloca`), atomics and reductions, warp-level queries.
#[test]
fn operations_outside_the_model_are_refused_with_their_reason() {
    let text = corpus(SCALAR);
    for (inst, want) in [
        ("trap;", "unsupported_instruction"),
        ("brkpt;", "unsupported_instruction"),
        ("nanosleep.u32 100;", "unsupported_instruction"),
        ("pmevent 1;", "unsupported_instruction"),
        (
            "setmaxnreg.inc.sync.aligned.u32 64;",
            "unsupported_instruction",
        ),
        ("bar.sync %r1;", "barrier"),
        ("membar.gl;", "barrier"),
        ("fence.sc.gpu;", "barrier"),
        ("prefetch.global.L2 [%rd12];", "unsupported_instruction"),
        ("prefetchu.L1 [%rd12];", "unsupported_instruction"),
        ("isspacep.global %p1, %rd12;", "unsupported_instruction"),
        ("red.global.add.f32 [%rd12], %f3;", "atomic"),
        ("atom.global.add.f32 %f3, [%rd12], %f3;", "atomic"),
        ("mbarrier.init.shared.b64 [%rd12], 1;", "shared_memory"),
        (
            "cp.async.ca.shared.global [%rd12], [%rd10], 4;",
            "shared_memory",
        ),
        ("activemask.b32 %r1;", "unsupported_instruction"),
        ("getctarank.u32 %r1, %rd12;", "unsupported_instruction"),
        ("discard.global.L2 [%rd12], 128;", "unsupported_instruction"),
        (
            "applypriority.global.L2::evict_normal [%rd12], 128;",
            "unsupported_instruction",
        ),
        (
            "createpolicy.fractional.L2::evict_last.b64 %rd1, 1.0;",
            "unsupported_instruction",
        ),
        (
            "st.async.b32 [%rd12], %r1, [%rd10];",
            "unsupported_instruction",
        ),
        (
            "multimem.ld_reduce.relaxed.gpu.global.add.f32 %f2, [%rd12];",
            "unsupported_instruction",
        ),
        (
            "tensormap.replace.tile.global_address.global.b1024.b64 [%rd12], %rd1;",
            "unsupported_instruction",
        ),
        ("elect.sync %r1|%p1, 0xffffffff;", "unsupported_instruction"),
        ("stackrestore.u32 %r1;", "unsupported_instruction"),
        ("alloca.u32 %r1, 8;", "unsupported_instruction"),
    ] {
        let attack = edit(&text, SCALAR_ADD, &format!("{SCALAR_ADD}\n\t{inst}"));
        assert_verdict(&attack, SCALAR_ENTRY, want, inst);
    }
}

/// Operands and params past the model: a 128-bit access (scalar ABI and
/// Triton, where the 16-byte access could straddle the mask's element),
/// `selp` of a pointer with the count or the output, by-value aggregate
/// params, launch-bound directives no 1-D launch honours, register ranges
/// and vector registers.
#[test]
fn operands_and_params_past_the_model_are_refused_with_their_reason() {
    let text = corpus(SCALAR);
    let b128 = |from: &str, to: &str| {
        edit(
            &edit(
                &text,
                ".reg .pred \t%p<2>;",
                ".reg .pred \t%p<2>;\n\t.reg .b128 \t%q<2>;",
            ),
            from,
            to,
        )
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "a .b128 load at a stride of 4",
            b128("ld.global.f32 \t%f1, [%rd12];", "ld.global.b128 \t%q1, [%rd12];\n\tmov.b128 \t{%rd1, %rd7}, %q1;\n\tmov.b64 \t{%f1, %f3}, %rd7;"),
            "non_elementwise_address",
        ),
        (
            "a .b128 store at a stride of 4",
            b128(SCALAR_STORE, "mov.b64 \t%rd1, {%f3, %f3};\n\tmov.b128 \t%q1, {%rd1, %rd1};\n\tst.global.b128 \t[%rd14], %q1;"),
            "non_elementwise_address",
        ),
        (
            "selp of in0 and the count",
            edit(&text, "cvta.to.global.u64 \t%rd8, %rd2;", "setp.eq.s64 \t%p1, %rd1, 0;\n\tselp.b64 \t%rd8, %rd2, %rd5, %p1;"),
            "pointer_misuse",
        ),
        (
            "selp of the output and in0, stored through",
            edit(&text, "cvta.to.global.u64 \t%rd13, %rd4;", "setp.eq.s64 \t%p1, %rd1, 0;\n\tselp.b64 \t%rd13, %rd4, %rd2, %p1;"),
            "pointer_misuse",
        ),
        (
            "selp of in0 and the output, loaded through",
            edit(&text, "cvta.to.global.u64 \t%rd8, %rd2;", "setp.eq.s64 \t%p1, %rd1, 0;\n\tselp.b64 \t%rd8, %rd2, %rd4, %p1;"),
            "pointer_misuse",
        ),
        (
            "the count as a .b8 array",
            edit(&text, ".param .u64 add_f32_scalar_param_3\n", ".param .align 8 .b8 add_f32_scalar_param_3[8]\n"),
            "param_type",
        ),
        (
            "a pointer as a .b8 array",
            edit(&text, ".param .u64 add_f32_scalar_param_0,", ".param .align 8 .b8 add_f32_scalar_param_0[8],"),
            "param_type",
        ),
        ("reqntid 0", edit(&text, "\n)\n", "\n)\n.reqntid 0\n"), "reqntid_conflict"),
        ("reqntid 2^32 - 1", edit(&text, "\n)\n", "\n)\n.reqntid 4294967295\n"), "reqntid_conflict"),
        ("reqntid 2-D", edit(&text, "\n)\n", "\n)\n.reqntid 256, 2\n"), "reqntid_conflict"),
        ("maxntid 0", edit(&text, "\n)\n", "\n)\n.maxntid 0\n"), "maxntid"),
        ("a shift by 2^64 - 1", edit(&text, "shl.b64 \t%rd9, %rd1, 2;", "shl.b64 \t%rd9, %rd1, 18446744073709551615;"), "non_elementwise_address"),
        ("a register range of 2^32 - 1", edit(&text, ".reg .b32 \t%r<4>;", ".reg .b32 \t%r<4294967295>;"), "other"),
        ("a vector register", edit(&edit(&text, ".reg .f32 \t%f<4>;", ".reg .f32 \t%f<4>;\n\t.reg .v4 .f32 \t%vv;"), SCALAR_ADD, "add.f32 \t%f3, %f2, %vv.x;"), "other"),
    ];
    for (what, attack, want) in cases {
        assert_verdict(&attack, SCALAR_ENTRY, want, what);
    }
    // Triton: a 16-byte `.b128` access has no modelled width, at any offset.
    let triton = edit(
        &corpus(TRITON),
        ".reg .pred \t%p<3>;",
        ".reg .pred \t%p<3>;\n\t.reg .b128 \t%q<2>;",
    );
    for off in [0, 4, 12, 2044] {
        let attack = edit(
            &triton,
            "@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];",
            &format!("@%p1 ld.global.b128 %q1, [ %rd1 + {off} ];\n\tmov.b128 {{%rd0, %rd7}}, %q1;\n\tmov.b64 {{%r1, %r2}}, %rd0;\n\tmov.b64 {{%r3, %r4}}, %rd7;"),
        );
        assert_verdict(
            &attack,
            "add_kernel",
            "unbounded_access",
            &format!("b128 at +{off}"),
        );
    }
}

/// Class (a) through `.func` inlining: a return value or an argument never
/// written on some path (the callee returns early, stores its result on one
/// branch or under a predicate; the caller passes no argument or passes it
/// under a predicate) is a register read before any write once inlined;
/// partial param reads and writes are no by-value passing; a guard on a
/// non-predicate register is mistyped. NVRTC `-G`'s `clamp_f32` (calls to
/// `fmaxf` and `fminf`).
#[test]
fn values_never_passed_through_a_call_are_refused() {
    let src = corpus("jit/nvrtc/clamp_f32_G.ptx");
    let entry = "clamp_f32";
    assert_verdict(&src, entry, "accepted", "the corpus kernel");
    let st = "\tmin.f32 \t%f3, %f1, %f2;\n\tst.param.f32 \t[func_retval0+0], %f3;";
    let callee = edit(
        &src,
        "\t.reg .f32 \t%f<4>;\n\n\n\tld.param.f32 \t%f1, [fminf_param_0];",
        "\t.reg .f32 \t%f<4>;\n\t.reg .pred \t%p<2>;\n\t.reg .b16 \t%rs<2>;\n\tld.param.f32 \t%f1, [fminf_param_0];",
    );
    let min = "\tmin.f32 \t%f3, %f1, %f2;\n\tsetp.lt.f32 \t%p1, %f1, %f2;";
    let pass = "\tst.param.f32 \t[param0+0], %f6;";
    let cases: Vec<(&str, String, &str)> = vec![
        ("no return value", edit(&src, st, "\tmin.f32 \t%f3, %f1, %f2;"), "undefined_register"),
        (
            "a return value on one branch",
            edit(&callee, st, &format!("{min}\n\t@%p1 bra \t$L__SKIP;\n\tst.param.f32 \t[func_retval0+0], %f3;\n$L__SKIP:")),
            "undefined_register",
        ),
        (
            "a predicated return value",
            edit(&callee, st, &format!("{min}\n\t@%p1 st.param.f32 \t[func_retval0+0], %f3;")),
            "undefined_register",
        ),
        (
            "an early predicated ret",
            edit(&callee, st, &format!("{min}\n\t@%p1 ret;\n\tst.param.f32 \t[func_retval0+0], %f3;")),
            "undefined_register",
        ),
        ("an argument never passed", edit(&src, pass, ""), "undefined_register"),
        (
            "an argument passed under a predicate",
            edit(&src, pass, "\t@%p1 st.param.f32 \t[param0+0], %f6;"),
            "undefined_register",
        ),
        (
            "half a return value",
            edit(&callee, st, &format!("{st}\n\tmov.b16 \t%rs1, 7;\n\tst.param.b16 \t[func_retval0+2], %rs1;")),
            "call_arguments",
        ),
        (
            "half an argument",
            edit(&callee, "\tld.param.f32 \t%f2, [fminf_param_1];", "\tld.param.b16 \t%rs1, [fminf_param_1+2];\n\tld.param.f32 \t%f2, [fminf_param_1];"),
            "call_arguments",
        ),
        (
            "a store to the callee's own param",
            edit(&src, st, &format!("{st}\n\tst.param.f32 \t[fminf_param_0+0], %f3;")),
            "call_arguments",
        ),
        (
            "a read of the return value before it is written",
            edit(&src, st, &format!("\tld.param.f32 \t%f3, [func_retval0+0];\n{st}")),
            "call_arguments",
        ),
        (
            "a timer in the callee",
            edit(&callee, st, "\tmov.u32 \t%r1, %clock;\n\tmov.b32 \t%f3, %r1;\n\tst.param.f32 \t[func_retval0+0], %f3;").replace(
                "\t.reg .b16 \t%rs<2>;",
                "\t.reg .b16 \t%rs<2>;\n\t.reg .b32 \t%r<2>;",
            ),
            "unmodelled_operand",
        ),
    ];
    for (what, attack, want) in cases {
        assert_verdict(&attack, entry, want, what);
    }
    // A guard on a register that is no predicate.
    let text = corpus(SCALAR);
    let guard = edit(
        &text,
        "@%p1 bra \t$L__BB0_2;",
        "selp.u32 \t%r1, 1, 0, %p1;\n\t@%r1 bra \t$L__BB0_2;",
    );
    assert_verdict(&guard, SCALAR_ENTRY, "operand_type", "@%r1 bra");
}
