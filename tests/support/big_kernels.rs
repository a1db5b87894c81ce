//! Large generated PTX for the verifier's cost: an accepted kernel of
//! replicated elementwise bodies, a hostile one of many blocks and many
//! registers in one long branch chain, a valid loop of many blocks each
//! branching back over many registers, and a hostile one where many blocks
//! join two states that differ in every register; each grown to a byte
//! size.
//!
//! Included with `#[path]` by `benches/verify.rs` and `tests/verifier/verification.rs`.
//!
//! Invariants:
//! - [`accepted`] is the scalar ABI `add_f32(in0, in1, out, n)`: every
//!   copy of the body is guarded by `i < n` and recomputes its addresses
//!   from registers written in the entry block, so every register it reads
//!   is written on every path before the read; its result is
//!   `out[i] = in0[i] + in1[i]` whatever the number of copies.
//! - [`refused`] differs from a valid kernel only in its last store, whose
//!   address is data (a value loaded from `in0`): a verifier refuses it
//!   only after it walked the whole chain.
//! - [`loops`] is `out[i] = in0[i] + in1[i]` after a loop of `m` blocks over `m`
//!   registers, each block writing one and branching back to the top (so
//!   the top joins `m` back edges, each state differing from the top's in
//!   the registers written on its way); it is valid and accepted.
//! - [`joins`] has two arms that write the same `m` registers with
//!   different constants, then `m` blocks each reached from both arms (so
//!   each joins two states that differ in all `m` registers); it is
//!   refused at the same data-addressed store as [`refused`].
//! - [`accepted`] and [`refused`] are at least `bytes` long and at most one
//!   copy and the epilogue (a few hundred bytes) longer; [`loops`] and
//!   [`joins`] at least `bytes` and at most about an eighth longer.
#![allow(dead_code)]

use std::fmt::Write as _;

const HEADER: &str = ".version 9.0\n.target sm_90\n.address_size 64\n\n";

/// The entry block shared by both: params, the global index `%rd1`, the
/// guard `%p1` (`i >= n`) and the three global pointers `%rd8`, `%rd11`,
/// `%rd13`.
fn prologue(symbol: &str, regs: (usize, usize, usize, usize)) -> String {
    let (preds, fs, rs, rds) = regs;
    format!(
        "{HEADER}.visible .entry {symbol}(\n\
         \t.param .u64 {symbol}_param_0,\n\
         \t.param .u64 {symbol}_param_1,\n\
         \t.param .u64 {symbol}_param_2,\n\
         \t.param .u64 {symbol}_param_3\n\
         )\n{{\n\
         \t.reg .pred %p<{preds}>;\n\
         \t.reg .f32 %f<{fs}>;\n\
         \t.reg .b32 %r<{rs}>;\n\
         \t.reg .b64 %rd<{rds}>;\n\n\
         \tld.param.u64 %rd2, [{symbol}_param_0];\n\
         \tld.param.u64 %rd3, [{symbol}_param_1];\n\
         \tld.param.u64 %rd4, [{symbol}_param_2];\n\
         \tld.param.u64 %rd5, [{symbol}_param_3];\n\
         \tmov.u32 %r1, %ctaid.x;\n\
         \tmov.u32 %r2, %ntid.x;\n\
         \tmul.wide.u32 %rd6, %r1, %r2;\n\
         \tmov.u32 %r3, %tid.x;\n\
         \tcvt.u64.u32 %rd7, %r3;\n\
         \tadd.s64 %rd1, %rd6, %rd7;\n\
         \tsetp.ge.s64 %p1, %rd1, %rd5;\n\
         \tcvta.to.global.u64 %rd8, %rd2;\n\
         \tcvta.to.global.u64 %rd11, %rd3;\n\
         \tcvta.to.global.u64 %rd13, %rd4;\n"
    )
}

/// `out[i] = in0[i] + in1[i]`, the guarded body replicated until the text
/// is at least `bytes` long (each copy with registers of its own, as an
/// unrolled loop compiles).
pub fn accepted(bytes: usize) -> String {
    let rd = |k: usize, j: usize| 16 + 4 * k + j;
    let f = |k: usize, j: usize| 1 + 3 * k + j;
    // Sized with the shortest prologue, so the text is at least `bytes`.
    let head = prologue("big_add", (2, 1, 4, 1)).len();
    let mut body = String::new();
    let mut k = 0;
    while head + body.len() < bytes || k == 0 {
        let _ = write!(
            body,
            "\t@%p1 bra $L__C{k};\n\
             \tshl.b64 %rd{a}, %rd1, 2;\n\
             \tadd.s64 %rd{b}, %rd8, %rd{a};\n\
             \tadd.s64 %rd{c}, %rd11, %rd{a};\n\
             \tld.global.f32 %f{f0}, [%rd{b}];\n\
             \tld.global.f32 %f{f1}, [%rd{c}];\n\
             \tadd.f32 %f{f2}, %f{f0}, %f{f1};\n\
             \tadd.s64 %rd{d}, %rd13, %rd{a};\n\
             \tst.global.f32 [%rd{d}], %f{f2};\n\
             $L__C{k}:\n",
            a = rd(k, 0),
            b = rd(k, 1),
            c = rd(k, 2),
            d = rd(k, 3),
            f0 = f(k, 0),
            f1 = f(k, 1),
            f2 = f(k, 2),
        );
        k += 1;
    }
    let mut text = prologue("big_add", (2, f(k, 0), 4, rd(k, 0)));
    text.push_str(&body);
    text.push_str("\tret;\n}\n");
    text
}

/// A long forward branch chain: each link is its own block that writes a
/// register of its own (so a verifier that keeps a full register state per
/// block holds blocks × registers; every read is of a register the entry
/// block wrote), then a guarded store whose address is data.
pub fn refused(bytes: usize) -> String {
    // Sized with the shortest prologue, so the text is at least `bytes`.
    let head = prologue("big_hostile", (2, 4, 1, 20)).len();
    let mut body = String::new();
    let mut k = 0;
    while head + body.len() < bytes || k == 0 {
        let _ = write!(
            body,
            "\t@%p1 bra $L__H{k};\n\tadd.s32 %r{next}, %r1, {k};\n$L__H{k}:\n",
            next = k + 4,
        );
        k += 1;
    }
    let data = k + 4;
    let mut text = prologue("big_hostile", (2, 4, data + 1, 20));
    text.push_str(&body);
    let _ = write!(
        text,
        "\t@%p1 bra $L__END;\n\
         \tshl.b64 %rd9, %rd1, 2;\n\
         \tadd.s64 %rd10, %rd8, %rd9;\n\
         \tld.global.u32 %r{data}, [%rd10];\n\
         \tcvt.u64.u32 %rd12, %r{data};\n\
         \tadd.s64 %rd14, %rd13, %rd12;\n\
         \tmov.f32 %f1, 0f00000000;\n\
         \tst.global.f32 [%rd14], %f1;\n\
         $L__END:\n\
         \tret;\n}}\n",
    );
    text
}

/// The data-addressed store [`refused`] and [`joins`] end with (after the
/// guard), reading the data from `%r{data}`.
fn data_store(text: &mut String, data: usize) {
    let _ = write!(
        text,
        "\t@%p1 bra $L__END;\n\
         \tshl.b64 %rd9, %rd1, 2;\n\
         \tadd.s64 %rd10, %rd8, %rd9;\n\
         \tld.global.u32 %r{data}, [%rd10];\n\
         \tcvt.u64.u32 %rd12, %r{data};\n\
         \tadd.s64 %rd14, %rd13, %rd12;\n\
         \tmov.f32 %f1, 0f00000000;\n\
         \tst.global.f32 [%rd14], %f1;\n\
         $L__END:\n\
         \tret;\n}}\n",
    );
}

/// The smallest `m` (grown by eighths) for which `make(m)` is at least
/// `bytes` long.
fn grown(bytes: usize, make: impl Fn(usize) -> String) -> String {
    let mut m = (bytes / 128).max(1);
    loop {
        let text = make(m);
        if text.len() >= bytes {
            return text;
        }
        m += m / 8 + 1;
    }
}

/// `m` registers set in the entry, then `m` blocks, each writing one
/// register from another and branching back to the top while `%p2`
/// (`ctaid.x == 1`, data) holds; then `out[i] = in0[i] + in1[i]`.
pub fn loops(bytes: usize) -> String {
    grown(bytes, |m| {
        let mut text = prologue("big_loops", (3, 4, m + 4, 16));
        text.push_str("\t@%p1 bra $L__END;\n");
        for r in 4..m + 4 {
            let _ = writeln!(text, "\tmov.b32 %r{r}, {r};");
        }
        text.push_str("\tsetp.eq.s32 %p2, %r1, 1;\n$L__TOP:\n");
        for b in 0..m {
            let d = 4 + (b * 7) % m;
            let a = 4 + (b * 13) % m;
            let _ = write!(
                text,
                "\tadd.s32 %r{d}, %r{a}, %r{d};\n\t@%p2 bra $L__TOP;\n"
            );
        }
        text.push_str(
            "\tshl.b64 %rd9, %rd1, 2;\n\
             \tadd.s64 %rd10, %rd8, %rd9;\n\
             \tld.global.f32 %f1, [%rd10];\n\
             \tadd.s64 %rd12, %rd11, %rd9;\n\
             \tld.global.f32 %f2, [%rd12];\n\
             \tadd.f32 %f3, %f1, %f2;\n\
             \tadd.s64 %rd14, %rd13, %rd9;\n\
             \tst.global.f32 [%rd14], %f3;\n\
             $L__END:\n\
             \tret;\n}\n",
        );
        text
    })
}

/// Two arms writing the same `m` registers with different constants, each
/// then branching to every one of `m` join blocks, which fall through
/// into each other; then the data-addressed store.
pub fn joins(bytes: usize) -> String {
    grown(bytes, |m| {
        let data = m + 4;
        let mut text = prologue("big_joins", (3, 2, data + 1, 16));
        text.push_str("\tsetp.eq.s32 %p2, %r1, 1;\n\t@%p2 bra $L__ARM;\n");
        for arm in 0..2 {
            if arm == 1 {
                text.push_str("$L__ARM:\n");
            }
            for r in 4..m + 4 {
                let _ = writeln!(text, "\tmov.b32 %r{r}, {};", r + arm);
            }
            for j in 0..m {
                let _ = writeln!(text, "\t@%p2 bra $L__J{j};");
            }
            let _ = writeln!(text, "\tbra.uni $L__J0;");
        }
        for j in 0..m {
            let _ = writeln!(text, "$L__J{j}:\n\tadd.s32 %r3, %r{}, 1;", 4 + j);
        }
        data_store(&mut text, data);
        text
    })
}
