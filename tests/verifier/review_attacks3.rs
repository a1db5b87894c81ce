//! Review attacks (w31r) on what w30a added to the frame and call domain:
//! carry chains lowered to plain instructions, `.b8` struct returns as one
//! register per field, per-value splits in the frame proof, frame slots
//! that hold frame addresses, zero-padded initializers and scopes renamed
//! apart. Each hole found has a test asserting its exact refusal; each
//! class that held is asserted too; every accepted kernel runs on the host
//! engine against a reference (or the canary-padded mutant oracle).
#![allow(clippy::unwrap_used, clippy::panic, clippy::type_complexity)]

use crate::support::mutants::oracle;
use crate::{refusal, rng};
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan};
use rand::Rng;

/// A scalar-ABI kernel `out[i] = f(a[i], b[i])` over u64 elements, with
/// `funcs` before it: `body` reads `%rd10` (a), `%rd11` (b), their halves
/// `%r10`/`%r11` (a lo/hi) and `%r12`/`%r13` (b lo/hi), and leaves the
/// result in `%rd20`.
fn carried_with(funcs: &str, body: &str) -> String {
    format!(
        r#".version 9.0
.target sm_90
.address_size 64

{funcs}
.visible .entry carried(
	.param .u64 carried_param_0,
	.param .u64 carried_param_1,
	.param .u64 carried_param_2,
	.param .u64 carried_param_3
)
{{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<60>;
	.reg .b64 	%rd<60>;
	.reg .b16 	%hs<8>;
	.reg .f32 	%f<8>;

	ld.param.u64 	%rd1, [carried_param_0];
	ld.param.u64 	%rd2, [carried_param_1];
	ld.param.u64 	%rd3, [carried_param_2];
	ld.param.u64 	%rd4, [carried_param_3];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd5, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd6, %r3;
	add.s64 	%rd7, %rd5, %rd6;
	setp.ge.s64 	%p1, %rd7, %rd4;
	@%p1 bra 	$L__END;
	shl.b64 	%rd8, %rd7, 3;
	cvta.to.global.u64 	%rd12, %rd1;
	add.s64 	%rd13, %rd12, %rd8;
	ld.global.u64 	%rd10, [%rd13];
	cvta.to.global.u64 	%rd14, %rd2;
	add.s64 	%rd15, %rd14, %rd8;
	ld.global.u64 	%rd11, [%rd15];
	mov.b64 	{{%r10, %r11}}, %rd10;
	mov.b64 	{{%r12, %r13}}, %rd11;
	{body}
	cvta.to.global.u64 	%rd16, %rd3;
	add.s64 	%rd17, %rd16, %rd8;
	st.global.u64 	[%rd17], %rd20;
$L__END:
	ret;
}}
"#
    )
}

fn carried(body: &str) -> String {
    carried_with("", body)
}

/// Runs `carried` over `a`, `b` on the host engine, the output poisoned
/// and its tail checked untouched.
fn run_carried(text: &str, a: &[u64], b: &[u64]) -> Vec<u64> {
    let k = HostKernel::compile_with(text, "carried", Families::ALL)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let n = a.len();
    let mut ia: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut ib: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; (n + 2) * 8];
    let spans = [
        HostSpan {
            ptr: ia.as_mut_ptr(),
            len: ia.len(),
        },
        HostSpan {
            ptr: ib.as_mut_ptr(),
            len: ib.len(),
        },
    ];
    let l = HostLaunch {
        inputs: &spans,
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
    // SAFETY: every span is a live Vec of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(out[n * 8..].iter().all(|b| *b == 0xFF), "tail written");
    out.chunks(8)
        .take(n)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// PTX's meaning of one carry instruction (ISA 9.7.2): `(d, CC.CF after)`
/// for `op` (`add`/`sub`/`mad`) with `half` (`mad` only), reading the flag
/// or not, writing it or not, at `bits` wide and `signed` (the high half
/// of `mad` only), on operands already reduced to `bits`.
#[allow(clippy::too_many_arguments)]
fn carry_reference(
    op: &str,
    half: &str,
    reads: bool,
    writes: bool,
    bits: u32,
    signed: bool,
    (a, b, c): (u64, u64, u64),
    cf: bool,
) -> (u64, bool) {
    let mask = if bits == 64 {
        u128::from(u64::MAX)
    } else {
        (1u128 << bits) - 1
    };
    let cin = u128::from(reads && cf);
    let (a, b, c) = (u128::from(a), u128::from(b), u128::from(c));
    let (d, out) = match op {
        "add" => {
            let s = a + b + cin;
            (s & mask, s >> bits != 0)
        }
        // `subc`: d = a - (b + CC.CF); the flag is the borrow out.
        "sub" => (a.wrapping_sub(b + cin) & mask, a < b + cin),
        _ => {
            let p = if signed {
                let sx = |v: u128| {
                    let sh = 128 - bits;
                    ((v << sh) as i128) >> sh
                };
                (sx(a) * sx(b)) as u128
            } else {
                a * b
            };
            let m = if half == "hi" {
                (p >> bits) & mask
            } else {
                p & mask
            };
            let s = m + c + cin;
            (s & mask, s >> bits != 0)
        }
    };
    (d as u64, if writes { out } else { cf })
}

/// Every carry form the lowering accepts (`add.cc`, `addc[.cc]`, `sub.cc`,
/// `subc[.cc]`, `mad.{lo,hi}.cc`, `madc.{lo,hi}[.cc]` at u32/s32/u64/s64),
/// with register operands, an immediate `b` (edge values), an immediate
/// `a`, and the result aliasing each operand, runs exactly as PTX defines
/// it: both the result and the flag after it (read back by `addc 0, 0`,
/// which also checks a form without `.cc` leaves the flag alone) are
/// compared with a u128 reference on every element, over edge and fresh
/// random operands, the carry in set and clear.
#[test]
fn every_carry_form_matches_a_u128_reference() {
    let mut r = rng("every carry form");
    let edges = [
        0u64,
        1,
        0x7FFF_FFFF,
        0x8000_0000,
        0xFFFF_FFFF,
        0x1_0000_0000,
        0x8000_0000_0000_0000,
        u64::MAX,
        u64::MAX - 1,
    ];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for x in edges {
        for y in edges {
            a.push(x);
            b.push(y);
        }
    }
    while a.len() < 240 {
        a.push(r.random());
        b.push(r.random());
    }
    let forms: &[(&str, &str, &str, bool, bool)] = &[
        ("add.cc", "add", "", false, true),
        ("addc", "add", "", true, false),
        ("addc.cc", "add", "", true, true),
        ("sub.cc", "sub", "", false, true),
        ("subc", "sub", "", true, false),
        ("subc.cc", "sub", "", true, true),
        ("mad.lo.cc", "mad", "lo", false, true),
        ("mad.hi.cc", "mad", "hi", false, true),
        ("madc.lo", "mad", "lo", true, false),
        ("madc.hi", "mad", "hi", true, false),
        ("madc.lo.cc", "mad", "lo", true, true),
        ("madc.hi.cc", "mad", "hi", true, true),
    ];
    let mut checked = 0;
    for (form, op, half, reads, writes) in forms {
        for ty in ["u32", "s32", "u64", "s64"] {
            let bits: u32 = ty[1..].parse().unwrap();
            let w = move |v: u64| if bits == 32 { v & 0xFFFF_FFFF } else { v };
            // Operand registers and how each input element maps to them.
            let (ra, rb, rc, rd, setup) = if bits == 32 {
                ("%r10", "%r12", "%r13", "%r40", "")
            } else {
                (
                    "%rd10",
                    "%rd11",
                    "%rd30",
                    "%rd40",
                    "mov.b64 \t%rd30, {%r13, %r10};\n\t",
                )
            };
            let operands = move |x: u64, y: u64| -> (u64, u64, u64) {
                let c = if bits == 32 {
                    y >> 32
                } else {
                    (y >> 32) | (x << 32)
                };
                (w(x), w(y), w(c))
            };
            // (a, b, c, d-alias) spellings with how they map the inputs.
            type Pick<'p> = Box<dyn Fn(u64, u64) -> (u64, u64, u64) + 'p>;
            let mut variants: Vec<(String, String, String, Option<&str>, Pick)> =
                vec![(ra.into(), rb.into(), rc.into(), None, Box::new(operands))];
            for alias in [ra, rb, rc] {
                if *op != "mad" && alias == rc {
                    continue;
                }
                variants.push((
                    if alias == ra { rd.into() } else { ra.into() },
                    if alias == rb { rd.into() } else { rb.into() },
                    if alias == rc { rd.into() } else { rc.into() },
                    Some(alias),
                    Box::new(operands),
                ));
            }
            for imm in [0i64, 1, -1, 0x7FFF_FFFF, 0xFFFF_FFFF, -0x8000_0000] {
                let iv = w(imm as u64);
                variants.push((
                    ra.into(),
                    imm.to_string(),
                    rc.into(),
                    None,
                    Box::new(move |x, y| {
                        let (p, _, q) = operands(x, y);
                        (p, iv, q)
                    }),
                ));
            }
            let a_imm = w(5);
            variants.push((
                "5".into(),
                rb.into(),
                rc.into(),
                None,
                Box::new(move |x, y| {
                    let (_, p, q) = operands(x, y);
                    (a_imm, p, q)
                }),
            ));
            for (va, vb, vc, alias, pick) in &variants {
                let opcode = format!("{form}.{ty}");
                let mut instr = format!("{opcode} \t{rd}, {va}, {vb}");
                if *op == "mad" {
                    instr.push_str(&format!(", {vc}"));
                }
                // The aliased operand's value copied into the result register.
                let copy = match alias {
                    Some(x) => format!("mov.b{bits} \t{rd}, {x};\n\t"),
                    None => String::new(),
                };
                // The flag in: bit 63 of a (a_hi + a_hi carries out).
                let pre = format!("{setup}add.cc.u32 \t%r50, %r11, %r11;\n\t{copy}{instr};\n\t");
                let d_out = if bits == 32 {
                    format!("{pre}cvt.u64.u32 \t%rd20, {rd};")
                } else {
                    format!("{pre}mov.b64 \t%rd20, {rd};")
                };
                let cf_out = format!("{pre}addc.u64 \t%rd20, 0, 0;");
                for (what, body) in [("result", d_out), ("flag", cf_out)] {
                    let text = carried(&body);
                    let canonical =
                        match ptx::canonicalize_with(&text, "carried", None, Families::ALL) {
                            Ok(c) => c,
                            Err(e) if va == "5" => {
                                eprintln!("{opcode} with an immediate a: refused ({e})");
                                continue;
                            }
                            Err(e) => panic!("{opcode} {va}, {vb}: {e}\n{text}"),
                        };
                    for gone in [".cc.", "addc", "subc", "madc"] {
                        assert!(!canonical.text.contains(gone), "{opcode}: `{gone}` left");
                    }
                    let got = run_carried(&text, &a, &b);
                    for ((x, y), g) in a.iter().zip(&b).zip(&got) {
                        let cf = x >> 63 == 1;
                        let (d, f) = carry_reference(
                            op,
                            half,
                            *reads,
                            *writes,
                            bits,
                            ty.starts_with('s'),
                            pick(*x, *y),
                            cf,
                        );
                        let want = if what == "result" { d } else { u64::from(f) };
                        assert_eq!(
                            *g, want,
                            "{what} of `{instr}` (alias {alias:?}): a = {x:#x}, b = {y:#x}, cf in {cf}"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} carry kernels checked");
}

/// A callee returning a 16-byte struct `{a + 1: u64, a as u32: u32}`.
const SRET_CALLEE: &str = ".func (.param .align 8 .b8 fr[16]) sf(\n\t.param .b64 sx\n)\n{\n\t.reg .pred \t%sp<4>;\n\t.reg .b64 \t%q<8>;\n\t.reg .b32 \t%s<8>;\n\t.reg .b16 \t%hs<8>;\n\tld.param.b64 \t%q1, [sx];\n\tadd.s64 \t%q2, %q1, 1;\n\tst.param.b64 \t[fr+0], %q2;\n\tcvt.u32.u64 \t%s1, %q1;\n\tst.param.b32 \t[fr+8], %s1;\n\tret;\n}\n";

/// The caller's call sequence of [`SRET_CALLEE`]: `%rd21` and `%r21` are
/// the fields, `%rd20` their xor.
const SRET_CALL: &str = "{\n\t.param .b64 param0;\n\tst.param.b64 \t[param0+0], %rd10;\n\t.param .align 8 .b8 retval0[16];\n\tcall.uni (retval0), sf, (param0);\n\tld.param.b64 \t%rd21, [retval0+0];\n\tld.param.b32 \t%r21, [retval0+8];\n\t}\n\tcvt.u64.u32 \t%rd22, %r21;\n\txor.b64 \t%rd20, %rd21, %rd22;";

fn sret(callee: (&str, &str), call: (&str, &str)) -> String {
    assert!(SRET_CALLEE.contains(callee.0), "{}", callee.0);
    assert!(SRET_CALL.contains(call.0), "{}", call.0);
    carried_with(
        &SRET_CALLEE.replacen(callee.0, callee.1, 1),
        &SRET_CALL.replacen(call.0, call.1, 1),
    )
}

/// A scalar-ABI kernel over u32 elements with a `size`-byte frame filled
/// in a loop (`frame[k] = x + k` while `k cmp bound`, `extra` in the loop
/// body) and read back at index `%r7`; `prelude` computes `%r9` (the
/// bound) and `%r7` from `x` (`%r4`).
fn framed(size: u32, prelude: &str, extra: &str, cmp: &str) -> String {
    format!(
        r#".version 9.0
.target sm_90
.address_size 64

.visible .entry framed(
	.param .u64 framed_param_0,
	.param .u64 framed_param_1,
	.param .u64 framed_param_2
)
{{
	.local .align 4 .b8 	__local_depot0[{size}];
	.reg .b64 	%SPL;
	.reg .pred 	%p<8>;
	.reg .b32 	%r<40>;
	.reg .b64 	%rd<32>;

	mov.u64 	%SPL, __local_depot0;
	ld.param.u64 	%rd1, [framed_param_0];
	ld.param.u64 	%rd2, [framed_param_1];
	ld.param.u64 	%rd3, [framed_param_2];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd4, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd5, %r3;
	add.s64 	%rd6, %rd4, %rd5;
	setp.ge.s64 	%p1, %rd6, %rd3;
	@%p1 bra 	$L__END;
	cvta.to.global.u64 	%rd7, %rd1;
	shl.b64 	%rd8, %rd6, 2;
	add.s64 	%rd9, %rd7, %rd8;
	ld.global.u32 	%r4, [%rd9];
	{prelude}
	mov.u32 	%r5, 0;
	add.u64 	%rd10, %SPL, 0;
	setp.{cmp} 	%p3, %r5, %r9;
	@!%p3 bra 	$L__READ;
$L__FILL:
	add.s32 	%r6, %r4, %r5;
	st.local.u32 	[%rd10], %r6;
	add.s64 	%rd10, %rd10, 4;
	add.s32 	%r5, %r5, 1;
	{extra}
	setp.{cmp} 	%p2, %r5, %r9;
	@%p2 bra 	$L__FILL;
$L__READ:
	mul.wide.u32 	%rd11, %r7, 4;
	add.s64 	%rd12, %SPL, %rd11;
	ld.local.u32 	%r8, [%rd12];
	cvta.to.global.u64 	%rd13, %rd2;
	add.s64 	%rd14, %rd13, %rd8;
	st.global.u32 	[%rd14], %r8;
$L__END:
	ret;
}}
"#
    )
}

/// A scalar-ABI kernel `out[i] = table[x & mask]` over u32 elements, with
/// the module variables `vars` before it; `table` names the one read.
fn tabled(vars: &str, table: &str, mask: u32) -> String {
    format!(
        r#".version 9.0
.target sm_90
.address_size 64

{vars}
.visible .entry tabled(
	.param .u64 tabled_param_0,
	.param .u64 tabled_param_1,
	.param .u64 tabled_param_2
)
{{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<20>;
	.reg .b64 	%rd<20>;

	ld.param.u64 	%rd1, [tabled_param_0];
	ld.param.u64 	%rd2, [tabled_param_1];
	ld.param.u64 	%rd3, [tabled_param_2];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd4, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd5, %r3;
	add.s64 	%rd6, %rd4, %rd5;
	setp.ge.s64 	%p1, %rd6, %rd3;
	@%p1 bra 	$L__END;
	cvta.to.global.u64 	%rd7, %rd1;
	shl.b64 	%rd8, %rd6, 2;
	add.s64 	%rd9, %rd7, %rd8;
	ld.global.u32 	%r4, [%rd9];
	and.b32 	%r5, %r4, {mask};
	mul.wide.u32 	%rd10, %r5, 4;
	mov.u64 	%rd11, {table};
	add.s64 	%rd12, %rd11, %rd10;
	ld.global.nc.u32 	%r6, [%rd12];
	cvta.to.global.u64 	%rd13, %rd2;
	add.s64 	%rd14, %rd13, %rd8;
	st.global.u32 	[%rd14], %r6;
$L__END:
	ret;
}}
"#
    )
}

/// Fresh random u64 operands with the edge values first.
fn operands(r: &mut rand::rngs::StdRng, n: usize) -> (Vec<u64>, Vec<u64>) {
    let edges = [0u64, 1, 0xFFFF_FFFF, 0x1_0000_0000, u64::MAX, u64::MAX - 1];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for x in edges {
        for y in edges {
            a.push(x);
            b.push(y);
        }
    }
    while a.len() < n {
        a.push(r.random());
        b.push(r.random());
    }
    (a, b)
}

/// A `.func cf(x) -> r` with `body` between reading `x` (`%s1`) and
/// writing `r` (`%s2`), and the caller's call of it passing `%r11` and
/// taking `%r21`, with `before` and `after` around it.
fn carry_call(body: &str, before: &str, after: &str) -> String {
    carried_with(
        &format!(".func (.param .b32 cr) cf(.param .b32 cx)\n{{\n\t.reg .b32 \t%s<4>;\n\tld.param.b32 \t%s1, [cx];\n\t{body}\n\tst.param.b32 \t[cr], %s2;\n\tret;\n}}\n"),
        &format!("{before}\n\t{{\n\t.param .b32 param0;\n\tst.param.b32 \t[param0+0], %r11;\n\t.param .b32 retval0;\n\tcall.uni (retval0), cf, (param0);\n\tld.param.b32 \t%r21, [retval0+0];\n\t}}\n\t{after}"),
    )
}

/// FINDING (carry across a call): PTX does not preserve `CC.CF` across
/// calls (ISA 9.7.2), but once inlined the lowered flag was one register
/// for caller and callee, so a callee reading its caller's carry, and a
/// caller reading a carry across a call (set before it, or by the
/// callee), were accepted and given a meaning the GPU does not have. Now
/// refused `undefined_register` naming the read; a chain inside the
/// callee, and a carry read across a branch in a body that calls, stay
/// accepted and run exactly.
#[test]
fn a_carry_is_not_preserved_across_calls() {
    for (what, text, function) in [
        (
            "the callee reads the caller's carry",
            carry_call(
                "addc.u32 \t%s2, %s1, 0;",
                "add.cc.u32 \t%r20, %r10, %r12;",
                "mov.b64 \t%rd20, {%r20, %r21};",
            ),
            "cf",
        ),
        (
            "the caller reads its carry after a call",
            carry_call(
                "add.u32 \t%s2, %s1, 1;",
                "add.cc.u32 \t%r20, %r10, %r12;",
                "addc.u32 \t%r21, %r21, 0;\n\tmov.b64 \t%rd20, {%r20, %r21};",
            ),
            "carried",
        ),
        (
            "the caller reads the callee's carry",
            carry_call(
                "add.cc.u32 \t%s2, %s1, %s1;",
                "",
                "addc.u32 \t%r20, 0, 0;\n\tmov.b64 \t%rd20, {%r20, %r21};",
            ),
            "carried",
        ),
        (
            "a carry set on one path around the call only",
            carry_call(
                "add.u32 \t%s2, %s1, 1;",
                "add.cc.u32 \t%r20, %r10, %r12;\n\tsetp.eq.u32 \t%p2, %r10, 0;\n\t@%p2 bra \t$L__SKIP;",
                "$L__SKIP:\n\taddc.u32 \t%r21, %r21, 0;\n\tmov.b64 \t%rd20, {%r20, %r21};",
            ),
            "carried",
        ),
    ] {
        let (reason, explanation) = refusal(&text, "carried");
        assert_eq!(reason, "undefined_register", "{what}: {explanation}");
        assert!(
            explanation.contains(&format!("`addc.u32` in `{function}` reads the carry flag"))
                && explanation.contains("does not preserve the carry across calls"),
            "{what}: {explanation}"
        );
    }
    // Held: a chain inside the callee, and one in the caller across a
    // branch and a label (but not a call), run exactly.
    let mut r = rng("carry around calls");
    let (a, b) = operands(&mut r, 400);
    let inside = carry_call(
        "add.cc.u32 \t%s3, %s1, %s1;\n\taddc.u32 \t%s2, 0, 0;",
        "add.cc.u32 \t%r20, %r10, %r12;\n\tsetp.eq.u32 \t%p2, %r13, 0;\n\t@%p2 bra \t$L__JOIN;\n\tadd.u32 \t%r22, %r10, 1;\n$L__JOIN:\n\taddc.u32 \t%r23, 0, 0;\n\tadd.u32 \t%r20, %r20, %r23;",
        "mov.b64 \t%rd20, {%r20, %r21};",
    );
    let got = run_carried(&inside, &a, &b);
    for ((x, y), g) in a.iter().zip(&b).zip(&got) {
        let (lo, c) = (*x as u32).overflowing_add(*y as u32);
        let hi = (x >> 63) as u32;
        let want = u64::from(lo.wrapping_add(u32::from(c))) | u64::from(hi) << 32;
        assert_eq!(*g, want, "a = {x:#x}, b = {y:#x}");
    }
}

/// Struct returns, attacked (held): a field written at two widths or
/// overlapping another, read at another width, a vector read, its
/// address taken by the caller or the callee, a read of the return in the
/// callee, a field read before the call or written on one path only, one
/// return variable passed to two calls, a field read at 16 or 8 bits:
/// each refused with its exact reason.
#[test]
fn struct_return_attacks_are_refused() {
    let none = ("", "");
    for (what, callee, call, reason, why) in [
        (
            "a field written at two widths",
            ("st.param.b32 \t[fr+8], %s1;", "st.param.b32 \t[fr+8], %s1;\n\tst.param.b64 \t[fr+8], %q1;"),
            none,
            "call_arguments",
            "`st.param.b64` at byte 8 (width 8) overlaps the field at byte 8 (width 4) of the struct `fr`",
        ),
        (
            "overlapping stores",
            ("st.param.b32 \t[fr+8], %s1;", "st.param.b32 \t[fr+8], %s1;\n\tst.param.b32 \t[fr+4], %s1;"),
            none,
            "call_arguments",
            "`st.param.b32` at byte 4 (width 4) overlaps the field at byte 0 (width 8) of the struct `fr`",
        ),
        (
            "a field read at another width",
            none,
            ("ld.param.b32 \t%r21, [retval0+8];", "ld.param.b32 \t%r21, [retval0+0];"),
            "call_arguments",
            "`ld.param.b32` at byte 0 (width 4) overlaps the field at byte 0 (width 8) of the struct `retval0`",
        ),
        (
            "a vector read",
            none,
            ("ld.param.b32 \t%r21, [retval0+8];", "ld.param.v2.b32 \t{%r21, %r22}, [retval0+8];"),
            "call_arguments",
            "`ld.param.v2.b32` is not a scalar access of the struct `retval0`",
        ),
        (
            "the return used as an address by the caller",
            none,
            ("ld.param.b32 \t%r21, [retval0+8];", "mov.u64 \t%rd23, retval0;\n\tld.param.b32 \t%r21, [retval0+8];"),
            "call_arguments",
            "`mov.u64` uses the call param `retval0` other than by value",
        ),
        (
            "the return used as an address by the callee",
            ("st.param.b32 \t[fr+8], %s1;", "st.param.b32 \t[fr+8], %s1;\n\tmov.u64 \t%q3, fr;"),
            none,
            "call_arguments",
            "`mov.u64` uses the param `fr` other than by value",
        ),
        (
            "the callee reads its return",
            ("st.param.b32 \t[fr+8], %s1;", "st.param.b32 \t[fr+8], %s1;\n\tld.param.b32 \t%s2, [fr+8];"),
            none,
            "call_arguments",
            "`ld.param.b32` in `sf` is not a read of a param it was passed or a write of its return",
        ),
        (
            "a field read before the call",
            none,
            ("call.uni", "ld.param.b32 \t%r22, [retval0+8];\n\tcall.uni"),
            "undefined_register",
            "`mov.b32` reads `%__arg2_8`, which is not written on every path to it",
        ),
        (
            "a field written under a predicate only",
            ("st.param.b32 \t[fr+8], %s1;", "setp.eq.u32 \t%sp1, %s1, 0;\n\t@%sp1 st.param.b32 \t[fr+8], %s1;"),
            none,
            "undefined_register",
            "`mov.b32` reads `%__arg2_8`, which is not written on every path to it",
        ),
        (
            "one return variable passed to two calls",
            none,
            ("ld.param.b64 \t%rd21, [retval0+0];", "call.uni (retval0), sf, (param0);\n\tld.param.b64 \t%rd21, [retval0+0];"),
            "call_arguments",
            "`param0` is passed twice",
        ),
        (
            "a 16-bit field read sign-extended into a 32-bit register",
            ("st.param.b32 \t[fr+8], %s1;", "cvt.u16.u64 \t%hs1, %q1;\n\tst.param.b16 \t[fr+8], %hs1;"),
            ("ld.param.b32 \t%r21, [retval0+8];", "ld.param.s16 \t%r21, [retval0+8];"),
            "operand_type",
            "`mov.s16` operand 1: `%r21` is declared `.b32`, which does not agree with `.s16`",
        ),
        (
            "a byte field",
            ("st.param.b32 \t[fr+8], %s1;", "st.param.b8 \t[fr+8], %s1;"),
            ("ld.param.b32 \t%r21, [retval0+8];", "ld.param.u8 \t%r21, [retval0+8];"),
            "operand_type",
            "`mov.b8` has no `.b8` form",
        ),
    ] {
        let (got, explanation) = refusal(&sret(callee, call), "carried");
        assert_eq!(got, reason, "{what}: {explanation}");
        assert!(explanation.contains(why), "{what}: {explanation}");
    }
    // Recursion through a struct return.
    let recursive = sret(
        ("\tret;\n}", "\t{\n\t.param .b64 p0;\n\tst.param.b64 \t[p0+0], %q1;\n\t.param .align 8 .b8 r0[16];\n\tcall.uni (r0), sf, (p0);\n\t}\n\tret;\n}"),
        none,
    );
    let (got, explanation) = refusal(&recursive, "carried");
    assert_eq!(got, "call_recursion", "{explanation}");
}

/// Struct returns the inliner accepts (a field read at another type of
/// its width, a field written twice, the plain call) run exactly on the
/// host engine, every element against the reference.
#[test]
fn accepted_struct_returns_run_exactly() {
    let mut r = rng("struct returns");
    let (a, b) = operands(&mut r, 300);
    let none = ("", "");
    type Reference = fn(u64) -> u64;
    let cases: [(&str, String, Reference); 3] = [
        ("the call", sret(none, none), |x| x.wrapping_add(1) ^ (x & 0xFFFF_FFFF)),
        (
            "a field read as f32",
            sret(none, ("ld.param.b32 \t%r21, [retval0+8];", "ld.param.f32 \t%f1, [retval0+8];\n\tmov.b32 \t%r21, %f1;")),
            |x| x.wrapping_add(1) ^ (x & 0xFFFF_FFFF),
        ),
        (
            "a field written twice",
            sret(("st.param.b32 \t[fr+8], %s1;", "st.param.b32 \t[fr+8], 7;\n\tst.param.b64 \t[fr+0], 5;\n\tst.param.b32 \t[fr+8], %s1;"), none),
            |x| 5 ^ (x & 0xFFFF_FFFF),
        ),
    ];
    for (what, text, f) in cases {
        let got = run_carried(&text, &a, &b);
        for (x, g) in a.iter().zip(&got) {
            assert_eq!(*g, f(*x), "{what}: a = {x:#x}");
        }
    }
}

/// Runs `tabled` over u32 elements on the host engine, the output
/// poisoned and its tail checked.
fn run_tabled(text: &str, x: &[u32]) -> Vec<u32> {
    let k = HostKernel::compile_with(text, "tabled", Families::ALL)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let n = x.len();
    let mut input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; (n + 2) * 4];
    let spans = [HostSpan {
        ptr: input.as_mut_ptr(),
        len: input.len(),
    }];
    let l = HostLaunch {
        inputs: &spans,
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
    // SAFETY: both spans are live Vecs of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(out[n * 4..].iter().all(|b| *b == 0xFF), "tail written");
    out.chunks(4)
        .take(n)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// FINDING (unbounded zero padding): a short initializer was padded to
/// the variable's declared size whatever it was, so `.global .b8
/// t[1 << 40] = {1, 2}` made the parser allocate a terabyte (the process
/// aborts), and many variables of 64 KiB each as much as the token limit
/// allowed. Now the padding is bounded over the module
/// (`MAX_INITIALIZER`); past it a variable keeps no initializer and reads
/// of it are refused as before (`global_variable`). Held: a short
/// initializer of `.global`, `.const`, `.b8` arrays reads zeros past its
/// end exactly; a longer one, a negative or two-dimensional size keeps no
/// initializer (refused); a `.shared` one is `shared_memory`.
#[test]
fn zero_padding_is_bounded_and_exact() {
    let (reason, explanation) = refusal(
        &tabled(".global .align 4 .b8 t[1099511627776] = {1, 2};", "t", 3),
        "tabled",
    );
    assert_eq!(reason, "global_variable", "{explanation}");
    let mut many = String::new();
    for k in 0..40 {
        many.push_str(&format!(".global .align 4 .b8 big{k}[65536] = {{1}};\n"));
    }
    many.push_str(".global .align 4 .u32 t[4] = {1, 2};");
    let (reason, explanation) = refusal(&tabled(&many, "t", 3), "tabled");
    assert_eq!(reason, "global_variable", "{explanation}");
    for (what, vars, mask) in [
        (
            "longer than the array",
            ".global .align 4 .u32 t[2] = {1, 2, 3, 4};",
            3,
        ),
        (
            "read past the array",
            ".global .align 4 .u32 t[4] = {1, 2};",
            7,
        ),
        (
            "two dimensions",
            ".global .align 4 .u32 t[2][4] = {1, 2};",
            7,
        ),
        (
            "a negative size",
            ".global .align 4 .u32 t[-4] = {1, 2};",
            3,
        ),
    ] {
        let (reason, explanation) = refusal(&tabled(vars, "t", mask), "tabled");
        assert_eq!(reason, "global_variable", "{what}: {explanation}");
    }
    let (reason, _) = refusal(
        &tabled(".shared .align 4 .u32 t[4] = {1, 2};", "t", 3),
        "tabled",
    );
    assert_eq!(reason, "shared_memory");
    let mut r = rng("zero padding");
    let x: Vec<u32> = (0..300).map(|_| r.random()).collect();
    for (vars, table) in [
        (".global .align 4 .u32 t[4] = {1, 2};", [1u32, 2, 0, 0]),
        (".const .align 4 .u32 t[4] = {7};", [7, 0, 0, 0]),
        (
            ".global .align 4 .b8 t[16] = {1, 2, 3, 4, 5};",
            [0x0403_0201, 5, 0, 0],
        ),
        (
            ".global .align 4 .u16 t[8] = {1, 2, 3};",
            [0x0002_0001, 3, 0, 0],
        ),
    ] {
        let got = run_tabled(&tabled(vars, "t", 3), &x);
        for (x, g) in x.iter().zip(&got) {
            assert_eq!(*g, table[(x & 3) as usize], "{vars}: x = {x:#x}");
        }
    }
}

fn vec2_g() -> String {
    let path = format!(
        "{}/tests/corpus/jit/nvrtc/add_f16_vec2_G.ptx",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path).unwrap()
}

fn vec2_with(edits: &[(&str, &str)]) -> String {
    let mut text = vec2_g();
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replacen(from, to, 1);
    }
    text
}

/// Runs `add_f16_vec2(a, b, out, n)` of `text` on the host engine over
/// u32 elements, the output poisoned and its tail checked.
fn run_vec2(text: &str, a: &[u32], b: &[u32]) -> Vec<u32> {
    let k = HostKernel::compile_with(text, "add_f16_vec2", Families::ALL)
        .unwrap_or_else(|e| panic!("{e}"));
    let n = a.len();
    let mut ia: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut ib: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; (n + 2) * 4];
    let spans = [
        HostSpan {
            ptr: ia.as_mut_ptr(),
            len: ia.len(),
        },
        HostSpan {
            ptr: ib.as_mut_ptr(),
            len: ib.len(),
        },
    ];
    let l = HostLaunch {
        inputs: &spans,
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
    // SAFETY: every span is a live Vec of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(out[n * 4..].iter().all(|b| *b == 0xFF), "tail written");
    out.chunks(4)
        .take(n)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// FINDING (address-space confusion): the frame proof held the frame's
/// local-window address (`%SPL`) and its generic one (`cvta.local` of
/// it, `%SP`) as the same value, so a generic access through `%SPL`, a
/// `.local` access through `%SP`, and a `cvta.local` of an address
/// already generic (the `%SP` itself, or a frame address reloaded from a
/// slot) were proved as accesses of the frame's bytes and accepted; on
/// the GPU each accesses other memory. Now the generic window is held
/// apart in the domain and each is refused `local_memory` naming it.
#[test]
fn the_frames_two_windows_are_not_confused() {
    for (what, edits, why) in [
        (
            "a generic load through the local-window address",
            &[(
                "ld.u64 \t%rd19, [%SP+8];",
                "ld.u64 \t%rd19, [%SP+8];\n\tld.u32 \t%r3, [%SPL+4];",
            )][..],
            "`ld.u32` accesses the local frame `__local_depot0` as generic memory through its local-window address",
        ),
        (
            "a .local load through the generic address",
            &[(
                "ld.u64 \t%rd19, [%SP+8];",
                "ld.u64 \t%rd19, [%SP+8];\n\tld.local.u32 \t%r3, [%SP+4];",
            )],
            "`ld.local.u32` accesses the local frame `__local_depot0` in the local window through its generic address",
        ),
        (
            "cvta.local of the generic address",
            &[(
                "add.u64 \t%rd12, %SP, 4;",
                "cvta.local.u64 \t%rd26, %SP;\n\tadd.u64 \t%rd12, %rd26, 4;",
            )],
            "`cvta.local.u64` converts an address of the local frame `__local_depot0` that is not its local-window address",
        ),
        (
            "cvta.local of an address reloaded from its slot",
            &[(
                "ld.u64 \t%rd19, [%SP+8];",
                "ld.u64 \t%rd19, [%SP+8];\n\tcvta.local.u64 \t%rd19, %rd19;",
            )],
            "`cvta.local.u64` converts an address of the local frame `__local_depot0` that is not its local-window address",
        ),
        (
            "the local-window address passed as the callee's generic `this`",
            &[("add.u64 \t%rd12, %SP, 4;", "add.u64 \t%rd12, %SPL, 4;")],
            "`st.u32` accesses the local frame `__local_depot0` as generic memory through its local-window address",
        ),
        (
            "a local-window address kept in a slot and used generically",
            &[("mov.b64 \t%rd13, %rd12;", "add.u64 \t%rd13, %SPL, 4;")],
            "`ld.u32` accesses the local frame `__local_depot0` as generic memory through its local-window address",
        ),
    ] {
        let (reason, explanation) = refusal(&vec2_with(edits), "add_f16_vec2");
        assert_eq!(reason, "local_memory", "{what}: {explanation}");
        assert!(explanation.contains(why), "{what}: {explanation}");
    }
}

/// Frame-address slots, attacked (held): data and a frame address in one
/// slot (the same statement on two paths, or two statements), half a
/// slot read, a vector store or load covering one, a slot overwritten with
/// data or read before it is written, a predicated or 32-bit store of an
/// address, arithmetic past the frame on a reloaded address, `cvta.to.
/// local` of one, an address compared, xored or narrowed, a scope's
/// register stored over a slot: each refused `local_memory` naming it.
/// The accepted variants (a slot written through `.local`, an address
/// copied into another slot, arithmetic inside the frame, a nested scope
/// shadowing a register) run on the host engine exactly as the kernel
/// they are equal to.
#[test]
fn frame_address_slot_attacks_are_refused_or_run_exactly() {
    let branch = "setp.eq.s64 \t%p3, %rd1, 5;\n\t";
    let ld19 = "ld.u64 \t%rd19, [%SP+8];";
    let cases: Vec<(&str, Vec<(&str, String)>, &str)> = vec![
        ("an address on one path, data on another (one statement)",
            vec![("mov.b64 \t%rd13, %rd12;", format!("mov.b64 \t%rd13, %rd12;\n\t{branch}@%p3 mov.b64 \t%rd13, %rd11;"))],
            "`ld.u32` may access byte offsets -9223372036854775808..=9223372036854775807"),
        ("an address on one path, data on another (two statements)",
            vec![("st.u64 \t[%SP+8], %rd13;", format!("{branch}@%p3 bra \t$L__X;\n\tst.u64 \t[%SP+8], %rd13;\n\tbra.uni \t$L__Y;\n$L__X:\n\tst.u64 \t[%SP+8], %rd11;\n$L__Y:"))],
            "`st.u64` accesses the local frame `__local_depot0` at width 8, another access at 4"),
        ("the low half of a slot read",
            vec![("ld.u64 \t%rd18, [%SP+24];", "ld.u64 \t%rd18, [%SP+24];\n\tld.u32 \t%r3, [%SP+24];".into())],
            "`ld.u32` may access bytes 24..28 of the local frame `__local_depot0`, which overlap the slot at byte 24"),
        ("a vector store covering a slot",
            vec![("ld.u64 \t%rd18, [%SP+24];", "st.v2.u64 \t[%SP+16], {%rd1, %rd1};\n\tld.u64 \t%rd18, [%SP+24];".into())],
            "`st.v2.u64` accesses the local frame `__local_depot0` at width 8, another access at 4"),
        ("a vector load covering a slot",
            vec![("ld.u64 \t%rd18, [%SP+24];", "ld.v2.u64 \t{%rd18, %rd26}, [%SP+16];\n\tld.u64 \t%rd18, [%SP+24];".into())],
            "`ld.v2.u64` accesses the local frame `__local_depot0` at width 8, another access at 4"),
        ("a slot overwritten with data",
            vec![(ld19, "st.u64 \t[%SP+8], %rd1;\n\tld.u64 \t%rd19, [%SP+8];".into())],
            "`st.u64` accesses the local frame `__local_depot0` at width 8, another access at 4"),
        ("a slot read before it is written",
            vec![("mov.b64 \t%rd13, %rd12;\n\tst.u64 \t[%SP+8], %rd13;", "ld.u64 \t%rd26, [%SP+8];\n\tst.u64 \t[%rd26], %rd1;\n\tmov.b64 \t%rd13, %rd12;\n\tst.u64 \t[%SP+8], %rd13;".into())],
            "`ld.u64` accesses the local frame `__local_depot0` at width 8, another access at 4"),
        ("a slot written on one path only",
            vec![("st.u64 \t[%SP+8], %rd13;", format!("{branch}@%p3 bra \t$L__X;\n\tst.u64 \t[%SP+8], %rd13;\n$L__X:"))],
            "`ld.u64` accesses the local frame `__local_depot0` at width 8, another access at 4"),
        ("a predicated store of an address",
            vec![("st.u64 \t[%SP+8], %rd13;", format!("{branch}@%p3 st.u64 \t[%SP+8], %rd13;"))],
            "`st.u64` uses the address of the local frame `__local_depot0` (in `%rd13`) other than to access it"),
        ("a 32-bit store of an address",
            vec![("st.u64 \t[%SP+8], %rd13;", "cvt.u32.u64 \t%r3, %rd13;\n\tst.u32 \t[%SP+8], %r3;".into())],
            "`cvt.u32.u64` uses the address of the local frame `__local_depot0` (in `%rd13`)"),
        ("arithmetic past the frame on a reloaded address",
            vec![(ld19, "ld.u64 \t%rd19, [%SP+8];\n\tadd.s64 \t%rd19, %rd19, 40;".into())],
            "`ld.u32` may access byte offsets 44..=44"),
        ("cvta.to.local of a reloaded address",
            vec![(ld19, "ld.u64 \t%rd19, [%SP+8];\n\tcvta.to.local.u64 \t%rd19, %rd19;".into())],
            "`cvta.to.local.u64` uses the address of the local frame `__local_depot0` (in `%rd19`) other than to access it"),
        ("a reloaded address compared",
            vec![(ld19, "ld.u64 \t%rd19, [%SP+8];\n\tsetp.eq.u64 \t%p3, %rd19, 0;\n\t@%p3 bra \t$L__BB0_2;".into())],
            "`setp.eq.u64` uses the address of the local frame `__local_depot0` (in `%rd19`)"),
        ("a reloaded address xored",
            vec![(ld19, "ld.u64 \t%rd19, [%SP+8];\n\txor.b64 \t%rd19, %rd19, 0;".into())],
            "`xor.b64` uses the address of the local frame `__local_depot0` (in `%rd19`)"),
        ("a scope's register stored over a slot",
            vec![("mov.b64 \t%rd13, %rd12;", "{\n\t.reg .b64 \t%rd12;\n\tadd.u64 \t%rd12, %SP, 36;\n\tst.u32 \t[%rd12], %r3;\n\t}\n\tmov.b64 \t%rd13, %rd12;".into())],
            "`st.u32` may access bytes 36..40 of the local frame `__local_depot0`, which overlap the slot at byte 32"),
    ];
    for (what, edits, why) in &cases {
        let edits: Vec<(&str, &str)> = edits.iter().map(|(a, b)| (*a, b.as_str())).collect();
        let (reason, explanation) = refusal(&vec2_with(&edits), "add_f16_vec2");
        assert_eq!(reason, "local_memory", "{what}: {explanation}");
        assert!(explanation.contains(why), "{what}: {explanation}");
    }
    let mut r = rng("frame-address slots");
    let a: Vec<u32> = (0..257).map(|_| r.random()).collect();
    let b: Vec<u32> = (0..257).map(|_| r.random()).collect();
    let original = vec2_g();
    let same = run_vec2(&original, &a, &b);
    let doubled = run_vec2(&original, &b, &b);
    for (what, edits, want) in [
        (
            "a slot written through .local",
            vec![(
                "st.u64 \t[%SP+8], %rd13;",
                "st.local.u64 \t[%SPL+8], %rd13;",
            )],
            &same,
        ),
        (
            "an address copied into another slot",
            vec![(
                ld19,
                "ld.u64 \t%rd19, [%SP+8];\n\tst.u64 \t[%SP+32], %rd19;",
            )],
            &same,
        ),
        (
            "a nested scope shadowing a register",
            vec![(
                "mov.b64 \t%rd13, %rd12;",
                "{\n\t.reg .b64 \t%rd12;\n\tmov.u64 \t%rd12, 0;\n\t}\n\tmov.b64 \t%rd13, %rd12;",
            )],
            &same,
        ),
        // `a`'s address moved to `b`'s: b + b.
        (
            "arithmetic inside the frame",
            vec![(
                ld19,
                "ld.u64 \t%rd19, [%SP+8];\n\tadd.s64 \t%rd19, %rd19, 12;",
            )],
            &doubled,
        ),
    ] {
        let got = run_vec2(&vec2_with(&edits), &a, &b);
        assert_eq!(&got, want, "{what}");
    }
}

/// Splits, attacked (held): a split bound redefined in the loop (grown,
/// doubled, set from data), a bound from a load, a negative bound read
/// unsigned, a bound that passes the frame only when read signed, an index
/// past the frame by one on one split value, `max` of a negative read
/// unsigned, a split bound with 33 values one slot past the frame, a
/// callee's inner scope shadowing its index register: each refused
/// `local_memory` naming the access. Many split registers in sequence are
/// refused `too_complex` within the cost bound. Every accepted variant
/// runs on the host engine against the reference, every element.
#[test]
fn split_attacks_are_refused_or_run_exactly() {
    let past = |op: &str, off: &str| format!("`{op}` may access byte offsets {off}");
    let b3 = "and.b32 \t%r9, %r4, 3;\n\tmov.u32 \t%r7, 0;";
    let cases: Vec<(&str, String, String)> = vec![
        (
            "a bound grown in the loop",
            framed(16, b3, "add.s32 \t%r9, %r9, 1;", "lt.u32"),
            past("st.local.u32", "16..=16"),
        ),
        (
            "a bound doubled in the loop",
            framed(16, b3, "shl.b32 \t%r9, %r9, 1;", "lt.u32"),
            past("st.local.u32", "16..=16"),
        ),
        (
            "a bound set from data in the loop",
            framed(16, b3, "and.b32 \t%r9, %r4, 7;", "lt.u32"),
            past("st.local.u32", "16..=16"),
        ),
        (
            "a bound from a load",
            framed(
                16,
                "ld.global.u32 \t%r9, [%rd9+4];\n\tmov.u32 \t%r7, 0;",
                "",
                "lt.u32",
            ),
            past("st.local.u32", "16..=16"),
        ),
        (
            "a negative bound read unsigned",
            framed(
                16,
                "and.b32 \t%r10, %r4, 3;\n\tadd.s32 \t%r9, %r10, -2;\n\tmov.u32 \t%r7, 0;",
                "",
                "lt.u32",
            ),
            past("st.local.u32", "16..=16"),
        ),
        (
            "a bound past the frame read signed",
            framed(
                16,
                "and.b32 \t%r10, %r4, 3;\n\tadd.s32 \t%r9, %r10, 2147483646;\n\tmov.u32 \t%r7, 0;",
                "",
                "lt.s32",
            ),
            past("st.local.u32", "16..=16"),
        ),
        (
            "an index one past on one value",
            framed(
                16,
                "and.b32 \t%r9, %r4, 3;\n\tadd.s32 \t%r7, %r9, 1;",
                "",
                "lt.u32",
            ),
            past("ld.local.u32", "16..=16"),
        ),
        (
            "neg of a split value, one past",
            framed(
                16,
                "and.b32 \t%r9, %r4, 3;\n\tneg.s32 \t%r10, %r9;\n\tadd.s32 \t%r7, %r10, 4;",
                "",
                "lt.u32",
            ),
            past("ld.local.u32", "16..=16"),
        ),
        (
            "max.u32 of a negative split value",
            framed(
                16,
                "and.b32 \t%r10, %r4, 3;\n\tadd.s32 \t%r9, %r10, -2;\n\tmax.u32 \t%r7, %r9, 0;",
                "",
                "lt.s32",
            ),
            past("ld.local.u32", "17179869176..=17179869176"),
        ),
        (
            "33 values, one slot past",
            framed(
                124,
                "and.b32 \t%r10, %r4, 63;\n\tmin.u32 \t%r9, %r10, 32;\n\tmov.u32 \t%r7, 0;",
                "",
                "lt.u32",
            ),
            past("st.local.u32", "124..=124"),
        ),
    ];
    for (what, text, why) in &cases {
        let (reason, explanation) = refusal(text, "framed");
        assert_eq!(reason, "local_memory", "{what}: {explanation}");
        assert!(explanation.contains(why.as_str()), "{what}: {explanation}");
    }
    // A callee's own scope shadowing the register it returns.
    let callee = ".func (.param .b32 zr) zf(.param .b32 zx)\n{\n\t.reg .b32 \t%r<8>;\n\tld.param.b32 \t%r7, [zx];\n\t{\n\t.reg .b32 \t%r7;\n\tmov.u32 \t%r7, 0;\n\t}\n\tst.param.b32 \t[zr], %r7;\n\tret;\n}\n\n.visible .entry framed(";
    let call = "and.b32 \t%r9, %r4, 3;\n\t{\n\t.param .b32 param0;\n\tst.param.b32 \t[param0+0], %r4;\n\t.param .b32 retval0;\n\tcall.uni (retval0), zf, (param0);\n\tld.param.b32 \t%r7, [retval0+0];\n\t}";
    let text = framed(16, call, "", "lt.u32").replacen(".visible .entry framed(", callee, 1);
    let (reason, explanation) = refusal(&text, "framed");
    assert_eq!(reason, "local_memory", "{explanation}");
    assert!(
        explanation.contains("`ld.local.u32` may access byte offsets"),
        "{explanation}"
    );
    // The cost bound: twelve split registers in sequence.
    let mut many = String::new();
    for k in 0..12 {
        many.push_str(&format!("and.b32 \t%r{}, %r4, 3;\n\t", 20 + k));
    }
    for k in 0..6 {
        many.push_str(&format!(
            "setp.lt.u32 \t%p4, %r{}, %r{};\n\t",
            20 + 2 * k,
            21 + 2 * k
        ));
    }
    let t = std::time::Instant::now();
    let (reason, explanation) =
        refusal(&framed(16, &format!("{many}{b3}"), "", "lt.u32"), "framed");
    eprintln!("twelve split registers: {reason} in {:?}", t.elapsed());
    assert_eq!(reason, "too_complex", "{explanation}");
    assert!(
        explanation.contains("costs more than 3000000 state entries visited"),
        "{explanation}"
    );
    // Accepted: (frame bytes, prelude, loop extra, compare, reference of
    // (slots written, index) from x).
    type Reference = fn(u32) -> (u32, u32);
    let accepted: [(u32, &str, &str, &str, Reference); 8] = [
        (16, b3, "", "lt.u32", |x| (x & 3, 0)),
        (16, b3, "min.u32 \t%r5, %r5, %r9;", "lt.u32", |x| (x & 3, 0)),
        (128, "and.b32 \t%r9, %r4, 31;\n\tshr.u32 \t%r11, %r4, 5;\n\tand.b32 \t%r7, %r11, 31;", "", "lt.u32", |x| (x & 31, (x >> 5) & 31)),
        (128, "and.b32 \t%r10, %r4, 63;\n\tmin.u32 \t%r9, %r10, 32;\n\tshr.u32 \t%r11, %r4, 6;\n\tand.b32 \t%r7, %r11, 31;", "", "lt.u32", |x| ((x & 63).min(32), (x >> 6) & 31)),
        (16, "and.b32 \t%r10, %r4, 3;\n\tadd.s32 \t%r9, %r10, -2;\n\tmov.u32 \t%r7, 1;", "", "lt.s32", |x| (((x & 3) as i32 - 2).max(0) as u32, 1)),
        (16, "and.b32 \t%r9, %r4, 3;\n\tmov.u32 \t%r7, %r9;", "", "lt.u32", |x| (x & 3, x & 3)),
        (16, "and.b32 \t%r9, %r4, 3;\n\tneg.s32 \t%r10, %r9;\n\tadd.s32 \t%r7, %r10, 3;", "", "lt.u32", |x| (x & 3, 3 - (x & 3))),
        (16, "and.b32 \t%r10, %r4, 3;\n\tadd.s32 \t%r9, %r10, -2;\n\tmin.s32 \t%r11, %r9, 3;\n\tmax.s32 \t%r7, %r11, 0;", "", "lt.s32", |x| (((x & 3) as i32 - 2).max(0) as u32, ((x & 3) as i32 - 2).max(0) as u32)),
    ];
    let mut r = rng("splits");
    let x: Vec<u32> = (0..400).map(|_| r.random()).collect();
    for (size, prelude, extra, cmp, f) in accepted {
        let text = framed(size, prelude, extra, cmp);
        let got = run_framed(&text, &x);
        for (x, g) in x.iter().zip(&got) {
            let (written, index) = f(*x);
            assert!(index < size / 4, "{prelude}: index {index} past the frame");
            let want = if index < written {
                x.wrapping_add(index)
            } else {
                0
            };
            assert_eq!(*g, want, "{prelude} / {extra}: x = {x:#x}");
        }
    }
}

/// Runs `framed` over u32 elements on the host engine, the output
/// poisoned and its tail checked.
fn run_framed(text: &str, x: &[u32]) -> Vec<u32> {
    let k = HostKernel::compile_with(text, "framed", Families::ALL)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let n = x.len();
    let mut input: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = vec![0xFFu8; (n + 2) * 4];
    let spans = [HostSpan {
        ptr: input.as_mut_ptr(),
        len: input.len(),
    }];
    let l = HostLaunch {
        inputs: &spans,
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
    // SAFETY: both spans are live Vecs of exactly `len` bytes.
    unsafe { k.launch(&l) }.unwrap();
    assert!(out[n * 4..].iter().all(|b| *b == 0xFF), "tail written");
    out.chunks(4)
        .take(n)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every kernel accepted above also passes the mutant oracle: accepted
/// by the default canonicalization, run on the host engine over random n
/// with canary-padded operands, no access outside them.
#[test]
fn accepted_attacks_pass_the_canary_oracle() {
    let mut r = rng("oracle");
    let none = ("", "");
    let ld19 = "ld.u64 \t%rd19, [%SP+8];";
    let texts = [
        sret(none, none),
        sret(
            (
                "st.param.b32 \t[fr+8], %s1;",
                "st.param.b32 \t[fr+8], 7;\n\tst.param.b32 \t[fr+8], %s1;",
            ),
            none,
        ),
        carry_call(
            "add.cc.u32 \t%s3, %s1, %s1;\n\taddc.u32 \t%s2, 0, 0;",
            "",
            "mov.b64 \t%rd20, {%r21, %r21};",
        ),
        vec2_with(&[(
            "st.u64 \t[%SP+8], %rd13;",
            "st.local.u64 \t[%SPL+8], %rd13;",
        )]),
        vec2_with(&[(
            ld19,
            "ld.u64 \t%rd19, [%SP+8];\n\tadd.s64 \t%rd19, %rd19, 12;",
        )]),
        framed(
            16,
            "and.b32 \t%r9, %r4, 3;\n\tmov.u32 \t%r7, %r9;",
            "",
            "lt.u32",
        ),
        framed(
            128,
            "and.b32 \t%r10, %r4, 63;\n\tmin.u32 \t%r9, %r10, 32;\n\tmov.u32 \t%r7, 31;",
            "",
            "lt.u32",
        ),
        tabled(".global .align 4 .b8 t[16] = {1, 2, 3, 4, 5};", "t", 3),
    ];
    for text in &texts {
        let symbol = ["carried", "add_f16_vec2", "framed", "tabled"]
            .into_iter()
            .find(|s| text.contains(&format!(".entry {s}(")))
            .unwrap();
        assert_eq!(oracle(text, symbol, &mut r), Ok(true), "{symbol}");
    }
}

/// One step of a random index chain: (PTX, the reference).
type Step = (String, Box<dyn Fn(&[u32]) -> u32>);

/// A random integer step reading earlier registers `%r20..` (or x,
/// `%r4`, as register 0) and writing `%r{20 + k}`.
fn random_step(r: &mut rand::rngs::StdRng, k: usize) -> Step {
    const C: [i64; 14] = [
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        31,
        -1,
        -2,
        -4,
        0x7FFF_FFFF,
        -0x8000_0000,
        0xFFFF_FFFC,
    ];
    let reg = |j: usize| {
        if j == 0 {
            "%r4".to_string()
        } else {
            format!("%r{}", 20 + j)
        }
    };
    let a = r.random_range(0..k);
    let b = r.random_range(0..k);
    let c = C[r.random_range(0..C.len())];
    let cu = c as u32;
    let d = format!("%r{}", 20 + k);
    let (ra, rb) = (reg(a), reg(b));
    let op = r.random_range(0..11);
    let (text, f): (String, Box<dyn Fn(&[u32]) -> u32>) = match op {
        0 => (
            format!("and.b32 \t{d}, {ra}, {c};"),
            Box::new(move |v| v[a] & cu),
        ),
        1 => (
            format!("add.s32 \t{d}, {ra}, {c};"),
            Box::new(move |v| v[a].wrapping_add(cu)),
        ),
        2 => (
            format!("sub.s32 \t{d}, {ra}, {rb};"),
            Box::new(move |v| v[a].wrapping_sub(v[b])),
        ),
        3 => (
            format!("neg.s32 \t{d}, {ra};"),
            Box::new(move |v| v[a].wrapping_neg()),
        ),
        4 => (
            format!("min.s32 \t{d}, {ra}, {c};"),
            Box::new(move |v| (v[a] as i32).min(cu as i32) as u32),
        ),
        5 => (
            format!("min.u32 \t{d}, {ra}, {c};"),
            Box::new(move |v| v[a].min(cu)),
        ),
        6 => (
            format!("max.s32 \t{d}, {ra}, {c};"),
            Box::new(move |v| (v[a] as i32).max(cu as i32) as u32),
        ),
        7 => (
            format!("max.u32 \t{d}, {ra}, {rb};"),
            Box::new(move |v| v[a].max(v[b])),
        ),
        8 => {
            let s = (cu & 31).max(1);
            (
                format!("shr.u32 \t{d}, {ra}, {s};"),
                Box::new(move |v| v[a] >> s),
            )
        }
        9 => {
            let s = (cu & 31).max(1);
            (
                format!("shr.s32 \t{d}, {ra}, {s};"),
                Box::new(move |v| ((v[a] as i32) >> s) as u32),
            )
        }
        _ => (
            format!("min.s32 \t{d}, {ra}, {rb};"),
            Box::new(move |v| (v[a] as i32).min(v[b] as i32) as u32),
        ),
    };
    (text, f)
}

/// The frame proof's integer domain (w30a's `neg`, `min`/`max`, splits of
/// a register-compared bound) fuzzed: random chains of integer steps from
/// `x` give the index and (through `min.u32 .., 4`) the loop bound of
/// `framed`; every kernel the verifier accepts must index inside the frame
/// for every sampled x (edges, the chain's constants and their
/// neighbours, random) and run on the host engine as the reference does.
#[test]
fn random_index_chains_are_inside_or_refused() {
    let mut r = rng("index chains");
    let mut xs: Vec<u32> = vec![
        0,
        1,
        2,
        3,
        4,
        5,
        0x7FFF_FFFF,
        0x8000_0000,
        0x8000_0001,
        u32::MAX,
        u32::MAX - 1,
        u32::MAX - 3,
        0xFFFF_FFFC,
    ];
    for c in [31u32, 6, 0x7FFF_FFFE, 0xFFFF_FFFB] {
        xs.extend([c.wrapping_sub(1), c, c.wrapping_add(1)]);
    }
    while xs.len() < 300 {
        xs.push(r.random());
    }
    let (mut accepted, mut total) = (0, 0);
    for _ in 0..1000 {
        let m = r.random_range(1..=4);
        let mut steps: Vec<Step> = (1..=m).map(|k| random_step(&mut r, k)).collect();
        // Mostly, a clamp the proof must see through (or see is not one).
        if r.random_bool(0.8) {
            let (a, k) = (format!("%r{}", 20 + m), 20 + m + 1);
            let pick = |r: &mut rand::rngs::StdRng, c: &[i32]| c[r.random_range(0..c.len())];
            let clamp: Vec<Step> = match r.random_range(0..5) {
                0 => {
                    let (c1, c2) = (pick(&mut r, &[2, 3, 4]), pick(&mut r, &[0, -1, 1]));
                    vec![
                        (
                            format!("min.s32 \t%r{k}, {a}, {c1};"),
                            Box::new(move |v: &[u32]| (v[m] as i32).min(c1) as u32),
                        ),
                        (
                            format!("max.s32 \t%r{}, %r{k}, {c2};", k + 1),
                            Box::new(move |v: &[u32]| (v[m + 1] as i32).max(c2) as u32),
                        ),
                    ]
                }
                1 => {
                    let c = pick(&mut r, &[3, 4]) as u32;
                    vec![(
                        format!("min.u32 \t%r{k}, {a}, {c};"),
                        Box::new(move |v: &[u32]| v[m].min(c)),
                    )]
                }
                2 => {
                    let c = pick(&mut r, &[3, 7]) as u32;
                    vec![(
                        format!("and.b32 \t%r{k}, {a}, {c};"),
                        Box::new(move |v: &[u32]| v[m] & c),
                    )]
                }
                3 => {
                    let c = pick(&mut r, &[29, 30]) as u32;
                    vec![(
                        format!("shr.u32 \t%r{k}, {a}, {c};"),
                        Box::new(move |v: &[u32]| v[m] >> c),
                    )]
                }
                _ => {
                    let (c1, c2) = (pick(&mut r, &[0, -1, 1]), pick(&mut r, &[2, 3, 4]));
                    vec![
                        (
                            format!("max.s32 \t%r{k}, {a}, {c1};"),
                            Box::new(move |v: &[u32]| (v[m] as i32).max(c1) as u32),
                        ),
                        (
                            format!("min.s32 \t%r{}, %r{k}, {c2};", k + 1),
                            Box::new(move |v: &[u32]| (v[m + 1] as i32).min(c2) as u32),
                        ),
                    ]
                }
            };
            steps.extend(clamp);
        }
        let n = steps.len();
        let last = format!("%r{}", 20 + n);
        let bounded = r.random_bool(0.5);
        let mut prelude: String = steps.iter().map(|(t, _)| format!("{t}\n\t")).collect();
        if bounded {
            prelude.push_str(&format!(
                "min.u32 \t%r9, {last}, 4;\n\tmov.u32 \t%r7, {last};"
            ));
        } else {
            prelude.push_str(&format!("mov.u32 \t%r9, 4;\n\tmov.u32 \t%r7, {last};"));
        }
        let text = framed(16, &prelude, "", "lt.u32");
        total += 1;
        let Ok(_) = ptx::canonicalize_with(&text, "framed", None, Families::ALL) else {
            continue;
        };
        accepted += 1;
        let got = run_framed(&text, &xs);
        for (x, g) in xs.iter().zip(&got) {
            let mut v = vec![*x];
            for (_, f) in &steps {
                let y = f(&v);
                v.push(y);
            }
            let index = v[n];
            let written = if bounded { index.min(4) } else { 4 };
            assert!(
                index < 4,
                "accepted with index {index} at x = {x:#x}:\n\t{prelude}"
            );
            let want = if index < written {
                x.wrapping_add(index)
            } else {
                0
            };
            assert_eq!(*g, want, "x = {x:#x}:\n\t{prelude}");
        }
    }
    eprintln!("{accepted} of {total} random index chains accepted, each checked");
}

/// FINDING (liveness cost): the two backward analyses w30a added to the
/// frame proof (which registers a compare may read; which are read again,
/// dropped at labels) iterated over the whole body until nothing changed,
/// with no bound: a chain of back edges takes one round each, so 1 000 of
/// them (3 000 statements, well inside the module limits) took 30 s of the
/// verifier's time and 2 000 over 3 minutes (debug build), before the
/// proof's own cost bound could apply. Now a worklist visits a statement
/// again only when a successor changed, and the words visited are bounded
/// (`MAX_LIVENESS_COST`): refused `too_complex` at once.
#[test]
fn a_chain_of_back_edges_is_refused_within_the_liveness_bound() {
    let k = 1000;
    let mut chain = String::from(
        "mov.u32 \t%q0, %r4;\n\tsetp.eq.u32 \t%p5, %r4, 7;\n$L__C0:\n\tadd.u32 \t%q0, %q0, %r4;\n\t",
    );
    for i in 1..k {
        chain.push_str(&format!(
            "$L__C{i}:\n\tadd.u32 \t%q{i}, %q{}, 1;\n\t@%p5 bra \t$L__C{};\n\t",
            i - 1,
            i - 1
        ));
    }
    chain.push_str(&format!(
        "and.b32 \t%r9, %q{}, 3;\n\tmov.u32 \t%r7, 0;",
        k - 1
    ));
    let text = framed(16, &chain, "", "lt.u32").replace(
        ".reg .b32 \t%r<40>;",
        &format!(".reg .b32 \t%r<40>;\n\t.reg .b32 \t%q<{k}>;"),
    );
    let t = std::time::Instant::now();
    let (reason, explanation) = refusal(&text, "framed");
    eprintln!("{k} back edges: {reason} in {:?}", t.elapsed());
    assert_eq!(reason, "too_complex", "{explanation}");
    assert!(
        explanation
            .contains("liveness for the local frame's proof costs more than 3000000 words visited"),
        "{explanation}"
    );
}

/// FINDING (lead's review, class: a frame address moved across its
/// windows by arithmetic): the windows were only told apart at `cvta`, so
/// adding 2^40 to the local-window address (or taking it from the generic
/// one) made an address the proof read as the other window's frame byte;
/// on the GPU it reaches other memory. Any arithmetic that moves a frame
/// address out of its window is refused.
#[test]
fn a_frame_address_moved_across_its_windows_by_arithmetic_is_refused() {
    for (what, edit) in [
        (
            "the local-window address plus 2^40, loaded as generic",
            "ld.u64 \t%rd19, [%SP+8];\n\tadd.u64 \t%rd26, %SPL, 1099511627776;\n\tld.u32 \t%r3, [%rd26];",
        ),
        (
            "the generic address less 2^40, loaded as .local",
            "ld.u64 \t%rd19, [%SP+8];\n\tsub.u64 \t%rd26, %SP, 1099511627776;\n\tld.local.u32 \t%r3, [%rd26];",
        ),
    ] {
        let text = vec2_with(&[("ld.u64 \t%rd19, [%SP+8];", edit)]);
        let (reason, explanation) = refusal(&text, "add_f16_vec2");
        assert_eq!(reason, "local_memory", "{what}: {explanation}");
        assert!(
            explanation.contains("out of its window"),
            "{what}: {explanation}"
        );
    }
}

/// FINDING (lead's review, class: a split narrowing a guarded
/// instruction's source): a path split per value of a predicated `shr`'s
/// result narrowed the shift's source as if the `shr` had run on every
/// path; where the guard was false the source keeps its whole range. Here
/// the frame index is the source less the split value's `<< 6` (0..=63
/// where the shift ran, up to 255 where it did not) and the frame holds 64
/// words: the read past it must be refused.
#[test]
fn a_guarded_shift_does_not_narrow_its_source_on_a_split_path() {
    let prelude = "and.b32 \t%r10, %r4, 255;\n\tmov.u32 \t%r9, 0;\n\tsetp.eq.u32 \t%p4, %r4, 7;\n\t@%p4 shr.u32 \t%r9, %r10, 6;\n\tshl.b32 \t%r11, %r9, 6;\n\tsub.s32 \t%r7, %r10, %r11;";
    let (reason, explanation) = refusal(&framed(256, prelude, "", "lt.u32"), "framed");
    assert_eq!(reason, "local_memory", "{explanation}");
}
