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
//! - Recursion is bounded by the depth, at most 5 for any register count a
//!   `u32` index can name.

use std::rc::Rc;

/// Children per inner node, values per leaf.
const FAN: usize = 16;
/// `log2(FAN)`.
const BITS: u32 = 4;

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
    /// changed. `f` must be idempotent (see the module doc). `work` counts
    /// the nodes visited, which the callers bound.
    pub(super) fn join_with(
        &mut self,
        other: &Regs<T>,
        f: impl Fn(T, T) -> T,
        work: &mut usize,
    ) -> bool {
        if self.len != other.len || self.depth != other.depth {
            // Files of one analysis always have one length; joining others
            // would be meaningless, so refuse to change anything.
            return false;
        }
        join_node(&mut self.root, &other.root, &f, work)
    }
}

fn join_node<T: Copy + PartialEq>(
    a: &mut Rc<Node<T>>,
    b: &Rc<Node<T>>,
    f: &impl Fn(T, T) -> T,
    work: &mut usize,
) -> bool {
    if Rc::ptr_eq(a, b) {
        return false;
    }
    *work = work.saturating_add(1);
    match (&**a, &**b) {
        (Node::Leaf(x), Node::Leaf(y)) => {
            let joined: [T; FAN] = std::array::from_fn(|j| f(x[j], y[j]));
            if joined == *x {
                return false;
            }
            *a = if joined == *y {
                b.clone()
            } else {
                Rc::new(Node::Leaf(joined))
            };
            true
        }
        (Node::Inner(x), Node::Inner(y)) => {
            let mut children = x.clone();
            let mut changed = false;
            for (c, d) in children.iter_mut().zip(y.iter()) {
                changed |= join_node(c, d, f, work);
            }
            if !changed {
                return false;
            }
            *a = if children.iter().zip(y.iter()).all(|(c, d)| Rc::ptr_eq(c, d)) {
                b.clone()
            } else {
                Rc::new(Node::Inner(children))
            };
            true
        }
        // One shape per length: never two different node kinds.
        _ => false,
    }
}
