//! The soundness oracle's GPU half. The mutant oracle of
//! `tests/verifier/mutants.rs` runs accepted mutants on the host engine; this
//! runs them on the GPU, the way the CUDA executor runs the canonical text
//! (`cuModuleLoadData`, its parameter layout, a 1-D grid), and checks what
//! the host engine cannot see:
//!
//! - **Register leaks.** Before each launch a victim kernel (hand-written,
//!   not through ptxd: any tenant's kernel may leave anything behind) fills
//!   about 200 registers of every thread on every SM with a marker. The
//!   kernel under test runs twice, once after a victim of marker A and once
//!   after one of marker B, on the same inputs: its two outputs must be
//!   identical bit for bit (an output that depends on what the previous
//!   kernel left is a leak, whatever its element type), and no 4- or 8-byte
//!   output element may hold a marker word.
//! - **Memory outside the operands.** Every operand lies between two canary
//!   regions in its allocation, and an "other tenant" allocation of known
//!   contents sits beside them: after each launch every canary and the other
//!   tenant must be intact, and no output word may hold a canary or the
//!   other tenant's word. With `PTXD_ORACLE_EXACT=1` every operand is an
//!   allocation of exactly its size instead, for a run under
//!   `compute-sanitizer --tool memcheck`, which then reports any access
//!   outside an allocation.
//! - **Faults.** A launch error (illegal address, misaligned access,
//!   illegal instruction) of an accepted kernel is a finding; the context is
//!   lost with it, so the oracle stops there. An accepted text the driver's
//!   JIT refuses (a load error, which leaves the context usable) is counted
//!   and reported apart: ptxd's model of the text and ptxas's disagree.
//!
//! The kernels: three hand-written attackers that store a value built from
//! a register no instruction that runs wrote (never written; never written
//! but added to an input; written only under the guard's predicate, false
//! where it runs), then accepted mutants of the corpus
//! (`tests/support/mutants.rs`, `$PTXD_MUTANTS` tries, seed
//! `$PTXD_MUTANT_SEED`). Findings are printed; the first few kernels with a
//! finding are written to `$PTXD_ORACLE_OUT` when set. The test fails when
//! anything is found.

use std::ffi::c_void;
use std::fmt::Write as _;

use ptxd::ptx;
use ptxd_client::cuda::{CudaDevice, DeviceAllocation};
use rand::{Rng, SeedableRng};

use super::device;
use super::mutants;
use super::nvcc_ref;

/// What the victims leave in their registers.
const MARKER_A: u32 = 0xDEAD_BEEF;
const MARKER_B: u32 = 0xFEE1_600D;
/// What surrounds every operand, and what the other tenant holds.
const CANARY: u32 = 0xCA7A_11E5;
const OTHER_TENANT: u32 = 0x5EC2_E7AA;
/// Bytes of canary on each side of an operand.
const CANARY_BYTES: usize = 4096;
/// Registers the victim keeps live at once (ptxas allocates one each).
const VICTIM_REGISTERS: usize = 200;

/// A kernel that loads `VICTIM_REGISTERS` words (all the marker) into as
/// many registers, every one live at once (volatile loads and stores keep
/// their order), then stores them all.
fn victim_ptx() -> String {
    let mut text = String::from(
        ".version 8.0\n.target sm_90\n.address_size 64\n\n\
         .visible .entry victim(.param .u64 src, .param .u64 dst)\n{\n",
    );
    let _ = writeln!(text, "\t.reg .b32 %v<{VICTIM_REGISTERS}>;");
    text.push_str(
        "\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<6>;\n\
         \tld.param.u64 %rd1, [src];\n\tld.param.u64 %rd2, [dst];\n\
         \tcvta.to.global.u64 %rd1, %rd1;\n\tcvta.to.global.u64 %rd2, %rd2;\n\
         \tmov.u32 %r1, %tid.x;\n\tmov.u32 %r2, %ctaid.x;\n\tmov.u32 %r3, %ntid.x;\n\
         \tmad.lo.s32 %r1, %r2, %r3, %r1;\n\
         \tmul.wide.u32 %rd3, %r1, 4;\n\tadd.s64 %rd4, %rd2, %rd3;\n",
    );
    for k in 0..VICTIM_REGISTERS {
        let _ = writeln!(text, "\tld.volatile.global.b32 %v{k}, [%rd1+{}];", 4 * k);
    }
    for k in 0..VICTIM_REGISTERS {
        let _ = writeln!(text, "\tst.volatile.global.b32 [%rd4], %v{k};");
    }
    text.push_str("\tret;\n}\n");
    text
}

/// `add_f32_scalar` with the body between the guard and the store
/// replaced by `body`, under the entry name `symbol`; `%f1`..`%f4` are
/// declared, `%p1` is the guard (`i >= n`, false in the body), `%rd10` and
/// `%rd12` the two inputs' element addresses and `%rd14` the output's.
fn attacker_ptx(symbol: &str, body: &str) -> String {
    format!(
        ".version 9.0\n.target sm_90\n.address_size 64\n\n\
         .visible .entry {symbol}(\n\
         \t.param .u64 {symbol}_param_0,\n\t.param .u64 {symbol}_param_1,\n\
         \t.param .u64 {symbol}_param_2,\n\t.param .u64 {symbol}_param_3\n)\n{{\n\
         \t.reg .pred %p<2>;\n\t.reg .f32 %f<5>;\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<15>;\n\
         \tld.param.u64 %rd2, [{symbol}_param_0];\n\tld.param.u64 %rd3, [{symbol}_param_1];\n\
         \tld.param.u64 %rd4, [{symbol}_param_2];\n\tld.param.u64 %rd5, [{symbol}_param_3];\n\
         \tmov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %ntid.x;\n\tmul.wide.u32 %rd6, %r1, %r2;\n\
         \tmov.u32 %r3, %tid.x;\n\tcvt.u64.u32 %rd7, %r3;\n\tadd.s64 %rd1, %rd6, %rd7;\n\
         \tsetp.ge.s64 %p1, %rd1, %rd5;\n\t@%p1 bra $L__BB0_2;\n\
         \tcvta.to.global.u64 %rd8, %rd2;\n\tshl.b64 %rd9, %rd1, 2;\n\tadd.s64 %rd10, %rd8, %rd9;\n\
         \tcvta.to.global.u64 %rd11, %rd3;\n\tadd.s64 %rd12, %rd11, %rd9;\n\
         \tcvta.to.global.u64 %rd13, %rd4;\n\tadd.s64 %rd14, %rd13, %rd9;\n\
         {body}\
         $L__BB0_2:\n\tret;\n}}\n"
    )
}

/// The hand-written attackers of issue 20's first class: each stores a
/// value built from a register that no instruction that runs wrote.
fn attackers() -> Vec<(&'static str, String)> {
    vec![
        // Reads both inputs (the ABI asks for it), stores a register no
        // instruction writes.
        (
            "never_written",
            attacker_ptx(
                "never_written",
                "\tld.global.f32 %f1, [%rd12];\n\tld.global.f32 %f2, [%rd10];\n\
                 \tadd.f32 %f3, %f2, %f1;\n\tst.global.f32 [%rd14], %f4;\n",
            ),
        ),
        // The same, added to the inputs' sum, so the store cannot be dropped.
        (
            "never_written_sum",
            attacker_ptx(
                "never_written_sum",
                "\tld.global.f32 %f1, [%rd12];\n\tld.global.f32 %f2, [%rd10];\n\
                 \tadd.f32 %f3, %f2, %f1;\n\tadd.f32 %f3, %f3, %f4;\n\
                 \tst.global.f32 [%rd14], %f3;\n",
            ),
        ),
        // The only write is predicated on the guard, false where it runs.
        (
            "predicated_write",
            attacker_ptx(
                "predicated_write",
                "\t@%p1 ld.global.f32 %f1, [%rd12];\n\tld.global.f32 %f2, [%rd10];\n\
                 \tadd.f32 %f3, %f2, %f1;\n\tst.global.f32 [%rd14], %f3;\n",
            ),
        ),
    ]
}

/// Accepted kernels of both corpora, canonical, with their entry names
/// (the seeds of `tests/verifier/mutants.rs`).
fn seeds() -> Vec<(String, String)> {
    let nvcc = nvcc_ref::corpus_root();
    // The seed kernels: `$PTXD_CORPUS` where the GPU pack puts them (its
    // nvcc corpus is not beside them), else the source tree's corpus.
    let root = std::env::var_os("PTXD_CORPUS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| nvcc.parent().unwrap().to_path_buf());
    let mut files = vec![
        root.join("add_f32_scalar.ptx"),
        root.join("affine_f32_scalar.ptx"),
        root.join("silu_mul_f16_scalar.ptx"),
    ];
    for stem in ["f32_basic", "ints", "casts", "f16_bf16", "hints"] {
        files.push(nvcc.join(format!("ptx/{stem}.sm_90.ptx")));
    }
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for func in ptx::parse::parse(&text).unwrap().functions {
            if let Ok(c) = ptx::canonicalize(&text, &func.name, None) {
                out.push((c.text, func.name));
            }
        }
    }
    out
}

/// One operand: its allocation, where its elements start, and its bytes.
struct Operand {
    mem: DeviceAllocation,
    offset: usize,
    len: usize,
}

impl Operand {
    fn address(&self) -> u64 {
        self.mem.device_ptr() + self.offset as u64
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Random bytes with no marker, canary or other-tenant word in them.
fn clean_random(len: usize, r: &mut impl Rng) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    r.fill_bytes(&mut bytes);
    for c in bytes.chunks_exact_mut(4) {
        let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if [MARKER_A, MARKER_B, CANARY, OTHER_TENANT].contains(&w) {
            c[0] ^= 1;
        }
    }
    bytes
}

/// What the oracle made of one kernel.
enum Verdict {
    /// The verifier refused it: nothing to run.
    Refused(String),
    /// Accepted, but the driver's JIT refuses the canonical text.
    JitRefused(String),
    /// Accepted, and ran clean after both victims.
    Clean,
    /// Accepted, and ran with these findings.
    Found(Vec<String>),
    /// A launch failed (a fault): the context is lost.
    Lost(String),
}

struct Oracle {
    dev: CudaDevice,
    victim: ptxd_client::cuda::LocalModule,
    victim_src: [DeviceAllocation; 2],
    victim_dst: DeviceAllocation,
    other: DeviceAllocation,
    exact: bool,
}

const VICTIM_BLOCK: u32 = 128;
const VICTIM_GRID: u32 = 132 * 16;

impl Oracle {
    fn new(dev: CudaDevice, exact: bool) -> Oracle {
        let victim = dev.load_module(victim_ptx().as_bytes()).unwrap();
        let src = |marker: u32| {
            let mem = dev.alloc(4 * VICTIM_REGISTERS).unwrap();
            mem.upload(0, &vec![marker; VICTIM_REGISTERS]).unwrap();
            mem
        };
        let victim_src = [src(MARKER_A), src(MARKER_B)];
        let victim_dst = dev
            .alloc(4 * (VICTIM_BLOCK * VICTIM_GRID) as usize)
            .unwrap();
        let other = dev.alloc(1 << 20).unwrap();
        other.upload(0, &vec![OTHER_TENANT; 1 << 18]).unwrap();
        Oracle {
            dev,
            victim,
            victim_src,
            victim_dst,
            other,
            exact,
        }
    }

    /// Runs the victim of marker `which` over every SM.
    fn fill_registers(&self, which: usize) -> Result<(), String> {
        let function = self.victim.function("victim").map_err(|e| e.to_string())?;
        let mut src = self.victim_src[which].device_ptr();
        let mut dst = self.victim_dst.device_ptr();
        let mut params: Vec<*mut c_void> =
            vec![(&mut src as *mut u64).cast(), (&mut dst as *mut u64).cast()];
        let stream = self.dev.stream().map_err(|e| e.to_string())?;
        // SAFETY: two u64 params, the victim's (src, dst); src holds
        // VICTIM_REGISTERS words and dst one word per launched thread.
        unsafe { function.launch(&stream, VICTIM_GRID, VICTIM_BLOCK, &mut params) }
            .map_err(|e| format!("victim launch: {e}"))?;
        stream.synchronize().map_err(|e| format!("victim: {e}"))
    }

    fn operand(&self, bytes: &[u8]) -> Result<Operand, String> {
        let pad = if self.exact { 0 } else { CANARY_BYTES };
        let mem = self
            .dev
            .alloc(bytes.len() + 2 * pad + 4)
            .map_err(|e| e.to_string())?;
        if pad > 0 {
            let canary = vec![CANARY; pad / 4];
            mem.upload(0, &canary).map_err(|e| e.to_string())?;
            mem.upload(pad + bytes.len(), &canary)
                .map_err(|e| e.to_string())?;
        }
        if !bytes.is_empty() {
            mem.upload(pad, bytes).map_err(|e| e.to_string())?;
        }
        Ok(Operand {
            mem,
            offset: pad,
            len: bytes.len(),
        })
    }

    /// The canaries of `op` that changed, as a description.
    fn canaries(&self, op: &Operand, name: &str, out: &mut Vec<String>) {
        if self.exact {
            return;
        }
        let mut all = vec![0u8; op.len + 2 * CANARY_BYTES];
        if op.mem.download(0, &mut all).is_err() {
            out.push(format!("{name}: cannot read back"));
            return;
        }
        let before = words(&all[..CANARY_BYTES]).filter(|w| *w != CANARY).count();
        let after = words(&all[CANARY_BYTES + op.len..])
            .filter(|w| *w != CANARY)
            .count();
        if before + after > 0 {
            out.push(format!(
                "{name}: {before} canary words before and {after} after it overwritten"
            ));
        }
    }

    /// Launches `symbol` of `module` on fresh operands after the victim of
    /// marker `which`; the output bytes, and every finding.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        module: &ptxd_client::cuda::LocalModule,
        symbol: &str,
        signature: &ptx::Signature,
        inputs: &[Vec<u8>],
        n: usize,
        params: &[f32],
        which: usize,
        findings: &mut Vec<String>,
    ) -> Result<Vec<u8>, String> {
        let sizes = &signature.element_sizes;
        let out_size = *sizes.last().unwrap() as usize;
        let ops: Vec<Operand> = inputs
            .iter()
            .map(|b| self.operand(b))
            .collect::<Result<_, _>>()?;
        let out = self.operand(&vec![0xA5u8; n * out_size])?;
        let mut addresses: Vec<u64> = ops.iter().map(Operand::address).collect();
        addresses.push(out.address());
        let mut count = n as i64;
        let mut scalars = params.to_vec();
        let mut ptrs: Vec<*mut c_void> = addresses
            .iter_mut()
            .map(|a| (a as *mut u64).cast::<c_void>())
            .collect();
        ptrs.push((&mut count as *mut i64).cast());
        ptrs.extend(scalars.iter_mut().map(|p| (p as *mut f32).cast::<c_void>()));
        let block = signature
            .reqntid
            .unwrap_or_else(|| signature.maxntid.map_or(256, |m| m.min(256)));
        let grid = n.div_ceil(block as usize).max(1) as u32;
        let function = module.function(symbol).map_err(|e| e.to_string())?;
        self.fill_registers(which)?;
        let stream = self.dev.stream().map_err(|e| e.to_string())?;
        // SAFETY: one pointer per verified parameter (input and output
        // addresses as u64, n as i64, the f32 scalars), each to a local
        // that outlives the synchronize; every operand holds n elements of
        // its verified size between canaries.
        unsafe { function.launch(&stream, grid, block, &mut ptrs) }
            .map_err(|e| format!("launch: {e}"))?;
        stream.synchronize().map_err(|e| format!("fault: {e}"))?;
        for (k, op) in ops.iter().enumerate() {
            self.canaries(op, &format!("input {k}"), findings);
        }
        self.canaries(&out, "output", findings);
        let mut other = vec![0u32; 1 << 18];
        self.other
            .download(0, &mut other)
            .map_err(|e| e.to_string())?;
        let touched = other.iter().filter(|w| **w != OTHER_TENANT).count();
        if touched > 0 {
            findings.push(format!(
                "the other tenant's allocation: {touched} words changed"
            ));
        }
        let mut got = vec![0u8; out.len];
        out.mem
            .download(out.offset, &mut got)
            .map_err(|e| e.to_string())?;
        if out_size >= 4 {
            for (what, word) in [
                ("marker A", MARKER_A),
                ("marker B", MARKER_B),
                ("a canary", CANARY),
                ("the other tenant's word", OTHER_TENANT),
            ] {
                let hits = words(&got).filter(|w| *w == word).count();
                if hits > 0 {
                    findings.push(format!("{hits} output words hold {what} ({word:#010x})"));
                }
            }
        }
        Ok(got)
    }

    /// Runs one accepted kernel after each victim.
    fn check(&self, text: &str, symbol: &str, r: &mut impl Rng) -> Verdict {
        let canonical = match ptx::canonicalize(text, symbol, None) {
            Ok(c) => c,
            Err(e) => return Verdict::Refused(e.to_string()),
        };
        // A text the driver's JIT refuses is refused INVALID_ARTIFACT at
        // load: the context stays usable.
        let module = match self.dev.load_module(canonical.text.as_bytes()) {
            Ok(m) => m,
            Err(e) => return Verdict::JitRefused(e.to_string()),
        };
        match self.run(&module, symbol, &canonical.signature, r) {
            Ok(findings) if findings.is_empty() => Verdict::Clean,
            // A finding must reproduce on fresh inputs: an output word that
            // equals a marker or the other tenant's word by chance (a
            // random 32-bit result does, once in 2^32 words: it happened
            // once in 1.1e7 words of one run) does not, a leak or an
            // out-of-bounds read does.
            Ok(findings) => match self.run(&module, symbol, &canonical.signature, r) {
                Ok(again) if again.is_empty() => Verdict::Clean,
                Ok(again) => Verdict::Found(findings.into_iter().chain(again).collect()),
                Err(e) => Verdict::Lost(e),
            },
            Err(e) => Verdict::Lost(e),
        }
    }

    /// Launches `module`'s `symbol` after each victim on the same random
    /// operands; the findings. `Err`: a launch failed, the context is gone.
    fn run(
        &self,
        module: &ptxd_client::cuda::LocalModule,
        symbol: &str,
        signature: &ptx::Signature,
        r: &mut impl Rng,
    ) -> Result<Vec<String>, String> {
        let signature = signature.clone();
        let sizes = &signature.element_sizes;
        let mut n = r.random_range(1..40_000usize);
        if n % 256 == 0 {
            n += 1;
        }
        let inputs: Vec<Vec<u8>> = sizes[..signature.inputs as usize]
            .iter()
            .map(|s| clean_random(n * *s as usize, r))
            .collect();
        let params: Vec<f32> = (0..signature.scalar_params)
            .map(|_| r.random_range(-4.0f32..4.0))
            .collect();
        let mut findings = Vec::new();
        let a = self.launch(
            module,
            symbol,
            &signature,
            &inputs,
            n,
            &params,
            0,
            &mut findings,
        )?;
        let b = self.launch(
            module,
            symbol,
            &signature,
            &inputs,
            n,
            &params,
            1,
            &mut findings,
        )?;
        let element = *sizes.last().unwrap() as usize;
        let differ = (0..n)
            .filter(|i| a[i * element..(i + 1) * element] != b[i * element..(i + 1) * element])
            .count();
        if differ > 0 {
            findings.push(format!(
                "{differ} of {n} output elements depend on the previous kernel's registers"
            ));
        }
        Ok(findings)
    }
}

fn save(name: &str, text: &str) {
    if let Some(dir) = std::env::var_os("PTXD_ORACLE_OUT") {
        let _ = std::fs::write(std::path::Path::new(&dir).join(name), text);
    }
}

#[test]
fn accepted_kernels_neither_leak_registers_nor_touch_memory_outside_their_operands() {
    let exact = std::env::var("PTXD_ORACLE_EXACT").is_ok_and(|v| v == "1");
    let oracle = Oracle::new(device(), exact);
    let seed: u64 = std::env::var("PTXD_MUTANT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    let tries: usize = std::env::var("PTXD_MUTANTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    eprintln!(
        "oracle: mutant seed {seed}, {tries} tries, operands {}",
        if exact {
            "exact (for memcheck)"
        } else {
            "between canaries"
        }
    );
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut report: Vec<String> = Vec::new();
    let mut jit_refused: Vec<String> = Vec::new();
    let mut saved = 0;
    // The hand-written attackers first.
    for (symbol, text) in attackers() {
        let verdict = oracle.check(&text, symbol, &mut r);
        let what = match &verdict {
            Verdict::Refused(e) => format!("refused: {e}"),
            Verdict::JitRefused(e) => format!("accepted, the JIT refuses it: {e}"),
            Verdict::Clean => "accepted, ran clean".into(),
            Verdict::Found(f) => format!("accepted, FOUND: {}", f.join("; ")),
            Verdict::Lost(e) => format!("accepted, FAULTED: {e}"),
        };
        eprintln!("oracle: attacker {symbol}: {what}");
        if matches!(verdict, Verdict::Found(_) | Verdict::Lost(_)) {
            report.push(format!("attacker {symbol}: {what}"));
            save(&format!("attacker-{symbol}.ptx"), &text);
        }
        assert!(!matches!(verdict, Verdict::Lost(_)), "the context is lost");
    }
    let seeds = seeds();
    assert!(seeds.len() > 50, "{} seeds", seeds.len());
    let (mut ran, mut refused, mut clean) = (0usize, 0usize, 0usize);
    let mut lost = None;
    for attempt in 0..tries {
        let (text, symbol) = &seeds[r.random_range(0..seeds.len())];
        let mutant = mutants::mutate(text, &mut r);
        let mut keep = |kind: &str| {
            if saved < 6 {
                saved += 1;
                save(&format!("{kind}-{attempt}-{symbol}.ptx"), &mutant);
            }
        };
        match oracle.check(&mutant, symbol, &mut r) {
            Verdict::Refused(_) => refused += 1,
            Verdict::JitRefused(e) => {
                jit_refused.push(format!("mutant {attempt} of {symbol}: {e}"));
                keep("jit-refused");
            }
            Verdict::Clean => {
                ran += 1;
                clean += 1;
            }
            Verdict::Found(f) => {
                ran += 1;
                report.push(format!("mutant {attempt} of {symbol}: {}", f.join("; ")));
                keep("finding");
            }
            Verdict::Lost(e) => {
                ran += 1;
                report.push(format!("mutant {attempt} of {symbol}: {e}"));
                keep("fault");
                lost = Some(attempt);
                break;
            }
        }
    }
    eprintln!(
        "oracle: {ran} accepted mutants ran on the GPU ({clean} clean, {} with findings), \
         {refused} refused, {} accepted but refused by the driver's JIT{}",
        report.len(),
        jit_refused.len(),
        lost.map_or(String::new(), |a| format!(
            "; stopped at mutant {a}: the context is lost"
        ))
    );
    for line in &report {
        eprintln!("  FINDING {line}");
    }
    for line in &jit_refused {
        eprintln!("  JIT-REFUSED {line}");
    }
    assert!(ran > 0, "no mutant was accepted");
    assert!(
        report.is_empty() && jit_refused.is_empty(),
        "{} findings, {} accepted texts the JIT refuses:\n{}\n{}",
        report.len(),
        jit_refused.len(),
        report.join("\n"),
        jit_refused.join("\n")
    );
}
