//! Review attacks (w31r) on what w30a added to the frame and call domain:
//! carry chains lowered to plain instructions, `.b8` struct returns as one
//! register per field, per-value splits in the frame proof, frame slots
//! that hold frame addresses, zero-padded initializers and scopes renamed
//! apart. Each hole found has a test asserting its exact refusal; each
//! class that held is asserted too; every accepted kernel runs on the host
//! engine against a reference (or the canary-padded mutant oracle).
#![allow(clippy::unwrap_used, clippy::panic)]

use crate::support::mutants::oracle;
use ptxd::ptx::{self, Families, HostKernel, HostLaunch, HostSpan, PtxError};
use rand::{Rng, SeedableRng};

/// A fresh seed, printed so a failure can be replayed.
fn rng(what: &str) -> rand::rngs::StdRng {
    let seed: u64 = rand::random();
    eprintln!("{what}: seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// The refusal's (sub_reason, explanation).
fn refusal(text: &str, entry: &str) -> (&'static str, String) {
    match ptx::canonicalize_with(text, entry, None, Families::ALL) {
        Err(PtxError::NonScalarAbi {
            sub_reason,
            explanation,
            ..
        }) => (sub_reason, explanation),
        other => panic!("expected a refusal, got {other:?}\n{text}"),
    }
}

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
            let mut variants: Vec<(String, String, String, Option<&str>, Pick)> = vec![(
                ra.into(),
                rb.into(),
                rc.into(),
                None,
                Box::new(move |x, y| operands(x, y)),
            )];
            for alias in [ra, rb, rc] {
                if *op != "mad" && alias == rc {
                    continue;
                }
                variants.push((
                    if alias == ra { rd.into() } else { ra.into() },
                    if alias == rb { rd.into() } else { rb.into() },
                    if alias == rc { rd.into() } else { rc.into() },
                    Some(alias),
                    Box::new(move |x, y| operands(x, y)),
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
                    let canonical = match ptx::canonicalize_with(&text, "carried", None, Families::ALL) {
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
