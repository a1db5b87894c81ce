//! What the one launch check costs per launch: today's scalar-ABI check
//! (the [`Signature`] terms the ring uses) against the same launch checked
//! through the kernel's verified [`LaunchContract`] bound to its block size
//! (the gRPC path), and a contract with a 32-bit-index precondition; the
//! ratio is printed from the same run.
//!
//! Run: `cargo bench --bench launch_check`. The goal (issue 21) is at most
//! 0.3 µs per launch through the contract.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;
use std::time::Instant;

use ptxd::handles::DeviceGeneration;
use ptxd::launch::{
    self, BoundContract, BufferCap, Capabilities, EventCap, KernelCap, LaunchRefusal, LaunchShape,
    LaunchTerms, Placement,
};
use ptxd::ptx::contract::{Condition, Expr, Precondition, INDEX_FITS_I32};
use ptxd::ptx::{LaunchContract, Signature};

const HERE: Placement = Placement {
    device_index: 0,
    generation: DeviceGeneration(1),
};

struct Table(Vec<BufferCap>);

impl Capabilities for Table {
    type Operand = (usize, u64);
    type Event = usize;
    type Error = LaunchRefusal;
    fn operand(&self, &(i, offset): &(usize, u64)) -> Result<(BufferCap, u64), LaunchRefusal> {
        let b = self.0.get(i).ok_or(LaunchRefusal::Internal("not held"))?;
        Ok((*b, offset))
    }
    fn event(&self, _: &usize) -> Result<EventCap, LaunchRefusal> {
        Err(LaunchRefusal::Internal("no events"))
    }
    fn describe(&self, _: Placement) -> String {
        String::new()
    }
}

/// Nanoseconds per check of `terms`, one run of `iters`.
fn per_launch<K: LaunchTerms + ?Sized>(terms: &K, table: &Table, iters: u32) -> f64 {
    let inputs = [(0, 0u64), (1, 64)];
    let output = (2, 128u64);
    {
        let started = Instant::now();
        for i in 0..iters {
            let shape = LaunchShape {
                inputs: black_box(&inputs[..]),
                output: Some(black_box(&output)),
                n: black_box(1 << 20) + u64::from(i & 7),
                scalars: 1,
                wait: None,
                signal: None,
            };
            let cap = KernelCap {
                signature: terms,
                placement: HERE,
            };
            black_box(launch::check(table, cap, &shape).unwrap());
        }
        started.elapsed().as_nanos() as f64 / f64::from(iters)
    }
}

fn main() {
    let signature = Signature {
        inputs: 2,
        element_sizes: vec![4, 4, 4],
        scalar_params: 1,
        reqntid: None,
        maxntid: None,
    };
    let contract = LaunchContract::scalar(&signature, &[]);
    let narrow = contract.clone().assuming(Precondition {
        name: INDEX_FITS_I32,
        condition: Condition::AtMost(Expr::product(Expr::Grid, Expr::Block), 1 << 31),
    });
    let table = Table(
        (0..3)
            .map(|i| BufferCap {
                id: i,
                size: 1 << 24,
                placement: HERE,
            })
            .collect(),
    );
    let iters = 200_000;
    let bound = BoundContract {
        contract: &contract,
        block: 256,
    };
    let bound_narrow = BoundContract {
        contract: &narrow,
        block: 256,
    };
    // What a ring checks a Triton-family kernel against: its contract as
    // the grant carries it (encoded by the front, decoded once by the
    // executor), with Triton's footprints (`roundup(n, 4) × 4`, four
    // elements per thread) and the 32-bit index's precondition.
    let mut triton = narrow.clone();
    triton.geometry.elements_per_thread = 4;
    for f in &mut triton.footprints {
        f.bytes = Expr::product(Expr::RoundUp(Box::new(Expr::Count), 4), Expr::Const(4));
    }
    let granted = ptxd::ring_check::decode(&ptxd::ring_check::encode(&triton)).unwrap();
    let bound_granted = BoundContract {
        contract: &granted,
        block: 128,
    };
    // The three in turn, best of seven rounds each: a loaded machine's
    // drift hits all three alike.
    let (mut today, mut bound_ns, mut with_precondition) = (f64::MAX, f64::MAX, f64::MAX);
    let mut ring_granted = f64::MAX;
    for _ in 0..7 {
        ring_granted = ring_granted.min(per_launch(&bound_granted, &table, iters));
        today = today.min(per_launch(&signature, &table, iters));
        bound_ns = bound_ns.min(per_launch(&bound, &table, iters));
        with_precondition = with_precondition.min(per_launch(&bound_narrow, &table, iters));
    }
    let bound = bound_ns;
    println!("launch check, 2 inputs + output, best of 7 interleaved rounds × {iters}:");
    println!("  signature (today's check)         {today:7.1} ns/launch");
    println!(
        "  contract (scalar ABI)             {bound:7.1} ns/launch  ({:.2}× today's)",
        bound / today
    );
    println!(
        "  contract + index_fits_i32         {with_precondition:7.1} ns/launch  ({:.2}× today's)",
        with_precondition / today
    );
    println!(
        "  ring-granted Triton-shaped        {ring_granted:7.1} ns/launch  ({:.2}× today's)",
        ring_granted / today
    );
}
