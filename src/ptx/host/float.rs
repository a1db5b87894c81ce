//! Correctly rounded conversions between f64 and the narrower PTX float
//! formats (f32, f16, bf16) in the four IEEE rounding modes, written by hand.
//!
//! The one primitive is [`round`]: it rounds `x + ε` to a format, where `x`
//! is an f64 and `ε` is an infinitesimal whose sign the caller knows (the
//! sign of the rounding error of the f64 computation that produced `x`).
//! That makes results of f64 arithmetic on f32 operands correctly rounded
//! in every mode, not double-rounded: add/fma use the exact TwoSum error,
//! div/sqrt the sign of an exact remainder.

use std::cmp::Ordering;

/// A rounding mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rnd {
    /// To nearest, ties to even.
    Rn,
    /// Toward zero.
    Rz,
    /// Toward −∞.
    Rm,
    /// Toward +∞.
    Rp,
}

/// A binary float format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Format {
    /// Stored mantissa bits.
    pub man: u32,
    /// Exponent bits.
    pub exp: u32,
    /// The NaN the GPU produces for this format.
    pub canonical_nan: u64,
}

pub const F32: Format = Format {
    man: 23,
    exp: 8,
    canonical_nan: 0x7FFF_FFFF,
};
pub const F16: Format = Format {
    man: 10,
    exp: 5,
    canonical_nan: 0x7FFF,
};
pub const BF16: Format = Format {
    man: 7,
    exp: 8,
    canonical_nan: 0x7FFF,
};

impl Format {
    fn bias(self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }

    fn sign_bit(self) -> u64 {
        1 << (self.man + self.exp)
    }

    fn inf(self) -> u64 {
        ((1u64 << self.exp) - 1) << self.man
    }

    fn max_finite(self) -> u64 {
        self.inf() - 1
    }
}

/// Decodes `bits` of format `f` exactly into an f64.
pub fn decode(bits: u64, f: Format) -> f64 {
    let man_mask = (1u64 << f.man) - 1;
    let exp_mask = (1u64 << f.exp) - 1;
    let sign = if bits & f.sign_bit() != 0 { -1.0 } else { 1.0 };
    let e = (bits >> f.man) & exp_mask;
    let m = bits & man_mask;
    if e == exp_mask {
        return if m == 0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    let (mant, exp) = if e == 0 {
        (m, 1 - f.bias() - f.man as i32)
    } else {
        (m | (1 << f.man), e as i32 - f.bias() - f.man as i32)
    };
    sign * (mant as f64) * pow2(exp)
}

/// 2^e as an f64, exactly, for e in the f64 range (subnormals included).
pub fn pow2(e: i32) -> f64 {
    if e > 1023 {
        f64::INFINITY
    } else if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else if e >= -1074 {
        f64::from_bits(1u64 << (e + 1074))
    } else {
        0.0
    }
}

/// Rounds `x + ε` to format `f` in mode `mode`, where `eps` is the sign of
/// the infinitesimal `ε` (`Equal` when `x` is exact). Returns the bits.
pub fn round(x: f64, eps: Ordering, f: Format, mode: Rnd) -> u64 {
    if x.is_nan() {
        return f.canonical_nan;
    }
    let neg = x.is_sign_negative();
    let sign = if neg { f.sign_bit() } else { 0 };
    if x.is_infinite() {
        return sign | f.inf();
    }
    // Work on the magnitude; flip ε's sign with x's.
    let eps = if neg { eps.reverse() } else { eps };
    let away = match mode {
        Rnd::Rn => None,
        Rnd::Rz => Some(false),
        Rnd::Rm => Some(neg),
        Rnd::Rp => Some(!neg),
    };
    if x == 0.0 {
        // ±0 + ε: only a directed mode away from zero moves it.
        if eps == Ordering::Greater && away == Some(true) {
            return sign | 1;
        }
        return sign;
    }
    let bits = x.abs().to_bits();
    let (m, e) = {
        let be = (bits >> 52) as i32;
        let frac = bits & ((1u64 << 52) - 1);
        if be == 0 {
            (frac, -1074)
        } else {
            (frac | (1 << 52), be - 1075)
        }
    };
    // |x| = m × 2^e. The quantum of the result near |x|:
    let top = e + 63 - m.leading_zeros() as i32; // floor(log2 |x|)
    let emin = 1 - f.bias();
    let emax = f.bias();
    let q = top.max(emin) - f.man as i32;
    let overflow = || -> u64 {
        if away == Some(false) {
            sign | f.max_finite()
        } else {
            sign | f.inf()
        }
    };
    if top > emax {
        return overflow();
    }
    let mut q = q;
    let shift = q - e;
    let (mut int, frac_cmp_half, inexact) = if shift <= 0 {
        // |x| is a multiple of the quantum; only ε decides.
        (m << (-shift).min(63), Ordering::Less, false)
    } else if shift >= 64 {
        (0, Ordering::Less, true)
    } else {
        let rem = m & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        (m >> shift, rem.cmp(&half), rem != 0)
    };
    // Fold ε in: the fraction is `rem + ε` in quantum units.
    let (cmp_half, nonzero) = if inexact {
        let c = if frac_cmp_half == Ordering::Equal {
            eps
        } else {
            frac_cmp_half
        };
        (c, true)
    } else {
        match eps {
            Ordering::Equal => (Ordering::Less, false),
            Ordering::Greater => (Ordering::Less, true),
            Ordering::Less => {
                // Just below an integer multiple: step down, fraction ≈ 1.
                // Below a binade's first value the quantum halves.
                if int == 1 << f.man && q > emin - f.man as i32 {
                    int = (1 << (f.man + 1)) - 1;
                    q -= 1;
                } else {
                    int = int.saturating_sub(1);
                }
                (Ordering::Greater, true)
            }
        }
    };
    let up = match away {
        None => cmp_half == Ordering::Greater || (cmp_half == Ordering::Equal && int & 1 == 1),
        Some(a) => a && nonzero,
    };
    if up {
        int += 1;
    }
    if int >> (f.man + 1) != 0 {
        int >>= 1;
        q += 1;
    }
    if int == 0 {
        return sign;
    }
    if int >> f.man == 0 {
        // Subnormal: q is emin - man here.
        return sign | int;
    }
    let biased = q + f.man as i32 + f.bias();
    if biased >= (1 << f.exp) - 1 {
        return overflow();
    }
    sign | ((biased as u64) << f.man) | (int & ((1u64 << f.man) - 1))
}

/// Rounds an f64 to f64 in a directed mode, given the sign of `ε`.
pub fn round_f64(x: f64, eps: Ordering, mode: Rnd) -> f64 {
    if eps == Ordering::Equal || !x.is_finite() {
        return x;
    }
    let down = |v: f64| v.next_down();
    let up = |v: f64| v.next_up();
    match mode {
        Rnd::Rn => x,
        Rnd::Rp if eps == Ordering::Greater => up(x),
        Rnd::Rm if eps == Ordering::Less => down(x),
        Rnd::Rz if x > 0.0 && eps == Ordering::Less => down(x),
        Rnd::Rz if x < 0.0 && eps == Ordering::Greater => up(x),
        _ => x,
    }
}

/// `a + b` in f64 and the sign of its rounding error (Knuth's TwoSum).
pub fn two_sum(a: f64, b: f64) -> (f64, Ordering) {
    let s = a + b;
    if !s.is_finite() {
        return (s, Ordering::Equal);
    }
    let bb = s - a;
    let err = (a - (s - bb)) + (b - bb);
    (s, err.partial_cmp(&0.0).unwrap_or(Ordering::Equal))
}

/// `a × b` in f64 and the sign of its rounding error.
pub fn two_prod(a: f64, b: f64) -> (f64, Ordering) {
    let p = a * b;
    if !p.is_finite() {
        return (p, Ordering::Equal);
    }
    let err = a.mul_add(b, -p);
    (p, err.partial_cmp(&0.0).unwrap_or(Ordering::Equal))
}

/// `a / b` in f64 and the sign of its rounding error.
pub fn div_err(a: f64, b: f64) -> (f64, Ordering) {
    let q = a / b;
    if !q.is_finite() || q == 0.0 {
        return (q, Ordering::Equal);
    }
    // a - q·b is exact under fma; its sign times b's is the sign of a/b - q.
    let rem = (-q).mul_add(b, a);
    let s = rem.partial_cmp(&0.0).unwrap_or(Ordering::Equal);
    (q, if b < 0.0 { s.reverse() } else { s })
}

/// `√a` in f64 and the sign of its rounding error.
pub fn sqrt_err(a: f64) -> (f64, Ordering) {
    let r = a.sqrt();
    if !r.is_finite() || r == 0.0 {
        return (r, Ordering::Equal);
    }
    let rem = (-r).mul_add(r, a);
    (r, rem.partial_cmp(&0.0).unwrap_or(Ordering::Equal))
}

/// Rounds an integer (exactly, as i128) to format `f`.
pub fn round_int(v: i128, f: Format, mode: Rnd) -> u64 {
    let x = v as f64;
    let back = x as i128;
    round(x, v.cmp(&back), f, mode)
}

/// Rounds an integer to f64 in `mode`.
pub fn round_int_f64(v: i128, mode: Rnd) -> f64 {
    let x = v as f64;
    round_f64(x, v.cmp(&(x as i128)), mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn f32_round_matches_rust_casts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..200_000 {
            let x = f64::from_bits(rng.random());
            if x.is_nan() {
                continue;
            }
            let got = round(x, Ordering::Equal, F32, Rnd::Rn) as u32;
            assert_eq!(got, (x as f32).to_bits(), "{x:e}");
        }
        // Near the f32 range ends and subnormals.
        for _ in 0..200_000 {
            let x = f64::from(f32::from_bits(rng.random())) * (1.0 + rng.random::<f64>() * 1e-7);
            if x.is_nan() {
                continue;
            }
            assert_eq!(
                round(x, Ordering::Equal, F32, Rnd::Rn) as u32,
                (x as f32).to_bits()
            );
        }
    }

    #[test]
    fn f16_round_trip_and_directed() {
        for bits in 0u64..0x10000 {
            let x = decode(bits, F16);
            if x.is_nan() {
                continue;
            }
            for m in [Rnd::Rn, Rnd::Rz, Rnd::Rm, Rnd::Rp] {
                assert_eq!(round(x, Ordering::Equal, F16, m), bits, "{bits:#x} {m:?}");
            }
        }
        // Halfway between 1 and 1 + 2^-10 goes to even (1) under rn.
        let mid = 1.0 + pow2(-11);
        assert_eq!(round(mid, Ordering::Equal, F16, Rnd::Rn), 0x3C00);
        assert_eq!(round(mid, Ordering::Greater, F16, Rnd::Rn), 0x3C01);
        assert_eq!(round(mid, Ordering::Equal, F16, Rnd::Rp), 0x3C01);
        assert_eq!(round(mid, Ordering::Equal, F16, Rnd::Rz), 0x3C00);
        assert_eq!(round(-mid, Ordering::Equal, F16, Rnd::Rm), 0xBC01);
        assert_eq!(round(1.0, Ordering::Less, F16, Rnd::Rz), 0x3BFF);
        assert_eq!(round(65520.0, Ordering::Equal, F16, Rnd::Rn), 0x7C00);
        assert_eq!(round(65519.0, Ordering::Equal, F16, Rnd::Rn), 0x7BFF);
        assert_eq!(round(1e9, Ordering::Equal, F16, Rnd::Rz), 0x7BFF);
        assert_eq!(round(pow2(-25), Ordering::Equal, F16, Rnd::Rn), 0);
        assert_eq!(round(pow2(-25), Ordering::Greater, F16, Rnd::Rn), 1);
        assert_eq!(round(pow2(-30), Ordering::Equal, F16, Rnd::Rp), 1);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(
            round(1.0 + pow2(-8), Ordering::Equal, BF16, Rnd::Rn),
            0x3F80
        );
        assert_eq!(
            round(1.0 + 3.0 * pow2(-8), Ordering::Equal, BF16, Rnd::Rn),
            0x3F82
        );
        for bits in 0u64..0x10000 {
            let x = decode(bits, BF16);
            if !x.is_nan() {
                assert_eq!(round(x, Ordering::Equal, BF16, Rnd::Rn), bits);
            }
        }
    }
}
