//! Indexed local frames: an entry's one `.local` frame that
//! [`super::promote_frame`] could not promote (some access is at a computed
//! offset) is proved and lowered here.
//!
//! **The proof.** A path-sensitive abstract interpretation of the entry
//! (in the style of the eBPF verifier's state exploration): every register
//! holds a set of strided intervals (`lo..=hi` step `stride`, at most
//! [`MAX_PARTS`] of them), a frame address (`frame + offset`, the offset
//! such a set), a float magnitude bound (from `abs` and a compare with a
//! constant, which is how the Payne-Hanek slow path of `sinf`/`cosf` is
//! guarded), a predicate (known, or the compare that made it, to refine
//! both edges of a branch) or nothing known. A branch whose predicate is
//! known follows one edge, so a loop whose counter is a constant is
//! unrolled; a label visited more than [`UNROLL`] times widens (what
//! changed is forgotten) so every loop terminates; a state equal to one
//! already explored at a label is pruned; past [`MAX_STEPS`] instruction
//! steps the kernel is refused `too_complex`. A register that a
//! register-to-register integer compare may read later (a backward slice)
//! and that gets at most [`MAX_SPLIT`] values on a path is split into one
//! path per value (exact: the paths together are the same executions), so
//! a loop bounded by another register computed from the same value has
//! constant bounds on each path; label visits are counted per such path
//! (its lineage), and registers no path reads again are dropped from the
//! state at a label, so that paths differing only there meet.
//! `mov.b64 {lo, hi}, x` gives the halves of x's bounds (of its bits, for
//! a float of known magnitude). Every access of the frame
//! (`ld.local`/`st.local` through a frame address, a generic `ld`/`st`
//! through one) must, on every path, have every lane inside the frame
//! (`0 <= off`, `off + width <= size`) and aligned to its width; all
//! accesses have one width. A frame address used any other way (stored,
//! compared, passed to a non-local access, multiplied...) is refused: the
//! frame does not escape.
//!
//! **The lowering.** The frame becomes `size / width` registers, zeroed at
//! entry (CUDA does not zero local memory: a never-written byte reads 0,
//! never another tenant's data). Frame addresses become plain offsets (the
//! frame symbol is `0`), a load is a `selp` chain over the slots, a store a
//! `selp` into each slot. The canonical text has no local memory, so the
//! host engine runs it as it runs any other kernel and the GPU runs the
//! same instructions.
//!
//! Anything else (several frames, a frame inside a `{ }` scope, control
//! flow other than `bra`/`ret`/`exit`) is left for the verifier to refuse
//! as `local_memory`.

use std::collections::HashMap;

use super::super::parse::{AddrBase, Imm, Instr, Module, Operand, Stmt};
use super::super::{PtxError, SubReason};
use super::refuse;

/// The largest frame lowered here, in bytes.
pub const MAX_INDEXED_FRAME: u64 = 256;
/// The most slots a frame lowered here may have (each access costs two
/// instructions per slot).
pub const MAX_SLOTS: u64 = 64;
/// The most instruction steps the proof may take.
pub const MAX_STEPS: usize = 200_000;
/// The most work the proof may do, in state entries visited: each step
/// scans its state once, each label visit once per state kept there. (The
/// largest accepted kernel of the corpus, an inlined `sinf`, costs about
/// 850 000.)
pub const MAX_COST: usize = 3_000_000;
/// The most work each of the two backward analyses (which registers a
/// compare may read, which may be read again) may do, in bitset words
/// visited.
pub const MAX_LIVENESS_COST: usize = 3_000_000;
/// Visits of one label before what changes there is forgotten.
pub const UNROLL: usize = 64;
/// The most strided intervals one value keeps.
const MAX_PARTS: usize = 4;
/// The most values a register feeding a register-to-register compare is
/// split into (one path per value).
pub const MAX_SPLIT: i128 = 32;

/// A frame's generic address (`cvta.local` of its local-window one) is
/// held in the domain as its offset plus `GENERIC`, so that the two
/// windows never meet: a `.local` access through a generic address, a
/// generic access through a local-window address, or a `cvta.local` of an
/// address already generic (each of which the GPU runs against other
/// memory) is told apart and refused, not proved as the frame's bytes.
const GENERIC: i128 = 1 << 40;
/// How far from its window's base an offset may be to be told in it.
const WINDOW: i128 = 1 << 39;

/// The window every offset of `s` lies in: `Some(true)` generic,
/// `Some(false)` local, `None` neither (mixed, or unbounded).
fn window(s: &Set) -> Option<bool> {
    if s.iter().all(|p| p.lo > -WINDOW && p.hi < WINDOW) {
        Some(false)
    } else if s
        .iter()
        .all(|p| p.lo > GENERIC - WINDOW && p.hi < GENERIC + WINDOW)
    {
        Some(true)
    } else {
        None
    }
}

/// `s` moved by `by`.
fn shifted(s: &Set, by: i128) -> Set {
    s.iter()
        .map(|p| Si {
            lo: p.lo + by,
            hi: p.hi + by,
            stride: p.stride,
        })
        .collect()
}

/// `lo..=hi` in steps of `stride` (`stride == 0` iff `lo == hi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Si {
    lo: i128,
    hi: i128,
    stride: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Si {
    fn one(v: i128) -> Si {
        Si {
            lo: v,
            hi: v,
            stride: 0,
        }
    }
    fn new(lo: i128, hi: i128, stride: i128) -> Si {
        if lo == hi {
            Si::one(lo)
        } else {
            Si {
                lo,
                hi,
                stride: stride.max(1),
            }
        }
    }
    fn hull(self, o: Si) -> Si {
        let s = gcd(gcd(self.stride, o.stride), self.lo - o.lo);
        Si::new(self.lo.min(o.lo), self.hi.max(o.hi), s)
    }
    fn add(self, o: Si) -> Si {
        Si::new(self.lo + o.lo, self.hi + o.hi, gcd(self.stride, o.stride))
    }
    fn neg(self) -> Si {
        Si::new(-self.hi, -self.lo, self.stride)
    }
    fn mul(self, o: Si) -> Si {
        let c = [
            self.lo * o.lo,
            self.lo * o.hi,
            self.hi * o.lo,
            self.hi * o.hi,
        ];
        let lo = c.iter().copied().min().unwrap_or(0);
        let hi = c.iter().copied().max().unwrap_or(0);
        let stride = match (self.stride, o.stride) {
            (0, _) => (o.stride * self.lo).abs(),
            (_, 0) => (self.stride * o.lo).abs(),
            _ => 1,
        };
        Si::new(lo, hi, stride)
    }
}

/// A set of integers as up to [`MAX_PARTS`] strided intervals.
type Set = Vec<Si>;

fn norm(mut s: Set) -> Set {
    s.sort_by_key(|p| p.lo);
    s.dedup();
    while s.len() > MAX_PARTS {
        let (a, b) = (s.remove(0), s.remove(0));
        s.insert(0, a.hull(b));
    }
    s
}

fn join_sets(a: &Set, b: &Set) -> Set {
    norm(a.iter().chain(b.iter()).copied().collect())
}

/// Each part brought into `[0, 2^bits)`, or `None` when a part straddles
/// a multiple of `2^bits` (its values wrap apart).
fn wrap(s: Set, bits: u32) -> Option<Set> {
    let m = 1i128 << bits;
    let mut out = Vec::with_capacity(s.len());
    for p in s {
        let k = p.lo.div_euclid(m);
        if p.hi.div_euclid(m) != k {
            return None;
        }
        out.push(Si::new(p.lo - k * m, p.hi - k * m, p.stride));
    }
    Some(norm(out))
}

/// The values read as signed `bits`-bit integers, or `None` when a part
/// crosses the sign boundary.
fn signed(s: &Set, bits: u32) -> Option<Set> {
    let half = 1i128 << (bits - 1);
    s.iter()
        .map(|p| {
            if p.hi < half {
                Some(*p)
            } else if p.lo >= half {
                Some(Si::new(p.lo - 2 * half, p.hi - 2 * half, p.stride))
            } else {
                None
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
enum Av {
    /// Nothing known.
    Top,
    /// An integer register's value, unsigned at its width.
    Int(Set),
    /// The frame's address plus one of these offsets.
    Frame(Set),
    /// The address of constant table `k` (an initialized module variable)
    /// plus one of these offsets.
    Table(usize, Set),
    /// `|x|` of float register x (as it was: x's redefinition forgets this).
    Abs(String),
    /// A float whose magnitude is within `[lo, hi]`, never NaN.
    Mag {
        bits: u32,
        lo: f64,
        hi: f64,
    },
    Known(bool),
    /// What `setp` computed: `a cmp b` at type `ty` (negated when `not`).
    Cond {
        cmp: String,
        ty: String,
        a: Operand,
        b: Operand,
        not: bool,
    },
}

impl Av {
    fn names(&self) -> Vec<&str> {
        let mut out = Vec::new();
        match self {
            Av::Abs(x) => out.push(x.as_str()),
            Av::Cond { a, b, .. } => {
                for o in [a, b] {
                    if let Operand::Name(n) = o {
                        out.push(n.as_str());
                    }
                }
            }
            _ => {}
        }
        out
    }

    fn join(&self, o: &Av) -> Av {
        match (self, o) {
            _ if self == o => self.clone(),
            (Av::Int(a), Av::Int(b)) => Av::Int(join_sets(a, b)),
            (Av::Frame(a), Av::Frame(b)) => Av::Frame(join_sets(a, b)),
            (Av::Table(k, a), Av::Table(l, b)) if k == l => Av::Table(*k, join_sets(a, b)),
            // A frame address meeting anything else: unbounded (an access
            // through it is refused).
            (Av::Frame(_), _) | (_, Av::Frame(_)) => {
                Av::Frame(vec![Si::new(i128::from(i64::MIN), i128::from(i64::MAX), 1)])
            }
            // A table address meeting anything else: unusable (a load
            // through it is no table load, which leaves the tables alone).
            (Av::Table(..), _) | (_, Av::Table(..)) => Av::Table(usize::MAX, Vec::new()),
            _ => Av::Top,
        }
    }
}

type State = HashMap<String, Av>;

fn get<'s>(st: &'s State, n: &str) -> &'s Av {
    st.get(n).unwrap_or(&Av::Top)
}

/// Writes `n`, forgetting every link to its old value.
fn set(st: &mut State, n: &str, v: Av) {
    st.retain(|_, x| !x.names().contains(&n));
    if v == Av::Top || v.names().contains(&n) {
        st.remove(n);
    } else {
        st.insert(n.to_string(), v);
    }
}

/// Each frame access: (is a store, lane width, lanes).
struct Access {
    /// `None`: the frame; `Some(k)`: constant table `k` (loads only).
    region: Option<usize>,
    store: bool,
    width: u32,
    lanes: usize,
    ty: String,
    /// The bytes it may touch, `lo..hi`, over every path (the frame's).
    span: (i128, i128),
}

struct Prover<'b> {
    body: &'b [Stmt],
    frame: &'b str,
    size: u64,
    /// The constant tables: (name, bytes).
    tables: &'b [(String, Vec<u8>)],
    /// Whether every use of every table is a provably in-bounds load.
    tables_ok: bool,
    labels: HashMap<&'b str, usize>,
    /// Statement index -> whether it is a frame access (generic ones may
    /// be either; they must be the same on every path).
    accesses: HashMap<usize, Option<Access>>,
    /// Per statement, the registers a register-to-register integer compare
    /// may read after it (see [`split_registers`]).
    split: Vec<Bits>,
    /// Per statement, the registers read again after it (see
    /// [`live_registers`]).
    live: Vec<Bits>,
    /// The numbers of the registers in `split` and `live`.
    regs: Regs,
    /// Statement index -> (is a store, offset) of each move of a frame
    /// address through a slot of the frame (see [`Prover::pointer_slot`]).
    pointers: HashMap<usize, (bool, i128)>,
}

/// How many integers `s` holds (saturating).
fn count(s: &Set) -> i128 {
    s.iter()
        .map(|p| {
            if p.stride == 0 {
                1
            } else {
                (p.hi - p.lo) / p.stride + 1
            }
        })
        .fold(0i128, i128::saturating_add)
}

/// The values of `s` within `lo..=hi`.
fn clip(s: &Set, lo: i128, hi: i128) -> Set {
    let mut kept = Vec::new();
    for q in s {
        let step = q.stride.max(1);
        let a = if q.lo >= lo {
            q.lo
        } else {
            q.lo + (lo - q.lo + step - 1) / step * step
        };
        let z = if q.hi <= hi {
            q.hi
        } else {
            q.hi - (q.hi - hi + step - 1) / step * step
        };
        if a <= z {
            kept.push(Si::new(a, z, q.stride));
        }
    }
    kept
}

/// On a path split off where `i` gave its destination the value `v`: the
/// source of a plain unsigned `shr` by a constant `k` (at 32 or 64 bits)
/// is in `v << k ..= (v << k) + 2^k - 1` there, so a later compare of the
/// source agrees with the split (double `sin` on sm_100 splits
/// `e = x >> 6` and then compares `x < 128`). A source register holding
/// values wider than the shift's type is left as it is, and so is the
/// source of a guarded `shr` (where its guard was false the destination
/// kept its old value, so the split says nothing of the source).
fn preimage(i: &Instr, v: i128, st: &mut State) {
    if i.guard.is_some() {
        return;
    }
    let ("shr.u32" | "shr.b32" | "shr.u64" | "shr.b64", [Operand::Name(d), Operand::Name(a), b]) =
        (i.opcode.as_str(), &i.operands[..])
    else {
        return;
    };
    let Some(k) = imm(b) else {
        return;
    };
    if a == d || !(0..64).contains(&k) {
        return;
    }
    // Only when the register holds no more bits than the `shr` reads (a
    // wider register's high bits are not what was shifted).
    let bits: u32 = if i.opcode.ends_with("32") { 32 } else { 64 };
    if let Av::Int(x) = get(st, a) {
        if !x.iter().all(|p| p.lo >= 0 && p.hi >> bits == 0) {
            return;
        }
        let lo = v << k;
        let kept = clip(x, lo, lo + (1i128 << k) - 1);
        if !kept.is_empty() {
            st.insert(a.clone(), Av::Int(kept));
        }
    }
}

/// A set of registers, by their number in [`Regs`].
#[derive(Debug, Clone, Default, PartialEq)]
struct Bits(Vec<u64>);

impl Bits {
    fn contains(&self, k: usize) -> bool {
        self.0.get(k / 64).is_some_and(|w| w >> (k % 64) & 1 == 1)
    }
    fn insert(&mut self, k: usize) {
        if self.0.len() <= k / 64 {
            self.0.resize(k / 64 + 1, 0);
        }
        self.0[k / 64] |= 1 << (k % 64);
    }
    fn union(&mut self, o: &Bits) {
        if self.0.len() < o.0.len() {
            self.0.resize(o.0.len(), 0);
        }
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a |= b;
        }
    }
    fn any(&self) -> bool {
        self.0.iter().any(|w| *w != 0)
    }
}

/// The registers the body names, numbered.
#[derive(Default)]
struct Regs(HashMap<String, usize>);

impl Regs {
    fn id(&mut self, n: &str) -> usize {
        let next = self.0.len();
        *self.0.entry(n.to_string()).or_insert(next)
    }
    fn get(&self, n: &str) -> Option<usize> {
        self.0.get(n).copied()
    }
}

/// The body's branches as both backward analyses read them, built once:
/// per statement, (what it writes, what it reads), its successors and its
/// predecessors.
struct Flow {
    rw: Vec<(Bits, Bits)>,
    succ: Vec<Vec<usize>>,
    pred: Vec<Vec<usize>>,
}

impl Flow {
    fn new(body: &[Stmt], labels: &HashMap<&str, usize>, regs: &mut Regs) -> Flow {
        let n = body.len();
        let mut rw: Vec<(Bits, Bits)> = Vec::with_capacity(n);
        for s in body {
            let (mut w, mut r) = (Bits::default(), Bits::default());
            if let Stmt::Instr(i) = s {
                let dests = Prover::dests(i);
                for d in &dests {
                    w.insert(regs.id(d));
                }
                let mut names = Vec::new();
                for o in i.operands.iter().skip(usize::from(!dests.is_empty())) {
                    super::operand_names(o, &mut names);
                }
                if let Some((_, g)) = &i.guard {
                    names.push(g);
                }
                for x in names {
                    r.insert(regs.id(x));
                }
            }
            rw.push((w, r));
        }
        let succ: Vec<Vec<usize>> = (0..n)
            .map(|pc| super::successors(body, labels, pc))
            .collect();
        let mut pred: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (pc, ss) in succ.iter().enumerate() {
            for &s in ss {
                if let Some(p) = pred.get_mut(s) {
                    p.push(pc);
                }
            }
        }
        Flow { rw, succ, pred }
    }
}

/// A backward analysis over the body's branches: per statement, the
/// registers wanted before it, given those wanted after it. `uses(i,
/// wanted after)` says whether `i`'s sources are wanted (an unguarded `i`
/// first kills what it writes). Returns (wanted before, wanted after) per
/// statement.
fn backward(
    body: &[Stmt],
    flow: &Flow,
    regs: &Regs,
    uses: impl Fn(&Instr, &Bits, &Bits) -> bool,
) -> Result<(Vec<Bits>, Vec<Bits>), PtxError> {
    let n = body.len();
    let Flow { rw, succ, pred } = flow;
    let mut live_in: Vec<Bits> = vec![Bits::default(); n];
    let mut live_out: Vec<Bits> = vec![Bits::default(); n];
    // A worklist, last statement first: a statement is visited again only
    // when what a successor wants changed, and the words visited are
    // counted (a chain of back edges made the rounds of a plain iteration
    // cubic in the body: 2 000 of them took minutes).
    let words = regs.0.len() / 64 + 1;
    let mut cost = 0usize;
    let mut queued = vec![true; n];
    let mut work: Vec<usize> = (0..n).collect();
    while let Some(pc) = work.pop() {
        queued[pc] = false;
        cost = cost.saturating_add((succ[pc].len() + 2) * words);
        if cost > MAX_LIVENESS_COST {
            return Err(refuse(
                SubReason::TooComplex,
                0,
                format!(
                    "the registers' liveness for the local frame's proof costs more than {MAX_LIVENESS_COST} words visited"
                ),
            ));
        }
        let mut out = Bits::default();
        for &s in &succ[pc] {
            out.union(&live_in[s]);
        }
        let mut inn = out.clone();
        if let Stmt::Instr(i) = &body[pc] {
            let (w, r) = &rw[pc];
            if i.guard.is_none() {
                for (k, word) in w.0.iter().enumerate() {
                    if let Some(x) = inn.0.get_mut(k) {
                        *x &= !word;
                    }
                }
            }
            if uses(i, w, &out) {
                inn.union(r);
            }
        }
        live_out[pc] = out;
        if inn != live_in[pc] {
            live_in[pc] = inn;
            for &p in &pred[pc] {
                if !queued[p] {
                    queued[p] = true;
                    work.push(p);
                }
            }
        }
    }
    Ok((live_in, live_out))
}

/// Per statement, the registers whose value after it a register-to-register
/// integer compare may read, directly or through what is computed from
/// them before they are written again (a backward slice, over the branches
/// of the body). A path that gives such a register a set of at most
/// [`MAX_SPLIT`] values is split there into one path per value (the paths
/// together are the same executions, so this is exact), which is how a
/// loop bounded by another register (the Payne-Hanek loop of double `sin`:
/// `i` from `15 - e` while `i < 19 - e`) becomes a loop with constant
/// bounds on each path.
fn split_registers(body: &[Stmt], flow: &Flow, regs: &Regs) -> Result<Vec<Bits>, PtxError> {
    backward(body, flow, regs, |i, w, out| {
        let parts: Vec<&str> = i.opcode.split('.').collect();
        let compare = parts.first() == Some(&"setp")
            && !parts.last().is_some_and(|t| t.starts_with('f'))
            && matches!(&i.operands[..], [_, Operand::Name(_), Operand::Name(_), ..]);
        let mut written = w.clone();
        written.0.iter_mut().zip(&out.0).for_each(|(a, b)| *a &= b);
        written.0.truncate(out.0.len());
        compare || written.any()
    })
    .map(|b| b.1)
}

/// Per statement, the registers that may be read after control reaches
/// it before being written: what a state at a label keeps (a value no
/// path reads again cannot change what the proof concludes, and states
/// that differ only there are one).
fn live_registers(body: &[Stmt], flow: &Flow, regs: &Regs) -> Result<Vec<Bits>, PtxError> {
    backward(body, flow, regs, |_, _, _| true).map(|b| b.0)
}

fn type_bits(ty: &str) -> Option<u32> {
    ty.get(1..)?.parse().ok()
}

fn imm(o: &Operand) -> Option<i128> {
    match o {
        Operand::Imm(Imm::Int(v)) => Some(i128::from(*v)),
        _ => None,
    }
}

fn f_imm(o: &Operand) -> Option<f64> {
    match o {
        Operand::Imm(Imm::F32(b)) => Some(f64::from(f32::from_bits(*b))),
        Operand::Imm(Imm::F64(b)) => Some(f64::from_bits(*b)),
        _ => None,
    }
}

/// What a memory instruction is: (store, space, lanes, type).
fn mem_parts(opcode: &str) -> Option<(bool, &str, usize, &str)> {
    let parts: Vec<&str> = opcode.split('.').collect();
    let (op, rest) = parts.split_first()?;
    let store = match *op {
        "ld" => false,
        "st" => true,
        _ => return None,
    };
    let mut space = "";
    let mut lanes = 1;
    let mut ty = None;
    for p in rest {
        match *p {
            "local" | "global" | "shared" | "const" | "param" => space = p,
            "v2" => lanes = 2,
            "v4" => lanes = 4,
            "nc" | "ca" | "cg" | "cs" | "lu" | "cv" | "wb" | "wt" | "volatile" | "relaxed"
            | "weak" => {}
            t if type_bits(t).is_some() => ty = Some(t),
            _ => return None,
        }
    }
    Some((store, space, lanes, ty?))
}

/// The bits of a float of `fb` bits whose magnitude is in `[lo, hi]`
/// (non-negative floats order as their bits), the bounds rounded outward
/// to f32 at 32 bits; either sign.
fn mag_bits(fb: u32, lo: f64, hi: f64) -> Set {
    let (l, h) = if fb == 32 {
        let mut l = lo as f32;
        if f64::from(l) > lo {
            l = f32::from_bits(l.to_bits().saturating_sub(1));
        }
        let mut h = hi as f32;
        if f64::from(h) < hi {
            h = f32::from_bits(h.to_bits() + 1);
        }
        (i128::from(l.to_bits()), i128::from(h.to_bits()))
    } else {
        (i128::from(lo.to_bits()), i128::from(hi.to_bits()))
    };
    let sign = 1i128 << (fb - 1);
    norm(vec![Si::new(l, h, 1), Si::new(l + sign, h + sign, 1)])
}

/// The low and the high 32-bit halves of the 64-bit values `s`: the high
/// half of each part is a part; the low half only when the part does not
/// cross a multiple of 2^32 (else unknown).
fn halves(s: &Set) -> (Option<Set>, Set) {
    let m = 1i128 << 32;
    let mut low = Some(Vec::new());
    let mut high = Vec::new();
    for p in s {
        let (a, b) = (p.lo.div_euclid(m), p.hi.div_euclid(m));
        let stride = if p.stride % m == 0 { p.stride / m } else { 1 };
        high.push(Si::new(a, b, stride));
        if a == b {
            if let Some(l) = low.as_mut() {
                l.push(Si::new(p.lo - a * m, p.hi - a * m, p.stride));
            }
        } else {
            low = None;
        }
    }
    (low.map(norm), norm(high))
}

impl<'b> Prover<'b> {
    fn err(&self, line: u32, why: String) -> PtxError {
        refuse(SubReason::LocalMemory, line, why)
    }

    /// The frame offsets `s` an access of `space` (`local` or generic)
    /// reaches: a generic address's, less `GENERIC`, for a generic access;
    /// a local-window address's for a `.local` one; an address of the
    /// other window is refused (the GPU would access other memory). A set
    /// of neither window is left as it is (no offset of it is inside).
    fn in_window(&self, i: &Instr, s: Set, space: &str) -> Result<Set, PtxError> {
        match (window(&s), space) {
            (Some(true), "") => Ok(shifted(&s, -GENERIC)),
            (Some(true), _) => Err(self.err(
                i.line,
                format!(
                    "`{}` accesses the local frame `{}` in the local window through its generic address (`cvta.local` of it)",
                    i.opcode, self.frame
                ),
            )),
            (Some(false), "") => Err(self.err(
                i.line,
                format!(
                    "`{}` accesses the local frame `{}` as generic memory through its local-window address (not `cvta.local` of it)",
                    i.opcode, self.frame
                ),
            )),
            _ => Ok(s),
        }
    }

    fn value(&self, st: &State, o: &Operand, bits: u32) -> Av {
        match o {
            Operand::Imm(Imm::Int(v)) => {
                let m = 1i128 << bits;
                Av::Int(vec![Si::one(i128::from(*v).rem_euclid(m))])
            }
            Operand::Name(n) if n == self.frame => Av::Frame(vec![Si::one(0)]),
            Operand::Name(n) if self.tables.iter().any(|t| t.0 == *n) => Av::Table(
                self.tables
                    .iter()
                    .position(|t| t.0 == *n)
                    .unwrap_or(usize::MAX),
                vec![Si::one(0)],
            ),
            // An instruction of `bits` bits reads the low `bits` bits of a
            // wider register (`cvt`, `ld`/`st`'s relaxed rule).
            Operand::Name(n) => match get(st, n) {
                Av::Int(s)
                    if (1..=64).contains(&bits)
                        && s.iter().any(|p| p.lo < 0 || p.hi >> bits != 0) =>
                {
                    wrap(s.clone(), bits).map_or(Av::Top, Av::Int)
                }
                v => v.clone(),
            },
            _ => Av::Top,
        }
    }

    fn escapes(&mut self, st: &State, i: &Instr, o: &Operand) -> Result<(), PtxError> {
        let mut bad = None;
        let mut table = false;
        let mut check = |n: &str| {
            if n == self.frame || matches!(get(st, n), Av::Frame(_)) {
                bad = Some(n.to_string());
            }
            if self.tables.iter().any(|t| t.0 == n) || matches!(get(st, n), Av::Table(..)) {
                table = true;
            }
        };
        match o {
            Operand::Name(n) | Operand::Not(n) => check(n),
            Operand::Pair(a, b) => {
                check(a);
                check(b);
            }
            Operand::Addr {
                base: AddrBase::Name(n),
                ..
            } => check(n),
            Operand::List(l) => {
                for x in l {
                    if let Operand::Name(n) = x {
                        check(n);
                    }
                }
            }
            _ => {}
        }
        if table {
            self.tables_ok = false;
        }
        match bad {
            Some(n) => Err(self.err(
                i.line,
                format!(
                    "`{}` uses the address of the local frame `{}` (in `{n}`) other than to access it: the frame must not escape",
                    i.opcode, self.frame
                ),
            )),
            None => Ok(()),
        }
    }

    /// Every register `i` writes.
    fn dests(i: &Instr) -> Vec<String> {
        let base = i.opcode.split('.').next().unwrap_or("");
        if matches!(
            base,
            "st" | "red"
                | "bar"
                | "barrier"
                | "membar"
                | "fence"
                | "bra"
                | "ret"
                | "exit"
                | "prefetch"
                | "trap"
        ) {
            return Vec::new();
        }
        match i.operands.first() {
            Some(Operand::Name(n)) => vec![n.clone()],
            Some(Operand::Pair(a, b)) => vec![a.clone(), b.clone()],
            Some(Operand::List(l)) => l
                .iter()
                .filter_map(|o| match o {
                    Operand::Name(n) => Some(n.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Checks one access of the frame at the offsets `offs` (+ `c`).
    fn access(
        &mut self,
        at: usize,
        i: &Instr,
        frame_access: Option<(Set, i64)>,
        store: bool,
        lanes: usize,
        ty: &str,
    ) -> Result<(), PtxError> {
        let seen = self.accesses.get(&at);
        let Some((offs, c)) = frame_access else {
            if matches!(seen, Some(Some(_))) {
                return Err(self.err(
                    i.line,
                    format!(
                        "`{}` accesses the local frame `{}` on one path and other memory on another",
                        i.opcode, self.frame
                    ),
                ));
            }
            self.accesses.insert(at, None);
            return Ok(());
        };
        if matches!(seen, Some(None)) {
            return Err(self.err(
                i.line,
                format!(
                    "`{}` accesses the local frame `{}` on one path and other memory on another",
                    i.opcode, self.frame
                ),
            ));
        }
        let w = type_bits(ty).unwrap_or(0) / 8;
        if w == 0 {
            return Err(self.err(i.line, format!("`{}`: no width", i.opcode)));
        }
        if let Some(Some(a)) = seen {
            if a.width != w {
                return Err(self.err(
                    i.line,
                    format!(
                        "`{}` accesses the local frame `{}` at width {w}, another access at {}",
                        i.opcode, self.frame, a.width
                    ),
                ));
            }
        }
        if let Some(Some(a)) = self
            .accesses
            .values()
            .find(|a| a.as_ref().is_some_and(|a| a.region.is_none()))
        {
            if a.width != w {
                return Err(self.err(
                    i.line,
                    format!(
                        "`{}` accesses the local frame `{}` at width {w}, another access at {}",
                        i.opcode, self.frame, a.width
                    ),
                ));
            }
        }
        let w = i128::from(w);
        let last = self.size as i128 - w * lanes as i128;
        // PTX aligns a `.v2`/`.v4` access to the whole vector.
        let vector = w * lanes as i128;
        for p in &offs {
            let (lo, hi) = (p.lo + i128::from(c), p.hi + i128::from(c));
            let aligned = lo % vector == 0 && p.stride % vector == 0;
            if lo < 0 || hi > last || !aligned {
                return Err(self.err(
                    i.line,
                    format!(
                        "`{}` may access byte offsets {lo}..={hi} (step {}) of the local frame `{}` of {} bytes with {lanes} lane(s) of {w} bytes: not provably inside it and aligned",
                        i.opcode,
                        p.stride.max(1),
                        self.frame,
                        self.size
                    ),
                ));
            }
        }
        let lo = offs.iter().map(|p| p.lo).min().unwrap_or(0) + i128::from(c);
        let hi = offs.iter().map(|p| p.hi).max().unwrap_or(0) + i128::from(c) + vector;
        let span = match self.accesses.get(&at) {
            Some(Some(a)) => (a.span.0.min(lo), a.span.1.max(hi)),
            _ => (lo, hi),
        };
        if self.pointers.contains_key(&at) {
            return Err(self.err(
                i.line,
                format!(
                    "`{}` moves a frame address of the local frame `{}` on one path and other data on another",
                    i.opcode, self.frame
                ),
            ));
        }
        self.accesses.insert(
            at,
            Some(Access {
                region: None,
                store,
                width: w as u32,
                lanes,
                ty: ty.to_string(),
                span,
            }),
        );
        Ok(())
    }

    /// A 64-bit store of a frame address to a single offset of the frame,
    /// or a 64-bit load from a single offset that holds one on this path
    /// (`-G` builds keep `this` pointers of temporaries there): the slot is
    /// tracked in the state (`#slot<offset>`) and its statement recorded.
    /// `Ok(false)` when `i` is no such access.
    fn pointer_slot(
        &mut self,
        at: usize,
        i: &Instr,
        st: &mut State,
        store: bool,
        lanes: usize,
        ty: &str,
    ) -> Result<bool, PtxError> {
        let o = &i.operands;
        let (addr, value) = if store {
            (o.first(), o.get(1))
        } else {
            (o.get(1), o.first())
        };
        let wide = lanes == 1
            && type_bits(ty) == Some(64)
            && matches!(ty.as_bytes().first(), Some(b'b' | b'u' | b's'))
            && i.guard.is_none()
            && o.len() == 2;
        let off = match addr {
            Some(Operand::Addr {
                base: AddrBase::Name(n),
                offset,
            }) if wide => match self.value(st, &Operand::Name(n.clone()), 64) {
                // In the window of the access's space only (else it is
                // refused as an access).
                Av::Frame(s) if s.len() == 1 && s[0].stride == 0 => {
                    let generic = mem_parts(&i.opcode).is_some_and(|m| m.1.is_empty());
                    match window(&s) {
                        Some(g) if g == generic => {
                            s[0].lo - if generic { GENERIC } else { 0 } + i128::from(*offset)
                        }
                        _ => return Ok(false),
                    }
                }
                _ => return Ok(false),
            },
            _ => return Ok(false),
        };
        let key = format!("#slot{off}");
        let (Some(Operand::Name(v)), true) = (
            value,
            off >= 0 && off % 8 == 0 && off + 8 <= self.size as i128,
        ) else {
            return Ok(false);
        };
        let held = if store {
            match self.value(st, &Operand::Name(v.clone()), 64) {
                Av::Frame(f) => Some(f),
                _ => None,
            }
        } else {
            match st.get(&key) {
                Some(Av::Frame(f)) => Some(f.clone()),
                _ => None,
            }
        };
        let Some(held) = held else {
            return Ok(false);
        };
        if matches!(self.accesses.get(&at), Some(Some(_)))
            || self.pointers.get(&at).is_some_and(|p| *p != (store, off))
        {
            return Err(self.err(
                i.line,
                format!(
                    "`{}` moves a frame address of the local frame `{}` on one path and other data, or another slot, on another",
                    i.opcode, self.frame
                ),
            ));
        }
        self.pointers.insert(at, (store, off));
        if store {
            st.insert(key, Av::Frame(held));
        } else {
            set(st, v, Av::Frame(held));
        }
        Ok(true)
    }

    /// Records a load of constant table `k` at the offsets `offs` (+ `c`);
    /// anything but an in-bounds, aligned load of one table at one width
    /// leaves the tables alone.
    #[allow(clippy::too_many_arguments)]
    fn table_load(
        &mut self,
        at: usize,
        k: usize,
        offs: Set,
        c: i64,
        store: bool,
        space: &str,
        lanes: usize,
        ty: &str,
    ) {
        let Some((_, bytes)) = self.tables.get(k) else {
            self.tables_ok = false;
            return;
        };
        let w = i128::from(type_bits(ty).unwrap_or(0) / 8);
        let last = bytes.len() as i128 - w * lanes as i128;
        let inside = !offs.is_empty()
            && offs.iter().all(|p| {
                let (lo, hi) = (p.lo + i128::from(c), p.hi + i128::from(c));
                lo >= 0 && hi <= last && w >= 2 && lo % w == 0 && p.stride % w == 0
            });
        let same = match self.accesses.get(&at) {
            None => true,
            Some(Some(a)) => a.region == Some(k) && i128::from(a.width) == w,
            Some(None) => false,
        };
        if store || !matches!(space, "global" | "const" | "") || !inside || !same {
            self.tables_ok = false;
            return;
        }
        self.accesses.insert(
            at,
            Some(Access {
                region: Some(k),
                store,
                width: w as u32,
                lanes,
                ty: ty.to_string(),
                span: (0, 0),
            }),
        );
    }

    /// Runs instruction `i` (not a branch) on `st`.
    fn step(&mut self, at: usize, i: &Instr, st: &mut State) -> Result<(), PtxError> {
        let op = i.opcode.as_str();
        let parts: Vec<&str> = op.split('.').collect();
        let base = parts.first().copied().unwrap_or("");
        let ty = parts.last().copied().unwrap_or("");
        let bits = type_bits(ty).filter(|b| (1..=64).contains(b)).unwrap_or(64);
        let o = &i.operands;
        // Memory accesses.
        if let Some((store, space, lanes, mty)) = mem_parts(op) {
            if matches!(space, "local" | "") && self.pointer_slot(at, i, st, store, lanes, mty)? {
                return Ok(());
            }
            let (addr, value) = if store {
                (o.first(), o.get(1))
            } else {
                (o.get(1), o.first())
            };
            if let Some(v) = value {
                self.escapes(st, i, v)?;
            }
            let (frame_access, table_access) = match addr {
                Some(Operand::Addr {
                    base: AddrBase::Name(n),
                    offset,
                }) => match self.value(st, &Operand::Name(n.clone()), 64) {
                    Av::Frame(s) if matches!(space, "local" | "") => {
                        (Some((self.in_window(i, s, space)?, *offset)), None)
                    }
                    Av::Frame(s) => (Some((s, *offset)), None),
                    Av::Table(k, s) => (None, Some((k, s, *offset))),
                    _ => (None, None),
                },
                _ => (None, None),
            };
            if let Some((k, offs, c)) = table_access {
                self.table_load(at, k, offs, c, store, space, lanes, mty);
                for d in Self::dests(i) {
                    set(st, &d, Av::Top);
                }
                return Ok(());
            }
            if let Some(Access {
                region: Some(_), ..
            }) = self.accesses.get(&at).and_then(Option::as_ref)
            {
                // A table load on another path.
                self.tables_ok = false;
            }
            match space {
                "local" | "" => {
                    if space == "local" && frame_access.is_none() {
                        return Err(self.err(
                            i.line,
                            format!(
                                "`{op}` is not provably an access of the local frame `{}`",
                                self.frame
                            ),
                        ));
                    }
                    self.access(at, i, frame_access, store, lanes, mty)?;
                }
                _ => {
                    if let Some(a) = addr {
                        self.escapes(st, i, a)?;
                    }
                }
            }
            for d in Self::dests(i) {
                set(st, &d, Av::Top);
            }
            return Ok(());
        }
        let d = match o.first() {
            Some(Operand::Name(d)) => Some(d.clone()),
            _ => None,
        };
        let int = |v: Av| match v {
            Av::Int(s) => Some(s),
            _ => None,
        };
        // Integer arithmetic only at integer types: a float op on bits the
        // domain holds as integers knows nothing.
        let float_op =
            ty.starts_with('f') && matches!(base, "add" | "sub" | "mul" | "shl" | "shr" | "and");
        // The integer arms model `.sN`/`.uN`/`.bN` at 8..64 bits only (not
        // `.bf16`, `.u16x2`, `.b128`).
        let int_ty = matches!(ty.as_bytes().first(), Some(b's' | b'u' | b'b'))
            && matches!(type_bits(ty), Some(8 | 16 | 32 | 64));
        if float_op {
            for x in o.iter().skip(1) {
                self.escapes(st, i, x)?;
            }
            if let Some(Operand::Name(d)) = o.first() {
                set(st, d, Av::Top);
            }
            return Ok(());
        }
        // `mov.b64 {lo, hi}, x`: x's halves (x's bits when x is a float of
        // known magnitude), read as 64 bits.
        if let ("mov.b64", [Operand::List(l), a]) = (op, &o[..]) {
            if let ([Operand::Name(dl), Operand::Name(dh)], None) = (&l[..], &i.guard) {
                self.escapes(st, i, a)?;
                let v = match self.value(st, a, 64) {
                    Av::Mag { bits: 64, lo, hi } => Some(mag_bits(64, lo, hi)),
                    Av::Int(x) => wrap(x, 64),
                    _ => None,
                };
                let (lo, hi) = match v.as_ref().map(halves) {
                    Some((lo, hi)) => (lo.map_or(Av::Top, Av::Int), Av::Int(hi)),
                    None => (Av::Top, Av::Top),
                };
                set(st, dl, lo);
                set(st, dh, hi);
                return Ok(());
            }
        }
        let result: Option<Av> = match (base, &o[..]) {
            // `neg` of an integer: `2^bits - x`, wrapped.
            ("neg", [_, a]) if int_ty && parts.len() == 2 => {
                self.escapes(st, i, a)?;
                Some(match self.value(st, a, bits) {
                    Av::Int(x) => {
                        wrap(x.iter().map(|p| p.neg()).collect(), bits).map_or(Av::Top, Av::Int)
                    }
                    _ => Av::Top,
                })
            }
            // `min`/`max` of integers: each bound is the min (max) of the
            // operands' bounds, in the signed view at `.sN`.
            ("min" | "max", [_, a, b]) if int_ty && parts.len() == 2 => {
                self.escapes(st, i, a)?;
                self.escapes(st, i, b)?;
                let sgn = ty.starts_with('s');
                let view = |v: Av| match v {
                    Av::Int(x) if sgn => signed(&x, bits),
                    Av::Int(x) => Some(x),
                    _ => None,
                };
                let bounds =
                    |s: &Set| Some((s.iter().map(|p| p.lo).min()?, s.iter().map(|p| p.hi).max()?));
                let x = view(self.value(st, a, bits));
                let y = view(self.value(st, b, bits));
                Some(
                    match (x.as_ref().and_then(bounds), y.as_ref().and_then(bounds)) {
                        (Some((xl, xh)), Some((yl, yh))) => {
                            let (lo, hi) = if base == "min" {
                                (xl.min(yl), xh.min(yh))
                            } else {
                                (xl.max(yl), xh.max(yh))
                            };
                            wrap(vec![Si::new(lo, hi, 1)], bits).map_or(Av::Top, Av::Int)
                        }
                        _ => Av::Top,
                    },
                )
            }
            ("mov" | "cvta", [_, a]) if !matches!(a, Operand::Addr { .. }) => {
                let is_cvta = base == "cvta";
                if is_cvta && parts.get(1) != Some(&"local") {
                    self.escapes(st, i, a)?;
                    Some(Av::Top)
                } else if let (true, Av::Frame(f)) = (is_cvta, self.value(st, a, bits)) {
                    // `cvta.local`: the local-window address made generic;
                    // of an address already generic, other memory.
                    if window(&f) != Some(false) {
                        return Err(self.err(
                            i.line,
                            format!(
                                "`{}` converts an address of the local frame `{}` that is not its local-window address",
                                i.opcode, self.frame
                            ),
                        ));
                    }
                    Some(Av::Frame(shifted(&f, GENERIC)))
                } else {
                    Some(match self.value(st, a, bits) {
                        Av::Mag { bits: fb, lo, hi }
                            if bits == fb && matches!(fb, 32 | 64) && !ty.starts_with('f') =>
                        {
                            Av::Int(mag_bits(fb, lo, hi))
                        }
                        v => v,
                    })
                }
            }
            // `abs.ftz` flushes a subnormal to 0: no bound on the original.
            ("abs", [_, Operand::Name(a)]) if ty.starts_with('f') && parts.len() == 2 => {
                Some(Av::Abs(a.clone()))
            }
            // Wrapping arithmetic only: `.sat` (and any other modifier but
            // `.cc`, whose result wraps) changes the result: unknown.
            ("add" | "sub", [_, a, b])
                if int_ty && (parts.len() == 2 || (parts.len() == 3 && parts[1] == "cc")) =>
            {
                let (va, vb) = (self.value(st, a, bits), self.value(st, b, bits));
                let sub = base == "sub";
                // A frame or table address plus or minus an integer
                // (read as signed) stays one.
                let region = |v: &Av| match v {
                    Av::Frame(f) => Some((None, f.clone())),
                    Av::Table(k, f) => Some((Some(*k), f.clone())),
                    _ => None,
                };
                let make = |r: Option<usize>, f: Set| match r {
                    None => Av::Frame(f),
                    Some(k) => Av::Table(k, f),
                };
                let moved = match (region(&va), region(&vb)) {
                    (Some(p), None) => Some((p, &vb)),
                    (None, Some(p)) if !sub => Some((p, &va)),
                    _ => None,
                };
                if let Some(((r, f), k)) = moved {
                    let unbounded = vec![Si::new(i128::from(i64::MIN), i128::from(i64::MAX), 1)];
                    let k = match k {
                        Av::Int(k) => signed(k, bits),
                        Av::Top => None,
                        _ => {
                            self.escapes(st, i, a)?;
                            self.escapes(st, i, b)?;
                            None
                        }
                    };
                    let out = match k {
                        Some(k) => {
                            let mut out = Vec::new();
                            for p in &f {
                                for q in &k {
                                    out.push(if sub { p.add(q.neg()) } else { p.add(*q) });
                                }
                            }
                            norm(out)
                        }
                        None => unbounded,
                    };
                    // The windows are told apart only by their offsets:
                    // arithmetic that moves a frame address from one to
                    // the other (adding 2^40 to the local-window address)
                    // would make the proof read another window's bytes.
                    if r.is_none() {
                        if let (Some(from), Some(to)) = (window(&f), window(&out)) {
                            if from != to {
                                return Err(self.err(
                                    i.line,
                                    format!(
                                        "`{}` moves an address of the local frame `{}` out of its window",
                                        i.opcode, self.frame
                                    ),
                                ));
                            }
                        }
                    }
                    let v = make(r, out);
                    let d = match o.first() {
                        Some(Operand::Name(d)) => d.clone(),
                        _ => String::new(),
                    };
                    let v = match &i.guard {
                        Some((neg, p)) => match get(st, p) {
                            Av::Known(k) if *k != *neg => v,
                            Av::Known(_) => get(st, &d).clone(),
                            _ => v.join(get(st, &d)),
                        },
                        None => v,
                    };
                    set(st, &d, v);
                    return Ok(());
                }
                match (va, vb) {
                    (Av::Int(x), Av::Int(y)) => {
                        let mut out = Vec::new();
                        for p in &x {
                            for q in &y {
                                out.push(if sub { p.add(q.neg()) } else { p.add(*q) });
                            }
                        }
                        Some(wrap(out, bits).map_or(Av::Top, Av::Int))
                    }
                    _ => {
                        self.escapes(st, i, a)?;
                        self.escapes(st, i, b)?;
                        Some(Av::Top)
                    }
                }
            }
            // `mul.lo`, `mul.wide` (of at most 32 bits) and plain `shl`.
            ("mul" | "shl", [_, a, b])
                if int_ty
                    && match parts[..] {
                        ["shl", _] => true,
                        ["mul", "lo", _] => true,
                        ["mul", "wide", _] => bits <= 32,
                        _ => false,
                    } =>
            {
                self.escapes(st, i, a)?;
                self.escapes(st, i, b)?;
                let wide = parts.get(1) == Some(&"wide");
                let src_bits = bits;
                let out_bits = if wide { bits * 2 } else { bits };
                let sgn = ty.starts_with('s');
                let x = int(self.value(st, a, src_bits));
                let y = if base == "shl" {
                    imm(b)
                        .filter(|k| (0..64).contains(k))
                        .map(|k| vec![Si::one(1i128 << k)])
                } else {
                    int(self.value(st, b, src_bits))
                };
                let ext = |s: Set| {
                    if wide && sgn {
                        signed(&s, src_bits)
                    } else {
                        Some(s)
                    }
                };
                Some(match (x.and_then(ext), y.and_then(ext)) {
                    (Some(x), Some(y)) => {
                        let mut out = Vec::new();
                        for p in &x {
                            for q in &y {
                                out.push(p.mul(*q));
                            }
                        }
                        wrap(out, out_bits).map_or(Av::Top, Av::Int)
                    }
                    _ => Av::Top,
                })
            }
            ("shr", [_, a, b]) if int_ty && parts.len() == 2 => {
                self.escapes(st, i, a)?;
                self.escapes(st, i, b)?;
                let sgn = ty.starts_with('s');
                let x = int(self.value(st, a, bits));
                Some(match (x, imm(b).filter(|k| (0..64).contains(k))) {
                    (Some(x), Some(k)) => {
                        let x = if sgn { signed(&x, bits) } else { Some(x) };
                        match x {
                            Some(x) => {
                                let d = 1i128 << k;
                                let out = x
                                    .iter()
                                    .map(|p| {
                                        let s = if p.stride % d == 0 { p.stride / d } else { 1 };
                                        Si::new(p.lo.div_euclid(d), p.hi.div_euclid(d), s)
                                    })
                                    .collect();
                                wrap(out, bits).map_or(Av::Top, Av::Int)
                            }
                            None => Av::Top,
                        }
                    }
                    _ => Av::Top,
                })
            }
            ("and", [_, a, b]) if int_ty && parts.len() == 2 => {
                self.escapes(st, i, a)?;
                self.escapes(st, i, b)?;
                let x = int(self.value(st, a, bits));
                let m = imm(b).map(|m| m.rem_euclid(1i128 << bits));
                Some(match (x, m) {
                    (Some(x), Some(m)) if m & (m + 1) == 0 => {
                        // A low mask: each part within one block stays an
                        // interval.
                        let out = x
                            .iter()
                            .map(|p| {
                                if p.lo / (m + 1) == p.hi / (m + 1) {
                                    Si::new(p.lo & m, p.hi & m, p.stride)
                                } else {
                                    Si::new(0, m, 1)
                                }
                            })
                            .collect();
                        Av::Int(norm(out))
                    }
                    (Some(x), Some(m))
                        if m != 0
                            && (m >> m.trailing_zeros()) & ((m >> m.trailing_zeros()) + 1) == 0 =>
                    {
                        // A contiguous mask `2^(k+1) - 2^t`: the low mask
                        // `2^(k+1) - 1`, then rounded down to a multiple of
                        // `2^t` (monotone, so each part's ends stay ends).
                        let t = m.trailing_zeros();
                        let low = m | ((1i128 << t) - 1);
                        let q = 1i128 << t;
                        let out = x
                            .iter()
                            .map(|p| {
                                let (lo, hi) = if p.lo / (low + 1) == p.hi / (low + 1) {
                                    (p.lo & low, p.hi & low)
                                } else {
                                    (0, low)
                                };
                                Si::new(lo / q * q, hi / q * q, q)
                            })
                            .collect();
                        Av::Int(norm(out))
                    }
                    // Any other mask: at most `m`, a multiple of its lowest
                    // set bit.
                    (_, Some(m)) if m != 0 => {
                        Av::Int(vec![Si::new(0, m, 1i128 << m.trailing_zeros())])
                    }
                    (_, Some(_)) => Av::Int(vec![Si::one(0)]),
                    _ => Av::Top,
                })
            }
            ("cvt", [_, a]) if parts.len() >= 3 => {
                self.escapes(st, i, a)?;
                let dt = parts[parts.len() - 2];
                let (db, sb) = (type_bits(dt).unwrap_or(0), type_bits(ty).unwrap_or(0));
                let integer = |t: &str| {
                    matches!(t.as_bytes().first(), Some(b's' | b'u' | b'b'))
                        && matches!(type_bits(t), Some(8 | 16 | 32 | 64))
                };
                let plain = parts.len() == 3;
                // `value` reads the low `sb` bits of a wider source.
                Some(match self.value(st, a, sb) {
                    Av::Int(x) if plain && integer(dt) && integer(ty) => {
                        let x = if ty.starts_with('s') && db > sb {
                            signed(&x, sb)
                        } else {
                            Some(x)
                        };
                        // A negative signed result is sign-extended into a
                        // wider destination register: known only when not
                        // negative.
                        x.and_then(|x| wrap(x, db))
                            .filter(|x| {
                                !dt.starts_with('s')
                                    || db == 64
                                    || x.iter().all(|p| p.hi >> (db - 1) == 0)
                            })
                            .map_or(Av::Top, Av::Int)
                    }
                    _ => Av::Top,
                })
            }
            ("selp", [_, a, b, Operand::Name(p)]) => {
                self.escapes(st, i, a)?;
                self.escapes(st, i, b)?;
                Some(match get(st, p) {
                    Av::Known(true) => self.value(st, a, bits),
                    Av::Known(false) => self.value(st, b, bits),
                    _ => self.value(st, a, bits).join(&self.value(st, b, bits)),
                })
            }
            ("setp", [Operand::Name(_), a, b]) if parts.len() == 3 => {
                self.escapes(st, i, a)?;
                self.escapes(st, i, b)?;
                let cond = Av::Cond {
                    cmp: parts[1].to_string(),
                    ty: ty.to_string(),
                    a: a.clone(),
                    b: b.clone(),
                    not: false,
                };
                Some(match self.decide(st, &cond) {
                    Some(k) => Av::Known(k),
                    None => cond,
                })
            }
            ("not", [_, Operand::Name(p)]) if ty == "pred" => Some(match get(st, p) {
                Av::Known(k) => Av::Known(!k),
                Av::Cond { cmp, ty, a, b, not } => Av::Cond {
                    cmp: cmp.clone(),
                    ty: ty.clone(),
                    a: a.clone(),
                    b: b.clone(),
                    not: !not,
                },
                _ => Av::Top,
            }),
            _ => None,
        };
        match (result, d) {
            (Some(v), Some(d)) => {
                // A guarded write may not happen: join with the old value.
                let v = match &i.guard {
                    Some((neg, p)) => match get(st, p) {
                        Av::Known(k) if *k != *neg => v,
                        Av::Known(_) => get(st, &d).clone(),
                        _ => v.join(get(st, &d)),
                    },
                    None => v,
                };
                set(st, &d, v);
            }
            _ => {
                for x in o.iter().skip(usize::from(!Self::dests(i).is_empty())) {
                    self.escapes(st, i, x)?;
                }
                for d in Self::dests(i) {
                    set(st, &d, Av::Top);
                }
            }
        }
        Ok(())
    }

    /// The truth of an integer compare when every value decides it.
    fn decide(&self, st: &State, c: &Av) -> Option<bool> {
        let Av::Cond {
            cmp, ty, a, b, not, ..
        } = c
        else {
            return None;
        };
        let bits = type_bits(ty).filter(|b| (1..=64).contains(b))?;
        if ty.starts_with('f') {
            return None;
        }
        let get_set = |o: &Operand| match self.value(st, o, bits) {
            Av::Int(s) => {
                if ty.starts_with('s') {
                    signed(&s, bits)
                } else {
                    Some(s)
                }
            }
            _ => None,
        };
        let (x, y) = (get_set(a)?, get_set(b)?);
        // The signed view is not sorted: the bounds over every part.
        let bounds = |s: &Set| Some((s.iter().map(|p| p.lo).min()?, s.iter().map(|p| p.hi).max()?));
        let ((xl, xh), (yl, yh)) = (bounds(&x)?, bounds(&y)?);
        let r = match cmp.as_str() {
            "eq" if xl == xh && yl == yh => Some(xl == yl),
            "eq" | "ne" if xh < yl || yh < xl => Some(cmp == "ne"),
            "ne" if xl == xh && yl == yh => Some(xl != yl),
            "lt" | "lo" if xh < yl => Some(true),
            "lt" | "lo" if xl >= yh => Some(false),
            "le" | "ls" if xh <= yl => Some(true),
            "le" | "ls" if xl > yh => Some(false),
            "gt" | "hi" if xl > yh => Some(true),
            "gt" | "hi" if xh <= yl => Some(false),
            "ge" | "hs" if xl >= yh => Some(true),
            "ge" | "hs" if xh < yl => Some(false),
            _ => None,
        }?;
        Some(r != *not)
    }

    /// `st` on the edge where predicate `p` is `truth`, or `None` when that
    /// edge cannot be taken.
    fn refine(&self, st: &State, p: &str, truth: bool) -> Option<State> {
        let mut out = st.clone();
        match get(st, p) {
            Av::Known(k) => return (*k == truth).then_some(out),
            Av::Cond {
                cmp, ty, a, b, not, ..
            } => {
                let holds = truth != *not;
                // A compare at a type not modelled here (`.bf16`) bounds
                // nothing, and both of its edges may be taken.
                let Some(bits) = type_bits(ty).filter(|b| (1..=64).contains(b)) else {
                    return Some(out);
                };
                if ty.starts_with('f') {
                    if !matches!(ty.as_str(), "f32" | "f64") {
                        return Some(out);
                    }
                    // |x| (cmp) c with c a constant: the magnitude bound.
                    let (Operand::Name(d), Some(c)) = (a, f_imm(b)) else {
                        return Some(out);
                    };
                    let src = match get(st, d) {
                        Av::Abs(x) => x.clone(),
                        _ => return Some(out),
                    };
                    let (lo, hi) = match get(st, &src) {
                        Av::Mag { lo, hi, .. } => (*lo, *hi),
                        _ => (0.0, f64::INFINITY),
                    };
                    let bound = match (cmp.as_str(), holds) {
                        ("ge" | "gt", true) | ("ltu" | "leu", false) => Some((lo.max(c), hi)),
                        ("lt" | "le", true) | ("geu" | "gtu", false) => Some((lo, hi.min(c))),
                        _ => None,
                    };
                    if let Some((lo, hi)) = bound {
                        if c.is_nan() || lo > hi {
                            return None;
                        }
                        out.insert(src, Av::Mag { bits, lo, hi });
                    }
                    return Some(out);
                }
                // An integer register against a constant.
                let (Operand::Name(r), Some(c)) = (a, imm(b)) else {
                    return Some(out);
                };
                let sgn = ty.starts_with('s');
                // An integer register nothing is known of holds any value
                // of the compare's width.
                let any = vec![Si::new(0, (1i128 << bits) - 1, 1)];
                let x = match get(st, r) {
                    Av::Int(x) => x,
                    Av::Top => &any,
                    _ => return Some(out),
                };
                let view = if sgn {
                    signed(x, bits)
                } else {
                    Some(x.clone())
                };
                let Some(view) = view else { return Some(out) };
                let c = if sgn { c } else { c.rem_euclid(1i128 << bits) };
                let (op, holds) = match cmp.as_str() {
                    "lo" => ("lt", holds),
                    "ls" => ("le", holds),
                    "hi" => ("gt", holds),
                    "hs" => ("ge", holds),
                    o => (o, holds),
                };
                if matches!((op, holds), ("ne", true) | ("eq", false)) {
                    // Only an end of a part can be taken off.
                    let mut kept = Vec::new();
                    for q in view {
                        let s = q.stride.max(1);
                        let lo = if q.lo == c { q.lo + s } else { q.lo };
                        let hi = if q.hi == c { q.hi - s } else { q.hi };
                        if lo <= hi {
                            kept.push(Si::new(lo, hi, q.stride));
                        }
                    }
                    if kept.is_empty() {
                        return None;
                    }
                    out.insert(r.clone(), Av::Int(wrap(kept, bits)?));
                    return Some(out);
                }
                let (op, lo, hi) = match (op, holds) {
                    ("lt", true) | ("ge", false) => ("r", i128::MIN, c - 1),
                    ("le", true) | ("gt", false) => ("r", i128::MIN, c),
                    ("gt", true) | ("le", false) => ("r", c + 1, i128::MAX),
                    ("ge", true) | ("lt", false) => ("r", c, i128::MAX),
                    ("eq", true) | ("ne", false) => ("r", c, c),
                    _ => ("-", 0, 0),
                };
                if op != "r" {
                    return Some(out);
                }
                let mut kept = Vec::new();
                for q in view {
                    let s = q.stride.max(1);
                    // The first and last values of q inside [lo, hi].
                    let a = if q.lo >= lo {
                        q.lo
                    } else {
                        q.lo + (lo - q.lo + s - 1) / s * s
                    };
                    let z = if q.hi <= hi {
                        q.hi
                    } else {
                        q.hi - (q.hi - hi + s - 1) / s * s
                    };
                    if a <= z {
                        kept.push(Si::new(a, z, q.stride));
                    }
                }
                if kept.is_empty() {
                    return None;
                }
                let kept = wrap(kept, bits)?;
                out.insert(r.clone(), Av::Int(kept));
            }
            _ => {}
        }
        Some(out)
    }

    fn run(&mut self) -> Result<(), PtxError> {
        // Each path carries its lineage: a path split off per value (see
        // `split`) starts a new one, and a label's visits are counted per
        // lineage, so that the paths of a split each unroll their loop.
        let mut work: Vec<(usize, State, usize)> = vec![(0, State::new(), 0)];
        let mut lineages = 1usize;
        let mut visits: HashMap<(usize, usize), (usize, State)> = HashMap::new();
        let mut seen: HashMap<usize, Vec<State>> = HashMap::new();
        let mut steps = 0usize;
        // What the steps cost: each write scans the state, each label
        // visit compares it with every state kept there.
        let mut cost = 0usize;
        while let Some((mut pc, mut st, lineage)) = work.pop() {
            while let Some(s) = self.body.get(pc) {
                steps += 1;
                cost = cost.saturating_add(1 + st.len());
                if let Some(kept) = seen.get(&pc) {
                    cost = cost.saturating_add(kept.len().saturating_mul(1 + st.len()));
                }
                if cost > MAX_COST {
                    return Err(refuse(
                        SubReason::TooComplex,
                        0,
                        format!(
                            "proving the accesses of the local frame `{}` costs more than {MAX_COST} state entries visited",
                            self.frame
                        ),
                    ));
                }
                if steps > MAX_STEPS {
                    return Err(refuse(
                        SubReason::TooComplex,
                        0,
                        format!(
                            "proving the accesses of the local frame `{}` takes more than {MAX_STEPS} steps",
                            self.frame
                        ),
                    ));
                }
                match s {
                    Stmt::Label { .. } => {
                        // What no path reads again is forgotten, so that
                        // paths that differ only there meet.
                        if let Some(live) = self.live.get(pc) {
                            let regs = &self.regs;
                            st.retain(|k, _| {
                                k.starts_with('#') || regs.get(k).is_some_and(|k| live.contains(k))
                            });
                        }
                        let at = seen.entry(pc).or_default();
                        if at.contains(&st) {
                            break;
                        }
                        let (count, last) = visits
                            .entry((pc, lineage))
                            .or_insert_with(|| (0, State::new()));
                        if *count >= UNROLL {
                            // Widen: forget what changed since the last visit.
                            {
                                let keys: Vec<String> =
                                    st.keys().chain(last.keys()).cloned().collect();
                                let mut w = State::new();
                                for k in keys {
                                    let v = get(&st, &k).join(get(last, &k));
                                    let v = match v {
                                        Av::Int(_) if get(&st, &k) != get(last, &k) => Av::Top,
                                        Av::Frame(_) if get(&st, &k) != get(last, &k) => {
                                            Av::Frame(vec![Si::new(
                                                i128::from(i64::MIN),
                                                i128::from(i64::MAX),
                                                1,
                                            )])
                                        }
                                        v => v,
                                    };
                                    if v != Av::Top {
                                        w.insert(k, v);
                                    }
                                }
                                st = w;
                                if at.contains(&st) {
                                    break;
                                }
                            }
                        }
                        *count += 1;
                        *last = st.clone();
                        at.push(st.clone());
                        pc += 1;
                    }
                    Stmt::Instr(i) => {
                        let base = i.opcode.split('.').next().unwrap_or("");
                        match base {
                            "brx" | "call" => {
                                return Err(self.err(
                                    i.line,
                                    format!(
                                        "`{}`: control flow the proof of the local frame `{}` does not follow",
                                        i.opcode, self.frame
                                    ),
                                ));
                            }
                            "ret" | "exit" if i.guard.is_none() => break,
                            "ret" | "exit" => pc += 1,
                            "bra" => {
                                let Some(Operand::Name(l)) = i.operands.first() else {
                                    return Err(self.err(i.line, "a branch without a label".into()));
                                };
                                let Some(&target) = self.labels.get(l.as_str()) else {
                                    return Err(self.err(i.line, format!("no label `{l}`")));
                                };
                                match &i.guard {
                                    None => pc = target,
                                    Some((neg, p)) => {
                                        let taken = self.refine(&st, p, !neg);
                                        let fall = self.refine(&st, p, *neg);
                                        match (taken, fall) {
                                            (Some(t), Some(f)) => {
                                                work.push((target, t, lineage));
                                                st = f;
                                                pc += 1;
                                            }
                                            (Some(t), None) => {
                                                st = t;
                                                pc = target;
                                            }
                                            (None, Some(f)) => {
                                                st = f;
                                                pc += 1;
                                            }
                                            (None, None) => break,
                                        }
                                    }
                                }
                            }
                            _ => {
                                self.step(pc, i, &mut st)?;
                                // A register a register-to-register compare
                                // depends on, with a few values: one path each.
                                if let Some(Operand::Name(d)) = i.operands.first() {
                                    let wanted = self.regs.get(d).is_some_and(|k| {
                                        self.split.get(pc).is_some_and(|r| r.contains(k))
                                    });
                                    if wanted {
                                        if let Av::Int(v) = get(&st, d) {
                                            let n = count(v);
                                            if n > 1 && n <= MAX_SPLIT {
                                                let values: Vec<i128> = v
                                                    .iter()
                                                    .flat_map(|p| {
                                                        let step = p.stride.max(1);
                                                        (0..=(p.hi - p.lo) / step)
                                                            .map(move |k| p.lo + k * step)
                                                    })
                                                    .collect();
                                                let d = d.clone();
                                                for &x in values.iter().skip(1) {
                                                    let mut other = st.clone();
                                                    set(&mut other, &d, Av::Int(vec![Si::one(x)]));
                                                    preimage(i, x, &mut other);
                                                    // At most MAX_STEPS lineages
                                                    // (each costs a step).
                                                    let l = if lineages < MAX_STEPS {
                                                        lineages += 1;
                                                        lineages
                                                    } else {
                                                        lineage
                                                    };
                                                    work.push((pc + 1, other, l));
                                                }
                                                if let Some(&x) = values.first() {
                                                    set(&mut st, &d, Av::Int(vec![Si::one(x)]));
                                                    preimage(i, x, &mut st);
                                                }
                                            }
                                        }
                                    }
                                }
                                pc += 1;
                            }
                        }
                    }
                    _ => pc += 1,
                }
            }
        }
        Ok(())
    }
}

/// The declared width in bits of every register of the body.
fn register_widths(body: &[Stmt]) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for s in body {
        if let Stmt::Reg {
            ty, name, count, ..
        } = s
        {
            let bits = if ty == "pred" {
                1
            } else {
                type_bits(ty).unwrap_or(0)
            };
            match count {
                Some(n) => {
                    for k in 0..*n {
                        out.insert(format!("{name}{k}"), bits);
                    }
                }
                None => {
                    out.insert(name.clone(), bits);
                }
            }
        }
    }
    out
}

/// Proves and lowers entry `symbol`'s indexed local frame and the
/// constant tables it reads (see the module doc). Leaves the module as it
/// is when it has neither, or a frame of a shape this does not take (the
/// verifier then refuses `local_memory`).
pub fn lower_indexed(module: &mut Module, symbol: &str) -> Result<(), PtxError> {
    // The constant tables: initialized `.global`/`.const` arrays.
    let tables: Vec<(String, Vec<u8>)> = module
        .variables
        .iter()
        .filter(|v| matches!(v.space.as_str(), "global" | "const"))
        .filter_map(|v| Some((v.name.clone(), v.init.clone()?)))
        .filter(|(_, b)| !b.is_empty() && b.len() as u64 <= MAX_INDEXED_FRAME)
        .collect();
    let Some(f) = module
        .functions
        .iter_mut()
        .find(|f| f.is_entry && f.name == symbol)
    else {
        return Ok(());
    };
    let Some(body) = f.body.as_mut() else {
        return Ok(());
    };
    let frames: Vec<usize> = body
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Stmt::Var { space, .. } if space == "local"))
        .map(|(at, _)| at)
        .collect();
    let used_tables: Vec<(String, Vec<u8>)> = tables
        .into_iter()
        .filter(|(n, _)| {
            body.iter().any(|s| match s {
                Stmt::Instr(i) => super::instr_names(i).contains(&n.as_str())
                    || i.operands.iter().any(
                        |o| matches!(o, Operand::Addr { base: AddrBase::Name(b), .. } if b == n),
                    ),
                _ => false,
            })
        })
        .collect();
    let frame_at = match frames[..] {
        [] if used_tables.is_empty() => return Ok(()),
        [] => None,
        [at] => Some(at),
        _ => return Ok(()),
    };
    let (frame, size, var_line) = match frame_at.map(|at| &body[at]) {
        Some(Stmt::Var {
            name,
            bytes: Some(size),
            line,
            ..
        }) => (name.clone(), *size, *line),
        Some(_) => return Ok(()),
        None => (String::new(), 0, 0),
    };
    if let Some(at) = frame_at {
        if !zeroed_before_use(body, at) {
            return Ok(());
        }
    }
    if size > MAX_INDEXED_FRAME {
        return Err(refuse(
            SubReason::LocalMemory,
            var_line,
            format!(
                "the local frame `{frame}` has {size} bytes, more than the {MAX_INDEXED_FRAME} an indexed frame may have"
            ),
        ));
    }
    // The lowering's own names (scopes renamed apart use the other prefix).
    if uses_reserved(body, &RESERVED[..1]) {
        return Ok(());
    }
    let mut labels = HashMap::new();
    for (at, s) in body.iter().enumerate() {
        if let Stmt::Label { name, .. } = s {
            labels.insert(name.as_str(), at);
        }
    }
    let regs = register_widths(body);
    let mut numbers = Regs::default();
    let flow = Flow::new(body, &labels, &mut numbers);
    let split = split_registers(body, &flow, &numbers)?;
    let live = live_registers(body, &flow, &numbers)?;
    let mut prover = Prover {
        body,
        frame: &frame,
        size,
        tables: &used_tables,
        tables_ok: !used_tables.is_empty(),
        labels,
        accesses: HashMap::new(),
        split,
        live,
        regs: numbers,
        pointers: HashMap::new(),
    };
    prover.run()?;
    let tables_ok = prover.tables_ok;
    let pointers = std::mem::take(&mut prover.pointers);
    // A statement that moves a frame address on one path does so on all.
    if let Some(&at) = pointers.keys().find(|at| prover.accesses.contains_key(at)) {
        let (line, opcode) = match body.get(at) {
            Some(Stmt::Instr(i)) => (i.line, i.opcode.as_str()),
            _ => (var_line, ""),
        };
        return Err(refuse(
            SubReason::LocalMemory,
            line,
            format!(
                "`{opcode}` moves a frame address of the local frame `{frame}` on one path and other data on another"
            ),
        ));
    }
    // A slot that holds a frame address is touched by nothing else.
    let mut pointer_slots: Vec<i128> = pointers.values().map(|(_, off)| *off).collect();
    pointer_slots.sort_unstable();
    pointer_slots.dedup();
    for (&at, a) in &prover.accesses {
        let Some(a) = a.as_ref().filter(|a| a.region.is_none()) else {
            continue;
        };
        if let Some(p) = pointer_slots
            .iter()
            .find(|&&p| a.span.0 < p + 8 && p < a.span.1)
        {
            let (line, opcode) = match body.get(at) {
                Some(Stmt::Instr(i)) => (i.line, i.opcode.as_str()),
                _ => (var_line, ""),
            };
            return Err(refuse(
                SubReason::LocalMemory,
                line,
                format!(
                    "`{opcode}` may access bytes {}..{} of the local frame `{frame}`, which overlap the slot at byte {p} that holds a frame address",
                    a.span.0, a.span.1
                ),
            ));
        }
    }
    let accesses: Vec<(usize, Access)> = prover
        .accesses
        .into_iter()
        .filter_map(|(at, a)| a.map(|a| (at, a)))
        .filter(|(_, a)| a.region.is_none() || tables_ok)
        .collect();
    if frame_at.is_none() && !tables_ok {
        return Ok(());
    }
    let width = accesses
        .iter()
        .find(|(_, a)| a.region.is_none())
        .map_or(4, |(_, a)| a.width);
    // A byte-wide frame would be lowered to `.b8` registers, which PTX
    // does not have: refused naming the client's first byte access (not
    // an instruction of the lowering).
    if frame_at.is_some() && width == 1 {
        let first = accesses
            .iter()
            .filter(|(_, a)| a.region.is_none())
            .map(|(at, _)| *at)
            .min();
        if let Some(Stmt::Instr(i)) = first.and_then(|at| body.get(at)) {
            return Err(refuse(
                SubReason::OperandType,
                i.line,
                format!(
                    "`{}` accesses the local frame `{frame}` one byte at a time: its slots would be 8-bit registers, which PTX does not have",
                    i.opcode
                ),
            ));
        }
    }
    if frame_at.is_some() && (size % u64::from(width) != 0 || size / u64::from(width) > MAX_SLOTS) {
        return Err(refuse(
            SubReason::LocalMemory,
            var_line,
            format!(
                "the local frame `{frame}` of {size} bytes is not a whole number of at most {MAX_SLOTS} slots of {width} bytes"
            ),
        ));
    }
    let slots = if frame_at.is_some() {
        (size / u64::from(width)) as i64
    } else {
        0
    };
    let bits = width * 8;
    let slot = |k: i64| Operand::Name(format!("%__fs{k}"));
    let fo = Operand::Name("%__fo".to_string());
    let fp = Operand::Name("%__fp".to_string());
    let fv = |b: u32| Operand::Name(format!("%__fv{b}"));
    let mut temps: Vec<u32> = vec![bits];
    let mut rewritten: HashMap<usize, Vec<Instr>> = HashMap::new();
    for (at, a) in &accesses {
        let Stmt::Instr(i) = &body[*at] else { continue };
        let mk = |opcode: String, operands: Vec<Operand>| Instr {
            guard: i.guard.clone(),
            opcode,
            operands,
            line: i.line,
            col: i.col,
        };
        let (addr, value) = if a.store {
            (&i.operands[0], &i.operands[1])
        } else {
            (&i.operands[1], &i.operands[0])
        };
        let Operand::Addr {
            base: AddrBase::Name(b),
            offset,
        } = addr
        else {
            continue;
        };
        let named = *b == frame || used_tables.iter().any(|t| t.0 == *b);
        let base = if named {
            Operand::Imm(Imm::Int(0))
        } else {
            Operand::Name(b.clone())
        };
        let mut out = vec![mk(
            "add.s64".into(),
            vec![fo.clone(), base, Operand::Imm(Imm::Int(*offset))],
        )];
        let lanes: Vec<Operand> = match value {
            Operand::List(l) => l.clone(),
            v => vec![v.clone()],
        };
        if lanes.len() != a.lanes {
            continue;
        }
        let ty = a.ty.as_str();
        let w = a.width;
        let wb = w * 8;
        if !temps.contains(&wb) {
            temps.push(wb);
        }
        let fty = format!("b{wb}");
        let fv = fv(wb);
        // A table's value at byte `o`, as a literal of the load's width.
        let word = |t: &[u8], o: i64| -> Operand {
            let mut v = [0u8; 8];
            let o = o as usize;
            if let Some(src) = t.get(o..o + w as usize) {
                v[..w as usize].copy_from_slice(src);
            }
            let u = u64::from_le_bytes(v);
            Operand::Imm(Imm::Int(match w {
                2 => i64::from(u as u16 as i16),
                4 => i64::from(u as u32 as i32),
                _ => u as i64,
            }))
        };
        let table = a.region.and_then(|k| used_tables.get(k)).map(|t| &t.1[..]);
        let count = match table {
            Some(t) => (t.len() / w as usize) as i64,
            None => slots,
        };
        let pick = |k: i64| match table {
            Some(t) => word(t, k * i64::from(w)),
            None => slot(k),
        };
        for (j, v) in lanes.iter().enumerate() {
            let lane = j as i64 * i64::from(w);
            let vbits = match v {
                Operand::Name(n) => regs.get(n).copied().unwrap_or(wb),
                _ => wb,
            };
            if a.store {
                if vbits > wb && !ty.starts_with('f') {
                    out.push(mk(
                        format!("cvt.u{wb}.u{vbits}"),
                        vec![fv.clone(), v.clone()],
                    ));
                } else {
                    out.push(mk(format!("mov.{fty}"), vec![fv.clone(), v.clone()]));
                }
                for k in 0..count {
                    out.push(mk(
                        "setp.eq.s64".into(),
                        vec![
                            fp.clone(),
                            fo.clone(),
                            Operand::Imm(Imm::Int(k * i64::from(w) - lane)),
                        ],
                    ));
                    out.push(mk(
                        format!("selp.{fty}"),
                        vec![slot(k), fv.clone(), slot(k), fp.clone()],
                    ));
                }
            } else {
                out.push(mk(format!("mov.{fty}"), vec![fv.clone(), pick(0)]));
                for k in 1..count {
                    out.push(mk(
                        "setp.eq.s64".into(),
                        vec![
                            fp.clone(),
                            fo.clone(),
                            Operand::Imm(Imm::Int(k * i64::from(w) - lane)),
                        ],
                    ));
                    out.push(mk(
                        format!("selp.{fty}"),
                        vec![fv.clone(), pick(k), fv.clone(), fp.clone()],
                    ));
                }
                if vbits > wb && !ty.starts_with('f') {
                    let s = if ty.starts_with('s') { 's' } else { 'u' };
                    out.push(mk(
                        format!("cvt.{s}{vbits}.{s}{wb}"),
                        vec![v.clone(), fv.clone()],
                    ));
                } else {
                    out.push(mk(format!("mov.{fty}"), vec![v.clone(), fv.clone()]));
                }
            }
        }
        rewritten.insert(*at, out);
    }
    // Each slot holding a frame address is one `.b64` register.
    let pointer_reg = |off: i128| Operand::Name(format!("%__fq{off}"));
    for (&at, &(store, off)) in &pointers {
        let Stmt::Instr(i) = &body[at] else { continue };
        let (addr_at, value) = if store { (0, 1) } else { (1, 0) };
        let (Some(v), Some(_)) = (i.operands.get(value), i.operands.get(addr_at)) else {
            continue;
        };
        let operands = if store {
            vec![pointer_reg(off), v.clone()]
        } else {
            vec![v.clone(), pointer_reg(off)]
        };
        rewritten.insert(
            at,
            vec![Instr {
                guard: None,
                opcode: "mov.b64".into(),
                operands,
                line: i.line,
                col: i.col,
            }],
        );
    }
    let reg = |ty: &str, name: String| Stmt::Reg {
        ty: ty.to_string(),
        name,
        count: None,
        line: var_line,
        col: 0,
    };
    let mut decls = vec![reg("b64", "%__fo".into()), reg("pred", "%__fp".into())];
    for b in &temps {
        decls.push(reg(&format!("b{b}"), format!("%__fv{b}")));
    }
    for &p in &pointer_slots {
        decls.push(reg("b64", format!("%__fq{p}")));
    }
    let mut out = Vec::with_capacity(body.len() + accesses.len() * 4 * slots as usize);
    // The temporaries go first in the body: a table may be read outside
    // the scope of a callee's frame.
    out.append(&mut decls);
    for (at, s) in body.drain(..).enumerate() {
        if Some(at) == frame_at {
            for k in 0..slots {
                out.push(reg(&format!("b{bits}"), format!("%__fs{k}")));
            }
            // Zeroed where the frame is declared: a never-written byte
            // reads 0.
            for k in 0..slots {
                out.push(Stmt::Instr(Instr {
                    guard: None,
                    opcode: format!("mov.b{bits}"),
                    operands: vec![slot(k), Operand::Imm(Imm::Int(0))],
                    line: var_line,
                    col: 0,
                }));
            }
            for &p in &pointer_slots {
                out.push(Stmt::Instr(Instr {
                    guard: None,
                    opcode: "mov.b64".into(),
                    operands: vec![pointer_reg(p), Operand::Imm(Imm::Int(0))],
                    line: var_line,
                    col: 0,
                }));
            }
            continue;
        }
        if let Some(instrs) = rewritten.remove(&at) {
            out.extend(instrs.into_iter().map(Stmt::Instr));
            continue;
        }
        match s {
            Stmt::Instr(mut i) => {
                // A frame's or table's address is offset 0 of it.
                for o in &mut i.operands {
                    let lowered = matches!(o, Operand::Name(n)
                        if (frame_at.is_some() && *n == frame)
                            || (tables_ok && used_tables.iter().any(|t| t.0 == *n)));
                    if lowered {
                        *o = Operand::Imm(Imm::Int(0));
                    }
                }
                if frame_at.is_some() && i.opcode == "cvta.local.u64" {
                    i.opcode = "mov.u64".into();
                }
                out.push(Stmt::Instr(i));
            }
            s => out.push(s),
        }
    }
    *body = out;
    Ok(())
}

/// Whether the zeroing the lowering puts at the frame's declaration runs
/// before any use: no instruction precedes it in its scope (the body, or
/// the `{ }` it opens — an inlined callee's), and no branch from outside
/// that scope enters it.
fn zeroed_before_use(body: &[Stmt], var_at: usize) -> bool {
    let mut depth = 0i32;
    let mut open = None;
    for at in (0..var_at).rev() {
        match body[at] {
            Stmt::Close => depth += 1,
            Stmt::Open if depth == 0 => {
                open = Some(at);
                break;
            }
            Stmt::Open => depth -= 1,
            _ => {}
        }
    }
    let start = open.map_or(0, |o| o + 1);
    if body[start..var_at].iter().any(|s| {
        matches!(
            s,
            Stmt::Instr(_) | Stmt::Label { .. } | Stmt::Open | Stmt::Close
        )
    }) {
        return false;
    }
    let Some(open) = open else { return true };
    // The matching `}`.
    let mut depth = 0i32;
    let mut close = None;
    for (at, s) in body.iter().enumerate().skip(open) {
        match s {
            Stmt::Open => depth += 1,
            Stmt::Close => {
                depth -= 1;
                if depth == 0 {
                    close = Some(at);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(close) = close else { return false };
    let inside: Vec<&str> = body[open..close]
        .iter()
        .filter_map(|s| match s {
            Stmt::Label { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    body.iter().enumerate().all(|(at, s)| match s {
        Stmt::Instr(i) if (at < open || at > close) => !i
            .operands
            .iter()
            .any(|o| matches!(o, Operand::Name(n) if inside.contains(&n.as_str()))),
        _ => true,
    })
}

/// Renames the scoped declarations of entry `symbol` ([`flatten_scopes`])
/// when the body has a `.local` frame (the entry's or an inlined callee's)
/// and a scope. `false` when the renaming declined: names would stay
/// conflated across scopes, so the frame must not be proved.
pub fn flatten_frame_scopes(module: &mut Module, symbol: &str) -> bool {
    let Some(body) = module
        .functions
        .iter_mut()
        .find(|f| f.is_entry && f.name == symbol)
        .and_then(|f| f.body.as_mut())
    else {
        return true;
    };
    // The proof tracks registers by name: with a frame anywhere in the
    // body, every scope's registers are renamed apart (an inlined callee's
    // `%rd1` is not the entry's `%rd1`, whichever of them the frame is in).
    let framed = body
        .iter()
        .any(|s| matches!(s, Stmt::Var { space, .. } if space == "local"));
    let scoped = body.iter().any(|s| matches!(s, Stmt::Open));
    !(framed && scoped) || flatten_scopes(body)
}

/// The names the lowering and [`flatten_scopes`] make: a body already
/// naming one of them is left alone (its frame stays refused).
const RESERVED: [&str; 2] = ["%__f", "__sc"];

fn uses_reserved(body: &[Stmt], prefixes: &[&str]) -> bool {
    let reserved = |n: &str| {
        prefixes
            .iter()
            .any(|r| n.starts_with(r) || n.trim_start_matches('%').starts_with(r))
    };
    body.iter().any(|s| match s {
        Stmt::Reg { name, .. } | Stmt::Var { name, .. } => reserved(name),
        Stmt::Instr(i) => super::instr_names(i).into_iter().any(reserved),
        _ => false,
    })
}

/// Gives every register and variable declared inside a `{ }` scope a name
/// of its own (`%__sc<k>_<name>`), so that the frame proof can track
/// registers by name: an inlined callee's `%SP`, `%SPL` and frame no longer
/// shadow the caller's. The scopes themselves stay. `false` (and the body
/// untouched) when the body already uses a reserved name or its scopes do
/// not balance.
pub(super) fn flatten_scopes(body: &mut [Stmt]) -> bool {
    if uses_reserved(body, &RESERVED) {
        return false;
    }
    // Per open scope: (declared name, count of a `%r<N>` range, new name).
    let mut scopes: Vec<Vec<(String, Option<u32>, String)>> = vec![Vec::new()];
    let mut depth_ok = true;
    let mut fresh = 0u32;
    let mut renamed: Vec<Stmt> = Vec::with_capacity(body.len());
    let rename = |scopes: &[Vec<(String, Option<u32>, String)>], n: &str| -> Option<String> {
        let digits = n.len() - n.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, index) = n.split_at(n.len() - digits);
        let index: Option<u32> = index.parse().ok();
        for scope in scopes.iter().rev() {
            for (d, count, new) in scope.iter().rev() {
                match count {
                    None if d == n => return Some(new.clone()),
                    Some(c) if d == prefix && index.is_some_and(|i| i < *c) => {
                        return Some(format!("{new}{}", &n[prefix.len()..]));
                    }
                    _ => {}
                }
            }
        }
        None
    };
    for s in body.iter() {
        let s = match s {
            Stmt::Open => {
                scopes.push(Vec::new());
                Stmt::Open
            }
            Stmt::Close => {
                scopes.pop();
                if scopes.is_empty() {
                    depth_ok = false;
                    scopes.push(Vec::new());
                }
                Stmt::Close
            }
            Stmt::Reg {
                ty,
                name,
                count,
                line,
                col,
            } if scopes.len() > 1 => {
                fresh += 1;
                let new = format!("%__sc{fresh}_{}", name.trim_start_matches('%'));
                if let Some(scope) = scopes.last_mut() {
                    scope.push((name.clone(), *count, new.clone()));
                }
                Stmt::Reg {
                    ty: ty.clone(),
                    name: new,
                    count: *count,
                    line: *line,
                    col: *col,
                }
            }
            Stmt::Var {
                space,
                name,
                bytes,
                line,
            } if scopes.len() > 1 => {
                fresh += 1;
                let new = format!("__sc{fresh}_{name}");
                if let Some(scope) = scopes.last_mut() {
                    scope.push((name.clone(), None, new.clone()));
                }
                Stmt::Var {
                    space: space.clone(),
                    name: new,
                    bytes: *bytes,
                    line: *line,
                }
            }
            Stmt::Instr(i) => {
                let mut i = i.clone();
                let fix = |n: &mut String| {
                    if let Some(new) = rename(&scopes, n) {
                        *n = new;
                    }
                };
                if let Some((_, g)) = &mut i.guard {
                    fix(g);
                }
                for o in &mut i.operands {
                    match o {
                        Operand::Name(n) | Operand::Not(n) => fix(n),
                        Operand::Pair(a, b) => {
                            fix(a);
                            fix(b);
                        }
                        Operand::Addr {
                            base: AddrBase::Name(n),
                            ..
                        } => fix(n),
                        Operand::List(l) => {
                            for x in l {
                                match x {
                                    Operand::Name(n) | Operand::Not(n) => fix(n),
                                    Operand::Addr {
                                        base: AddrBase::Name(n),
                                        ..
                                    } => fix(n),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
                Stmt::Instr(i)
            }
            other => other.clone(),
        };
        renamed.push(s);
    }
    if !depth_ok || scopes.len() != 1 {
        return false;
    }
    for (slot, s) in body.iter_mut().zip(renamed) {
        *slot = s;
    }
    true
}
