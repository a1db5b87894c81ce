//! The PTX front end: a parser, the scalar-ABI verifier that reads the kernel
//! instead of trusting its name, and the host (CPU) engine that runs verified
//! kernels.
//!
//! API contract used by the rest of ptxd (the front calls [`verify()`] on every
//! PTX load; the host executor calls [`HostKernel::compile`] and
//! [`HostKernel::launch`]). Nothing here touches CUDA.
//!
//! Pipeline: [`parse`] (text → module) → [`mod@inline`] (the entry's `.func`
//! calls inlined) → [`ir`] (one entry, names resolved)
//! → [`mod@verify`] (the proof, whose result is a [`contract::LaunchContract`])
//! → [`host`] (decode and run on the CPU). The kernel's name is never
//! trusted: only its body decides.

use std::collections::BTreeMap;

pub mod contract;
pub mod host;
pub mod inline;
pub mod ir;
pub mod memo;
pub mod parse;
pub mod print;
pub mod reason;
pub mod verify;

pub use contract::LaunchContract;
pub use reason::SubReason;
pub use verify::{MAX_INPUTS, MAX_SCALAR_PARAMS};

/// The block size used when a kernel names none (no `.reqntid`) and the
/// executor reports none: the host engine's default, and the CUDA
/// executor's cap on a block chosen from the kernel's limits.
pub const DEFAULT_BLOCK: u32 = 256;

/// Which kernel families beyond the one-element-per-thread scalar ABI the
/// verifier accepts. Each is a proof the verifier can make, with the launch
/// contract (and preconditions) that proof needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Families {
    /// The seed's Vectorized{2,4} schedule: `.v2`/`.v4` global accesses of
    /// one vector per thread, `n` counted in vectors, each operand's element
    /// the whole vector (its offset aligned to it).
    pub vectorized: bool,
    /// A 32-bit index (`int i = blockIdx.x * blockDim.x + threadIdx.x`),
    /// exact under the precondition `index_fits_i32` (grid × block <=
    /// 2^31), which the contract then carries; and an `int n` count
    /// compared with it (`count_fits_i32`).
    pub index32: bool,
    /// Triton's and Inductor's elementwise kernels (`verify/triton.rs`): a
    /// 32-bit count, by-value scalars, two trailing scratch pointers ptxd
    /// passes as null, several elements per thread through masked (and
    /// vector) accesses, the index built with `shl`/`and`/`or` under
    /// `.reqntid`; the contract carries each operand's footprint,
    /// elements per thread, `count_fits_i32` and `index_fits_i32`.
    pub triton: bool,
    /// The seed's Strided schedule (`verify/strided.rs`): by-value 64-bit
    /// shape and stride args after `long long n`, addresses that are
    /// polynomials of `i`, `i / d`, `i % d` and the args; the contract
    /// carries each operand's footprint over the args and the
    /// preconditions `divisor_positive`, `arg_nonnegative` and
    /// `strided_index_fits_i64`.
    pub strided: bool,
}

impl Families {
    /// The scalar ABI only: what ptxd accepted before contracts.
    pub const SCALAR: Families = Families {
        vectorized: false,
        index32: false,
        triton: false,
        strided: false,
    };
    /// Every family the verifier can prove.
    pub const ALL: Families = Families {
        vectorized: true,
        index32: true,
        triton: true,
        strided: true,
    };
}

/// The families the daemon's loads (and [`verify()`], [`canonicalize`],
/// [`HostKernel::compile`]) accept: every family the verifier proves (see
/// `docs/verifier.md`; a kernel with a precondition the ring cannot check
/// is not granted to rings, `front::ring`). The Triton family's params (a
/// 32-bit count, scalars anywhere, null scratch pointers) are packed from
/// `LaunchContract::params` by both executors.
pub const DAEMON_FAMILIES: Families = Families::ALL;

/// The ABI a client declares for a kernel (optional on PTX, required for
/// cubin/fatbin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredAbi {
    pub inputs: u32,
    pub scalar_params: u32,
}

/// The verified scalar-ABI signature of a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Number of input pointers.
    pub inputs: u32,
    /// Element size in bytes of each operand: the inputs in order, then the
    /// output (`inputs + 1` entries).
    pub element_sizes: Vec<u32>,
    /// Number of trailing f32 params.
    pub scalar_params: u32,
    /// `.reqntid` x-extent, if present.
    pub reqntid: Option<u32>,
    /// `.maxntid` x-extent, if present.
    pub maxntid: Option<u32>,
}

/// Why a kernel was refused at load time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtxError {
    /// The text is not PTX ptxd can parse.
    #[error("PTX parse error at {line}:{column}: {message}")]
    Parse {
        line: u32,
        column: u32,
        message: String,
    },
    /// The module has no `.entry` with that name.
    #[error("no entry named {symbol:?} (entries: {entries:?})")]
    SymbolNotFound {
        symbol: String,
        entries: Vec<String>,
    },
    /// The kernel is not the scalar ABI.
    #[error("not the scalar ABI ({sub_reason}): {explanation}")]
    NonScalarAbi {
        /// A stable snake_case sub-reason, e.g. `vectorized_access`: always
        /// [`SubReason::as_str`] of the variant that refused.
        sub_reason: &'static str,
        /// The offending param's name, when one is to blame.
        param: Option<String>,
        /// The offending line (1-based), when one is to blame.
        line: Option<u32>,
        /// One line for a human.
        explanation: String,
    },
    /// The kernel is scalar but not what the request declared.
    #[error("declared {what} {expected} but the kernel has {found}")]
    AbiMismatch {
        what: &'static str,
        expected: u32,
        found: u32,
    },
    /// The host engine cannot run an instruction of this kernel.
    #[error("the host executor cannot run `{opcode}` (line {line})")]
    UnsupportedOnHost { opcode: String, line: u32 },
}

impl PtxError {
    /// Key/value details for the refusal's `ErrorInfo.metadata`.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        match self {
            PtxError::Parse { line, column, .. } => {
                m.insert("line".into(), line.to_string());
                m.insert("column".into(), column.to_string());
            }
            PtxError::SymbolNotFound { symbol, entries } => {
                m.insert("symbol".into(), symbol.clone());
                m.insert("entries".into(), entries.join(","));
            }
            PtxError::NonScalarAbi {
                sub_reason,
                param,
                line,
                explanation,
            } => {
                m.insert("sub_reason".into(), (*sub_reason).into());
                if let Some(p) = param {
                    m.insert("param".into(), p.clone());
                }
                if let Some(l) = line {
                    m.insert("line".into(), l.to_string());
                }
                m.insert("explanation".into(), explanation.clone());
            }
            PtxError::AbiMismatch {
                what,
                expected,
                found,
            } => {
                m.insert("what".into(), (*what).into());
                m.insert("expected".into(), expected.to_string());
                m.insert("found".into(), found.to_string());
            }
            PtxError::UnsupportedOnHost { opcode, line } => {
                m.insert("opcode".into(), opcode.clone());
                m.insert("line".into(), line.to_string());
            }
        }
        m
    }
}

/// Parses `text` and verifies that entry `symbol` follows the scalar ABI;
/// checks the declared ABI when one is given.
pub fn verify(
    text: &str,
    symbol: &str,
    declared: Option<DeclaredAbi>,
) -> Result<Signature, PtxError> {
    verify_kernel(text, symbol, declared, DAEMON_FAMILIES).map(|(_, v)| v.signature)
}

/// A verified kernel in the form that runs: canonical PTX printed from the
/// verified IR (see [`mod@print`]), its signature and its launch contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    pub text: String,
    pub signature: Signature,
    pub contract: LaunchContract,
}

/// Parses and verifies `symbol` in `text`, then prints it as canonical PTX
/// and checks that the printed text parses back to the very program that
/// was verified (and verifies again, to the same signature). What the
/// executors run is `Canonical::text`, never `text`.
pub fn canonicalize(
    text: &str,
    symbol: &str,
    declared: Option<DeclaredAbi>,
) -> Result<Canonical, PtxError> {
    canonicalize_with(text, symbol, declared, DAEMON_FAMILIES)
}

/// [`canonicalize`], accepting `families`.
pub fn canonicalize_with(
    text: &str,
    symbol: &str,
    declared: Option<DeclaredAbi>,
    families: Families,
) -> Result<Canonical, PtxError> {
    let (kernel, verified) = verify_kernel(text, symbol, declared, families)?;
    let entry_line = kernel.line;
    let refuse = |why: &str| PtxError::NonScalarAbi {
        sub_reason: SubReason::CanonicalForm.as_str(),
        param: None,
        line: Some(entry_line),
        explanation: why.to_string(),
    };
    if kernel.version.is_none()
        || kernel
            .target
            .iter()
            .filter(|t| t.starts_with("sm_"))
            .count()
            != 1
    {
        return Err(refuse(
            "the module needs `.version` and one `.target sm_XX`",
        ));
    }
    // The canonical text keeps every `.target` option but `debug`, whose
    // one effect on results (no fma contraction) it keeps by pinning the
    // rounding of float add/sub/mul instead ([`print::without_debug_target`]);
    // each option must be one ptxd knows to mean nothing else.
    if let Some(t) = kernel.target.iter().find(|t| !print::known_target(t)) {
        return Err(refuse(&format!(
            "the `.target` option `{t}` is not one ptxd keeps"
        )));
    }
    if kernel.address_size.is_some_and(|a| a != 64) {
        return Err(refuse("the scalar ABI needs `.address_size 64`"));
    }
    if let Some((directive, line)) = kernel.unkept.first() {
        return Err(PtxError::NonScalarAbi {
            sub_reason: SubReason::CanonicalForm.as_str(),
            param: None,
            line: Some(*line),
            explanation: format!(
                "`{directive}` changes how ptxas compiles the kernel, and the canonical text does not keep it"
            ),
        });
    }
    let kernel = print::without_debug_target(kernel);
    let printed = print::print(&kernel);
    let (again, reverified) = verify_kernel(&printed, symbol, declared, families)
        .map_err(|e| refuse(&format!("the canonical text does not verify: {e}")))?;
    if !print::same_program(&kernel, &again)
        || reverified.signature != verified.signature
        || !reverified.contract.same_terms(&verified.contract)
    {
        return Err(refuse(
            "the canonical text does not parse back to the verified program",
        ));
    }
    // The contract names the params as the canonical text does: it is the
    // text that runs.
    Ok(Canonical {
        text: printed,
        signature: verified.signature,
        contract: reverified.contract,
    })
}

/// Parses `text` and verifies entry `symbol`: its launch contract (and the
/// signature derived from it, for callers that take the scalar ABI only).
pub fn verify_contract(
    text: &str,
    symbol: &str,
    declared: Option<DeclaredAbi>,
    families: Families,
) -> Result<(Signature, LaunchContract), PtxError> {
    verify_kernel(text, symbol, declared, families).map(|(_, v)| (v.signature, v.contract))
}

/// Parses and lowers `symbol` (no verification): for tools and tests that
/// print or inspect the IR.
pub fn lower(text: &str, symbol: &str) -> Result<ir::Kernel, PtxError> {
    let mut module = parse::parse(text)?;
    inline::inline_calls(&mut module, symbol)?;
    inline::promote_frame(&mut module, symbol)?;
    ir::lower(&module, symbol)
}

pub(crate) fn verify_kernel(
    text: &str,
    symbol: &str,
    declared: Option<DeclaredAbi>,
    families: Families,
) -> Result<(ir::Kernel, verify::Verified), PtxError> {
    let mut module = parse::parse(text)?;
    inline::inline_calls(&mut module, symbol)?;
    inline::promote_frame(&mut module, symbol)?;
    let kernel = ir::lower(&module, symbol)?;
    let verified = verify::verify(&kernel, declared, families)?;
    Ok((kernel, verified))
}

pub use host::api::{HostFault, HostKernel, HostLaunch, HostSpan};

/// Every file below `root` whose name ends `.{extension}`, sorted: the
/// corpus and source walks of the crate's unit tests.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn files_under(root: &std::path::Path, extension: &str) -> Vec<std::path::PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == extension) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}
