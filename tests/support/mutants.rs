//! Random mutants of accepted kernels and the oracles they must pass:
//! whatever the verifier accepts must, run on the host engine in checked
//! mode over operands of exactly `n` elements, touch nothing else, and
//! write an output that does not depend on what its registers held before
//! the kernel wrote them.
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

/// Declared registers of a text: (name, type). Canonical text declares
/// one a line; a compiler's text also declares ranges (`%r<4>`: `%r0` to
/// `%r3`) and lists.
fn registers(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for l in text.lines() {
        let Some(l) = l
            .trim()
            .strip_prefix(".reg .")
            .and_then(|l| l.strip_suffix(';'))
        else {
            continue;
        };
        let Some((ty, names)) = l.split_once([' ', '\t']) else {
            continue;
        };
        for name in names.split(',').map(str::trim) {
            match name
                .strip_suffix('>')
                .and_then(|n| n.split_once('<'))
                .and_then(|(stem, count)| Some((stem, count.parse::<u32>().ok()?)))
            {
                // A range of thousands would only dilute the picks.
                Some((stem, count)) => {
                    out.extend((0..count.min(64)).map(|k| (format!("{stem}{k}"), ty.to_string())))
                }
                None => out.push((name.to_string(), ty.to_string())),
            }
        }
    }
    out
}

/// Declared params of a canonical text, in order: their names.
fn params(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix(".param .")?;
            let (_, name) = l.split_once(' ')?;
            Some(name.trim_end_matches([',', ';']).to_string())
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
    // Address spaces: a generic address made, another space named.
    ("cvta.to.global", "cvta.global"),
    ("cvta.to.global", "cvta.to.shared"),
    (".global", ".shared"),
    (".global", ".const"),
    // Widths: a 64-bit value read or computed at 32 bits, or widened.
    ("ld.param.u64", "ld.param.u32"),
    ("ld.param.u64", "ld.param.b8"),
    (".u64.u32", ".u32.u64"),
    (".u64.u32", ".s64.s32"),
    ("mul.wide.u32", "mul.lo.u32"),
    ("mul.wide.u32", "mul.wide.s32"),
    (".s64", ".s32"),
    (".b64", ".b32"),
];

/// One random instruction over the kernel's registers and params.
fn random_instruction(
    regs: &[(String, String)],
    params: &[String],
    r: &mut impl Rng,
) -> Option<String> {
    let r64 = |r: &mut _| reg_of(regs, r, &["b64", "u64", "s64"]).map(str::to_string);
    let r32 = |r: &mut _| reg_of(regs, r, &["b32", "u32", "s32"]).map(str::to_string);
    let f32r = |r: &mut _| reg_of(regs, r, &["f32"]).map(str::to_string);
    let pred = |r: &mut _| reg_of(regs, r, &["pred"]).map(str::to_string);
    let imm = *[0i64, 1, 2, 4, 8, -1, -4, 4096, 1 << 32].choose(r)?;
    let imm32 = *[-8i64, -4, -1, 0xffff_fff8, 1 << 31].choose(r)?;
    let special = *[
        "%clock",
        "%smid",
        "%warpid",
        "%nsmid",
        "%gridid",
        "%laneid",
        "%dynamic_smem_size",
    ]
    .choose(r)?;
    let param = |r: &mut _| params.choose(r).cloned();
    Some(match r.random_range(0..25) {
        // A param read past its own bytes, at another width, or as a
        // vector spanning the next param.
        17 => {
            let (ty, dest) = match r.random_range(0..4) {
                0 => ("u64", r64(r)?),
                1 => ("u32", r32(r)?),
                2 => ("u16", r32(r)?),
                _ => ("b8", r32(r)?),
            };
            let off = *[0i64, 4, 8, -8, 16, 7].choose(r)?;
            format!("ld.param.{ty} {dest}, [{}+{off}];", param(r)?).replace("+-", "-")
        }
        18 => match r.random_range(0..2) {
            0 => format!(
                "ld.param.v2.u64 {{{}, {}}}, [{}];",
                r64(r)?,
                r64(r)?,
                param(r)?
            ),
            _ => format!(
                "ld.param.v2.u32 {{{}, {}}}, [{}+4];",
                r32(r)?,
                r32(r)?,
                param(r)?
            ),
        },
        // A 64-bit value in 32-bit halves: unpacked (a pointer's bits as
        // data), packed from halves (one perhaps never written), narrowed.
        19 => format!("mov.b64 {{{}, {}}}, {};", r32(r)?, r32(r)?, r64(r)?),
        20 => format!("mov.b64 {}, {{{}, {}}};", r64(r)?, r32(r)?, r32(r)?),
        21 => format!(
            "{} {}, {};",
            ["cvt.u32.u64", "cvt.s32.s64"].choose(r)?,
            r32(r)?,
            r64(r)?
        ),
        // Address-space conversions other than into the global space.
        22 => format!(
            "{} {}, {};",
            [
                "cvta.global.u64",
                "cvta.to.global.u64",
                "cvta.to.shared.u64",
                "cvta.local.u64",
            ]
            .choose(r)?,
            r64(r)?,
            r64(r)?
        ),
        // Vector accesses: a lane perhaps never written, stored.
        23 => match r.random_range(0..3) {
            0 => format!(
                "ld.global.v2.f32 {{{}, {}}}, [{}];",
                f32r(r)?,
                f32r(r)?,
                r64(r)?
            ),
            1 => format!(
                "st.global.v2.f32 [{}], {{{}, {}}};",
                r64(r)?,
                f32r(r)?,
                f32r(r)?
            ),
            _ => format!(
                "st.global.v4.f32 [{}], {{{}, {}, {}, {}}};",
                r64(r)?,
                f32r(r)?,
                f32r(r)?,
                f32r(r)?,
                f32r(r)?
            ),
        },
        // A register defined only under complementary guards: defined on
        // every run, but by no unguarded write.
        24 => {
            let (p, d) = (pred(r)?, r64(r)?);
            format!(
                "@{p} mov.b64 {d}, {};\n\t@!{p} mov.b64 {d}, {};",
                r64(r)?,
                r64(r)?
            )
        }
        // A 32-bit literal widened: the hardware widens its bits at 32,
        // never the literal as written (w30r's escape: -8 read as -8).
        14 => format!(
            "mov.u32 {0}, {imm32};\n\t{1} {2}, {0};",
            r32(r)?,
            ["cvt.u64.u32", "cvt.s64.s32"].choose(r)?,
            r64(r)?
        ),
        // A special register as data.
        15 => format!("mov.u32 {}, {special};", r32(r)?),
        16 => format!("cvt.u64.u32 {}, {special};", r64(r)?),
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

/// A generator seeded from the environment variable `var` when it holds a
/// number, else from fresh randomness; the seed is printed, so that a
/// failing run can be repeated (`var=seed`).
pub fn seeded_rng(var: &str) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    let seed: u64 = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("mutant seed {seed} ({var}={seed} repeats this run)");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// How many mutants a run tries: the environment variable `var` when it
/// holds a number.
pub fn count_from(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|s| s.parse().ok())
}

/// Applies 1–3 random mutations to canonical `text`.
pub fn mutate(text: &str, r: &mut impl Rng) -> String {
    let regs = registers(text);
    let params = params(text);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for _ in 0..r.random_range(1..=3) {
        let inst: Vec<usize> = (0..lines.len())
            .filter(|i| is_instruction(&lines[*i]))
            .collect();
        let Some(&at) = inst.choose(r) else {
            break;
        };
        match r.random_range(0..16) {
            0 => {
                lines.remove(at);
            }
            14 => {
                // A scalar global access made a vector one, its other lanes
                // any register of the type (perhaps never written).
                let line = lines[at].clone();
                let t = line.trim();
                let vector = ["ld.global.", "st.global."].iter().find_map(|op| {
                    let rest = t.strip_prefix(op)?;
                    let (ty, ops) = rest.split_once(' ')?;
                    if ty.starts_with('v') || ty.contains('.') {
                        return None;
                    }
                    let ops = ops.strip_suffix(';')?;
                    let (a, b) = ops.split_once(", ")?;
                    let lanes = *[2usize, 4].choose(r)?;
                    let data = if op.starts_with("ld") { a } else { b };
                    let mut list = vec![data.to_string()];
                    // An integer element may sit in a `.b` register.
                    let bits = format!("b{}", ty.get(1..).unwrap_or(""));
                    for _ in 1..lanes {
                        list.push(reg_of(&regs, r, &[ty, bits.as_str()])?.to_string());
                    }
                    let list = format!("{{{}}}", list.join(", "));
                    Some(if op.starts_with("ld") {
                        format!("\t{op}v{lanes}.{ty} {list}, {b};")
                    } else {
                        format!("\t{op}v{lanes}.{ty} {a}, {list};")
                    })
                });
                if let Some(v) = vector {
                    lines[at] = v;
                }
            }
            15 => {
                // A definition put under a guard, with a copy of another
                // register under the complementary one: the register holds
                // one or the other on every run, by no unguarded write.
                let line = lines[at].clone();
                let t = line.trim();
                let dest = t
                    .split_once(' ')
                    .filter(|(op, _)| !op.starts_with("st.") && !op.starts_with('@'))
                    .and_then(|(_, ops)| ops.split([',', ';']).next())
                    .map(str::trim)
                    .and_then(|d| regs.iter().find(|(n, _)| n == d));
                if let (Some((d, ty)), Some(p)) = (dest, reg_of(&regs, r, &["pred"])) {
                    let other = reg_of(&regs, r, &[ty.as_str()]).unwrap_or(d);
                    lines[at] = format!("\t@{p} {t}\n\t@!{p} mov.{ty} {d}, {other};");
                }
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
                if let Some(new) = random_instruction(&regs, &params, r) {
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

/// Mutations aimed at the Triton family's proof, then [`mutate`]'s: an
/// index immediate nudged (`shl`/`and`/`or`/`add` amounts, address
/// offsets, compare literals), `or` and `add` swapped, a compare's kind or
/// signedness changed, a vector's width changed, a guard dropped or
/// negated, a multiplier changed.
pub fn mutate_triton(text: &str, r: &mut impl Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let inst: Vec<usize> = (0..lines.len())
        .filter(|i| is_instruction(&lines[*i]))
        .collect();
    for _ in 0..r.random_range(1..=2) {
        let Some(&at) = inst.choose(r) else {
            break;
        };
        let line = lines[at].clone();
        lines[at] = match r.random_range(0..7) {
            6 => {
                // A mask made a combined compare whose other predicate is
                // always true: `(i >= 0) || (i < n)` (or `xor`, inverting
                // it), which is no mask at all.
                match line.find("setp.lt.s32").zip(line.find(';')) {
                    Some((at, end)) => {
                        let rest = line[at + "setp.lt.s32".len()..end].trim();
                        let ops: Vec<&str> = rest.split(',').map(str::trim).collect();
                        match ops.as_slice() {
                            [p, a, b] => {
                                let comb = *["or", "xor", "and"].choose(r).unwrap_or(&"or");
                                format!(
                                    "\tsetp.ge.s32 {p}, {a}, 0;\n\tsetp.lt.{comb}.s32 {p}, {a}, {b}, {p};"
                                )
                            }
                            _ => line,
                        }
                    }
                    None => line,
                }
            }
            0 => {
                // Nudge the last integer immediate.
                let toks: Vec<&str> = line
                    .trim_end_matches(';')
                    .split([' ', ','])
                    .filter(|t| t.parse::<i64>().is_ok())
                    .collect();
                match toks.last().and_then(|t| Some((*t, t.parse::<i64>().ok()?))) {
                    Some((t, v)) => {
                        let to = [v + 1, v - 1, v * 2, v / 2, v + 4, v + 512]
                            .choose(r)
                            .copied()
                            .unwrap_or(v);
                        match line.rfind(t) {
                            Some(i) => format!("{}{to}{}", &line[..i], &line[i + t.len()..]),
                            None => line,
                        }
                    }
                    None => line,
                }
            }
            1 => line.replacen("or.b32", "add.s32", 1).replacen(
                "add.s32",
                "or.b32",
                usize::from(!line.contains("or.b32")),
            ),
            2 => {
                let (from, to) = *[
                    ("setp.lt.s32", "setp.le.s32"),
                    ("setp.lt.s32", "setp.lt.u32"),
                    ("setp.lt.s32", "setp.gt.s32"),
                    (".v4.", ".v2."),
                    (".v2.", ".v4."),
                    (".b16", ".b32"),
                    ("mul.wide.s32", "mul.wide.u32"),
                    ("shl.b32", "shr.u32"),
                ]
                .choose(r)
                .unwrap_or(&("", ""));
                if from.is_empty() {
                    line
                } else {
                    line.replacen(from, to, 1)
                }
            }
            3 => match line.trim_start().strip_prefix('@') {
                Some(rest) => match rest.split_once(' ') {
                    Some((g, i)) if r.random_bool(0.5) => {
                        format!(
                            "\t@{} {i}",
                            g.strip_prefix('!').map_or(format!("!{g}"), str::to_string)
                        )
                    }
                    Some((_, i)) => format!("\t{i}"),
                    None => line,
                },
                None => line,
            },
            _ => line,
        };
    }
    let mut out = lines.join("\n");
    out.push('\n');
    if r.random_bool(0.3) {
        mutate(&out, r)
    } else {
        out
    }
}

fn aligned(bytes: usize, r: &mut impl Rng) -> Vec<u64> {
    (0..bytes.div_ceil(8)).map(|_| r.random()).collect()
}

/// Canonicalizes `text`; if accepted, runs it in checked mode over operands
/// of exactly `n × element size` bytes, twice, its registers starting at
/// two different fills. `Ok(true)`: accepted, ran clean and wrote the same
/// output both times; `Ok(false)`: refused (or not runnable on the CPU
/// engine); `Err`: an accepted kernel faulted, or its output depended on
/// a register it never wrote.
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
        .map(|s| aligned(n as usize * *s as usize, r))
        .collect();
    let out_size = n as usize * sizes[sizes.len() - 1] as usize;
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
    // Run twice, the registers starting at two fills: an output that
    // depends on the fill read a register the kernel never wrote (on a GPU,
    // what the previous kernel left there).
    let run = |fill: u64| -> Result<Vec<u64>, String> {
        let mut out = vec![u64::MAX; out_size.div_ceil(8)];
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
        // SAFETY: every span points into a live Vec of at least `len`
        // bytes (the inputs outlive `spans`, `out` outlives `launch`).
        unsafe { kernel.launch_filled(&launch, fill) }
            .map_err(|f| format!("accepted kernel faulted with n = {n}, fill {fill:#x}: {f}"))?;
        Ok(out)
    };
    let fill: u64 = r.random();
    let (a, b) = (run(fill)?, run(!fill)?);
    match a.iter().zip(&b).position(|(x, y)| x != y) {
        None => Ok(true),
        Some(w) => Err(format!(
            "accepted kernel's output depends on registers it never wrote (n = {n}, \
             fills {fill:#x} and {:#x}: word {w} is {:#x} and {:#x})",
            !fill, a[w], b[w]
        )),
    }
}

/// The Triton family's oracle: canonicalizes `text` with every family; if
/// the Triton proof accepts it (branch-free kernels only), interprets the
/// canonical program's integer arithmetic for every thread of a few blocks
/// of a launch whose preconditions hold, and checks every global access
/// that runs (or whose predicate is unknown) against its operand's
/// contract footprint, a scratch pointer (null) being no operand at all,
/// and every register read (a guard even when false) against the thread's
/// writes so far (a guarded write counting only when its guard is known
/// true). `Ok(true)`: accepted, every access in bounds and every read
/// written; `Ok(false)`: refused, not the Triton family, or not judgeable
/// (an address computed from data); `Err`: an accepted kernel touched a
/// byte its contract does not grant or read a register it may not have
/// written.
pub fn triton_oracle(text: &str, symbol: &str, r: &mut impl Rng) -> Result<bool, String> {
    triton_oracle_granting_less(text, symbol, r, 0)
}

/// [`triton_oracle`] with every grant `less` bytes short of its footprint:
/// the check of the oracle itself (one element less must be caught).
pub fn triton_oracle_granting_less(
    text: &str,
    symbol: &str,
    r: &mut impl Rng,
    less: u128,
) -> Result<bool, String> {
    use ptxd::ptx::contract::{BlockRule, ParamKind};
    use ptxd::ptx::Families;
    let Ok(canonical) = ptx::canonicalize_with(text, symbol, None, Families::ALL) else {
        return Ok(false);
    };
    let c = &canonical.contract;
    let BlockRule::Required(block) = c.geometry.block else {
        return Ok(false);
    };
    if !c
        .params
        .iter()
        .any(|p| matches!(p.kind, ParamKind::Pointer { operand: None, .. }))
    {
        return Ok(false);
    }
    let Ok(kernel) = ptx::lower(&canonical.text, symbol) else {
        return Err("the canonical text does not lower".into());
    };
    if kernel.insts.iter().any(|i| i.base == "bra") {
        return Ok(false);
    }
    let n: u64 = match r.random_range(0..4) {
        0 => *[0u64, 1, 3, 1000, 4097, (1 << 31) - 1]
            .choose(r)
            .unwrap_or(&1),
        _ => r.random_range(0..70_000),
    };
    let values = c.values(n, block);
    // A 64-bit integer scalar (a broadcast's divisor) a small value, mostly
    // at least 1; any other scalar random bits.
    let args: Vec<u64> = c
        .scalar_types()
        .iter()
        .map(|t| match t {
            ptxd::ptx::contract::ScalarType::U64 | ptxd::ptx::contract::ScalarType::S64 => {
                match r.random_range(0..8) {
                    0 => *[0u64, 1, u64::MAX].choose(r).unwrap_or(&1),
                    _ => r.random_range(1..5000),
                }
            }
            _ => r.next_u64(),
        })
        .collect();
    if !c.preconditions.iter().all(|p| p.holds_with(&values, &args)) {
        return Ok(false);
    }
    // Each pointer param's base and the bytes it grants.
    let region = |k: usize| ((k as u64) + 1) << 44;
    let mut granted: Vec<Option<Grant>> = vec![None; c.params.len()];
    for f in &c.footprints {
        let Some(bytes) = f.bytes.eval_with(&values, &args) else {
            return Ok(false);
        };
        // Regions lie 2^44 bytes apart: a larger grant (no buffer is that
        // large) could not be told from the next param's.
        if bytes >= 1 << 44 {
            return Ok(false);
        }
        let written = matches!(
            c.params.get(usize::from(f.param)).map(|p| &p.kind),
            Some(ParamKind::Pointer {
                access: ptxd::ptx::contract::PointerAccess::Written,
                ..
            })
        );
        granted[usize::from(f.param)] = Some(Grant {
            base: region(usize::from(f.param)),
            bytes: bytes.saturating_sub(less),
            written,
        });
    }
    let mut next_arg = args.iter().copied();
    let params: Vec<u64> = c
        .params
        .iter()
        .enumerate()
        .map(|(k, p)| match p.kind {
            ParamKind::Pointer {
                operand: Some(_), ..
            } => region(k),
            ParamKind::Pointer { operand: None, .. } => 0,
            ParamKind::Count(_) => n,
            ParamKind::Scalar(_) => next_arg.next().unwrap_or(0),
        })
        .collect();
    // The first and last blocks, a random one, and those holding each
    // footprint's last element and the one past it (a static shape's
    // bound lies anywhere in the grid).
    let mut blocks = vec![0, values.grid.saturating_sub(1)];
    blocks.push(r.random_range(0..values.grid.max(1)));
    let per_block = u128::from(block) * u128::from(c.geometry.elements_per_thread);
    for (f, size) in c.footprints.iter().zip(&canonical.signature.element_sizes) {
        if let Some(bytes) = f.bytes.eval_with(&values, &args) {
            let last = (bytes / u128::from((*size).max(1))).saturating_sub(1) / per_block.max(1);
            let last = u64::try_from(last).unwrap_or(u64::MAX);
            blocks.extend([last, last.saturating_add(1)]);
        }
    }
    blocks.sort_unstable();
    blocks.retain(|b| *b < values.grid);
    blocks.dedup();
    for ctaid in blocks {
        for tid in 0..u64::from(block) {
            match interpret(&kernel, &params, &granted, ctaid, tid) {
                Ok(None) => {}
                Ok(Some(e)) => return Err(format!("n = {n}, ctaid {ctaid}, tid {tid}: {e}")),
                // Not judgeable (an address from data): counted as refused.
                Err(_) => return Ok(false),
            }
        }
    }
    Ok(true)
}

/// What a launch operand's pointer may touch: `bytes` from `base`, and
/// whether stores may.
#[derive(Clone, Copy)]
struct Grant {
    base: u64,
    bytes: u128,
    written: bool,
}

/// One thread's run of a branch-free kernel's integer arithmetic:
/// `Ok(Some(why))` for an access outside its grant or a read of a register
/// the thread may not have written, `Err` when a value the
/// check needs was computed from data (the mutant cannot be judged: the
/// caller counts it as refused).
fn interpret(
    k: &ptx::ir::Kernel,
    params: &[u64],
    granted: &[Option<Grant>],
    ctaid: u64,
    tid: u64,
) -> Result<Option<String>, String> {
    use ptx::ir::{Base, Opnd, Sreg, Ty};
    use ptx::parse::Imm;
    let mut regs: Vec<Option<u64>> = vec![None; k.reg_types.len()];
    // Whether this thread has written each register: a read of one it
    // never wrote (or wrote only under a guard that may not have held)
    // returns what the previous kernel left there.
    let mut written = vec![Written::No; k.reg_types.len()];
    let mask = |bits: u32, v: u64| {
        if bits >= 64 {
            v
        } else {
            v & ((1u64 << bits) - 1)
        }
    };
    let sext = |bits: u32, v: u64| {
        if bits >= 64 {
            v
        } else {
            let s = 64 - bits;
            (((v << s) as i64) >> s) as u64
        }
    };
    for inst in &k.insts {
        let read = |o: &Opnd, regs: &[Option<u64>]| -> Option<u64> {
            match o {
                Opnd::Reg(r) => regs.get(*r as usize).copied().flatten(),
                Opnd::Imm(Imm::Int(v)) => Some(*v as u64),
                Opnd::Sreg(Sreg::Ctaid(0)) => Some(ctaid),
                Opnd::Sreg(Sreg::Tid(0)) => Some(tid),
                _ => None,
            }
        };
        let runs = match inst.guard {
            None => Some(true),
            Some((neg, p)) => regs
                .get(p as usize)
                .copied()
                .flatten()
                .map(|v| (v != 0) != neg),
        };
        // The guard is read whether or not the instruction runs.
        if let Some((_, p)) = inst.guard {
            if let Some(why) = unwritten(&written, p, inst) {
                return Ok(Some(why));
            }
        }
        if runs == Some(false) {
            continue;
        }
        // A `ret` or `exit` that surely runs ends the thread: what follows
        // never runs (one under a guard from data may not: the thread goes
        // on, a superset of what it does).
        if matches!(inst.base.as_str(), "ret" | "exit") {
            if runs == Some(true) {
                return Ok(None);
            }
            continue;
        }
        for r in sources(inst) {
            if let Some(why) = unwritten(&written, r, inst) {
                return Ok(Some(why));
            }
        }
        for r in destinations_of(inst) {
            if let Some(w) = written.get_mut(r) {
                *w = match (runs, *w) {
                    (Some(true), _) | (None, Written::Yes) => Written::Yes,
                    _ => Written::Maybe,
                };
            }
        }
        let tys = inst.types();
        let ty = tys.last().copied().unwrap_or(Ty::Other);
        let bits = ty.bits();
        let src = |i: usize, regs: &[Option<u64>]| inst.ops.get(i).and_then(|o| read(o, regs));
        let dest = match inst.ops.first() {
            Some(Opnd::Reg(r)) => Some(*r as usize),
            _ => None,
        };
        let is_access = matches!(inst.base.as_str(), "ld" | "st") && inst.has("global");
        if is_access {
            let addr_op = if inst.base == "st" { 0 } else { 1 };
            let Some(Opnd::Addr {
                base: Base::Reg(b),
                offset,
            }) = inst.ops.get(addr_op)
            else {
                return Err("an access at no register".into());
            };
            let Some(base) = regs.get(*b as usize).copied().flatten() else {
                return Err("an address computed from data".into());
            };
            let lanes = if inst.has("v4") {
                4
            } else if inst.has("v2") {
                2
            } else {
                1
            };
            let width = u128::from(lanes * ty.bytes());
            let addr = base.wrapping_add(*offset as u64);
            let store = inst.base == "st";
            let hit = granted
                .iter()
                .flatten()
                .find(|g| addr >= g.base && addr - g.base < 1 << 44);
            let ok = hit.is_some_and(|g| {
                u128::from(addr - g.base) + width <= g.bytes && (g.written || !store)
            });
            if !ok {
                return Ok(Some(format!(
                    "line {}: `{}` at {addr:#x} ({width} bytes) outside every grant",
                    inst.line, inst.opcode
                )));
            }
            // A loaded value is data.
            if inst.base == "ld" {
                for r in destinations(inst) {
                    regs[r] = None;
                }
            }
            continue;
        }
        let v: Option<u64> = match inst.base.as_str() {
            "ld" if inst.has("param") => match inst.ops.get(1) {
                Some(Opnd::Addr {
                    base: Base::Param(p),
                    offset: 0,
                }) => params.get(usize::from(*p)).map(|v| mask(bits, *v)),
                _ => None,
            },
            "mov" => src(1, &regs).map(|v| mask(bits, v)),
            "shl" => match (src(1, &regs), src(2, &regs)) {
                (Some(a), Some(s)) if s < u64::from(bits) => Some(mask(bits, a << s)),
                (Some(_), Some(_)) => Some(0),
                _ => None,
            },
            "shr" if ty.is_int() => match (src(1, &regs), src(2, &regs)) {
                (Some(a), Some(s)) => {
                    let s = s.min(u64::from(bits)) as u32;
                    Some(if ty.is_signed() {
                        let a = sext(bits, a) as i64;
                        mask(bits, (a >> s.min(63)) as u64)
                    } else {
                        mask(bits, mask(bits, a).checked_shr(s).unwrap_or(0))
                    })
                }
                _ => None,
            },
            // `bfe d, a, pos, len`: bits `[pos, pos + len)` of `a`, sign
            // extended from the last one taken for `.s32`/`.s64`.
            "bfe" if ty.is_int() => match (src(1, &regs), src(2, &regs), src(3, &regs)) {
                (Some(a), Some(pos), Some(len)) => {
                    let (pos, len) = ((pos & 0xff) as u32, (len & 0xff) as u32);
                    let a = mask(bits, a);
                    if len == 0 {
                        Some(0)
                    } else {
                        let top = (pos + len).min(bits);
                        let field = if pos >= bits {
                            0
                        } else {
                            mask(top - pos, a >> pos)
                        };
                        let msb = if pos + len > bits {
                            (a >> (bits - 1)) & 1
                        } else {
                            (a >> (pos + len - 1)) & 1
                        };
                        Some(if ty.is_signed() && msb == 1 {
                            mask(bits, field | !mask(top.saturating_sub(pos), u64::MAX))
                        } else {
                            field
                        })
                    }
                }
                _ => None,
            },
            // A remainder by zero has no specified value: an accepted
            // kernel whose preconditions hold never computes one.
            "rem" if ty.is_int() => match (src(1, &regs), src(2, &regs)) {
                (Some(_), Some(b)) if mask(bits, b) == 0 => {
                    return Ok(Some(format!(
                        "line {}: `{}` divides by zero",
                        inst.line, inst.opcode
                    )));
                }
                (Some(a), Some(b)) => Some(if ty.is_signed() {
                    let (a, b) = (sext(bits, a) as i64, sext(bits, b) as i64);
                    mask(bits, a.wrapping_rem(b) as u64)
                } else {
                    mask(bits, mask(bits, a) % mask(bits, b))
                }),
                _ => None,
            },
            "and" | "or" | "xor" | "add" | "sub" if ty.is_int() && bits >= 32 => {
                match (src(1, &regs), src(2, &regs)) {
                    (Some(a), Some(b)) => Some(mask(
                        bits,
                        match inst.base.as_str() {
                            "and" => a & b,
                            "or" => a | b,
                            "xor" => a ^ b,
                            "add" => a.wrapping_add(b),
                            _ => a.wrapping_sub(b),
                        },
                    )),
                    _ => None,
                }
            }
            "mul" | "mad" if ty.is_int() => {
                let (a, b) = (src(1, &regs), src(2, &regs));
                let c = if inst.base == "mad" {
                    src(3, &regs)
                } else {
                    Some(0)
                };
                match (a, b, c) {
                    (Some(a), Some(b), Some(c)) if inst.has("wide") => {
                        let (a, b) = if ty.is_signed() {
                            (sext(bits, a), sext(bits, b))
                        } else {
                            (mask(bits, a), mask(bits, b))
                        };
                        Some(a.wrapping_mul(b).wrapping_add(c))
                    }
                    (Some(a), Some(b), Some(c)) if inst.has("lo") => {
                        Some(mask(bits, a.wrapping_mul(b).wrapping_add(c)))
                    }
                    _ => None,
                }
            }
            "cvt" if tys.len() == 2 && tys[0].is_int() && tys[1].is_int() => {
                let (to, from) = (tys[0], tys[1]);
                src(1, &regs).map(|v| {
                    let v = if from.is_signed() {
                        sext(from.bits(), v)
                    } else {
                        mask(from.bits(), v)
                    };
                    mask(to.bits(), v)
                })
            }
            "setp" if ty.is_int() => match (src(1, &regs), src(2, &regs)) {
                (Some(a), Some(b)) => {
                    let (sa, sb) = (sext(bits, a) as i64, sext(bits, b) as i64);
                    let (ua, ub) = (mask(bits, a), mask(bits, b));
                    let cmp = inst.mods.first().map(String::as_str).unwrap_or("");
                    let t = match (cmp, ty.is_signed()) {
                        ("lt", true) => sa < sb,
                        ("le", true) => sa <= sb,
                        ("gt", true) => sa > sb,
                        ("ge", true) => sa >= sb,
                        ("lt" | "lo", false) => ua < ub,
                        ("le" | "ls", false) => ua <= ub,
                        ("gt" | "hi", false) => ua > ub,
                        ("ge" | "hs", false) => ua >= ub,
                        ("eq", _) => ua == ub,
                        ("ne", _) => ua != ub,
                        _ => return Err(format!("setp .{cmp}")),
                    };
                    // A combined compare (`setp.lt.or.s32 p, a, b, q`)
                    // folds in its predicate operand, negated as `!q`.
                    let comb = inst
                        .mods
                        .iter()
                        .find(|m| matches!(m.as_str(), "and" | "or" | "xor"));
                    match (comb.map(String::as_str), inst.ops.get(3)) {
                        (None, None) => Some(u64::from(t)),
                        (Some(c), Some(Opnd::Reg(q) | Opnd::Not(q))) => {
                            let neg = matches!(inst.ops.get(3), Some(Opnd::Not(_)));
                            regs.get(*q as usize).copied().flatten().map(|v| {
                                let q = (v != 0) != neg;
                                u64::from(match c {
                                    "and" => t && q,
                                    "or" => t || q,
                                    _ => t != q,
                                })
                            })
                        }
                        // A pair destination (`%p|%q`) or another form:
                        // left unknown.
                        _ => None,
                    }
                }
                _ => None,
            },
            _ => None,
        };
        // A predicated write that may not run leaves the register unknown
        // (its old value or the new one).
        let v = if runs == Some(true) { v } else { None };
        if inst.base == "st" {
            continue;
        }
        match dest {
            Some(d) if !matches!(inst.ops.first(), Some(Opnd::Pair(..))) => {
                if let Some(slot) = regs.get_mut(d) {
                    *slot = v;
                }
            }
            _ => {
                for r in destinations(inst) {
                    regs[r] = None;
                }
            }
        }
    }
    Ok(None)
}

/// Whether one thread has written a register so far.
#[derive(Clone, Copy, PartialEq)]
enum Written {
    No,
    /// Only under a guard whose value came from data.
    Maybe,
    Yes,
}

/// Why reading `r` at `inst` reads a register not surely written.
fn unwritten(written: &[Written], r: u32, inst: &ptx::ir::Inst) -> Option<String> {
    match written.get(r as usize) {
        Some(Written::Yes) => None,
        w => Some(format!(
            "line {}: `{}` reads register {r}, {} written before",
            inst.line,
            inst.opcode,
            if w == Some(&Written::Maybe) {
                "perhaps not"
            } else {
                "never"
            }
        )),
    }
}

/// Whether `inst` writes its first operand: everything but stores and
/// control flow.
fn has_destination(inst: &ptx::ir::Inst) -> bool {
    !matches!(
        inst.base.as_str(),
        "st" | "bra" | "ret" | "exit" | "prefetch" | "prefetchu" | "red" | "bar" | "trap"
    )
}

/// The registers `inst` writes (none for a store or control flow).
fn destinations_of(inst: &ptx::ir::Inst) -> Vec<usize> {
    if has_destination(inst) {
        destinations(inst)
    } else {
        Vec::new()
    }
}

/// The registers `inst` reads as sources or address bases (its guard
/// apart): every register of every operand but the destination.
fn sources(inst: &ptx::ir::Inst) -> Vec<u32> {
    use ptx::ir::{Base, Opnd};
    fn of(o: &Opnd, into: &mut Vec<u32>) {
        match o {
            Opnd::Reg(r) | Opnd::Not(r) => into.push(*r),
            Opnd::Pair(a, b) => into.extend([*a, *b]),
            Opnd::Addr {
                base: Base::Reg(r), ..
            } => into.push(*r),
            Opnd::List(items) => items.iter().for_each(|o| of(o, into)),
            _ => {}
        }
    }
    let skip = usize::from(has_destination(inst));
    let mut out = Vec::new();
    for o in inst.ops.iter().skip(skip) {
        of(o, &mut out);
    }
    out
}

fn destinations(inst: &ptx::ir::Inst) -> Vec<usize> {
    use ptx::ir::Opnd;
    match inst.ops.first() {
        Some(Opnd::Reg(r)) => vec![*r as usize],
        Some(Opnd::Pair(a, b)) => vec![*a as usize, *b as usize],
        Some(Opnd::List(items)) => items
            .iter()
            .filter_map(|o| match o {
                Opnd::Reg(r) => Some(*r as usize),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}
