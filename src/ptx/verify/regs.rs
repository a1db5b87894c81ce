//! A register file for the analyses' per-block states whose copies share
//! structure: copying one costs O(1), writing a register O(log n), and
//! joining two costs time proportional to the registers in which they
//! differ, not to the number of registers.
//!
//! The dataflow (`cfg.rs`) and the must-define analysis (`defined.rs`) keep
//! one state per basic block. As full vectors that is blocks × registers,
//! quadratic in the text (a replicated elementwise body of 64 KiB was
//! already 27 MiB, 512 KiB 1.4 GiB). Here a block's state shares every
//! subtree it did not change with the state it came from, so the states of
//! all blocks together hold only what the instructions wrote.
//!
//! Invariants:
//! - The shape is fixed by the length: a tree of `FAN`-way inner nodes of
//!   one depth over leaves of `FAN` values. Two files of one length have
//!   the same shape, so a join walks both in step; slots past the length
//!   hold the fill value in every file and are never read.
//! - A file is a value: [`Regs::set`] copies every shared node on its path
//!   (`Rc::make_mut`), so no write through one file is seen in another.
//! - [`Regs::join_with`] skips subtrees shared by both files (`Rc::ptr_eq`),
//!   so it is exact only for an idempotent `f` (`f(x, x) == x`), as every
//!   join and meet of a lattice is; where the result equals the other
//!   file's subtree it takes that subtree, so joins keep files sharing.
//! - Recursion is bounded by the depth: 7 for the 2^19 registers the
//!   parser's token cap allows, 11 for any count a `u32` index can name.

use std::collections::HashMap;
use std::rc::Rc;

/// Children per inner node, values per leaf.
const FAN: usize = 8;
/// `log2(FAN)`.
const BITS: u32 = 3;

#[derive(Clone)]
enum Node<T> {
    Leaf([T; FAN]),
    Inner([Rc<Node<T>>; FAN]),
}

/// `len` values of `T`, indexed by register id (or word of registers).
#[derive(Clone)]
pub(super) struct Regs<T> {
    root: Rc<Node<T>>,
    len: usize,
    /// Inner levels above the leaves.
    depth: u32,
}

/// Which child of a node at `level` (1 = just above the leaves) holds `i`.
fn slot(i: usize, level: u32) -> usize {
    (i >> (BITS * level)) & (FAN - 1)
}

impl<T: Copy + PartialEq> Regs<T> {
    /// `len` copies of `fill`, in O(depth) memory (every subtree shared).
    pub(super) fn new(len: usize, fill: T) -> Regs<T> {
        let mut root = Rc::new(Node::Leaf([fill; FAN]));
        let mut depth = 0;
        while (FAN as u128) << (BITS * depth) < len as u128 {
            let child = root;
            root = Rc::new(Node::Inner(std::array::from_fn(|_| child.clone())));
            depth += 1;
        }
        Regs { root, len, depth }
    }

    pub(super) fn get(&self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        let mut node = &self.root;
        let mut level = self.depth;
        loop {
            match &**node {
                Node::Inner(children) => {
                    node = &children[slot(i, level)];
                    level = level.saturating_sub(1);
                }
                Node::Leaf(values) => return Some(values[i & (FAN - 1)]),
            }
        }
    }

    /// Writes `v` at `i` (nothing past the length); copies only the shared
    /// nodes on the path, and nothing when `i` already holds `v`.
    pub(super) fn set(&mut self, i: usize, v: T) {
        if i >= self.len || self.get(i) == Some(v) {
            return;
        }
        let mut node = &mut self.root;
        let mut level = self.depth;
        loop {
            match Rc::make_mut(node) {
                Node::Inner(children) => {
                    node = &mut children[slot(i, level)];
                    level = level.saturating_sub(1);
                }
                Node::Leaf(values) => {
                    values[i & (FAN - 1)] = v;
                    return;
                }
            }
        }
    }

    /// `self[i] = f(self[i], other[i])` for every `i`; whether anything
    /// changed. `f` must be idempotent (see the module doc). `memo` counts
    /// the nodes visited, which the callers bound.
    pub(super) fn join_with(
        &mut self,
        other: &Regs<T>,
        f: impl Fn(T, T) -> T,
        memo: &mut JoinMemo<T>,
    ) -> bool {
        if self.len != other.len || self.depth != other.depth {
            // Files of one analysis always have one length; joining others
            // would be meaningless, so refuse to change anything.
            return false;
        }
        join_node(&mut self.root, &other.root, &f, memo)
    }
}

/// The joins of node pairs already computed, by the nodes' addresses, and
/// the work done. One memo serves one analysis (one `f`): a kernel that
/// makes many blocks meet the same two differing states (or states that
/// differ from those in a few registers) pays for each distinct pair of
/// subtrees once, in time and in memory. Each entry holds both nodes, so
/// neither address can be reused by another node while the memo lives,
/// and no node it holds can be changed in place (`Rc::make_mut` copies a
/// node that has another owner).
pub(super) struct JoinMemo<T> {
    seen: HashMap<(usize, usize), Joined<T>>,
    /// Nodes visited and not answered from `seen`: the work the analyses
    /// bound.
    pub(super) work: usize,
}

struct Joined<T> {
    _inputs: (Rc<Node<T>>, Rc<Node<T>>),
    result: Rc<Node<T>>,
    changed: bool,
}

impl<T> JoinMemo<T> {
    pub(super) fn new() -> JoinMemo<T> {
        JoinMemo {
            seen: HashMap::new(),
            work: 0,
        }
    }
}

fn join_node<T: Copy + PartialEq>(
    a: &mut Rc<Node<T>>,
    b: &Rc<Node<T>>,
    f: &impl Fn(T, T) -> T,
    memo: &mut JoinMemo<T>,
) -> bool {
    if Rc::ptr_eq(a, b) {
        return false;
    }
    let key = (Rc::as_ptr(a) as usize, Rc::as_ptr(b) as usize);
    if let Some(done) = memo.seen.get(&key) {
        *a = done.result.clone();
        return done.changed;
    }
    memo.work = memo.work.saturating_add(1);
    let inputs = (a.clone(), b.clone());
    let changed = match (&**a, &**b) {
        (Node::Leaf(x), Node::Leaf(y)) => {
            let joined: [T; FAN] = std::array::from_fn(|j| f(x[j], y[j]));
            if joined == *x {
                false
            } else {
                *a = if joined == *y {
                    b.clone()
                } else {
                    Rc::new(Node::Leaf(joined))
                };
                true
            }
        }
        (Node::Inner(x), Node::Inner(y)) => {
            let mut children = x.clone();
            let mut changed = false;
            for (c, d) in children.iter_mut().zip(y.iter()) {
                changed |= join_node(c, d, f, memo);
            }
            if changed {
                *a = if children.iter().zip(y.iter()).all(|(c, d)| Rc::ptr_eq(c, d)) {
                    b.clone()
                } else {
                    Rc::new(Node::Inner(children))
                };
            }
            changed
        }
        // One shape per length: never two different node kinds.
        _ => false,
    };
    memo.seen.insert(
        key,
        Joined {
            _inputs: inputs,
            result: a.clone(),
            changed,
        },
    );
    changed
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::{JoinMemo, Regs};

    /// Files built by random writes, copies and joins read exactly like
    /// plain vectors put through the same steps, at lengths around every
    /// depth boundary (so padding slots and shared subtrees are covered),
    /// with a join that is idempotent but not a plain max on the bits.
    #[test]
    fn shared_files_read_like_plain_vectors() {
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // A small lattice: 0 bottom-ish values, joins of unequal values go
        // to 255 (as `V::join` sends unequal data to `Top`).
        let join = |a: u8, b: u8| if a == b { a } else { 255 };
        for len in [0, 1, 15, 16, 17, 255, 256, 257, 4097, 70_000] {
            let mut files: Vec<(Regs<u8>, Vec<u8>)> = vec![(Regs::new(len, 7), vec![7; len])];
            let mut memo = JoinMemo::new();
            for _ in 0..400 {
                let at = rng.random_range(0..files.len());
                match rng.random_range(0..4) {
                    0 | 1 if len > 0 => {
                        let (i, v) = (rng.random_range(0..len), rng.random_range(0..4u8));
                        files[at].0.set(i, v);
                        files[at].1[i] = v;
                    }
                    2 => {
                        let copy = files[at].clone();
                        files.push(copy);
                    }
                    _ => {
                        let other = rng.random_range(0..files.len());
                        let (theirs, plain) = files[other].clone();
                        let before = files[at].1.clone();
                        let changed = files[at].0.join_with(&theirs, join, &mut memo);
                        for (a, b) in files[at].1.iter_mut().zip(&plain) {
                            *a = join(*a, *b);
                        }
                        assert_eq!(changed, files[at].1 != before, "seed {seed} len {len}");
                    }
                }
            }
            for (shared, plain) in &files {
                for (i, v) in plain.iter().enumerate() {
                    assert_eq!(shared.get(i), Some(*v), "seed {seed} len {len} at {i}");
                }
                assert_eq!(shared.get(len), None);
            }
        }
    }

    /// Many joins of the same two differing files cost one walk: the
    /// second and later are answered from the memo.
    #[test]
    fn a_repeated_join_is_answered_from_the_memo() {
        let a = Regs::new(100_000, 0u8);
        let mut b = a.clone();
        for i in (0..100_000).step_by(3) {
            b.set(i, 1);
        }
        let mut memo = JoinMemo::new();
        let mut first = a.clone();
        assert!(first.join_with(&b, |x, y| x.max(y), &mut memo));
        let once = memo.work;
        assert!(once > 6000, "{once}");
        for _ in 0..1000 {
            let mut again = a.clone();
            assert!(again.join_with(&b, |x, y| x.max(y), &mut memo));
            assert_eq!(again.get(99_999), Some(1));
        }
        assert_eq!(memo.work, once);
    }
}
