//! Random mutants of accepted kernels and the memory-safety oracle they
//! must pass: whatever the verifier accepts must, run on the host engine in
//! checked mode over operands of exactly `n` elements, touch nothing else.
//! Shared by `tests/verifier/mutants.rs` (bounded, in CI) and the fuzz target
//! `fuzz/fuzz_targets/verify_oracle.rs` (long runs).
//!
//! Mutations work on canonical text (one statement per line). They never
//! move or retarget a branch or a label, so control flow stays forward-only
//! and every mutant terminates.
#![allow(dead_code)]

use ptxd::ptx::{self, HostKernel, HostLaunch, HostSpan};
use rand::seq::IndexedRandom;
use rand::Rng;

/// Declared registers of a canonical text: (name, type).
fn registers(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix(".reg .")?.strip_suffix(';')?;
            let (ty, name) = l.split_once(' ')?;
            Some((name.to_string(), ty.to_string()))
        })
        .collect()
}

fn is_instruction(line: &str) -> bool {
    let t = line.trim();
    line.starts_with('\t')
        && !t.starts_with('.')
        && !t.ends_with(':')
        && !t.contains(" bra ")
        && !t.starts_with("bra")
        && t.ends_with(';')
}

fn reg_of<'a>(regs: &'a [(String, String)], r: &mut impl Rng, ty: &[&str]) -> Option<&'a str> {
    let pool: Vec<&(String, String)> = regs
        .iter()
        .filter(|(_, t)| ty.contains(&t.as_str()))
        .collect();
    pool.choose(r).map(|(n, _)| n.as_str())
}

const OPCODE_SWAPS: &[(&str, &str)] = &[
    (".s64", ".u64"),
    (".u64", ".s64"),
    (".s64", ".f64"),
    (".u64", ".b64"),
    (".u32", ".u16"),
    (".wide", ""),
    (".ge", ".gt"),
    (".ge", ".lt"),
    (".lt", ".le"),
    (".ge", ".hs"),
    ("add.", "sub."),
    ("add.", "mul.lo."),
    ("mul.wide", "mul.hi"),
    ("shl.", "shr."),
    (".global", ""),
    (".global", ".param"),
    (".f32", ".f64"),
    (".f32", ".b16"),
    (".nc", ""),
    ("cvta.to.global", "cvta.to.local"),
    ("ld.", "st."),
];

/// One random instruction over the kernel's registers.
fn random_instruction(regs: &[(String, String)], r: &mut impl Rng) -> Option<String> {
    let r64 = |r: &mut _| reg_of(regs, r, &["b64", "u64", "s64"]).map(str::to_string);
    let r32 = |r: &mut _| reg_of(regs, r, &["b32", "u32", "s32"]).map(str::to_string);
    let f32r = |r: &mut _| reg_of(regs, r, &["f32"]).map(str::to_string);
    let pred = |r: &mut _| reg_of(regs, r, &["pred"]).map(str::to_string);
    let imm = *[0i64, 1, 2, 4, 8, -1, -4, 4096, 1 << 32].choose(r)?;
    Some(match r.random_range(0..14) {
        0 => format!("add.s64 {}, {}, {};", r64(r)?, r64(r)?, r64(r)?),
        1 => format!("mov.b64 {}, {};", r64(r)?, r64(r)?),
        2 => format!("shl.b64 {}, {}, {};", r64(r)?, r64(r)?, imm & 7),
        3 => format!("add.s64 {}, {}, {imm};", r64(r)?, r64(r)?),
        4 => format!("setp.lt.s64 {}, {}, {};", pred(r)?, r64(r)?, r64(r)?),
        5 => format!(
            "selp.b64 {}, {}, {}, {};",
            r64(r)?,
            r64(r)?,
            r64(r)?,
            pred(r)?
        ),
        6 => format!("cvt.u64.u32 {}, {};", r64(r)?, r32(r)?),
        7 => format!("ld.global.f32 {}, [{}];", f32r(r)?, r64(r)?),
        8 => format!("st.global.f32 [{}], {};", r64(r)?, f32r(r)?),
        9 => format!("mad.lo.s64 {}, {}, {imm}, {};", r64(r)?, r64(r)?, r64(r)?),
        10 => format!("mul.wide.u32 {}, {}, {};", r64(r)?, r32(r)?, r32(r)?),
        11 => format!("mov.u32 {}, %tid.x;", r32(r)?),
        12 => format!("not.pred {}, {};", pred(r)?, pred(r)?),
        _ => format!("sub.s64 {}, {}, {};", r64(r)?, r64(r)?, r64(r)?),
    })
}

/// Applies 1–3 random mutations to canonical `text`.
pub fn mutate(text: &str, r: &mut impl Rng) -> String {
    let regs = registers(text);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for _ in 0..r.random_range(1..=3) {
        let inst: Vec<usize> = (0..lines.len())
            .filter(|i| is_instruction(&lines[*i]))
            .collect();
        let Some(&at) = inst.choose(r) else {
            break;
        };
        match r.random_range(0..14) {
            0 => {
                lines.remove(at);
            }
            10 => {
                // Declare (or change) `.reqntid`: the block size the index
                // proof may read a constant as.
                let x = [32u32, 64, 128, 192, 256, 1024]
                    .choose(r)
                    .copied()
                    .unwrap_or(256);
                let decl = format!(".reqntid {x}, 1, 1");
                if let Some(i) = lines.iter().position(|l| l.starts_with(".reqntid")) {
                    lines[i] = decl;
                } else if let Some(i) = lines.iter().position(|l| l == ")") {
                    lines.insert(i + 1, decl);
                }
            }
            11 => {
                // Fold a constant between the address register and the
                // access: `add r, r, c` before, `[r + k]` in the access, `k`
                // cancelling `c` or not.
                let line = lines[at].clone();
                let base = line
                    .split_once('[')
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map(|(b, _)| b.to_string())
                    .filter(|b| b.starts_with('%') && !b.contains(['+', '-']));
                if let Some(b) = base {
                    let c = [8i64, -8, 4, 16, 1 << 33].choose(r).copied().unwrap_or(8);
                    let k = [-c, -c, -c + 4, -c - 4, 0].choose(r).copied().unwrap_or(-c);
                    lines[at] = line
                        .replacen(&format!("[{b}]"), &format!("[{b}+{k}]"), 1)
                        .replace("+-", "-");
                    lines.insert(at, format!("	add.s64 {b}, {b}, {c};"));
                }
            }
            12 => {
                // A constant where `%ntid.x` was: a proof only under a
                // matching `.reqntid`.
                let c = [64i64, 128, 256].choose(r).copied().unwrap_or(256);
                if let Some(i) = lines.iter().position(|l| l.contains("%ntid.x")) {
                    lines[i] = lines[i].replace("%ntid.x", &c.to_string());
                }
            }
            13 => {
                // `or` for `add`: the same only when no bit is in both.
                if lines[at].contains("add.s64") {
                    lines[at] = lines[at].replacen("add.s64", "or.b64", 1);
                }
            }
            1 => {
                let copy = lines[at].clone();
                if let Some(&to) = inst.choose(r) {
                    lines.insert(to, copy);
                }
            }
            2 => {
                if let Some(&other) = inst.choose(r) {
                    lines.swap(at, other);
                }
            }
            3 => {
                // Replace one register operand with another register.
                let line = lines[at].clone();
                let names: Vec<&str> = regs
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .filter(|n| {
                        line.contains(&format!("{n},"))
                            || line.contains(&format!("{n};"))
                            || line.contains(&format!("{n}]"))
                    })
                    .collect();
                if let (Some(from), Some((to, _))) = (names.choose(r), regs.choose(r)) {
                    for end in [",", ";", "]"] {
                        if line.contains(&format!("{from}{end}")) {
                            lines[at] =
                                line.replacen(&format!("{from}{end}"), &format!("{to}{end}"), 1);
                            break;
                        }
                    }
                }
            }
            4 => {
                if let Some((from, to)) = OPCODE_SWAPS.choose(r) {
                    if lines[at].contains(from) {
                        lines[at] = lines[at].replacen(from, to, 1);
                    }
                }
            }
            5 => {
                if let Some(p) = reg_of(&regs, r, &["pred"]) {
                    let neg = if r.random_bool(0.5) { "!" } else { "" };
                    lines[at] = format!("\t@{neg}{p} {}", lines[at].trim());
                }
            }
            6 => {
                if let Some(new) = random_instruction(&regs, r) {
                    lines.insert(at, format!("\t{new}"));
                }
            }
            7 => {
                let off = [4i64, -4, 8, 1, 4096].choose(r).copied().unwrap_or(4);
                lines[at] = lines[at].replacen(']', &format!("+{off}]"), 1);
            }
            8 => {
                // Change an immediate.
                let line = lines[at].clone();
                let toks: Vec<&str> = line
                    .split([' ', ',', ';'])
                    .filter(|t| !t.is_empty() && t.parse::<i64>().is_ok())
                    .collect();
                if let (Some(t), Some(v)) =
                    (toks.choose(r), [0i64, 1, 3, 16, -1, 1 << 40].choose(r))
                {
                    lines[at] = line.replacen(&format!(" {t}"), &format!(" {v}"), 1);
                }
            }
            _ => {
                // Flip a branch's predicate or drop it (forward only).
                let bras: Vec<usize> = (0..lines.len())
                    .filter(|i| lines[*i].contains(" bra "))
                    .collect();
                if let Some(&b) = bras.choose(r) {
                    let l = lines[b].clone();
                    lines[b] = if l.contains("@!") {
                        l.replacen("@!", "@", 1)
                    } else if r.random_bool(0.5) {
                        l.replacen('@', "@!", 1)
                    } else {
                        match l.split_once(" bra ") {
                            Some((_, t)) => format!("\tbra {t}"),
                            None => l,
                        }
                    };
                }
            }
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

fn aligned(bytes: usize, r: &mut impl Rng, poison: bool) -> Vec<u64> {
    (0..bytes.div_ceil(8))
        .map(|_| if poison { u64::MAX } else { r.random() })
        .collect()
}

/// Canonicalizes `text`; if accepted, runs it in checked mode over operands
/// of exactly `n × element size` bytes. `Ok(true)`: accepted and ran
/// clean; `Ok(false)`: refused (or not runnable on the CPU engine); `Err`:
/// an accepted kernel faulted.
pub fn oracle(text: &str, symbol: &str, r: &mut impl Rng) -> Result<bool, String> {
    let Ok(canonical) = ptx::canonicalize(text, symbol, None) else {
        return Ok(false);
    };
    let kernel = match HostKernel::compile(&canonical.text, symbol) {
        Ok(k) => k,
        // An instruction the CPU engine does not implement: nothing to run.
        Err(ptx::PtxError::UnsupportedOnHost { .. }) => return Ok(false),
        Err(e) => return Err(format!("accepted but the host engine refuses it: {e}")),
    };
    let sig = kernel.signature().clone();
    let n: u64 = r.random_range(0..3000);
    let sizes = &sig.element_sizes;
    let mut inputs: Vec<Vec<u64>> = sizes[..sizes.len() - 1]
        .iter()
        .map(|s| aligned(n as usize * *s as usize, r, false))
        .collect();
    let out_size = n as usize * sizes[sizes.len() - 1] as usize;
    let mut out = aligned(out_size, r, true);
    let spans: Vec<HostSpan> = inputs
        .iter_mut()
        .zip(sizes)
        .map(|(b, s)| HostSpan {
            ptr: b.as_mut_ptr().cast(),
            len: n as usize * *s as usize,
        })
        .collect();
    let params: Vec<f32> = (0..sig.scalar_params)
        .map(|_| r.random_range(-4.0..4.0))
        .collect();
    let launch = HostLaunch {
        inputs: &spans,
        args: &[],
        output: HostSpan {
            ptr: out.as_mut_ptr().cast(),
            len: out_size,
        },
        n,
        params: &params,
        threads: 1,
        checked: true,
        control: None,
    };
    // SAFETY: every span points into a live Vec of at least `len` bytes.
    unsafe { kernel.launch(&launch) }
        .map(|()| true)
        .map_err(|f| format!("accepted kernel faulted with n = {n}: {f}"))
}
