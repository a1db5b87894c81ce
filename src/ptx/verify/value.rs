//! The abstract values of the verifier's domain: what a register provably
//! holds ([`V`]), the special registers the index is made of ([`Sk`]), the
//! set of params a value may carry bits of ([`ParamSet`]), and how two
//! values join. A module of its own so that the transfer functions
//! (`dataflow.rs`) and the arithmetic (`arith.rs`) both build on it without
//! importing each other.
//!
//! Invariant: a join never turns a value that may carry a param's bits into
//! data; it keeps them in its `ParamSet` (`Tainted` at worst).

/// The special registers the index is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sk {
    Tid,
    Ntid,
    Ctaid,
}

/// A set of params: the params whose bits a value may carry.
///
/// Only the 64-bit integer params (the pointers and the count) ever join a
/// set, and `layout` admits at most `MAX_INPUTS + 2` of them (checked at
/// compile time below), well inside [`ParamSet::CAPACITY`]. The one way in
/// is [`ParamSet::single`], which answers `None` past the capacity, so no
/// param index can lose its bit unnoticed (the caller refuses it as
/// `param_out_of_range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct ParamSet([u64; 2]);

const _: () = assert!(super::MAX_INPUTS + 2 <= ParamSet::CAPACITY as usize);

impl ParamSet {
    pub(super) const EMPTY: ParamSet = ParamSet([0; 2]);
    /// The most params a set can name.
    pub(super) const CAPACITY: u16 = 128;

    /// The set holding param `p` alone, or `None` when `p` has no bit.
    pub(super) fn single(p: u16) -> Option<ParamSet> {
        let mut words = [0u64; 2];
        *words.get_mut(usize::from(p / 64))? = 1 << (p % 64);
        Some(ParamSet(words))
    }

    pub(super) fn contains(self, p: u16) -> bool {
        self.0
            .get(usize::from(p / 64))
            .is_some_and(|w| w >> (p % 64) & 1 == 1)
    }

    pub(super) fn is_empty(self) -> bool {
        self.0 == [0; 2]
    }

    pub(super) fn has_any(self) -> bool {
        !self.is_empty()
    }

    pub(super) fn len(self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    /// The lowest param of the set.
    pub(super) fn first(self) -> Option<u16> {
        self.iter().next()
    }

    /// The params of the set, lowest first.
    pub(super) fn iter(self) -> impl Iterator<Item = u16> {
        (0..Self::CAPACITY).filter(move |p| self.contains(*p))
    }
}

impl std::ops::BitOr for ParamSet {
    type Output = ParamSet;
    fn bitor(self, other: ParamSet) -> ParamSet {
        ParamSet([self.0[0] | other.0[0], self.0[1] | other.0[1]])
    }
}

/// The lowest param of a set, for messages.
pub(super) fn first(m: ParamSet) -> Option<u16> {
    m.first()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum V {
    /// Data: nothing ptxd relies on, and no pointer bits.
    Top,
    Const(i64),
    /// The raw value of one of these 64-bit integer params (a pointer or
    /// the count; more than one bit after a `selp` or a join).
    Param(ParamSet),
    /// `%tid.x` etc. in 32 bits.
    S32(Sk),
    /// The same, zero-extended to 64 bits.
    S64(Sk),
    /// `ctaid.x * ntid.x` in 32 bits (wraps).
    Block32,
    /// `ctaid.x * ntid.x` exactly, in 64 bits.
    Block64,
    /// The global index, in 64 bits.
    Index,
    /// Anything derived from an index computed in 32 bits (wraps).
    Narrow,
    /// `ctaid.x × ntid.x + tid.x` computed in 32 bits, only with the
    /// 32-bit-index family: every thread's value is its global index, in
    /// `[0, grid × block)`, so it is exact (no wrap, non-negative as `.s32`)
    /// exactly when `grid × block <= 2^31` — the `index_fits_i32`
    /// precondition, which a use of it as a 64-bit index records
    /// ([`Event::Assume`]). Anything else computed from it is `Narrow`.
    Index32,
    /// `i × s` in 64 bits.
    Scaled(u32),
    /// `param + i × s + c` for one of the params of the set (`s == 0`:
    /// `param + c`, `c != 0`). An access through it at `[reg + o]` is
    /// element i exactly when `c + o == 0`.
    Addr(ParamSet, u32, i64),
    /// A param plus something that is not `i × s`.
    Derived(ParamSet),
    /// A param plus a 32-bit (wrapping) index times something.
    NarrowAddr(ParamSet),
    /// May carry the bits of one of these params (after a join of a pointer
    /// with something else). Never an address, never data.
    Tainted(ParamSet),
    /// The whole 32-bit count param `p` (the 32-bit index family's `int
    /// n`): compared with the 32-bit index it is a guard, anything else is
    /// a misuse of the count.
    Count32(u16),
    /// A predicate that is true when `i >= n` (`in_range == false`) or when
    /// `i < n` (`in_range == true`), `n` being param `count`.
    Guard {
        count: u16,
        in_range: bool,
    },
}

impl V {
    /// The params whose bits this value may carry.
    pub(super) fn params(self) -> ParamSet {
        match self {
            V::Param(m) | V::Addr(m, _, _) | V::Derived(m) | V::NarrowAddr(m) | V::Tainted(m) => m,
            V::Count32(p) => ParamSet::single(p).unwrap_or(ParamSet::EMPTY),
            _ => ParamSet::EMPTY,
        }
    }

    pub(super) fn pointer(self) -> Option<u16> {
        first(self.params())
    }

    /// Plain data: losing track of it can never matter.
    pub(super) fn is_data(self) -> bool {
        matches!(self, V::Top | V::Const(_))
    }

    /// The width in bits of the value class (0 for data).
    pub(super) fn width(self) -> u32 {
        match self {
            // A wrapped index is never trusted, at any width.
            V::Top | V::Const(_) | V::Guard { .. } | V::Narrow => 0,
            V::S32(_) | V::Block32 | V::Index32 | V::Count32(_) => 32,
            _ => 64,
        }
    }

    /// What a register holds after paths with `self` and `other` meet.
    pub(super) fn join(self, other: V) -> V {
        if self == other {
            return self;
        }
        let m = self.params() | other.params();
        match (self, other) {
            (V::Param(a), V::Param(b)) => V::Param(a | b),
            (V::Addr(a, s, c), V::Addr(b, t, d)) if s == t && c == d => V::Addr(a | b, s, c),
            _ if !m.is_empty() => V::Tainted(m),
            _ => V::Top,
        }
    }
}
