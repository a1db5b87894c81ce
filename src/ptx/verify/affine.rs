//! The integer domain of the Triton family: a register's value as an affine
//! form over the launch's free variables, with the bits it may have set.
//!
//! Modelled on the Linux eBPF verifier's `tnum` (known bits) and range
//! tracking, cut to what elementwise index arithmetic needs: a value is
//! `ctaid·a + tid·b + c` with `a, b, c >= 0` ([`Lin`]) and a mask of the
//! bits that may be set ([`Int::bits`]; every other bit is known zero).
//!
//! Invariants:
//! - An [`Int`] is exact: the register holds the mathematical value of its
//!   form, provided every form that reached a 32-bit use (a compare, a
//!   widening, a narrowing) is at most `2^31 - 1` — the exactness
//!   requirements the analysis records and the contract turns into the
//!   precondition `index_fits_i32`. Every operation either is exact
//!   whatever its operands held (`× 0`) or gives a form no smaller, term by
//!   term, than each operand's, so a requirement met by a use is met by
//!   everything that fed it.
//! - `or` and `add` of forms whose possible bits are disjoint are the same
//!   value: that is the only way an `or` is modelled; `and` with a mask
//!   that keeps every possible bit is the identity; anything else is data.
//! - A 64-bit form keeps every term below `2^31`, so with `grid <= 2^31`
//!   (implied by `index_fits_i32`) and a block of at most 1024 threads its
//!   value stays below `2^63`: no 64-bit step wraps.

/// `ctaid.x · ctaid + tid.x · tid + c`, every term non-negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Lin {
    pub(super) ctaid: u64,
    pub(super) tid: u64,
    pub(super) c: u64,
}

impl Lin {
    pub(super) const fn constant(c: u64) -> Lin {
        Lin {
            ctaid: 0,
            tid: 0,
            c,
        }
    }

    pub(super) fn add(self, o: Lin) -> Option<Lin> {
        Some(Lin {
            ctaid: self.ctaid.checked_add(o.ctaid)?,
            tid: self.tid.checked_add(o.tid)?,
            c: self.c.checked_add(o.c)?,
        })
    }

    pub(super) fn scale(self, k: u64) -> Option<Lin> {
        Some(Lin {
            ctaid: self.ctaid.checked_mul(k)?,
            tid: self.tid.checked_mul(k)?,
            c: self.c.checked_mul(k)?,
        })
    }

    /// Whether it has no free variable.
    pub(super) fn is_constant(self) -> bool {
        self.ctaid == 0 && self.tid == 0
    }

    /// The largest value of the terms but the block's: `tid · (block - 1) + c`.
    pub(super) fn within_block(self, block: u32) -> Option<u64> {
        self.tid
            .checked_mul(u64::from(block.saturating_sub(1)))?
            .checked_add(self.c)
    }

    /// The gcd of the variables' coefficients (0 when there are none).
    pub(super) fn stride_gcd(self) -> u64 {
        gcd(self.ctaid, self.tid)
    }

    /// Whether every term is below `2^31` (a 64-bit form's bound).
    pub(super) fn small(self) -> bool {
        self.ctaid < 1 << 31 && self.tid < 1 << 31 && self.c < 1 << 31
    }
}

pub(super) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// An exact integer: its form, the bits it may have set, its width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Int {
    pub(super) lin: Lin,
    pub(super) bits: u64,
    pub(super) wide: bool,
}

/// Every bit at and above the lowest possibly-set bit of `bits`, up to
/// `width`: what a carry can reach.
fn carried(bits: u64, width: u64) -> u64 {
    if bits == 0 {
        return 0;
    }
    width & !((1u64 << bits.trailing_zeros()) - 1)
}

impl Int {
    fn mask(wide: bool) -> u64 {
        if wide {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        }
    }

    /// A constant of the given width (its two's complement bits as a
    /// non-negative value; a negative constant is no form).
    pub(super) fn constant(v: i64, wide: bool) -> Option<Int> {
        let v = u64::try_from(v).ok()?;
        if v & !Int::mask(wide) != 0 {
            return None;
        }
        Some(Int {
            lin: Lin::constant(v),
            bits: v,
            wide,
        })
    }

    /// `%ctaid.x`: any 32-bit value.
    pub(super) fn ctaid() -> Int {
        Int {
            lin: Lin {
                ctaid: 1,
                tid: 0,
                c: 0,
            },
            bits: u64::from(u32::MAX),
            wide: false,
        }
    }

    /// `%tid.x` under `.reqntid block`: below `block`.
    pub(super) fn tid(block: u32) -> Int {
        let max = u64::from(block.saturating_sub(1));
        let bits = if max == 0 {
            0
        } else {
            u64::MAX >> max.leading_zeros()
        };
        Int {
            lin: Lin {
                ctaid: 0,
                tid: 1,
                c: 0,
            },
            bits,
            wide: false,
        }
    }

    fn checked(self) -> Option<Int> {
        (!self.wide || self.lin.small()).then_some(self)
    }

    /// `self << k` at its width.
    pub(super) fn shl(self, k: u32) -> Option<Int> {
        if k >= 32 {
            return None;
        }
        Int {
            lin: self.lin.scale(1 << k)?,
            bits: (self.bits << k) & Int::mask(self.wide),
            wide: self.wide,
        }
        .checked()
    }

    /// `self · k` at its width (or widened to 64 bits).
    pub(super) fn mul(self, k: u64, wide: bool) -> Option<Int> {
        if k == 0 {
            return Int::constant(0, wide);
        }
        let bits = if k.is_power_of_two() {
            self.bits << k.trailing_zeros()
        } else {
            carried(self.bits << k.trailing_zeros(), u64::MAX)
        };
        Int {
            lin: self.lin.scale(k)?,
            bits: bits & Int::mask(wide),
            wide,
        }
        .checked()
    }

    /// `self + o`; both of one width.
    pub(super) fn add(self, o: Int) -> Option<Int> {
        if self.wide != o.wide {
            return None;
        }
        let bits = if self.bits & o.bits == 0 {
            self.bits | o.bits
        } else {
            carried(self.bits | o.bits, Int::mask(self.wide))
        };
        Int {
            lin: self.lin.add(o.lin)?,
            bits,
            wide: self.wide,
        }
        .checked()
    }

    /// `self | o`: a sum only when no bit may be set in both.
    pub(super) fn or(self, o: Int) -> Option<Int> {
        if self.bits & o.bits != 0 {
            return None;
        }
        self.add(o)
    }

    /// `self & m`: the identity only when `m` keeps every possible bit.
    pub(super) fn and(self, m: u64) -> Option<Int> {
        (self.bits & !m == 0).then_some(self)
    }

    /// The same value at the other width (the caller records that a
    /// 32-bit form it widens or narrows must be exact).
    pub(super) fn with_width(self, wide: bool) -> Option<Int> {
        Int {
            lin: self.lin,
            bits: self.bits & Int::mask(wide),
            wide,
        }
        .checked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Triton's index: `(tid << 2) & 508 | ctaid << 10 | 512` under
    /// `.reqntid 128` is `1024·ctaid + 4·tid + 512`.
    #[test]
    fn disjoint_shifts_and_ors_are_exact_sums() {
        let t = Int::tid(128).shl(2).unwrap().and(508).unwrap();
        let c = Int::ctaid().shl(10).unwrap();
        let x = t.or(c).unwrap();
        assert_eq!(
            x.lin,
            Lin {
                ctaid: 1024,
                tid: 4,
                c: 0
            }
        );
        let y = x.or(Int::constant(512, false).unwrap()).unwrap();
        assert_eq!(y.lin.c, 512);
        // Bit 2 may be set in x: or-ing 4 is no sum.
        assert!(x.or(Int::constant(4, false).unwrap()).is_none());
        // A mask that drops a possible bit is no identity.
        assert!(Int::tid(256).shl(2).unwrap().and(508).is_none());
    }

    #[test]
    fn wide_forms_keep_their_terms_small() {
        let x = Int::ctaid().shl(10).unwrap().with_width(true).unwrap();
        assert!(x.mul(1 << 22, true).is_none());
        assert!(x.mul(4, true).is_some());
    }
}
