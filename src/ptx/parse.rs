//! Lexer and parser for PTX modules as nvcc/NVVM, LLVM NVPTX (Triton) and
//! JIT emitters write them.
//!
//! Invariants:
//! - Never panics and never recurses on input: braces, scopes and debug
//!   sections are tracked with counters, capped at [`MAX_SCOPE_DEPTH`].
//! - Memory is linear in the input: a register range `%r<N>` is recorded as
//!   one declaration (never expanded), and `N` is capped at
//!   [`MAX_REGISTER_RANGE`] anyway.
//! - Every error carries the 1-based line and column of the offending token.

use super::PtxError;

/// The largest `N` accepted in `.reg .t %r<N>`. Nothing is allocated per
/// declared register; the cap keeps register ids comfortably inside `u32`.
pub const MAX_REGISTER_RANGE: u32 = 1 << 20;
/// The deepest `{ }` nesting accepted inside a function body.
pub const MAX_SCOPE_DEPTH: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TokKind {
    /// Identifier, directive (`.reg`), register (`%r1`), opcode (`ld.global.f32`).
    Word,
    /// An integer literal; the value is in `Tok::int`.
    Int,
    /// `0fXXXXXXXX`: the f32 bits are in `Tok::int`.
    F32,
    /// `0dXXXXXXXXXXXXXXXX` or a decimal float: the f64 bits are in `Tok::int`.
    F64,
    Str,
    Punct(u8),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Tok<'a> {
    pub kind: TokKind,
    pub text: &'a str,
    pub int: u64,
    pub line: u32,
    pub col: u32,
}

fn err(line: u32, column: u32, message: impl Into<String>) -> PtxError {
    PtxError::Parse {
        line,
        column,
        message: message.into(),
    }
}

fn is_word_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || matches!(c, b'_' | b'$' | b'%' | b'.')
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.')
}

/// Splits `text` into tokens, dropping comments.
pub(crate) fn lex(text: &str) -> Result<Vec<Tok<'_>>, PtxError> {
    let bytes = text.as_bytes();
    let mut toks = Vec::new();
    let (mut i, mut line, mut line_start) = (0usize, 1u32, 0usize);
    while i < bytes.len() {
        let c = bytes[i];
        let col = u32::try_from(i - line_start + 1).unwrap_or(u32::MAX);
        if c == b'\n' {
            line = line.saturating_add(1);
            i += 1;
            line_start = i;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'*') {
            let (start_line, start_col) = (line, col);
            i += 2;
            loop {
                match bytes.get(i) {
                    None => return Err(err(start_line, start_col, "unterminated /* comment")),
                    Some(b'*') if bytes.get(i + 1) == Some(&b'/') => {
                        i += 2;
                        break;
                    }
                    Some(b'\n') => {
                        line = line.saturating_add(1);
                        i += 1;
                        line_start = i;
                    }
                    Some(_) => i += 1,
                }
            }
            continue;
        }
        let start = i;
        let mut tok = Tok {
            kind: TokKind::Word,
            text: "",
            int: 0,
            line,
            col,
        };
        if c == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                i += 1;
            }
            if bytes.get(i) != Some(&b'"') {
                return Err(err(line, col, "unterminated string"));
            }
            i += 1;
            tok.kind = TokKind::Str;
        } else if c.is_ascii_digit() {
            while i < bytes.len() && is_word_char(bytes[i]) {
                // A decimal exponent may carry a sign: 1e-5.
                if matches!(bytes[i], b'e' | b'E')
                    && matches!(bytes.get(i + 1), Some(b'+' | b'-'))
                    && !text[start..i].starts_with("0x")
                    && !text[start..i].starts_with("0X")
                    && !text[start..i].starts_with("0f")
                    && !text[start..i].starts_with("0d")
                {
                    i += 1;
                }
                i += 1;
            }
            let (kind, value) = number(&text[start..i]).ok_or_else(|| {
                err(
                    line,
                    col,
                    format!("malformed number {:?}", clip(&text[start..i])),
                )
            })?;
            tok.kind = kind;
            tok.int = value;
        } else if is_word_start(c) {
            i += 1;
            loop {
                match bytes.get(i) {
                    Some(&b) if is_word_char(b) => i += 1,
                    // `::` inside an opcode or a state space
                    // (`ld.global.L1::no_allocate`, `shared::cta`) belongs to
                    // the word; a label definition is one `:`.
                    Some(b':')
                        if bytes.get(i + 1) == Some(&b':')
                            && bytes.get(i + 2).copied().is_some_and(is_word_char) =>
                    {
                        i += 2;
                    }
                    _ => break,
                }
            }
        } else if b",;:[](){}<>+-@!=|".contains(&c) {
            i += 1;
            tok.kind = TokKind::Punct(c);
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(err(line, col, format!("unexpected character {ch:?}")));
        }
        tok.text = &text[start..i];
        if toks.len() >= MAX_TOKENS {
            return Err(too_complex(
                line,
                format!("the text has more than {MAX_TOKENS} tokens"),
            ));
        }
        toks.push(tok);
    }
    Ok(toks)
}

/// The most tokens a module may have: with [`MAX_INSTRUCTIONS`], what
/// bounds the memory and time parsing, lowering and verifying one module
/// can take (the verifier's own work is bounded in `verify/cfg.rs`). The
/// largest nvcc corpus module has about 10 000.
pub const MAX_TOKENS: usize = 1 << 19;

/// The most instructions a module may have, over all its functions.
pub const MAX_INSTRUCTIONS: usize = 1 << 15;
/// The most bytes of integer initializers a module keeps, zero padding
/// included, over all its variables (past it, an initializer is dropped,
/// as one that does not fit its variable is).
pub const MAX_INITIALIZER: usize = 1 << 16;

/// A module too large to analyse within the bounds: a `too_complex`
/// refusal, like the verifier's own.
fn too_complex(line: u32, explanation: String) -> PtxError {
    PtxError::NonScalarAbi {
        sub_reason: super::SubReason::TooComplex.as_str(),
        param: None,
        line: Some(line),
        explanation,
    }
}

/// At most 40 characters of `s`, for messages.
pub(crate) fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn number(s: &str) -> Option<(TokKind, u64)> {
    let lower = s.to_ascii_lowercase();
    if let Some(hex) = lower.strip_prefix("0f") {
        if hex.len() == 8 {
            return u32::from_str_radix(hex, 16)
                .ok()
                .map(|v| (TokKind::F32, u64::from(v)));
        }
        return None;
    }
    if let Some(hex) = lower.strip_prefix("0d") {
        if hex.len() == 16 {
            return u64::from_str_radix(hex, 16).ok().map(|v| (TokKind::F64, v));
        }
        return None;
    }
    let body = lower.strip_suffix('u').unwrap_or(&lower);
    if let Some(hex) = body.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).ok().map(|v| (TokKind::Int, v));
    }
    if let Some(bin) = body.strip_prefix("0b") {
        return u64::from_str_radix(bin, 2).ok().map(|v| (TokKind::Int, v));
    }
    if body.contains(['.', 'e']) {
        let v: f64 = lower.parse().ok()?;
        return Some((TokKind::F64, v.to_bits()));
    }
    if body.len() > 1 && body.starts_with('0') {
        return u64::from_str_radix(&body[1..], 8)
            .ok()
            .map(|v| (TokKind::Int, v));
    }
    body.parse::<u64>().ok().map(|v| (TokKind::Int, v))
}

/// An immediate operand as written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Imm {
    /// An integer, two's complement.
    Int(i64),
    /// `0f` literal bits.
    F32(u32),
    /// `0d` literal bits or a decimal float.
    F64(u64),
}

/// The base of an address operand `[base+offset]`.
#[derive(Debug, Clone, PartialEq)]
pub enum AddrBase {
    /// A register or a symbol (param, variable), resolved later.
    Name(String),
    /// An absolute address.
    Imm(i64),
}

/// An operand as written.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    /// A register, special register, label or symbol.
    Name(String),
    /// `!%p`
    Not(String),
    /// `%p|%q` (setp's two destinations).
    Pair(String, String),
    Imm(Imm),
    Addr {
        base: AddrBase,
        offset: i64,
    },
    /// `{a, b, ..}` or a call's `(a, b, ..)`.
    List(Vec<Operand>),
}

/// One instruction.
#[derive(Debug, Clone, PartialEq)]
pub struct Instr {
    /// `@%p` / `@!%p`: (negated, register).
    pub guard: Option<(bool, String)>,
    /// The full dotted opcode, e.g. `ld.global.f32`.
    pub opcode: String,
    pub operands: Vec<Operand>,
    pub line: u32,
    pub col: u32,
}

/// A statement of a function body.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `.reg .ty %r<N>;` (`count = Some(N)`) or `.reg .ty %a, %b;`.
    Reg {
        ty: String,
        name: String,
        count: Option<u32>,
        line: u32,
        col: u32,
    },
    /// A `.shared`/`.local`/`.const`/`.global` variable declared in the body.
    Var {
        space: String,
        name: String,
        /// Its size in bytes, for a `.bN`/`.uN`/.. scalar or array.
        bytes: Option<u64>,
        line: u32,
    },
    Label {
        name: String,
        line: u32,
    },
    Instr(Instr),
    /// A directive in the body that changes how ptxas compiles the code
    /// (`.pragma "nounroll";`) and that the canonical text does not keep.
    Unkept {
        directive: String,
        line: u32,
    },
    /// `{`
    Open,
    /// `}`
    Close,
}

/// A kernel or function parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: String,
    /// The type directive without its dot, e.g. `u64`, `f32`, `b8`.
    pub ty: String,
    /// `.ptr .global` etc.: the state space the pointer points to.
    pub ptr_space: Option<String>,
    /// `[N]` for byte-array params.
    pub array: Option<u64>,
    /// Declared `.reg` (a function's register param) rather than `.param`.
    pub is_reg: bool,
    pub line: u32,
}

/// An `.entry` or `.func`.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub is_entry: bool,
    pub params: Vec<Param>,
    /// A `.func`'s return params (`.func (.param .b32 ret) name (..)`).
    pub returns: Vec<Param>,
    pub reqntid: Option<[u32; 3]>,
    pub maxntid: Option<[u32; 3]>,
    pub minnctapersm: Option<u32>,
    pub maxnreg: Option<u32>,
    /// `None` for a declaration without a body.
    pub body: Option<Vec<Stmt>>,
    pub line: u32,
    /// Performance and cluster directives the canonical text does not keep
    /// (`.maxclusterrank`, `.noreturn`, `.pragma`, ..), with their lines.
    pub unkept: Vec<(String, u32)>,
}

/// The one body directive the canonical text keeps: `.pragma "nounroll";`
/// (an [`Stmt::Unkept`] with this directive).
pub const NOUNROLL: &str = ".pragma \"nounroll\"";

/// A module-level variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    /// `global`, `shared`, `const` or `local`.
    pub space: String,
    pub name: String,
    pub line: u32,
    /// Its size in bytes, for a scalar or array of a sized type.
    pub bytes: Option<u64>,
    /// Its initializer as little-endian bytes, for an array of an integer
    /// type initialized with a flat list of integer literals that fits it
    /// (zero-padded to its size; within [`MAX_INITIALIZER`] per module).
    pub init: Option<Vec<u8>>,
}

/// A parsed module.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Module {
    pub version: Option<String>,
    pub target: Vec<String>,
    pub address_size: Option<u32>,
    pub functions: Vec<Function>,
    pub variables: Vec<Variable>,
    /// Module-level `.pragma`s, which the canonical text does not keep.
    pub unkept: Vec<(String, u32)>,
}

const TYPES: &[&str] = &[
    ".b8", ".b16", ".b32", ".b64", ".b128", ".u8", ".u16", ".u32", ".u64", ".s8", ".s16", ".s32",
    ".s64", ".f16", ".f16x2", ".bf16", ".bf16x2", ".f32", ".f64", ".pred", ".e4m3", ".e5m2",
    ".e4m3x2", ".e5m2x2", ".tf32",
];

struct Parser<'a> {
    toks: Vec<Tok<'a>>,
    pos: usize,
    /// Instructions parsed so far, in every function.
    instructions: usize,
    /// Initializer bytes kept so far, zero padding included, in every
    /// variable (at most [`MAX_INITIALIZER`]).
    initialized: usize,
    /// Position reported at end of input.
    end: (u32, u32),
}

/// Parses a PTX module.
pub fn parse(text: &str) -> Result<Module, PtxError> {
    let toks = lex(text)?;
    let end_line = u32::try_from(text.lines().count().max(1)).unwrap_or(u32::MAX);
    let mut p = Parser {
        toks,
        pos: 0,
        initialized: 0,
        instructions: 0,
        end: (end_line, 1),
    };
    p.module()
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<Tok<'a>> {
        self.toks.get(self.pos + k).copied()
    }

    fn next(&mut self) -> Result<Tok<'a>, PtxError> {
        let t = self.peek().ok_or_else(|| self.eof("more input"))?;
        self.pos += 1;
        Ok(t)
    }

    fn eof(&self, wanted: &str) -> PtxError {
        err(
            self.end.0,
            self.end.1,
            format!("unexpected end of input, expected {wanted}"),
        )
    }

    fn unexpected(t: Tok<'_>, wanted: &str) -> PtxError {
        err(
            t.line,
            t.col,
            format!("expected {wanted}, found {:?}", clip(t.text)),
        )
    }

    fn is_punct(&self, c: u8) -> bool {
        matches!(self.peek(), Some(t) if t.kind == TokKind::Punct(c))
    }

    fn eat_punct(&mut self, c: u8) -> bool {
        if self.is_punct(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, c: u8) -> Result<Tok<'a>, PtxError> {
        let t = self.next()?;
        if t.kind == TokKind::Punct(c) {
            Ok(t)
        } else {
            Err(Self::unexpected(t, &format!("`{}`", c as char)))
        }
    }

    fn word(&mut self, wanted: &str) -> Result<Tok<'a>, PtxError> {
        let t = self.next()?;
        if t.kind == TokKind::Word {
            Ok(t)
        } else {
            Err(Self::unexpected(t, wanted))
        }
    }

    fn int(&mut self) -> Result<u64, PtxError> {
        let t = self.next()?;
        if t.kind == TokKind::Int {
            Ok(t.int)
        } else {
            Err(Self::unexpected(t, "an integer"))
        }
    }

    fn u32_value(&mut self) -> Result<u32, PtxError> {
        let t = self.peek().ok_or_else(|| self.eof("an integer"))?;
        let v = self.int()?;
        u32::try_from(v).map_err(|_| err(t.line, t.col, "integer out of range"))
    }

    /// `.file` and `.loc` by their grammar (ptxas is not line-based: what
    /// follows on the same line is the next statement, and it runs):
    /// `.file N "name" [, timestamp, size]` and
    /// `.loc file line column {, function_name label [+ off] | , inlined_at file line column}`.
    fn debug_directive(&mut self, t: Tok<'a>) -> Result<(), PtxError> {
        if t.text == ".file" {
            self.int()?;
            let name = self.next()?;
            if name.kind != TokKind::Str {
                return Err(Self::unexpected(name, "a file name string"));
            }
            if self.eat_punct(b',') {
                self.int()?;
                self.expect_punct(b',')?;
                self.int()?;
            }
            return Ok(());
        }
        for _ in 0..3 {
            self.int()?;
        }
        while self.eat_punct(b',') {
            let w = self.word("`function_name` or `inlined_at`")?;
            match w.text {
                "function_name" => {
                    self.word("a label")?;
                    if self.eat_punct(b'+') {
                        self.int()?;
                    }
                }
                "inlined_at" => {
                    for _ in 0..3 {
                        self.int()?;
                    }
                }
                _ => return Err(Self::unexpected(w, "`function_name` or `inlined_at`")),
            }
        }
        Ok(())
    }

    /// `.pragma "a" [, "b"..];`: strings only, so nothing can hide inside.
    /// A `.pragma`'s strings, as written (quotes included).
    fn pragma(&mut self) -> Result<Vec<&'a str>, PtxError> {
        let mut out = Vec::new();
        loop {
            let t = self.next()?;
            if t.kind != TokKind::Str {
                return Err(Self::unexpected(t, "a pragma string"));
            }
            out.push(t.text);
            if self.eat_punct(b';') {
                return Ok(out);
            }
            self.expect_punct(b',')?;
        }
    }

    /// Skips a balanced `{ .. }` group (debug sections).
    fn skip_braces(&mut self) -> Result<(), PtxError> {
        self.expect_punct(b'{')?;
        let mut depth = 1usize;
        while depth > 0 {
            let t = self.next()?;
            match t.kind {
                TokKind::Punct(b'{') => depth += 1,
                TokKind::Punct(b'}') => depth -= 1,
                _ => {}
            }
        }
        Ok(())
    }

    fn module(&mut self) -> Result<Module, PtxError> {
        let mut m = Module::default();
        while let Some(t) = self.peek() {
            if t.kind != TokKind::Word {
                return Err(Self::unexpected(t, "a directive"));
            }
            match t.text {
                ".version" => {
                    self.pos += 1;
                    let v = self.next()?;
                    if !matches!(v.kind, TokKind::F64 | TokKind::Int) {
                        return Err(Self::unexpected(v, "a version number"));
                    }
                    m.version = Some(v.text.to_string());
                }
                ".target" => {
                    self.pos += 1;
                    loop {
                        m.target.push(self.word("a target")?.text.to_string());
                        if !self.eat_punct(b',') {
                            break;
                        }
                    }
                }
                ".address_size" => {
                    self.pos += 1;
                    m.address_size = Some(self.u32_value()?);
                }
                ".file" | ".loc" => {
                    self.pos += 1;
                    self.debug_directive(t)?;
                }
                ".section" => {
                    self.pos += 1;
                    self.word("a section name")?;
                    self.skip_braces()?;
                }
                ".pragma" => {
                    self.pos += 1;
                    self.pragma()?;
                    m.unkept.push((t.text.to_string(), t.line));
                }
                ".visible" | ".extern" | ".weak" | ".common" => self.pos += 1,
                ".entry" | ".func" => {
                    self.pos += 1;
                    let f = self.function(t.text == ".entry", t.line)?;
                    m.functions.push(f);
                }
                ".global" | ".shared" | ".const" | ".local" => {
                    self.pos += 1;
                    let (name, bytes, init) = self.variable_init()?;
                    m.variables.push(Variable {
                        space: t.text[1..].to_string(),
                        name,
                        line: t.line,
                        bytes,
                        init,
                    });
                }
                _ => return Err(Self::unexpected(t, "a module directive")),
            }
        }
        Ok(m)
    }

    /// After a state space: the variable's name and, for a scalar or an
    /// array of a sized type, its size in bytes.
    fn variable(&mut self) -> Result<(String, Option<u64>), PtxError> {
        self.variable_init().map(|(name, bytes, _)| (name, bytes))
    }

    /// A flat `{int, int, ..}` initializer of `element`-byte integers, as
    /// little-endian bytes; `None` (and the braces skipped) for any other.
    fn initializer(&mut self, element: Option<u64>) -> Result<Option<Vec<u8>>, PtxError> {
        let start = self.pos;
        let parsed = (|| {
            let e = usize::try_from(element?).ok().filter(|e| *e <= 8)?;
            if !self.eat_punct(b'{') {
                return None;
            }
            let mut out = Vec::new();
            loop {
                let neg = self.eat_punct(b'-');
                let t = self.peek()?;
                if t.kind != TokKind::Int {
                    return None;
                }
                let v = if neg { t.int.wrapping_neg() } else { t.int };
                self.pos += 1;
                out.extend_from_slice(&v.to_le_bytes()[..e]);
                if out.len() > MAX_INITIALIZER {
                    return None;
                }
                if self.eat_punct(b'}') {
                    return Some(out);
                }
                if !self.eat_punct(b',') {
                    return None;
                }
            }
        })();
        if parsed.is_none() {
            self.pos = start;
            self.skip_braces()?;
        }
        Ok(parsed)
    }

    /// After a state space: the variable's name, its size in bytes (for a
    /// scalar or an array of a sized type) and its integer initializer.
    #[allow(clippy::type_complexity)]
    fn variable_init(&mut self) -> Result<(String, Option<u64>, Option<Vec<u8>>), PtxError> {
        let mut name = None;
        let mut element: Option<u64> = None;
        let mut integer = false;
        let mut count: Option<u64> = Some(1);
        let mut init = None;
        loop {
            let t = self.next()?;
            match t.kind {
                TokKind::Word if t.text.starts_with('.') && TYPES.contains(&t.text) => {
                    element = type_bytes(&t.text[1..]);
                    integer = matches!(t.text.as_bytes().get(1), Some(b'b' | b'u' | b's'))
                        && !t.text.contains('x');
                }
                TokKind::Word if !t.text.starts_with('.') && name.is_none() => {
                    name = Some(t.text.to_string());
                    if self.eat_punct(b'[') {
                        count = match self.peek() {
                            Some(n) if n.kind == TokKind::Int => {
                                self.pos += 1;
                                Some(n.int)
                            }
                            _ => None,
                        };
                    }
                }
                TokKind::Punct(b';') => break,
                TokKind::Punct(b'{') => {
                    self.pos -= 1;
                    init = self.initializer(element.filter(|_| integer))?;
                }
                _ => {}
            }
        }
        let name = name.ok_or_else(|| self.eof("a variable name"))?;
        let bytes = element.zip(count).and_then(|(e, c)| e.checked_mul(c));
        // An initializer counts only when it fits the variable; a shorter
        // one is padded with zeros (PTX ISA 5.4.4: initializers may be
        // incomplete, as NVVM emits them, trailing zeros left out).
        // The padding is bounded over the module (a declared size is the
        // client's: `.global .b8 t[1 << 40] = {1}`, or many such, must not
        // allocate what the text does not hold); past the bound a variable
        // keeps no initializer, as one that does not fit it.
        let room = MAX_INITIALIZER.saturating_sub(self.initialized);
        let init = init.and_then(|mut b: Vec<u8>| {
            let n = usize::try_from(bytes?)
                .ok()
                .filter(|n| b.len() <= *n && *n <= room)?;
            b.resize(n, 0);
            Some(b)
        });
        self.initialized += init.as_ref().map_or(0, Vec::len);
        Ok((name, bytes, init))
    }

    fn function(&mut self, is_entry: bool, line: u32) -> Result<Function, PtxError> {
        // `.func (.param .b32 ret) name (..)`: the return list comes first.
        let mut returns = Vec::new();
        if !is_entry && self.is_punct(b'(') {
            returns = self.param_list()?;
        }
        let name = self.word("a function name")?.text.to_string();
        let params = if self.is_punct(b'(') {
            self.param_list()?
        } else {
            Vec::new()
        };
        let mut f = Function {
            name,
            is_entry,
            params,
            returns,
            reqntid: None,
            maxntid: None,
            minnctapersm: None,
            maxnreg: None,
            body: None,
            line,
            unkept: Vec::new(),
        };
        loop {
            let t = self.peek().ok_or_else(|| self.eof("a function body"))?;
            match (t.kind, t.text) {
                (TokKind::Punct(b';'), _) => {
                    self.pos += 1;
                    return Ok(f);
                }
                (TokKind::Punct(b'{'), _) => break,
                (TokKind::Word, ".reqntid") => {
                    self.pos += 1;
                    f.reqntid = Some(self.dims()?);
                }
                (TokKind::Word, ".maxntid") => {
                    self.pos += 1;
                    f.maxntid = Some(self.dims()?);
                }
                (TokKind::Word, ".minnctapersm") => {
                    self.pos += 1;
                    f.minnctapersm = Some(self.u32_value()?);
                }
                (TokKind::Word, ".maxnreg") => {
                    self.pos += 1;
                    f.maxnreg = Some(self.u32_value()?);
                }
                (TokKind::Word, ".maxclusterrank") => {
                    self.pos += 1;
                    self.u32_value()?;
                    f.unkept.push((t.text.to_string(), t.line));
                }
                (TokKind::Word, ".reqnctapercluster") => {
                    self.pos += 1;
                    self.dims()?;
                    f.unkept.push((t.text.to_string(), t.line));
                }
                (TokKind::Word, ".explicitcluster" | ".noreturn") => {
                    self.pos += 1;
                    f.unkept.push((t.text.to_string(), t.line));
                }
                (TokKind::Word, ".pragma") => {
                    self.pos += 1;
                    self.pragma()?;
                    f.unkept.push((t.text.to_string(), t.line));
                }
                _ => return Err(Self::unexpected(t, "a performance directive or `{`")),
            }
        }
        f.body = Some(self.body()?);
        Ok(f)
    }

    fn dims(&mut self) -> Result<[u32; 3], PtxError> {
        let mut d = [1u32; 3];
        for (k, slot) in d.iter_mut().enumerate() {
            if k > 0 && !self.eat_punct(b',') {
                break;
            }
            *slot = self.u32_value()?;
        }
        Ok(d)
    }

    fn param_list(&mut self) -> Result<Vec<Param>, PtxError> {
        self.expect_punct(b'(')?;
        let mut params = Vec::new();
        if self.eat_punct(b')') {
            return Ok(params);
        }
        loop {
            params.push(self.param()?);
            if self.eat_punct(b')') {
                return Ok(params);
            }
            self.expect_punct(b',')?;
        }
    }

    fn param(&mut self) -> Result<Param, PtxError> {
        let first = self.word("`.param`")?;
        if first.text != ".param" && first.text != ".reg" {
            return Err(Self::unexpected(first, "`.param`"));
        }
        let mut ty = None;
        let mut ptr_space = None;
        let mut after_ptr = false;
        loop {
            let t = self.word("a parameter type or name")?;
            if !t.text.starts_with('.') {
                let mut p = Param {
                    name: t.text.to_string(),
                    ty: ty.ok_or_else(|| Self::unexpected(t, "a parameter type"))?,
                    ptr_space,
                    array: None,
                    is_reg: first.text == ".reg",
                    line: t.line,
                };
                if self.eat_punct(b'[') {
                    p.array = Some(self.int()?);
                    self.expect_punct(b']')?;
                }
                return Ok(p);
            }
            match t.text {
                ".align" => {
                    self.int()?;
                }
                ".ptr" => after_ptr = true,
                s if TYPES.contains(&s) => ty = Some(s[1..].to_string()),
                s if after_ptr => ptr_space = Some(s[1..].to_string()),
                _ => return Err(Self::unexpected(t, "a parameter attribute")),
            }
        }
    }

    fn body(&mut self) -> Result<Vec<Stmt>, PtxError> {
        self.expect_punct(b'{')?;
        let mut out = Vec::new();
        let mut depth = 0usize;
        loop {
            let t = self.peek().ok_or_else(|| self.eof("`}`"))?;
            match t.kind {
                TokKind::Punct(b'}') => {
                    self.pos += 1;
                    if depth == 0 {
                        return Ok(out);
                    }
                    depth -= 1;
                    out.push(Stmt::Close);
                }
                TokKind::Punct(b'{') => {
                    self.pos += 1;
                    depth += 1;
                    if depth > MAX_SCOPE_DEPTH {
                        return Err(err(t.line, t.col, "scopes nested too deeply"));
                    }
                    out.push(Stmt::Open);
                }
                TokKind::Punct(b'@') => out.push(Stmt::Instr(self.instr()?)),
                TokKind::Word => self.statement(t, &mut out)?,
                _ => return Err(Self::unexpected(t, "a statement")),
            }
        }
    }

    fn statement(&mut self, t: Tok<'a>, out: &mut Vec<Stmt>) -> Result<(), PtxError> {
        if matches!(self.peek_at(1), Some(n) if n.kind == TokKind::Punct(b':')) {
            self.pos += 2;
            out.push(Stmt::Label {
                name: t.text.to_string(),
                line: t.line,
            });
            return Ok(());
        }
        match t.text {
            ".loc" | ".file" => {
                self.pos += 1;
                self.debug_directive(t)?;
            }
            ".pragma" => {
                self.pos += 1;
                let strings = self.pragma()?;
                // `nounroll` only stops ptxas unrolling the loop it heads:
                // the canonical text keeps it (`ir::Kernel::nounroll`).
                let directive = if strings == ["\"nounroll\""] {
                    NOUNROLL.to_string()
                } else {
                    t.text.to_string()
                };
                out.push(Stmt::Unkept {
                    directive,
                    line: t.line,
                });
            }
            ".reg" => {
                self.pos += 1;
                self.reg_decl(None, out)?;
            }
            // `.reg.b32 f;` (cuda_fp16.h writes it without a space): the
            // lexer keeps dotted words whole.
            s if s.starts_with(".reg.") && TYPES.contains(&&s[4..]) => {
                self.pos += 1;
                self.reg_decl(Some(s[5..].to_string()), out)?;
            }
            ".shared" | ".local" | ".const" | ".global" | ".param" => {
                self.pos += 1;
                let (name, bytes) = self.variable()?;
                out.push(Stmt::Var {
                    space: t.text[1..].to_string(),
                    name,
                    bytes,
                    line: t.line,
                });
            }
            s if s.starts_with('.') => return Err(Self::unexpected(t, "a statement")),
            _ => out.push(Stmt::Instr(self.instr()?)),
        }
        Ok(())
    }

    fn reg_decl(&mut self, mut ty: Option<String>, out: &mut Vec<Stmt>) -> Result<(), PtxError> {
        loop {
            let t = self.word("a register type or name")?;
            if t.text.starts_with('.') {
                match t.text {
                    ".v2" | ".v4" | ".v8" => {
                        return Err(err(t.line, t.col, "vector registers are not supported"))
                    }
                    s if TYPES.contains(&s) => ty = Some(s[1..].to_string()),
                    _ => return Err(Self::unexpected(t, "a register type")),
                }
                continue;
            }
            let ty = ty.ok_or_else(|| Self::unexpected(t, "a register type"))?;
            let mut name = t;
            loop {
                let mut count = None;
                if self.eat_punct(b'<') {
                    let at = self.peek().ok_or_else(|| self.eof("a register count"))?;
                    let n = self.int()?;
                    if n > u64::from(MAX_REGISTER_RANGE) {
                        return Err(err(
                            at.line,
                            at.col,
                            format!(
                                "register range <{n}> exceeds the limit of {MAX_REGISTER_RANGE}"
                            ),
                        ));
                    }
                    count = Some(u32::try_from(n).unwrap_or(MAX_REGISTER_RANGE));
                    self.expect_punct(b'>')?;
                }
                out.push(Stmt::Reg {
                    ty: ty.clone(),
                    name: name.text.to_string(),
                    count,
                    line: name.line,
                    col: name.col,
                });
                if self.eat_punct(b';') {
                    return Ok(());
                }
                self.expect_punct(b',')?;
                name = self.word("a register name")?;
            }
        }
    }

    fn instr(&mut self) -> Result<Instr, PtxError> {
        let first = self.peek().ok_or_else(|| self.eof("an instruction"))?;
        self.instructions += 1;
        if self.instructions > MAX_INSTRUCTIONS {
            return Err(too_complex(
                first.line,
                format!("the module has more than {MAX_INSTRUCTIONS} instructions"),
            ));
        }
        let mut guard = None;
        if self.eat_punct(b'@') {
            let neg = self.eat_punct(b'!');
            guard = Some((neg, self.word("a predicate register")?.text.to_string()));
        }
        let op = self.word("an opcode")?;
        if !op
            .text
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphabetic)
        {
            return Err(Self::unexpected(op, "an opcode"));
        }
        let mut operands = Vec::new();
        if !self.eat_punct(b';') {
            loop {
                operands.push(self.operand()?);
                if self.eat_punct(b';') {
                    break;
                }
                self.expect_punct(b',')?;
            }
        }
        Ok(Instr {
            guard,
            opcode: op.text.to_string(),
            operands,
            line: first.line,
            col: first.col,
        })
    }

    fn signed_int(&mut self) -> Result<i64, PtxError> {
        let neg = self.eat_punct(b'-');
        let v = self.int()? as i64;
        Ok(if neg { v.wrapping_neg() } else { v })
    }

    fn operand(&mut self) -> Result<Operand, PtxError> {
        let t = self.next()?;
        match t.kind {
            TokKind::Word => {
                if self.eat_punct(b'|') {
                    let second = self.word("a predicate register")?;
                    return Ok(Operand::Pair(t.text.to_string(), second.text.to_string()));
                }
                Ok(Operand::Name(t.text.to_string()))
            }
            TokKind::Int => Ok(Operand::Imm(Imm::Int(t.int as i64))),
            TokKind::F32 => Ok(Operand::Imm(Imm::F32(t.int as u32))),
            TokKind::F64 => Ok(Operand::Imm(Imm::F64(t.int))),
            TokKind::Punct(b'-') => {
                let v = self.next()?;
                match v.kind {
                    TokKind::Int => Ok(Operand::Imm(Imm::Int((v.int as i64).wrapping_neg()))),
                    TokKind::F32 => Ok(Operand::Imm(Imm::F32(v.int as u32 ^ 0x8000_0000))),
                    TokKind::F64 => Ok(Operand::Imm(Imm::F64(v.int ^ (1 << 63)))),
                    _ => Err(Self::unexpected(v, "a number")),
                }
            }
            TokKind::Punct(b'!') => Ok(Operand::Not(
                self.word("a predicate register")?.text.to_string(),
            )),
            TokKind::Punct(b'[') => {
                let b = self.next()?;
                let base = match b.kind {
                    TokKind::Word => AddrBase::Name(b.text.to_string()),
                    TokKind::Int => AddrBase::Imm(b.int as i64),
                    _ => return Err(Self::unexpected(b, "an address")),
                };
                let mut offset = 0i64;
                if self.eat_punct(b'+') {
                    offset = self.signed_int()?;
                } else if self.eat_punct(b'-') {
                    offset = (self.int()? as i64).wrapping_neg();
                }
                self.expect_punct(b']')?;
                Ok(Operand::Addr { base, offset })
            }
            TokKind::Punct(open @ (b'{' | b'(')) => {
                let close = if open == b'{' { b'}' } else { b')' };
                let mut items = Vec::new();
                if self.eat_punct(close) {
                    return Ok(Operand::List(items));
                }
                loop {
                    let item = self.operand()?;
                    if matches!(item, Operand::List(_)) {
                        return Err(err(t.line, t.col, "nested operand lists"));
                    }
                    items.push(item);
                    if self.eat_punct(close) {
                        return Ok(Operand::List(items));
                    }
                    self.expect_punct(b',')?;
                }
            }
            _ => Err(Self::unexpected(t, "an operand")),
        }
    }
}

/// The size in bytes of a variable of the fundamental type `.{name}` (the
/// parser's own table: `ir` lowers the parser's output, so the parser does
/// not import it); `None` for a type with no size here (packed, `b128`).
fn type_bytes(name: &str) -> Option<u64> {
    Some(match name {
        "b8" | "u8" | "s8" | "pred" => 1,
        "b16" | "u16" | "s16" | "f16" | "bf16" => 2,
        "b32" | "u32" | "s32" | "f32" => 4,
        "b64" | "u64" | "s64" | "f64" => 8,
        _ => return None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn hex_floats_and_ints() {
        assert_eq!(number("0f3F800000"), Some((TokKind::F32, 0x3F80_0000)));
        assert_eq!(
            number("0d3FF0000000000000"),
            Some((TokKind::F64, 1.0f64.to_bits()))
        );
        assert_eq!(number("0x10"), Some((TokKind::Int, 16)));
        assert_eq!(number("10U"), Some((TokKind::Int, 10)));
        assert_eq!(number("1.5"), Some((TokKind::F64, 1.5f64.to_bits())));
        assert_eq!(number("0f3F80"), None);
    }

    #[test]
    fn huge_register_range_is_refused_without_allocating() {
        let src = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n .reg .b32 %r<4000000000>;\n ret;\n}\n";
        match parse(src) {
            Err(PtxError::Parse { line, column, .. }) => {
                assert_eq!((line, column), (6, 15));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_have_positions() {
        match parse(".version 8.0\n.entry k(\n .param .u64 a\n{") {
            Err(PtxError::Parse { line, column, .. }) => assert_eq!((line, column), (4, 1)),
            other => panic!("{other:?}"),
        }
        match parse(".entry k() { add.f32 %f1, %f2 # ; }") {
            Err(PtxError::Parse { line, column, .. }) => assert_eq!((line, column), (1, 31)),
            other => panic!("{other:?}"),
        }
    }
}
