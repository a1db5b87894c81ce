//! Why a kernel is not the scalar ABI: the closed list of `sub_reason`s a
//! [`super::PtxError::NonScalarAbi`] refusal carries.
//!
//! Invariant: this enum is the only source of sub_reason strings. Every
//! refusal names a variant, [`SubReason::as_str`] gives its stable wire
//! string, and [`SubReason::ALL`] lists every variant, so the verifier's
//! module doc and the README can be checked against the code (see the
//! tests in `verify/mod.rs`), never against a scan of the source.

/// A stable reason a kernel is refused as not the scalar ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubReason {
    ReqntidConflict,
    Maxntid,
    ParamType,
    ExtraParams,
    CountNot64bit,
    MissingParams,
    ParamCount,
    SharedMemory,
    LocalMemory,
    Call,
    UnsupportedInstruction,
    UnmodelledOperand,
    OperandType,
    UniformBranch,
    DuplicateDestination,
    Barrier,
    VectorizedAccess,
    Atomic,
    ConstMemory,
    ParamMisuse,
    NonGlobalMemory,
    GlobalVariable,
    TooComplex,
    UnreachableCode,
    PredicatedDefinition,
    PointerEscape,
    IndexNot64bit,
    NonIntegerArithmetic,
    PointerMisuse,
    NonElementwiseAddress,
    ParamOutOfRange,
    UnguardedAccess,
    NoOutputStore,
    UnusedInput,
    ScratchDereferenced,
    UnboundedAccess,
    IndexNotExact,
    BackwardBranch,
    UndefinedRegister,
    DuplicateLabel,
    CanonicalForm,
}

impl SubReason {
    /// Every variant, in the order the verifier checks its rules.
    pub const ALL: &'static [SubReason] = &[
        SubReason::ReqntidConflict,
        SubReason::Maxntid,
        SubReason::ParamType,
        SubReason::ExtraParams,
        SubReason::CountNot64bit,
        SubReason::MissingParams,
        SubReason::ParamCount,
        SubReason::SharedMemory,
        SubReason::LocalMemory,
        SubReason::Call,
        SubReason::UnsupportedInstruction,
        SubReason::UnmodelledOperand,
        SubReason::OperandType,
        SubReason::UniformBranch,
        SubReason::DuplicateDestination,
        SubReason::Barrier,
        SubReason::VectorizedAccess,
        SubReason::Atomic,
        SubReason::ConstMemory,
        SubReason::ParamMisuse,
        SubReason::NonGlobalMemory,
        SubReason::GlobalVariable,
        SubReason::TooComplex,
        SubReason::UnreachableCode,
        SubReason::PredicatedDefinition,
        SubReason::PointerEscape,
        SubReason::IndexNot64bit,
        SubReason::NonIntegerArithmetic,
        SubReason::PointerMisuse,
        SubReason::NonElementwiseAddress,
        SubReason::ParamOutOfRange,
        SubReason::UnguardedAccess,
        SubReason::NoOutputStore,
        SubReason::UnusedInput,
        SubReason::ScratchDereferenced,
        SubReason::UnboundedAccess,
        SubReason::IndexNotExact,
        SubReason::BackwardBranch,
        SubReason::UndefinedRegister,
        SubReason::DuplicateLabel,
        SubReason::CanonicalForm,
    ];

    /// The snake_case string the wire carries (`ErrorInfo.metadata["sub_reason"]`).
    pub const fn as_str(self) -> &'static str {
        match self {
            SubReason::ReqntidConflict => "reqntid_conflict",
            SubReason::Maxntid => "maxntid",
            SubReason::ParamType => "param_type",
            SubReason::ExtraParams => "extra_params",
            SubReason::CountNot64bit => "count_not_64bit",
            SubReason::MissingParams => "missing_params",
            SubReason::ParamCount => "param_count",
            SubReason::SharedMemory => "shared_memory",
            SubReason::LocalMemory => "local_memory",
            SubReason::Call => "call",
            SubReason::UnsupportedInstruction => "unsupported_instruction",
            SubReason::UnmodelledOperand => "unmodelled_operand",
            SubReason::OperandType => "operand_type",
            SubReason::UniformBranch => "uniform_branch",
            SubReason::DuplicateDestination => "duplicate_destination",
            SubReason::Barrier => "barrier",
            SubReason::VectorizedAccess => "vectorized_access",
            SubReason::Atomic => "atomic",
            SubReason::ConstMemory => "const_memory",
            SubReason::ParamMisuse => "param_misuse",
            SubReason::NonGlobalMemory => "non_global_memory",
            SubReason::GlobalVariable => "global_variable",
            SubReason::TooComplex => "too_complex",
            SubReason::UnreachableCode => "unreachable_code",
            SubReason::PredicatedDefinition => "predicated_definition",
            SubReason::PointerEscape => "pointer_escape",
            SubReason::IndexNot64bit => "index_not_64bit",
            SubReason::NonIntegerArithmetic => "non_integer_arithmetic",
            SubReason::PointerMisuse => "pointer_misuse",
            SubReason::NonElementwiseAddress => "non_elementwise_address",
            SubReason::ParamOutOfRange => "param_out_of_range",
            SubReason::UnguardedAccess => "unguarded_access",
            SubReason::NoOutputStore => "no_output_store",
            SubReason::UnusedInput => "unused_input",
            SubReason::ScratchDereferenced => "scratch_dereferenced",
            SubReason::UnboundedAccess => "unbounded_access",
            SubReason::IndexNotExact => "index_not_exact",
            SubReason::BackwardBranch => "backward_branch",
            SubReason::UndefinedRegister => "undefined_register",
            SubReason::DuplicateLabel => "duplicate_label",
            SubReason::CanonicalForm => "canonical_form",
        }
    }
}

impl std::fmt::Display for SubReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
