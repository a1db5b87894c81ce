//! Instruction-family tests: hand-written nvcc-style scalar kernels run by
//! the engine on random (and special) inputs with poisoned outputs, every
//! element compared with an independent Rust reference.
// The references mirror PTX semantics case by case (NaN-aware negated
// comparisons, explicit divide-by-zero results), indexed by lane.
#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::needless_range_loop,
    clippy::neg_cmp_op_on_partial_ord,
    clippy::manual_checked_ops,
    unused_parens
)]

use rand::{Rng, SeedableRng};

use crate::ptx::{HostKernel, HostLaunch, HostSpan};

/// A two-input elementwise kernel: `%a`, `%b` loaded as `tin`, `%d` stored
/// as `tout`; `body` computes `%d`.
fn kernel(tin: &str, rin: &str, tout: &str, rout: &str, body: &str) -> String {
    let log = |t: &str| match &t[1..] {
        "8" => 0,
        "16" => 1,
        "32" => 2,
        _ => 3,
    };
    let (li, lo) = (log(tin), log(tout));
    format!(
        r#".version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1, .param .u64 k_param_2, .param .u64 k_param_3)
{{
	.reg .pred 	%p<2>;
	.reg .pred 	%q<4>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<16>;
	.reg .f32 	%t<8>;
	.reg .b32 	%u<8>;
	.reg .b64 	%v<8>;
	.reg .b16 	%w<8>;
	.reg .f64 	%e<8>;
	.reg .{rin} 	%a, %b;
	.reg .{rout} 	%d;
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	ld.param.u64 	%rd3, [k_param_2];
	ld.param.u64 	%rd4, [k_param_3];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mul.wide.u32 	%rd5, %r1, %r2;
	mov.u32 	%r3, %tid.x;
	cvt.u64.u32 	%rd6, %r3;
	add.s64 	%rd7, %rd5, %rd6;
	setp.ge.s64 	%p1, %rd7, %rd4;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd8, %rd1;
	shl.b64 	%rd9, %rd7, {li};
	add.s64 	%rd10, %rd8, %rd9;
	cvta.to.global.u64 	%rd11, %rd2;
	add.s64 	%rd12, %rd11, %rd9;
	ld.global.{tin} 	%a, [%rd10];
	ld.global.{tin} 	%b, [%rd12];
{body}
	cvta.to.global.u64 	%rd13, %rd3;
	shl.b64 	%rd14, %rd7, {lo};
	add.s64 	%rd15, %rd13, %rd14;
	st.global.{tout} 	[%rd15], %d;
$L__BB0_2:
	ret;
}}
"#
    )
}

/// Runs `src` on inputs `a`, `b` (raw little-endian elements of `win`
/// bytes); returns the outputs (`wout` bytes each).
fn run(src: &str, a: &[u64], b: &[u64], win: usize, wout: usize, threads: usize) -> Vec<u64> {
    let k = HostKernel::compile(src, "k").unwrap_or_else(|e| panic!("{e}\n{src}"));
    let n = a.len();
    let pack = |v: &[u64]| -> Vec<u8> {
        v.iter()
            .flat_map(|x| x.to_le_bytes()[..win].to_vec())
            .collect()
    };
    let (mut ia, mut ib) = (pack(a), pack(b));
    let mut out = vec![0xA5u8; n * wout];
    let inputs = [
        HostSpan {
            ptr: ia.as_mut_ptr(),
            len: ia.len(),
        },
        HostSpan {
            ptr: ib.as_mut_ptr(),
            len: ib.len(),
        },
    ];
    let launch = HostLaunch {
        inputs: &inputs,
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
        n: n as u64,
        params: &[],
        threads,
        checked: true,
        control: None,
    };
    // SAFETY: the spans are live Vecs of exactly `len` bytes.
    unsafe { k.launch(&launch) }.unwrap();
    out.chunks(wout)
        .map(|c| {
            let mut x = [0u8; 8];
            x[..wout].copy_from_slice(c);
            u64::from_le_bytes(x)
        })
        .collect()
}

fn next_up(x: f32) -> f32 {
    if x == 0.0 {
        f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() + 1)
    } else {
        f32::from_bits(x.to_bits() - 1)
    }
}

fn next_down(x: f32) -> f32 {
    -next_up(-x)
}

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(0x5eed)
}

const N: usize = 3000;

/// Random f32 bits with specials mixed in.
fn f32s(r: &mut impl Rng, n: usize) -> Vec<u64> {
    let specials = [
        0u32,
        0x8000_0000,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        1,
        0x8000_0001,
        0x3F80_0000,
        0x7F7F_FFFF,
        0x0080_0000,
    ];
    (0..n)
        .map(|i| {
            let v = match i % 4 {
                0 => specials[r.random_range(0..specials.len())],
                1 => r.random::<u32>(),
                _ => (r.random_range(-1000.0f32..1000.0)).to_bits(),
            };
            u64::from(v)
        })
        .collect()
}

fn f32_eq(got: u64, want: f32) -> bool {
    let g = f32::from_bits(got as u32);
    (g.is_nan() && want.is_nan()) || g.to_bits() == want.to_bits()
}

fn check_f32(body: &str, f: impl Fn(f32, f32) -> f32) {
    let mut r = rng();
    let (a, b) = (f32s(&mut r, N), f32s(&mut r, N));
    let out = run(&kernel("f32", "f32", "f32", "f32", body), &a, &b, 4, 4, 2);
    for i in 0..N {
        let (x, y) = (f32::from_bits(a[i] as u32), f32::from_bits(b[i] as u32));
        let want = f(x, y);
        assert!(
            f32_eq(out[i], want),
            "{body}: {x:e} {y:e} -> {:e} want {want:e}",
            f32::from_bits(out[i] as u32)
        );
    }
}

#[test]
fn f32_rn_arithmetic_is_exact() {
    check_f32("\tadd.f32 \t%d, %a, %b;", |x, y| x + y);
    check_f32("\tsub.rn.f32 \t%d, %a, %b;", |x, y| x - y);
    check_f32("\tmul.rn.f32 \t%d, %a, %b;", |x, y| x * y);
    check_f32("\tdiv.rn.f32 \t%d, %a, %b;", |x, y| x / y);
    check_f32("\tfma.rn.f32 \t%d, %a, %b, %a;", |x, y| x.mul_add(y, x));
    check_f32("\tneg.f32 \t%d, %a;", |x, _| -x);
    check_f32("\tabs.f32 \t%d, %a;", |x, _| x.abs());
    check_f32("\tsqrt.rn.f32 \t%d, %a;", |x, _| x.sqrt());
    check_f32("\trcp.rn.f32 \t%d, %a;", |x, _| 1.0 / x);
    check_f32("\tmin.f32 \t%d, %a, %b;", |x, y| {
        if x.is_nan() {
            y
        } else if y.is_nan() {
            x
        } else if x == y {
            if x.is_sign_negative() {
                x
            } else {
                y
            }
        } else {
            x.min(y)
        }
    });
    check_f32("\tmax.f32 \t%d, %a, %b;", |x, y| {
        if x.is_nan() {
            y
        } else if y.is_nan() {
            x
        } else if x == y {
            if x.is_sign_negative() {
                y
            } else {
                x
            }
        } else {
            x.max(y)
        }
    });
    check_f32("\tcopysign.f32 \t%d, %a, %b;", |x, y| {
        if y.is_nan() {
            y
        } else {
            y.copysign(x)
        }
    });
    check_f32("\tadd.sat.f32 \t%d, %a, %b;", |x, y| {
        let s = x + y;
        if s.is_nan() || s <= 0.0 {
            0.0
        } else {
            s.min(1.0)
        }
    });
    check_f32("\tmul.ftz.f32 \t%d, %a, %b;", |x, y| {
        let fl = |v: f32| {
            if v.is_subnormal() {
                0.0f32.copysign(v)
            } else {
                v
            }
        };
        fl(fl(x) * fl(y))
    });
    check_f32(
        "\tmov.f32 \t%t1, 0f3F800000;\n\tadd.f32 \t%d, %a, %t1;",
        |x, _| x + 1.0,
    );
}

/// Directed rounding: the reference picks between the RNE result and its
/// neighbour using an exact f64 residual (inputs kept to magnitudes where
/// the f64 sum is exact).
#[test]
fn f32_directed_rounding() {
    let mut r = rng();
    let a: Vec<u64> = (0..N)
        .map(|_| u64::from(r.random_range(-1e4f32..1e4).to_bits()))
        .collect();
    let b: Vec<u64> = (0..N)
        .map(|_| u64::from(r.random_range(-1e4f32..1e4).to_bits()))
        .collect();
    // exact value as f64 (exact for these ops/magnitudes) or None for div.
    let directed = |exact_cmp: &dyn Fn(f32) -> std::cmp::Ordering, rne: f32, mode: &str| -> f32 {
        use std::cmp::Ordering::*;
        // exact_cmp(v) = sign of (v - exact).
        match mode {
            "rz" => {
                if rne > 0.0 && exact_cmp(rne) == Greater {
                    next_down(rne)
                } else if rne < 0.0 && exact_cmp(rne) == Less {
                    next_up(rne)
                } else {
                    rne
                }
            }
            "rm" => {
                if exact_cmp(rne) == Greater {
                    next_down(rne)
                } else {
                    rne
                }
            }
            _ => {
                if exact_cmp(rne) == Less {
                    next_up(rne)
                } else {
                    rne
                }
            }
        }
    };
    for mode in ["rz", "rm", "rp"] {
        for (op, body) in [
            ("add", format!("\tadd.{mode}.f32 \t%d, %a, %b;")),
            ("mul", format!("\tmul.{mode}.f32 \t%d, %a, %b;")),
            ("div", format!("\tdiv.{mode}.f32 \t%d, %a, %b;")),
            ("fma", format!("\tfma.{mode}.f32 \t%d, %a, %b, %a;")),
        ] {
            let out = run(&kernel("f32", "f32", "f32", "f32", &body), &a, &b, 4, 4, 1);
            for i in 0..N {
                let (x, y) = (f32::from_bits(a[i] as u32), f32::from_bits(b[i] as u32));
                let (xd, yd) = (f64::from(x), f64::from(y));
                let want = match op {
                    "add" => directed(
                        &|v| f64::from(v).partial_cmp(&(xd + yd)).unwrap(),
                        x + y,
                        mode,
                    ),
                    "mul" => directed(
                        &|v| f64::from(v).partial_cmp(&(xd * yd)).unwrap(),
                        x * y,
                        mode,
                    ),
                    // v vs x/y ⇔ v*y vs x (sign of y flips); v*y is exact in f64.
                    "div" => directed(
                        &|v| {
                            let c = (f64::from(v) * yd).partial_cmp(&xd).unwrap();
                            if y < 0.0 {
                                c.reverse()
                            } else {
                                c
                            }
                        },
                        x / y,
                        mode,
                    ),
                    _ => directed(
                        &|v| f64::from(v).partial_cmp(&(xd * yd + xd)).unwrap(),
                        x.mul_add(y, x),
                        mode,
                    ),
                };
                assert!(
                    f32_eq(out[i], want),
                    "{body}: {x:e} {y:e} -> {:e} want {want:e}",
                    f32::from_bits(out[i] as u32)
                );
            }
        }
    }
}

#[test]
fn f64_arithmetic() {
    let mut r = rng();
    let a: Vec<u64> = (0..N)
        .map(|i| {
            if i % 3 == 0 {
                r.random()
            } else {
                r.random_range(-1e6f64..1e6).to_bits()
            }
        })
        .collect();
    let b: Vec<u64> = (0..N)
        .map(|_| r.random_range(-1e6f64..1e6).to_bits())
        .collect();
    for (body, f) in [
        (
            "\tadd.f64 \t%d, %a, %b;",
            (|x: f64, y: f64| x + y) as fn(f64, f64) -> f64,
        ),
        ("\tmul.rn.f64 \t%d, %a, %b;", |x, y| x * y),
        ("\tdiv.rn.f64 \t%d, %a, %b;", |x, y| x / y),
        ("\tfma.rn.f64 \t%d, %a, %b, %b;", |x, y| x.mul_add(y, y)),
        ("\tsqrt.rn.f64 \t%d, %a;", |x, _| x.sqrt()),
    ] {
        let out = run(&kernel("f64", "f64", "f64", "f64", body), &a, &b, 8, 8, 1);
        for i in 0..N {
            let want = f(f64::from_bits(a[i]), f64::from_bits(b[i]));
            let got = f64::from_bits(out[i]);
            assert!(
                (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits(),
                "{body} {i}"
            );
        }
    }
}

#[test]
fn f64_nan_payloads_propagate_as_on_the_gpu() {
    // The H200 and x86 keep the first NaN operand's payload, quieted; a NaN
    // made from numbers is the canonical 0x7fffffffffffffff.
    let payload = 0x7ff8_0000_0000_0001u64;
    let signalling = 0x7ff0_0000_0000_0002u64;
    let a = vec![
        payload,
        signalling,
        f64::INFINITY.to_bits(),
        1.0f64.to_bits(),
        payload,
    ];
    let b = vec![
        1.0f64.to_bits(),
        1.0f64.to_bits(),
        f64::INFINITY.to_bits(),
        signalling,
        0x7ff8_0000_0000_0003,
    ];
    let out = run(
        &kernel("f64", "f64", "f64", "f64", "	sub.f64 	%d, %a, %b;"),
        &a,
        &b,
        8,
        8,
        1,
    );
    assert_eq!(
        out[..5],
        [
            payload,
            signalling | (1 << 51),
            0x7fff_ffff_ffff_ffff,
            signalling | (1 << 51),
            payload
        ]
    );
}

/// Nearest f16 by search over all f16 values (an implementation independent
/// of the engine's rounding), ties to even.
fn f16_nearest(x: f64) -> u16 {
    fn val(b: u16) -> f64 {
        let e = i32::from((b >> 10) & 0x1F);
        let m = f64::from(b & 0x3FF);
        let v = if e == 0 {
            m * 2f64.powi(-24)
        } else {
            (1.0 + m / 1024.0) * 2f64.powi(e - 15)
        };
        if b & 0x8000 != 0 {
            -v
        } else {
            v
        }
    }
    if x.is_nan() {
        return 0x7FFF;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let ax = x.abs();
    if ax >= 65520.0 {
        return sign | 0x7C00;
    }
    let (mut lo, mut hi) = (0u16, 0x7BFF);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if val(mid) <= ax {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    let below = lo;
    let above = if val(below) == ax { below } else { below + 1 };
    let pick = if above > 0x7BFF {
        below
    } else {
        let (db, da) = (ax - val(below), val(above) - ax);
        if db < da || (db == da && below & 1 == 0) {
            below
        } else {
            above
        }
    };
    sign | pick
}

fn f16_value(b: u16) -> f32 {
    let e = i32::from((b >> 10) & 0x1F);
    let m = f32::from(b & 0x3FF);
    let v = if e == 0x1F {
        if m == 0.0 {
            f32::INFINITY
        } else {
            f32::NAN
        }
    } else if e == 0 {
        m * 2f32.powi(-24)
    } else {
        (1.0 + m / 1024.0) * 2f32.powi(e - 15)
    };
    if b & 0x8000 != 0 {
        -v
    } else {
        v
    }
}

#[test]
fn f16_and_bf16_conversions() {
    let mut r = rng();
    let a = f32s(&mut r, N);
    let small: Vec<u64> = (0..N)
        .map(|_| u64::from(r.random_range(-70000.0f32..70000.0).to_bits()))
        .collect();
    for inputs in [&a, &small] {
        let out = run(
            &kernel("f32", "f32", "b16", "b16", "\tcvt.rn.f16.f32 \t%d, %a;"),
            inputs,
            inputs,
            4,
            2,
            1,
        );
        for i in 0..N {
            let x = f32::from_bits(inputs[i] as u32);
            let want = f16_nearest(f64::from(x));
            if x.is_nan() {
                assert_eq!(out[i] & 0x7C00, 0x7C00);
                continue;
            }
            assert_eq!(out[i] as u16, want, "cvt.rn.f16.f32 {x:e}");
        }
        let out = run(
            &kernel("f32", "f32", "b16", "b16", "\tcvt.rn.bf16.f32 \t%d, %a;"),
            inputs,
            inputs,
            4,
            2,
            1,
        );
        for i in 0..N {
            let x = inputs[i] as u32;
            if f32::from_bits(x).is_nan() {
                continue;
            }
            let want = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) as u16;
            assert_eq!(
                out[i] as u16,
                want,
                "cvt.rn.bf16.f32 {:e}",
                f32::from_bits(x)
            );
        }
    }
    let h: Vec<u64> = (0..0x10000u64).collect();
    let out = run(
        &kernel("b16", "b16", "f32", "f32", "\tcvt.f32.f16 \t%d, %a;"),
        &h,
        &h,
        2,
        4,
        2,
    );
    for i in 0..h.len() {
        let want = f16_value(i as u16);
        assert!(f32_eq(out[i], want), "cvt.f32.f16 {i:#x}");
    }
    let out = run(
        &kernel("b16", "b16", "f32", "f32", "\tcvt.f32.bf16 \t%d, %a;"),
        &h,
        &h,
        2,
        4,
        2,
    );
    for i in 0..h.len() {
        assert!(
            f32_eq(out[i], f32::from_bits((i as u32) << 16)),
            "cvt.f32.bf16 {i:#x}"
        );
    }
    // f16 arithmetic: exact in f64, then nearest f16.
    let hb: Vec<u64> = (0..N)
        .map(|_| u64::from(f16_nearest(r.random_range(-300.0..300.0))))
        .collect();
    let hc: Vec<u64> = (0..N)
        .map(|_| u64::from(f16_nearest(r.random_range(-300.0..300.0))))
        .collect();
    for (body, f) in [
        (
            "\tadd.f16 \t%d, %a, %b;",
            (|x: f64, y: f64| x + y) as fn(f64, f64) -> f64,
        ),
        ("\tmul.rn.f16 \t%d, %a, %b;", |x, y| x * y),
        ("\tfma.rn.f16 \t%d, %a, %b, %a;", |x, y| x * y + x),
    ] {
        let out = run(&kernel("b16", "b16", "b16", "b16", body), &hb, &hc, 2, 2, 1);
        for i in 0..N {
            let (x, y) = (
                f64::from(f16_value(hb[i] as u16)),
                f64::from(f16_value(hc[i] as u16)),
            );
            assert_eq!(out[i] as u16, f16_nearest(f(x, y)), "{body} {x} {y}");
        }
    }
}

fn sat_i32(v: f32) -> i64 {
    if v.is_nan() {
        0
    } else {
        (v as f64).clamp(i32::MIN as f64, i32::MAX as f64) as i64
    }
}

#[test]
fn float_int_conversions() {
    let mut r = rng();
    let a = f32s(&mut r, N);
    for (body, f) in [
        (
            "\tcvt.rni.s32.f32 \t%d, %a;",
            (|x: f32| sat_i32(x.round_ties_even()) as u32 as u64) as fn(f32) -> u64,
        ),
        ("\tcvt.rzi.s32.f32 \t%d, %a;", |x| {
            sat_i32(x.trunc()) as u32 as u64
        }),
        ("\tcvt.rmi.s32.f32 \t%d, %a;", |x| {
            sat_i32(x.floor()) as u32 as u64
        }),
        ("\tcvt.rpi.s32.f32 \t%d, %a;", |x| {
            sat_i32(x.ceil()) as u32 as u64
        }),
        ("\tcvt.rzi.u32.f32 \t%d, %a;", |x| x as u32 as u64),
    ] {
        let out = run(&kernel("f32", "f32", "b32", "b32", body), &a, &a, 4, 4, 1);
        for i in 0..N {
            let x = f32::from_bits(a[i] as u32);
            assert_eq!(out[i], f(x), "{body} {x:e}");
        }
    }
    let ints: Vec<u64> = (0..N)
        .map(|i| {
            if i % 2 == 0 {
                r.random::<u64>()
            } else {
                r.random_range(0..1u64 << 30)
            }
        })
        .collect();
    for (body, tin, win, f) in [
        (
            "\tcvt.rn.f32.s32 \t%d, %a;",
            "b32",
            4,
            (|x: u64| (x as u32 as i32 as f32).to_bits() as u64) as fn(u64) -> u64,
        ),
        ("\tcvt.rn.f32.u64 \t%d, %a;", "b64", 8, |x| {
            (x as f32).to_bits() as u64
        }),
        ("\tcvt.rn.f32.s64 \t%d, %a;", "b64", 8, |x| {
            (x as i64 as f32).to_bits() as u64
        }),
        ("\tcvt.u32.u64 \t%d, %a;", "b64", 8, |x| x as u32 as u64),
        ("\tcvt.sat.s32.s64 \t%d, %a;", "b64", 8, |x| {
            (x as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32 as u64
        }),
        (
            "\tcvt.sat.u8.s32 \t%u1, %a;\n\tcvt.u32.u8 \t%d, %u1;",
            "b32",
            4,
            |x| (x as u32 as i32).clamp(0, 255) as u64,
        ),
        ("\tcvt.s32.s16 \t%d, %a;", "b32", 4, |x| {
            x as u16 as i16 as i32 as u32 as u64
        }),
    ] {
        let k = kernel(tin, tin, "b32", "b32", body);
        let out = run(&k, &ints, &ints, win, 4, 1);
        for i in 0..N {
            assert_eq!(
                out[i],
                f(ints[i] & if win == 4 { 0xFFFF_FFFF } else { u64::MAX }),
                "{body} {:#x}",
                ints[i]
            );
        }
    }
    // Directed int → float: rz truncates the magnitude.
    let out = run(
        &kernel("b64", "b64", "b32", "b32", "\tcvt.rz.f32.s64 \t%d, %a;"),
        &ints,
        &ints,
        8,
        4,
        1,
    );
    for i in 0..N {
        let v = ints[i] as i64;
        let rn = v as f32;
        let want = if (rn as f64).abs() > (v as f64).abs() || (rn as i128).abs() > (v as i128).abs()
        {
            if v > 0 {
                next_down(rn)
            } else {
                next_up(rn)
            }
        } else {
            rn
        };
        assert_eq!(out[i] as u32, want.to_bits(), "cvt.rz.f32.s64 {v}");
    }
}

#[test]
fn integer_arithmetic() {
    let mut r = rng();
    let mut a: Vec<u64> = (0..N).map(|_| r.random()).collect();
    let b: Vec<u64> = (0..N)
        .map(|i| {
            if i % 5 == 0 {
                r.random_range(0..70)
            } else {
                r.random()
            }
        })
        .collect();
    a[0] = i32::MIN as u32 as u64;
    type F = fn(u64, u64) -> u64;
    let s32 = |x: u64| x as u32 as i32;
    let cases32: Vec<(&str, F)> = vec![
        ("add.s32", |x, y| (x as u32).wrapping_add(y as u32) as u64),
        ("sub.u32", |x, y| (x as u32).wrapping_sub(y as u32) as u64),
        ("mul.lo.s32", |x, y| {
            (x as u32).wrapping_mul(y as u32) as u64
        }),
        ("mul.hi.s32", |x, y| {
            (((x as u32 as i32 as i64) * (y as u32 as i32 as i64)) >> 32) as u32 as u64
        }),
        ("mul.hi.u32", |x, y| {
            (((x as u32 as u64) * (y as u32 as u64)) >> 32)
        }),
        ("div.s32", |x, y| {
            if y as u32 == 0 {
                0xFFFF_FFFF
            } else {
                (x as u32 as i32).wrapping_div(y as u32 as i32) as u32 as u64
            }
        }),
        ("div.u32", |x, y| {
            (x as u32)
                .checked_div(y as u32)
                .map_or(0xFFFF_FFFF, u64::from)
        }),
        ("rem.s32", |x, y| {
            if y as u32 == 0 {
                x as u32 as u64
            } else {
                (x as u32 as i32).wrapping_rem(y as u32 as i32) as u32 as u64
            }
        }),
        ("min.s32", |x, y| {
            (x as u32 as i32).min(y as u32 as i32) as u32 as u64
        }),
        ("max.u32", |x, y| (x as u32).max(y as u32) as u64),
        ("and.b32", |x, y| (x & y) as u32 as u64),
        ("or.b32", |x, y| (x | y) as u32 as u64),
        ("xor.b32", |x, y| (x ^ y) as u32 as u64),
        ("shl.b32", |x, y| {
            if y as u32 >= 32 {
                0
            } else {
                ((x as u32) << (y as u32)) as u64
            }
        }),
        ("shr.u32", |x, y| {
            if y as u32 >= 32 {
                0
            } else {
                ((x as u32) >> (y as u32)) as u64
            }
        }),
        ("shr.s32", |x, y| {
            ((x as u32 as i32) >> (y as u32).min(31)) as u32 as u64
        }),
        ("add.sat.s32", |x, y| {
            (x as u32 as i32).saturating_add(y as u32 as i32) as u32 as u64
        }),
    ];
    for (op, f) in &cases32 {
        let out = run(
            &kernel("b32", "b32", "b32", "b32", &format!("\t{op} \t%d, %a, %b;")),
            &a,
            &b,
            4,
            4,
            1,
        );
        for i in 0..N {
            assert_eq!(
                out[i],
                f(a[i] & 0xFFFF_FFFF, b[i] & 0xFFFF_FFFF),
                "{op} {:#x} {:#x}",
                a[i],
                b[i]
            );
        }
    }
    let _ = s32;
    for (op, f) in [
        (
            "neg.s32",
            (|x: u64| (x as u32).wrapping_neg() as u64) as fn(u64) -> u64,
        ),
        ("abs.s32", |x| {
            (x as u32 as i32).wrapping_abs() as u32 as u64
        }),
        ("not.b32", |x| !(x as u32) as u64),
        ("cnot.b32", |x| u64::from(x as u32 == 0)),
        ("popc.b32", |x| u64::from((x as u32).count_ones())),
        ("clz.b32", |x| u64::from((x as u32).leading_zeros())),
        ("brev.b32", |x| (x as u32).reverse_bits() as u64),
    ] {
        let out = run(
            &kernel("b32", "b32", "b32", "b32", &format!("\t{op} \t%d, %a;")),
            &a,
            &b,
            4,
            4,
            1,
        );
        for i in 0..N {
            assert_eq!(out[i], f(a[i] & 0xFFFF_FFFF), "{op} {:#x}", a[i]);
        }
    }
    let cases64: Vec<(&str, F)> = vec![
        ("add.s64", |x, y| x.wrapping_add(y)),
        ("mul.lo.u64", |x, y| x.wrapping_mul(y)),
        ("mul.hi.u64", |x, y| ((x as u128 * y as u128) >> 64) as u64),
        ("mul.hi.s64", |x, y| {
            ((x as i64 as i128 * y as i64 as i128) >> 64) as u64
        }),
        ("div.s64", |x, y| {
            if y == 0 {
                u64::MAX
            } else {
                (x as i64).wrapping_div(y as i64) as u64
            }
        }),
        ("rem.u64", |x, y| if y == 0 { x } else { x % y }),
        ("min.s64", |x, y| (x as i64).min(y as i64) as u64),
        ("shr.s64", |x, y| ((x as i64) >> (y as u32).min(63)) as u64),
        ("mad.lo.s64", |x, y| x.wrapping_mul(y).wrapping_add(x)),
    ];
    for (op, f) in &cases64 {
        let body = if op.starts_with("mad") {
            format!("\t{op} \t%d, %a, %b, %a;")
        } else if op.starts_with("sh") {
            // A shift amount is `.u32` (PTX's type rule; ptxas refuses a
            // 64-bit register there): the amount is `%b`'s low 32 bits.
            format!("\t{{\n\t.reg .b32 \t%s;\n\tcvt.u32.u64 \t%s, %b;\n\t{op} \t%d, %a, %s;\n\t}}")
        } else {
            format!("\t{op} \t%d, %a, %b;")
        };
        let out = run(&kernel("b64", "b64", "b64", "b64", &body), &a, &b, 8, 8, 1);
        for i in 0..N {
            assert_eq!(out[i], f(a[i], b[i]), "{op} {:#x} {:#x}", a[i], b[i]);
        }
    }
    for (op, f) in [
        (
            "mul.wide.s32",
            (|x: u64, y: u64| (x as u32 as i32 as i64 * y as u32 as i32 as i64) as u64) as F,
        ),
        ("mul.wide.u32", |x, y| (x as u32 as u64) * (y as u32 as u64)),
    ] {
        let out = run(
            &kernel("b32", "b32", "b64", "b64", &format!("\t{op} \t%d, %a, %b;")),
            &a,
            &b,
            4,
            8,
            1,
        );
        for i in 0..N {
            assert_eq!(out[i], f(a[i], b[i]), "{op}");
        }
    }
}

#[test]
fn setp_and_selp() {
    let mut r = rng();
    let a = f32s(&mut r, N);
    let mut b = f32s(&mut r, N);
    for i in (0..N).step_by(7) {
        b[i] = a[i];
    }
    type C = fn(f32, f32) -> bool;
    let cases: Vec<(&str, C)> = vec![
        ("eq", |x, y| x == y),
        ("ne", |x, y| !x.is_nan() && !y.is_nan() && x != y),
        ("lt", |x, y| x < y),
        ("le", |x, y| x <= y),
        ("gt", |x, y| x > y),
        ("ge", |x, y| x >= y),
        ("equ", |x, y| x.is_nan() || y.is_nan() || x == y),
        ("neu", |x, y| x.is_nan() || y.is_nan() || x != y),
        ("ltu", |x, y| x.is_nan() || y.is_nan() || x < y),
        ("leu", |x, y| x.is_nan() || y.is_nan() || x <= y),
        ("gtu", |x, y| x.is_nan() || y.is_nan() || x > y),
        ("geu", |x, y| x.is_nan() || y.is_nan() || x >= y),
        ("num", |x, y| !x.is_nan() && !y.is_nan()),
        ("nan", |x, y| x.is_nan() || y.is_nan()),
    ];
    for (cmp, f) in &cases {
        let body = format!("\tsetp.{cmp}.f32 \t%q1, %a, %b;\n\tselp.u32 \t%d, 7, 3, %q1;");
        let out = run(&kernel("f32", "f32", "b32", "b32", &body), &a, &b, 4, 4, 1);
        for i in 0..N {
            let (x, y) = (f32::from_bits(a[i] as u32), f32::from_bits(b[i] as u32));
            assert_eq!(
                out[i],
                if f(x, y) { 7 } else { 3 },
                "setp.{cmp} {x:e} {y:e}"
            );
        }
    }
    // .and/.or with a negated predicate, and the two-destination form.
    let body = "\tsetp.gt.f32 \t%q1, %a, 0f00000000;\n\tsetp.lt.and.f32 \t%q2|%q3, %a, %b, !%q1;\n\tselp.u32 \t%u1, 1, 0, %q2;\n\tselp.u32 \t%u2, 2, 0, %q3;\n\tor.b32 \t%d, %u1, %u2;";
    let out = run(&kernel("f32", "f32", "b32", "b32", body), &a, &b, 4, 4, 1);
    for i in 0..N {
        let (x, y) = (f32::from_bits(a[i] as u32), f32::from_bits(b[i] as u32));
        let c = !(x > 0.0);
        let want = u64::from(x < y && c) | (u64::from(!(x < y) && c) << 1);
        assert_eq!(out[i], want, "{x:e} {y:e}");
    }
    // Integer comparisons, signed vs unsigned.
    let ia: Vec<u64> = (0..N).map(|_| r.random::<u32>() as u64).collect();
    let ib: Vec<u64> = (0..N).map(|_| r.random::<u32>() as u64).collect();
    for (cmp, f) in [
        (
            "lt.s32",
            (|x: u64, y: u64| (x as u32 as i32) < (y as u32 as i32)) as fn(u64, u64) -> bool,
        ),
        ("lo.u32", |x, y| x < y),
        ("hs.u32", |x, y| x >= y),
        ("ne.b32", |x, y| x != y),
    ] {
        let body = format!("\tsetp.{cmp} \t%q1, %a, %b;\n\tselp.b32 \t%d, %a, %b, %q1;");
        let out = run(
            &kernel("b32", "b32", "b32", "b32", &body),
            &ia,
            &ib,
            4,
            4,
            1,
        );
        for i in 0..N {
            assert_eq!(
                out[i],
                if f(ia[i], ib[i]) { ia[i] } else { ib[i] },
                "setp.{cmp}"
            );
        }
    }
}

/// `.approx` forms are computed in f64 and rounded once; they must sit
/// within the PTX ISA's documented error of the true value.
#[test]
fn approx_transcendentals_within_tolerance() {
    let mut r = rng();
    let a: Vec<u64> = (0..N)
        .map(|_| u64::from(r.random_range(-20.0f32..20.0).to_bits()))
        .collect();
    let pos: Vec<u64> = (0..N)
        .map(|_| u64::from(r.random_range(1e-3f32..1e4).to_bits()))
        .collect();
    let rel = |got: f32, want: f64, tol: f64| {
        (f64::from(got) - want).abs() <= tol * want.abs().max(f64::MIN_POSITIVE)
    };
    for (body, inputs, f, tol, relative) in [
        (
            "\tex2.approx.f32 \t%d, %a;",
            &a,
            (|x: f64| x.exp2()) as fn(f64) -> f64,
            2f64.powi(-22),
            true,
        ),
        (
            "\tex2.approx.ftz.f32 \t%d, %a;",
            &a,
            |x| x.exp2(),
            2f64.powi(-22),
            true,
        ),
        (
            "\tlg2.approx.f32 \t%d, %a;",
            &pos,
            |x| x.log2(),
            2f64.powi(-22),
            false,
        ),
        (
            "\tsin.approx.f32 \t%d, %a;",
            &a,
            |x| x.sin(),
            2f64.powf(-20.9),
            false,
        ),
        (
            "\tcos.approx.ftz.f32 \t%d, %a;",
            &a,
            |x| x.cos(),
            2f64.powf(-20.9),
            false,
        ),
        (
            "\ttanh.approx.f32 \t%d, %a;",
            &a,
            |x| x.tanh(),
            2f64.powi(-11),
            true,
        ),
        (
            "\trsqrt.approx.f32 \t%d, %a;",
            &pos,
            |x| 1.0 / x.sqrt(),
            2f64.powi(-22),
            true,
        ),
        (
            "\tsqrt.approx.f32 \t%d, %a;",
            &pos,
            |x| x.sqrt(),
            2f64.powi(-22),
            true,
        ),
        (
            "\trcp.approx.f32 \t%d, %a;",
            &pos,
            |x| 1.0 / x,
            2f64.powi(-22),
            true,
        ),
        (
            "\tdiv.approx.f32 \t%d, %a, %b;",
            &pos,
            |_| 1.0,
            2f64.powi(-22),
            true,
        ),
    ] {
        let out = run(
            &kernel("f32", "f32", "f32", "f32", body),
            inputs,
            inputs,
            4,
            4,
            1,
        );
        for i in 0..N {
            let x = f64::from(f32::from_bits(inputs[i] as u32));
            let got = f32::from_bits(out[i] as u32);
            let want = f(x);
            let ok = if relative {
                rel(got, want, tol)
            } else {
                (f64::from(got) - want).abs() <= tol.max(want.abs() * 2f64.powi(-22))
            };
            assert!(ok, "{body} {x:e}: {got:e} vs {want:e}");
        }
    }
}

/// Divergent control flow: a data-dependent loop (backward branch) and an
/// if/else (forward branches) per element.
#[test]
fn divergent_loops_and_branches() {
    let body = "\tmov.u32 \t%u1, 0;\n\tmov.u32 \t%u2, %a;\n$L_loop:\n\tsetp.eq.s32 \t%q1, %u2, 0;\n\t@%q1 bra \t$L_done;\n\tand.b32 \t%u3, %u2, 1;\n\tsetp.eq.s32 \t%q2, %u3, 0;\n\t@%q2 bra \t$L_even;\n\tadd.s32 \t%u1, %u1, 3;\n\tbra.uni \t$L_next;\n$L_even:\n\tadd.s32 \t%u1, %u1, 1;\n$L_next:\n\tshr.u32 \t%u2, %u2, 1;\n\tbra.uni \t$L_loop;\n$L_done:\n\tmov.b32 \t%d, %u1;";
    let mut r = rng();
    let a: Vec<u64> = (0..N)
        .map(|_| u64::from(r.random::<u32>() >> r.random_range(0..32)))
        .collect();
    for threads in [1, 3] {
        let out = run(
            &kernel("b32", "b32", "b32", "b32", body),
            &a,
            &a,
            4,
            4,
            threads,
        );
        for i in 0..N {
            let mut v = a[i] as u32;
            let mut acc = 0u64;
            while v != 0 {
                acc += if v & 1 == 1 { 3 } else { 1 };
                v >>= 1;
            }
            assert_eq!(out[i], acc, "{:#x}", a[i]);
        }
    }
}

#[test]
fn unsupported_instructions_are_found_at_compile_time() {
    // (`sin.approx.f64` was here: PTX has no `.f64` `sin`, and the
    // verifier now refuses it first, `operand_type`.)
    for body in [
        "\tmov.u32 \t%u1, %laneid;\n\tmov.f32 \t%d, %a;",
        "\tfma.rz.f64 \t%d, %a, %b, %a;",
    ] {
        let src = kernel(
            if body.contains("f64") { "f64" } else { "f32" },
            if body.contains("f64") { "f64" } else { "f32" },
            if body.contains("f64") { "f64" } else { "f32" },
            if body.contains("f64") { "f64" } else { "f32" },
            body,
        );
        match HostKernel::compile(&src, "k") {
            Err(crate::ptx::PtxError::UnsupportedOnHost { line, .. }) => {
                assert!(line > 30, "{line}")
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

/// bf16 of an f32 by bits, ties to even (NaN excluded by the caller).
fn bf16_nearest(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Random 32-bit words whose halves are random f16/bf16 bits (NaNs,
/// infinities and subnormals among them).
fn halves(r: &mut impl Rng, n: usize) -> Vec<u64> {
    (0..n).map(|_| u64::from(r.random::<u32>())).collect()
}

/// `.f16x2`/`.bf16x2` arithmetic: each half computed on its own, correctly
/// rounded; a NaN half stays a NaN.
#[test]
fn packed_half_arithmetic_works_per_half() {
    let mut r = rng();
    let (a, b) = (halves(&mut r, N), halves(&mut r, N));
    type Half = (fn(u16) -> f32, fn(f32) -> u16, u16);
    let f16: Half = (f16_value, |x| f16_nearest(f64::from(x)), 0x7C00);
    let bf16: Half = (bf16_value, bf16_nearest, 0x7F80);
    for (body, (value, nearest, exp), f) in [
        (
            "\tadd.f16x2 \t%d, %a, %b;",
            f16,
            (|x, y| x + y) as fn(f32, f32) -> f32,
        ),
        ("\tsub.f16x2 \t%d, %a, %b;", f16, |x, y| x - y),
        ("\tmul.f16x2 \t%d, %a, %b;", f16, |x, y| x * y),
        ("\tadd.bf16x2 \t%d, %a, %b;", bf16, |x, y| x + y),
        ("\tmul.bf16x2 \t%d, %a, %b;", bf16, |x, y| x * y),
        ("\tneg.bf16x2 \t%d, %a;", bf16, |x, _| -x),
    ] {
        let out = run(&kernel("b32", "b32", "b32", "b32", body), &a, &b, 4, 4, 2);
        for i in 0..N {
            for h in [0, 16] {
                let (x, y) = (value((a[i] >> h) as u16), value((b[i] >> h) as u16));
                let got = (out[i] >> h) as u16;
                // One operation on two halves is exact in f32 (a sum of
                // two 11-bit significands or their 22-bit product), so
                // rounding the f32 result once is the correct rounding.
                let want = f(x, y);
                if want.is_nan() {
                    assert_eq!(got & exp, exp, "{body} {x:e} {y:e} -> {got:#x}");
                    assert_ne!(got & !(exp | 0x8000), 0, "{body} {x:e} {y:e} -> {got:#x}");
                } else {
                    assert_eq!(got, nearest(want), "{body} {x:e} {y:e} (half at bit {h})");
                }
            }
        }
    }
}

/// `cvt.rn.{f16x2,bf16x2}.f32 d, a, b`: `a` into the upper half, `b` into
/// the lower, each rounded to nearest even.
#[test]
fn packing_conversions_put_the_first_source_high() {
    let mut r = rng();
    let (a, b) = (f32s(&mut r, N), f32s(&mut r, N));
    for (body, nearest) in [
        (
            "\tcvt.rn.f16x2.f32 \t%d, %a, %b;",
            (|x: f32| f16_nearest(f64::from(x))) as fn(f32) -> u16,
        ),
        ("\tcvt.rn.bf16x2.f32 \t%d, %a, %b;", bf16_nearest),
    ] {
        let out = run(&kernel("f32", "f32", "b32", "b32", body), &a, &b, 4, 4, 1);
        for i in 0..N {
            let (x, y) = (f32::from_bits(a[i] as u32), f32::from_bits(b[i] as u32));
            for (got, v) in [((out[i] >> 16) as u16, x), (out[i] as u16, y)] {
                if v.is_nan() {
                    assert_eq!(got & 0x7FFF, 0x7FFF, "{body} NaN -> {got:#x}");
                } else {
                    assert_eq!(got, nearest(v), "{body} {x:e} {y:e} -> {:#x}", out[i]);
                }
            }
        }
    }
}

/// `bfe`: the field `a[pos .. pos + len]` (clipped to the word), the bits
/// above it the field's top bit for `.s32`, zero for `.u32`; pos and len
/// are the low bytes of b and c.
#[test]
fn bit_field_extract_follows_the_isa() {
    let mut r = rng();
    let a: Vec<u64> = (0..N).map(|_| u64::from(r.random::<u32>())).collect();
    // b's low byte is pos, its next byte len, both biased toward 0..40 (and
    // its high bytes random, which bfe ignores after the move below).
    let b: Vec<u64> = (0..N)
        .map(|i| {
            let (pos, len) = if i % 5 == 0 {
                (r.random::<u8>(), r.random::<u8>())
            } else {
                (r.random_range(0..40u8), r.random_range(0..40u8))
            };
            u64::from(u32::from(pos) | (u32::from(len) << 8) | (r.random::<u32>() & 0xFFFF_0000))
        })
        .collect();
    for signed in [true, false] {
        let t = if signed { "s32" } else { "u32" };
        let body = format!("\tshr.u32 \t%u1, %b, 8;\n\tbfe.{t} \t%d, %a, %b, %u1;");
        let out = run(&kernel("b32", "b32", "b32", "b32", &body), &a, &b, 4, 4, 1);
        for i in 0..N {
            let x = a[i] as u32;
            let (pos, len) = (b[i] as u32 & 0xFF, (b[i] as u32 >> 8) & 0xFF);
            let width = if pos >= 32 { 0 } else { len.min(32 - pos) };
            let field = if width == 0 {
                0
            } else {
                (x >> pos) & (u32::MAX >> (32 - width))
            };
            let sign = signed && len > 0 && (x >> (pos + len - 1).min(31)) & 1 == 1;
            let above = if width == 32 { 0 } else { u32::MAX << width };
            let want = if sign { field | above } else { field };
            assert_eq!(out[i] as u32, want, "bfe.{t} {x:#x} pos {pos} len {len}");
        }
    }
}

/// `bfi`: `b` with the low `len` bits of `a` put at `pos` (pos and len the
/// low bytes of their operands, bits past the word dropped), at 32 and 64
/// bits, against a bit-by-bit reference.
#[test]
fn bit_field_insert_follows_the_isa() {
    let mut r = rng();
    let a: Vec<u64> = (0..N).map(|_| r.random::<u64>()).collect();
    // b's high byte pair carries pos (byte 6) and len (byte 7), biased
    // toward 0..70, sometimes any byte.
    let b: Vec<u64> = (0..N)
        .map(|i| {
            let (pos, len) = if i % 5 == 0 {
                (r.random::<u8>(), r.random::<u8>())
            } else {
                (r.random_range(0..70u8), r.random_range(0..70u8))
            };
            (r.random::<u64>() & 0x0000_FFFF_FFFF_FFFF)
                | (u64::from(pos) << 48)
                | (u64::from(len) << 56)
        })
        .collect();
    for bits in [32u32, 64] {
        let body = if bits == 64 {
            "\tshr.u64 \t%v1, %b, 48;\n\tcvt.u32.u64 \t%u1, %v1;\n\tshr.u64 \t%v2, %b, 56;\n\tcvt.u32.u64 \t%u2, %v2;\n\tbfi.b64 \t%d, %a, %b, %u1, %u2;".to_string()
        } else {
            "\tshr.u64 \t%v1, %b, 48;\n\tcvt.u32.u64 \t%u1, %v1;\n\tshr.u64 \t%v2, %b, 56;\n\tcvt.u32.u64 \t%u2, %v2;\n\tcvt.u32.u64 \t%u3, %a;\n\tcvt.u32.u64 \t%u4, %b;\n\tbfi.b32 \t%u5, %u3, %u4, %u1, %u2;\n\tcvt.u64.u32 \t%d, %u5;".to_string()
        };
        let out = run(&kernel("b64", "b64", "b64", "b64", &body), &a, &b, 8, 8, 1);
        for i in 0..N {
            let (pos, len) = ((b[i] >> 48) & 0xFF, (b[i] >> 56) & 0xFF);
            let word = |v: u64| if bits == 32 { v & 0xFFFF_FFFF } else { v };
            let (x, y) = (word(a[i]), word(b[i]));
            let mut want = y;
            for k in 0..len {
                let at = pos + k;
                if at >= u64::from(bits) {
                    break;
                }
                want = (want & !(1 << at)) | (((x >> k) & 1) << at);
            }
            assert_eq!(
                out[i], want,
                "bfi.b{bits} a {x:#x} b {y:#x} pos {pos} len {len}"
            );
        }
    }
}

/// `shf`: the funnel shift of `b:a` by `c & 31` (`.wrap`) or `min(c, 32)`
/// (`.clamp`), left keeping the high word, right the low word.
#[test]
fn funnel_shift_follows_the_isa() {
    let mut r = rng();
    let a: Vec<u64> = (0..N).map(|_| r.random::<u64>()).collect();
    let b: Vec<u64> = (0..N)
        .map(|i| {
            let n = if i % 4 == 0 {
                r.random::<u8>()
            } else {
                r.random_range(0..40u8)
            };
            (r.random::<u64>() & 0xFFFF_FFFF) | (u64::from(n) << 32)
        })
        .collect();
    for (dir, mode) in [("l", "wrap"), ("l", "clamp"), ("r", "wrap"), ("r", "clamp")] {
        let body = format!(
            "\tcvt.u32.u64 \t%u1, %a;\n\tcvt.u32.u64 \t%u2, %b;\n\tshr.u64 \t%v1, %b, 32;\n\tcvt.u32.u64 \t%u3, %v1;\n\tshf.{dir}.{mode}.b32 \t%u4, %u1, %u2, %u3;\n\tcvt.u64.u32 \t%d, %u4;"
        );
        let out = run(&kernel("b64", "b64", "b64", "b64", &body), &a, &b, 8, 8, 1);
        for i in 0..N {
            let (lo, hi, c) = (a[i] & 0xFFFF_FFFF, b[i] & 0xFFFF_FFFF, b[i] >> 32);
            let n = if mode == "wrap" { c & 31 } else { c.min(32) };
            let t = (hi << 32) | lo;
            let want = if dir == "l" {
                ((u128::from(t) << n) >> 32) as u64 & 0xFFFF_FFFF
            } else {
                (t >> n) & 0xFFFF_FFFF
            };
            assert_eq!(out[i], want, "shf.{dir}.{mode} a {lo:#x} b {hi:#x} c {c}");
        }
    }
}

fn flush(v: f32) -> f32 {
    if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// The approximate ops the JIT corpus uses, against the bound the host
/// engine documents: `rcp.approx.ftz` and `div.full` are correctly rounded
/// on the host (the GPU's are within 1 and 2 ulp), `ex2.approx(.ftz)` is
/// within 1 ulp of the exact `2^x` (the GPU's within 2), and `.ftz` flushes
/// subnormal inputs and results to signed zero; `cvt.ftz.sat.f32.f32`
/// clamps to [0, 1] (NaN to 0).
#[test]
fn approximate_corpus_ops_meet_the_documented_bound() {
    check_f32("\trcp.approx.ftz.f32 \t%d, %a;", |x, _| {
        flush(1.0 / flush(x))
    });
    check_f32("\tdiv.full.f32 \t%d, %a, %b;", |x, y| x / y);
    check_f32("\tcvt.ftz.sat.f32.f32 \t%d, %a;", |x, _| {
        let x = flush(x);
        if x.is_nan() {
            0.0
        } else {
            x.clamp(0.0, 1.0)
        }
    });
    let mut r = rng();
    // Inputs across the whole range where 2^x is finite and nonzero in
    // f32 (subnormal results included), and subnormal inputs.
    let a: Vec<u64> = (0..N)
        .map(|i| {
            let x = match i % 5 {
                0 => f32::from_bits(r.random_range(1..0x0080_0000)),
                1 => r.random_range(-152.0f32..-120.0),
                _ => r.random_range(-126.0f32..128.0),
            };
            u64::from(x.to_bits())
        })
        .collect();
    for ftz in [false, true] {
        let body = if ftz {
            "\tex2.approx.ftz.f32 \t%d, %a;"
        } else {
            "\tex2.approx.f32 \t%d, %a;"
        };
        let out = run(&kernel("f32", "f32", "f32", "f32", body), &a, &a, 4, 4, 1);
        for i in 0..N {
            let x = f32::from_bits(a[i] as u32);
            let got = f32::from_bits(out[i] as u32);
            let input = if ftz { flush(x) } else { x };
            let exact = f64::from(input).exp2();
            if ftz && exact < f64::from(f32::MIN_POSITIVE) {
                // A subnormal result may round up to the smallest normal.
                assert!(
                    got == 0.0 || got == f32::MIN_POSITIVE,
                    "{body} {x:e}: {got:e}"
                );
                if got == 0.0 {
                    assert!(got.is_sign_positive(), "{body} {x:e}: -0");
                }
                continue;
            }
            // One ulp of the f32 format at the exact value (subnormal
            // spacing below 2^-126).
            let ulp = 2f64.powi((exact.log2().floor() as i32).max(-126) - 23);
            assert!(
                (f64::from(got) - exact).abs() <= ulp,
                "{body} {x:e}: {got:e} vs {exact:e} (ulp {ulp:e})"
            );
        }
    }
}

/// A register never written holds the launch's fill (the mutant oracles'
/// check that an accepted kernel reads none): a kernel the verifier
/// refuses for reading one, decoded unverified with its sibling's contract,
/// stores what the fill was, and a kernel that writes every register it
/// reads stores the same whatever the fill.
#[test]
fn a_never_written_register_holds_the_launch_fill() {
    let mut rng = rand::rng();
    let read = kernel("b32", "b32", "b32", "b32", "\tadd.s32 \t%d, %a, %u5;");
    let refused = crate::ptx::canonicalize(&read, "k", None);
    assert!(
        matches!(
            &refused,
            Err(crate::ptx::PtxError::NonScalarAbi {
                sub_reason: "undefined_register",
                ..
            })
        ),
        "{refused:?}"
    );
    let written = kernel("b32", "b32", "b32", "b32", "\tadd.s32 \t%d, %a, %b;");
    let verified = HostKernel::compile(&written, "k").unwrap();
    let unverified =
        HostKernel::unverified_for_tests(&read, "k", verified.contract().clone()).unwrap();
    let n = rng.random_range(1..300usize);
    let a: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    let b: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    let fill: u64 = rng.random();
    let launch = |k: &HostKernel, fill: u64| -> Vec<u32> {
        let (mut ia, mut ib) = (a.clone(), b.clone());
        let mut out = vec![0xA5A5_A5A5u32; n];
        let inputs = [
            HostSpan {
                ptr: ia.as_mut_ptr().cast(),
                len: n * 4,
            },
            HostSpan {
                ptr: ib.as_mut_ptr().cast(),
                len: n * 4,
            },
        ];
        let launch = HostLaunch {
            inputs: &inputs,
            args: &[],
            output: HostSpan {
                ptr: out.as_mut_ptr().cast(),
                len: n * 4,
            },
            n: n as u64,
            params: &[],
            threads: 1,
            checked: true,
            control: None,
        };
        // SAFETY: the spans are live Vecs of exactly `len` bytes.
        unsafe { k.launch_filled(&launch, fill) }.unwrap();
        out
    };
    let want: Vec<u32> = a.iter().map(|x| x.wrapping_add(fill as u32)).collect();
    assert_eq!(launch(&unverified, fill), want);
    assert_ne!(launch(&unverified, fill), launch(&unverified, !fill));
    assert_eq!(launch(&verified, fill), launch(&verified, !fill));
}
