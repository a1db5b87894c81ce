//! The launch checks: the one place that decides whether a launch may reach
//! a GPU. Both launch paths run it: the gRPC path in the front (against the
//! session's registry entries) and the shared-memory ring in the executor
//! (against the capability table the front pushes there).
//!
//! [`check`] is a pure function of a session's view of its capabilities and
//! the request. It evaluates the kernel's launch contract
//! ([`crate::ptx::contract`]) and keeps these invariants for every launch it
//! passes:
//! - the launch passes exactly the kernel's verified number of inputs and
//!   scalar params, and has an output;
//! - typed scalar arguments ([`ScalarArg`]) match the contract's `Scalar`
//!   params one for one, type for type (nothing is converted), and a launch
//!   passes either f32 `params` or typed args, never both; f32 `params`
//!   are f32 args, so a param of another type refuses them;
//! - `n` fits the type of the kernel's count param (a `.u32` count refuses
//!   `n > u32::MAX`), so no executor ever truncates it;
//! - every precondition of the contract holds at the launch's values (`n`
//!   fits the kernel's `long long` count, and whatever else the proof
//!   assumed, e.g. a 32-bit index that cannot wrap);
//! - every operand and event belongs to the session (the view refuses one
//!   that does not, alike for another session's and a made-up handle);
//! - every operand and event lives on the kernel's device, in the executor
//!   generation the kernel was loaded in (a mapping from a dead generation
//!   is not the memory the kernel would address);
//! - every operand's offset is a multiple of its alignment, and `offset +
//!   footprint` fits its buffer, computed in `u128` without overflow (the
//!   scalar ABI's footprint is `n × element_size`).
//!
//! The checks' own refusals are [`LaunchRefusal`], which knows nothing of
//! the wire; each path's view names its error type, into which a refusal
//! converts (the daemon's error funnel maps both to the same reason for the
//! same mistake).

use crate::handles::DeviceGeneration;
use crate::ptx::contract::{LaunchValues, ParamKind, ScalarType, COUNT_FITS_I64};
use crate::ptx::{LaunchContract, Signature};

/// A typed by-value scalar argument of a launch (`LaunchRequest.args`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScalarArg {
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

impl ScalarArg {
    /// The argument's type as the wire names it (`i32`, `u32`, ... `f64`).
    pub fn type_name(self) -> &'static str {
        match self {
            ScalarArg::I32(_) => "i32",
            ScalarArg::U32(_) => "u32",
            ScalarArg::I64(_) => "i64",
            ScalarArg::U64(_) => "u64",
            ScalarArg::F32(_) => "f32",
            ScalarArg::F64(_) => "f64",
        }
    }

    /// Whether it is exactly a value of the PTX type `ty` (`.s32` takes an
    /// i32, `.u32`/`.b32` a u32, and so on): no conversion is implied.
    pub fn is(self, ty: ScalarType) -> bool {
        matches!(
            (self, ty),
            (ScalarArg::I32(_), ScalarType::S32)
                | (ScalarArg::U32(_), ScalarType::U32)
                | (ScalarArg::I64(_), ScalarType::S64)
                | (ScalarArg::U64(_), ScalarType::U64)
                | (ScalarArg::F32(_), ScalarType::F32)
                | (ScalarArg::F64(_), ScalarType::F64)
        )
    }

    /// Its bits zero-extended to 64: what executors pack (an f32 as its
    /// `to_bits`, an i32 as its u32 bits).
    pub fn bits(self) -> u64 {
        match self {
            ScalarArg::I32(v) => u64::from(v as u32),
            ScalarArg::U32(v) => u64::from(v),
            ScalarArg::I64(v) => v as u64,
            ScalarArg::U64(v) => v,
            ScalarArg::F32(v) => u64::from(v.to_bits()),
            ScalarArg::F64(v) => v.to_bits(),
        }
    }
}

/// The wire's name for the argument type a PTX param type takes.
pub fn arg_type_name(ty: ScalarType) -> &'static str {
    match ty {
        ScalarType::S32 => "i32",
        ScalarType::U32 => "u32",
        ScalarType::S64 => "i64",
        ScalarType::U64 => "u64",
        ScalarType::F32 => "f32",
        ScalarType::F64 => "f64",
    }
}

/// Where an object lives: one of the daemon's devices, and the executor
/// generation its mapping (or module) is open in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Placement {
    pub device_index: usize,
    pub generation: DeviceGeneration,
}

/// What the check reads of a kernel: its arity, and for a launch of `n`
/// elements the contract's preconditions and each operand's footprint.
/// Implemented by [`Signature`] (the scalar ABI, evaluated directly: the
/// ring's path) and by [`BoundContract`] (any verified contract).
pub trait LaunchTerms {
    /// Input pointers the launch passes.
    fn inputs(&self) -> u32;
    /// By-value scalar arguments the launch passes.
    fn scalar_params(&self) -> u32;
    /// The launch values for `n`, once every precondition holds at them
    /// and the launch's scalar `args` (each as its bits, in the order of
    /// the scalar params; empty for f32 `params`).
    fn values(&self, n: u64, args: &[u64]) -> Result<LaunchValues, LaunchRefusal>;
    /// Operand `k`'s (inputs, then the output) alignment and footprint in
    /// bytes (`None`: past `u128`, or an argument it reads is negative),
    /// or `None` when there is no operand `k`.
    fn footprint(
        &self,
        k: usize,
        values: &LaunchValues,
        args: &[u64],
    ) -> Option<(u32, Option<u128>)>;
    /// Calls `f` with the index, type and name of every by-value scalar
    /// param, in order (one pass: the check of a launch's scalars is
    /// linear in their number); stops at `f`'s first refusal.
    fn each_scalar(
        &self,
        f: &mut dyn FnMut(usize, ScalarType, &str) -> Result<(), LaunchRefusal>,
    ) -> Result<(), LaunchRefusal>;
}

impl LaunchTerms for Signature {
    fn inputs(&self) -> u32 {
        self.inputs
    }
    fn scalar_params(&self) -> u32 {
        self.scalar_params
    }
    fn values(&self, n: u64, _args: &[u64]) -> Result<LaunchValues, LaunchRefusal> {
        if n > i64::MAX as u64 {
            return Err(LaunchRefusal::CountTooLarge);
        }
        // The scalar ABI's footprints read only `n`.
        Ok(LaunchValues {
            count: n,
            grid: 0,
            block: 0,
        })
    }
    fn footprint(
        &self,
        k: usize,
        values: &LaunchValues,
        _args: &[u64],
    ) -> Option<(u32, Option<u128>)> {
        let size = *self.element_sizes.get(k)?;
        Some((size, Some(u128::from(values.count) * u128::from(size))))
    }
    fn each_scalar(
        &self,
        f: &mut dyn FnMut(usize, ScalarType, &str) -> Result<(), LaunchRefusal>,
    ) -> Result<(), LaunchRefusal> {
        // The scalar ABI's scalars are all `float`; a signature carries no
        // names (the ring's refusals say `p<k>`, as the contract's would).
        (0..self.scalar_params as usize).try_for_each(|k| f(k, ScalarType::F32, ""))
    }
}

/// A verified contract bound to the block size its executor launches with.
#[derive(Debug, Clone, Copy)]
pub struct BoundContract<'a> {
    pub contract: &'a LaunchContract,
    pub block: u32,
}

impl LaunchTerms for BoundContract<'_> {
    fn inputs(&self) -> u32 {
        clamp(self.contract.inputs())
    }
    fn scalar_params(&self) -> u32 {
        clamp(self.contract.scalar_params())
    }
    fn values(&self, n: u64, args: &[u64]) -> Result<LaunchValues, LaunchRefusal> {
        let values = self.contract.values(n, self.block);
        for p in &self.contract.preconditions {
            if !p.holds_with(&values, args) {
                return Err(if p.name == COUNT_FITS_I64 {
                    LaunchRefusal::CountTooLarge
                } else {
                    let names = self.contract.arg_names();
                    LaunchRefusal::PreconditionFailed {
                        precondition: p.name,
                        condition: p.text(&names),
                        values: p.values_with(&values, args, &names),
                    }
                });
            }
        }
        // The count param's type bounds n whatever the proof assumed: an
        // executor passes n as that type and must never truncate it.
        let count = self.contract.params.iter().find_map(|p| match p.kind {
            ParamKind::Count(ty) => Some(ty),
            _ => None,
        });
        if let Some((name, max)) = count.and_then(count_limit) {
            if n > max {
                return Err(LaunchRefusal::PreconditionFailed {
                    precondition: name,
                    condition: format!("{name}: n <= {max}"),
                    values: format!("n={n}"),
                });
            }
        }
        Ok(values)
    }
    fn footprint(
        &self,
        k: usize,
        values: &LaunchValues,
        args: &[u64],
    ) -> Option<(u32, Option<u128>)> {
        let f = self.contract.footprints.get(k)?;
        Some((f.alignment, f.bytes.eval_with(values, args)))
    }
    fn each_scalar(
        &self,
        f: &mut dyn FnMut(usize, ScalarType, &str) -> Result<(), LaunchRefusal>,
    ) -> Result<(), LaunchRefusal> {
        let mut k = 0;
        for p in &self.contract.params {
            if let ParamKind::Scalar(ty) = p.kind {
                f(k, ty, &p.name)?;
                k += 1;
            }
        }
        Ok(())
    }
}

/// The precondition a count param of type `ty` puts on `n` (its name and
/// the largest `n`), or `None` when every `u64` fits.
fn count_limit(ty: ScalarType) -> Option<(&'static str, u64)> {
    match ty {
        ScalarType::U32 => Some(("count_fits_u32", u64::from(u32::MAX))),
        ScalarType::S32 => Some((crate::ptx::contract::COUNT_FITS_I32, i32::MAX as u64)),
        ScalarType::S64 => Some((COUNT_FITS_I64, i64::MAX as u64)),
        // A float count is not one the verifier names; u64 holds any n.
        ScalarType::U64 | ScalarType::F32 | ScalarType::F64 => None,
    }
}

/// The kernel a launch names: what its launches are checked against (its
/// verified signature, or its contract bound to its block size) and its
/// placement.
#[derive(Debug)]
pub struct KernelCap<'a, K: ?Sized = Signature> {
    pub signature: &'a K,
    pub placement: Placement,
}

impl<K: ?Sized> Clone for KernelCap<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K: ?Sized> Copy for KernelCap<'_, K> {}

/// A live buffer the session holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferCap {
    /// The executor's id for the buffer.
    pub id: u64,
    /// Bytes the mapping covers (verified by the executor when it opened it).
    pub size: u64,
    pub placement: Placement,
}

/// A live event the session holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventCap {
    /// The executor's id for the event.
    pub id: u64,
    pub placement: Placement,
}

/// A session's view of what it may launch on. Each launch path implements
/// it over its own table; lookups refuse what the session does not hold.
pub trait Capabilities {
    /// An operand as the path's request names it (buffer plus offset).
    type Operand;
    /// An event as the path's request names it.
    type Event: ?Sized;
    /// The path's refusals: its own lookups' and the checks'.
    type Error: From<LaunchRefusal>;
    /// The operand's buffer, and its byte offset.
    fn operand(&self, operand: &Self::Operand) -> Result<(BufferCap, u64), Self::Error>;
    fn event(&self, event: &Self::Event) -> Result<EventCap, Self::Error>;
    /// A placement as refusals name it (`<device uuid>@<generation>`).
    fn describe(&self, placement: Placement) -> String;
}

/// What a launch asks for, in the path's own terms.
#[derive(Debug)]
pub struct LaunchShape<'r, O, E: ?Sized> {
    pub inputs: &'r [O],
    pub output: Option<&'r O>,
    /// Elements per operand.
    pub n: u64,
    /// How many f32 scalar params (`params`) the launch passes.
    pub scalars: usize,
    pub wait: Option<&'r E>,
    pub signal: Option<&'r E>,
}

/// An operand that passed: the executor's buffer id and the byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedOperand {
    pub buffer_id: u64,
    pub offset: u64,
}

/// A launch that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedLaunch {
    pub inputs: Vec<CheckedOperand>,
    pub output: CheckedOperand,
    pub wait_event: Option<u64>,
    pub signal_event: Option<u64>,
}

/// Why the launch checks refuse a launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchRefusal {
    /// The launch passes another number of inputs or scalars than the
    /// kernel's verified signature takes.
    #[error("the kernel takes {expected} {what}, the launch gives {found}")]
    Arity {
        what: &'static str,
        expected: u32,
        found: u32,
    },
    #[error("a launch needs an output")]
    NoOutput,
    #[error("n must fit a long long")]
    CountTooLarge,
    /// An operand's offset is not a multiple of its element size.
    #[error("{operand}: offset {offset} is not a multiple of the element size {element_size}")]
    Misaligned {
        operand: String,
        offset: u64,
        element_size: u32,
    },
    #[error("operand {operand} needs {needed_bytes} bytes but its buffer holds {buffer_bytes}")]
    BufferTooSmall {
        operand: String,
        needed_bytes: u128,
        buffer_bytes: u64,
    },
    /// An operand or event lives on another device or generation than the
    /// kernel.
    #[error("operand {operand} is on {operand_device}, the kernel on {kernel_device}")]
    DeviceMismatch {
        operand: String,
        kernel_device: String,
        operand_device: String,
    },
    /// A precondition of the kernel's contract is false at this launch's
    /// values: `precondition` is its stable name, `condition` its text,
    /// `values` the launch values it read (`n=..,grid=..,block=..`).
    #[error("precondition {precondition} ({condition}) does not hold at {values}")]
    PreconditionFailed {
        precondition: &'static str,
        condition: String,
        values: String,
    },
    /// The launch's scalars do not match the kernel's by-value scalar
    /// params: `what` is `count` (another number of typed args), `type`
    /// (the `index`-th scalar, param `param`, is `expected` and the launch
    /// gives `given`) or `both` (f32 `params` and typed `args` together).
    #[error("{}", scalar_mismatch_text(what, *index, param, expected, given))]
    ScalarArgsMismatch {
        what: &'static str,
        index: u32,
        param: String,
        expected: String,
        given: String,
    },
    /// The signature is not one the verifier produces (a bug, not a
    /// caller's mistake).
    #[error("{0}")]
    Internal(&'static str),
}

fn scalar_mismatch_text(
    what: &str,
    index: u32,
    param: &str,
    expected: &str,
    given: &str,
) -> String {
    match what {
        "count" => format!("the kernel takes {expected} scalar args, the launch gives {given}"),
        "both" => "a launch passes f32 params or typed args, not both".to_string(),
        _ => format!(
            "scalar arg {index} (param {param}) is {expected}, the launch gives {given}; nothing is converted"
        ),
    }
}

/// Checks the launch's scalars against the kernel's by-value scalar params.
fn check_scalars<K: LaunchTerms + ?Sized>(
    terms: &K,
    scalars: usize,
    args: &[ScalarArg],
) -> Result<(), LaunchRefusal> {
    let expected = terms.scalar_params();
    if scalars > 0 && !args.is_empty() {
        return Err(LaunchRefusal::ScalarArgsMismatch {
            what: "both",
            index: 0,
            param: String::new(),
            expected: format!("{expected} scalars"),
            given: format!("{scalars} params and {} args", args.len()),
        });
    }
    if args.is_empty() {
        // f32 `params`: the scalar ABI's arity refusal, as always; then
        // each must be an f32 param.
        if scalars != expected as usize {
            return Err(LaunchRefusal::Arity {
                what: "scalar params",
                expected,
                found: clamp(scalars),
            });
        }
        return terms.each_scalar(&mut |k, ty, name| match ty {
            ScalarType::F32 => Ok(()),
            _ => Err(LaunchRefusal::ScalarArgsMismatch {
                what: "type",
                index: clamp(k),
                param: param_name(k, name),
                expected: arg_type_name(ty).to_string(),
                given: "f32".to_string(),
            }),
        });
    }
    if args.len() != expected as usize {
        return Err(LaunchRefusal::ScalarArgsMismatch {
            what: "count",
            index: 0,
            param: String::new(),
            expected: expected.to_string(),
            given: args.len().to_string(),
        });
    }
    terms.each_scalar(&mut |k, ty, name| {
        let arg = args.get(k).ok_or(LaunchRefusal::Internal(
            "the kernel's terms have more scalars",
        ))?;
        if arg.is(ty) {
            Ok(())
        } else {
            Err(LaunchRefusal::ScalarArgsMismatch {
                what: "type",
                index: clamp(k),
                param: param_name(k, name),
                expected: arg_type_name(ty).to_string(),
                given: arg.type_name().to_string(),
            })
        }
    })
}

/// The most typed args whose bits the check keeps on the stack; a launch
/// with more (a kernel with that many by-value scalars) allocates.
const ARGS_ON_STACK: usize = 16;

/// A scalar param's name for a refusal (`p<k>` where the terms carry none).
fn param_name(k: usize, name: &str) -> String {
    if name.is_empty() {
        format!("p{k}")
    } else {
        name.to_string()
    }
}

/// Checks a launch of `kernel` against the session's `view` (a launch
/// whose scalars are f32 `params` only: the ring's).
pub fn check<C: Capabilities, K: LaunchTerms + ?Sized>(
    view: &C,
    kernel: KernelCap<'_, K>,
    launch: &LaunchShape<'_, C::Operand, C::Event>,
) -> Result<CheckedLaunch, C::Error> {
    check_with_args(view, kernel, launch, &[])
}

/// Checks a launch of `kernel` against the session's `view`, with the
/// launch's typed scalar `args` (empty when it passes f32 `params` or no
/// scalars).
pub fn check_with_args<C: Capabilities, K: LaunchTerms + ?Sized>(
    view: &C,
    kernel: KernelCap<'_, K>,
    launch: &LaunchShape<'_, C::Operand, C::Event>,
    args: &[ScalarArg],
) -> Result<CheckedLaunch, C::Error> {
    let terms = kernel.signature;
    if launch.inputs.len() != terms.inputs() as usize {
        return Err(LaunchRefusal::Arity {
            what: "inputs",
            expected: terms.inputs(),
            found: clamp(launch.inputs.len()),
        }
        .into());
    }
    check_scalars(terms, launch.scalars, args)?;
    let output = launch.output.ok_or(LaunchRefusal::NoOutput)?;
    // The args' bits, for contract terms that read them (the Strided
    // family's shapes and strides).
    let mut stack = [0u64; ARGS_ON_STACK];
    let heap: Vec<u64>;
    let bits: &[u64] = if args.len() <= ARGS_ON_STACK {
        for (slot, arg) in stack.iter_mut().zip(args) {
            *slot = arg.bits();
        }
        &stack[..args.len()]
    } else {
        heap = args.iter().map(|a| a.bits()).collect();
        &heap
    };
    let values = terms.values(launch.n, bits)?;
    let mismatch = |operand: String, placement: Placement| LaunchRefusal::DeviceMismatch {
        operand,
        kernel_device: view.describe(kernel.placement),
        operand_device: view.describe(placement),
    };
    let mut inputs = Vec::with_capacity(launch.inputs.len());
    let operands = launch.inputs.iter().chain([output]);
    for (index, operand) in operands.enumerate() {
        let name = || {
            if index < launch.inputs.len() {
                format!("input {index}")
            } else {
                "output".to_string()
            }
        };
        let (alignment, footprint) =
            terms
                .footprint(index, &values, bits)
                .ok_or(LaunchRefusal::Internal(
                    "the kernel's terms do not cover every operand",
                ))?;
        let (buffer, offset) = view.operand(operand)?;
        if buffer.placement != kernel.placement {
            return Err(mismatch(name(), buffer.placement).into());
        }
        if alignment > 1 && offset % u64::from(alignment) != 0 {
            return Err(LaunchRefusal::Misaligned {
                operand: name(),
                offset,
                element_size: alignment,
            }
            .into());
        }
        let needed = footprint.and_then(|f| f.checked_add(u128::from(offset)));
        if needed.is_none_or(|needed| needed > u128::from(buffer.size)) {
            return Err(LaunchRefusal::BufferTooSmall {
                operand: name(),
                needed_bytes: needed.unwrap_or(u128::MAX),
                buffer_bytes: buffer.size,
            }
            .into());
        }
        inputs.push(CheckedOperand {
            buffer_id: buffer.id,
            offset,
        });
    }
    let output = inputs
        .pop()
        .ok_or(LaunchRefusal::Internal("signature without an output"))?;
    let event = |event: Option<&C::Event>, field: &str| -> Result<Option<u64>, C::Error> {
        let Some(event) = event else {
            return Ok(None);
        };
        let event = view.event(event)?;
        if event.placement != kernel.placement {
            return Err(mismatch(field.to_string(), event.placement).into());
        }
        Ok(Some(event.id))
    };
    let wait_event = event(launch.wait, "wait_event")?;
    let signal_event = event(launch.signal, "signal_event")?;
    Ok(CheckedLaunch {
        inputs,
        output,
        wait_event,
        signal_event,
    })
}

fn clamp(count: usize) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::buffers::{ObjectKind, RegistryError};
    use crate::error::Error;
    use crate::ptx::LaunchContract;
    use ptxd_proto::v1::Reason;
    use rand::Rng;

    const HERE: Placement = Placement {
        device_index: 0,
        generation: DeviceGeneration(7),
    };

    /// A table of buffers and events by index; an index past the end is one
    /// the session does not hold.
    struct Table {
        buffers: Vec<BufferCap>,
        events: Vec<EventCap>,
    }

    impl Capabilities for Table {
        type Operand = (usize, u64);
        type Event = usize;
        type Error = Error;
        fn operand(&self, &(index, offset): &(usize, u64)) -> Result<(BufferCap, u64), Error> {
            let buffer = self.buffers.get(index).ok_or(RegistryError::Unknown {
                kind: ObjectKind::Buffer,
                handle: index.to_string(),
            })?;
            Ok((*buffer, offset))
        }
        fn event(&self, &index: &usize) -> Result<EventCap, Error> {
            Ok(*self.events.get(index).ok_or(RegistryError::Unknown {
                kind: ObjectKind::Event,
                handle: index.to_string(),
            })?)
        }
        fn describe(&self, p: Placement) -> String {
            format!("DEV-{}@{}", p.device_index, p.generation.0)
        }
    }

    fn signature(element_sizes: Vec<u32>, scalar_params: u32) -> Signature {
        Signature {
            inputs: element_sizes.len() as u32 - 1,
            element_sizes,
            scalar_params,
            reqntid: None,
            maxntid: None,
        }
    }

    fn table(sizes: &[u64]) -> Table {
        Table {
            buffers: sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| BufferCap {
                    id: 100 + i as u64,
                    size,
                    placement: HERE,
                })
                .collect(),
            events: vec![EventCap {
                id: 9,
                placement: HERE,
            }],
        }
    }

    fn shape<'r>(
        inputs: &'r [(usize, u64)],
        output: &'r (usize, u64),
        n: u64,
        scalars: usize,
    ) -> LaunchShape<'r, (usize, u64), usize> {
        LaunchShape {
            inputs,
            output: Some(output),
            n,
            scalars,
            wait: None,
            signal: None,
        }
    }

    fn reason(result: Result<CheckedLaunch, Error>) -> Reason {
        result.unwrap_err().refusal().reason
    }

    #[test]
    fn a_launch_inside_its_buffers_passes_with_their_ids() {
        let sig = signature(vec![4, 2, 8], 1);
        let view = table(&[4096, 4096, 8192]);
        let kernel = KernelCap {
            signature: &sig,
            placement: HERE,
        };
        let inputs = [(0, 0), (1, 2)];
        let mut launch = shape(&inputs, &(2, 0), 1024, 1);
        launch.wait = Some(&0);
        let checked = check(&view, kernel, &launch).unwrap();
        assert_eq!(
            checked,
            CheckedLaunch {
                inputs: vec![
                    CheckedOperand {
                        buffer_id: 100,
                        offset: 0
                    },
                    CheckedOperand {
                        buffer_id: 101,
                        offset: 2
                    },
                ],
                output: CheckedOperand {
                    buffer_id: 102,
                    offset: 0
                },
                wait_event: Some(9),
                signal_event: None,
            }
        );
    }

    #[test]
    fn each_mistake_gets_its_own_reason() {
        let sig = signature(vec![4, 4], 0);
        let view = table(&[400, 400]);
        let kernel = KernelCap {
            signature: &sig,
            placement: HERE,
        };
        let one = [(0, 0)];
        assert_eq!(
            reason(check(&view, kernel, &shape(&[], &(1, 0), 1, 0))),
            Reason::AbiMismatch
        );
        assert_eq!(
            reason(check(&view, kernel, &shape(&one, &(1, 0), 1, 1))),
            Reason::AbiMismatch
        );
        let mut no_output = shape(&one, &(1, 0), 1, 0);
        no_output.output = None;
        assert_eq!(
            reason(check(&view, kernel, &no_output)),
            Reason::InvalidArgument
        );
        assert_eq!(
            reason(check(&view, kernel, &shape(&one, &(1, 0), u64::MAX, 0))),
            Reason::InvalidArgument
        );
        // Not held.
        assert_eq!(
            reason(check(&view, kernel, &shape(&[(5, 0)], &(1, 0), 1, 0))),
            Reason::StaleBuffer
        );
        // Misaligned, then one element past the end.
        assert_eq!(
            reason(check(&view, kernel, &shape(&[(0, 2)], &(1, 0), 1, 0))),
            Reason::InvalidArgument
        );
        assert_eq!(
            reason(check(&view, kernel, &shape(&one, &(1, 4), 100, 0))),
            Reason::BufferTooSmall
        );
        // An event the session does not hold.
        let mut launch = shape(&one, &(1, 0), 1, 0);
        launch.signal = Some(&3);
        assert_eq!(
            reason(check(&view, kernel, &launch)),
            Reason::InvalidArgument
        );
    }

    #[test]
    fn another_device_or_generation_is_a_mismatch_naming_both() {
        let sig = signature(vec![4, 4], 0);
        for elsewhere in [
            Placement {
                device_index: 1,
                generation: HERE.generation,
            },
            Placement {
                device_index: 0,
                generation: DeviceGeneration(6),
            },
        ] {
            let mut view = table(&[400, 400]);
            view.buffers[0].placement = elsewhere;
            view.events[0].placement = elsewhere;
            let kernel = KernelCap {
                signature: &sig,
                placement: HERE,
            };
            let err = check(&view, kernel, &shape(&[(0, 0)], &(1, 0), 1, 0)).unwrap_err();
            let refusal = err.refusal();
            assert_eq!(refusal.reason, Reason::DeviceMismatch);
            assert_eq!(refusal.metadata["operand"], "input 0");
            assert_eq!(refusal.metadata["kernel_device"], "DEV-0@7");
            assert_eq!(
                refusal.metadata["operand_device"],
                format!("DEV-{}@{}", elsewhere.device_index, elsewhere.generation.0)
            );
            // Events are held to the same rule, named the same way.
            let view = Table {
                buffers: table(&[400, 400]).buffers,
                events: view.events,
            };
            let mut launch = shape(&[(0, 0)], &(1, 0), 1, 0);
            launch.wait = Some(&0);
            let refusal = check(&view, kernel, &launch).unwrap_err().refusal();
            assert_eq!(refusal.reason, Reason::DeviceMismatch);
            assert_eq!(refusal.metadata["operand"], "wait_event");
            assert_eq!(refusal.metadata["kernel_device"], "DEV-0@7");
        }
    }

    /// Random shapes against an independent statement of the bound: a launch
    /// passes exactly when every operand is aligned and fits.
    #[test]
    fn bounds_agree_with_a_reference_on_random_launches() {
        let mut rng = rand::rng();
        for _ in 0..20_000 {
            let sizes: Vec<u32> = (0..3)
                .map(|_| [1, 2, 4, 8][rng.random_range(0..4)])
                .collect();
            let sig = signature(sizes.clone(), 0);
            let buffers: Vec<u64> = (0..3).map(|_| rng.random_range(0..4096)).collect();
            let offsets: Vec<u64> = (0..3).map(|_| rng.random_range(0..4096)).collect();
            let n = if rng.random_bool(0.01) {
                rng.random_range(0..=i64::MAX as u64)
            } else {
                rng.random_range(0..1024)
            };
            let view = table(&buffers);
            let inputs = [(0, offsets[0]), (1, offsets[1])];
            let kernel = KernelCap {
                signature: &sig,
                placement: HERE,
            };
            let result = check(&view, kernel, &shape(&inputs, &(2, offsets[2]), n, 0));
            let fits = (0..3).all(|i| {
                let size = u128::from(sizes[i]);
                u128::from(offsets[i]) % size == 0
                    && u128::from(offsets[i]) + u128::from(n) * size <= u128::from(buffers[i])
            });
            assert_eq!(
                result.is_ok(),
                fits,
                "{sizes:?} {buffers:?} {offsets:?} n={n}"
            );
        }
    }

    /// The table's view without the daemon's error: lookups it cannot
    /// answer are a refusal too.
    struct Bare(Table);

    impl Capabilities for Bare {
        type Operand = (usize, u64);
        type Event = usize;
        type Error = LaunchRefusal;
        fn operand(
            &self,
            &(index, offset): &(usize, u64),
        ) -> Result<(BufferCap, u64), LaunchRefusal> {
            let buffer = self
                .0
                .buffers
                .get(index)
                .ok_or(LaunchRefusal::Internal("not held"))?;
            Ok((*buffer, offset))
        }
        fn event(&self, &index: &usize) -> Result<EventCap, LaunchRefusal> {
            self.0
                .events
                .get(index)
                .copied()
                .ok_or(LaunchRefusal::Internal("not held"))
        }
        fn describe(&self, p: Placement) -> String {
            self.0.describe(p)
        }
    }

    #[test]
    fn the_checks_refuse_with_their_own_enum_without_the_daemons_error() {
        let sig = signature(vec![4, 4], 0);
        let view = Bare(table(&[400, 400]));
        let kernel = KernelCap {
            signature: &sig,
            placement: HERE,
        };
        let one = [(0, 0)];
        assert_eq!(
            check(&view, kernel, &shape(&[], &(1, 0), 1, 0)),
            Err(LaunchRefusal::Arity {
                what: "inputs",
                expected: 1,
                found: 0
            })
        );
        assert_eq!(
            check(&view, kernel, &shape(&one, &(1, 0), u64::MAX, 0)),
            Err(LaunchRefusal::CountTooLarge)
        );
        assert_eq!(
            check(&view, kernel, &shape(&[(0, 2)], &(1, 0), 1, 0)),
            Err(LaunchRefusal::Misaligned {
                operand: "input 0".into(),
                offset: 2,
                element_size: 4
            })
        );
        assert_eq!(
            check(&view, kernel, &shape(&one, &(1, 4), 100, 0)),
            Err(LaunchRefusal::BufferTooSmall {
                operand: "output".into(),
                needed_bytes: 404,
                buffer_bytes: 400
            })
        );
        let mut elsewhere = table(&[400, 400]);
        elsewhere.buffers[0].placement.generation = DeviceGeneration(8);
        assert_eq!(
            check(&Bare(elsewhere), kernel, &shape(&one, &(1, 0), 1, 0)),
            Err(LaunchRefusal::DeviceMismatch {
                operand: "input 0".into(),
                kernel_device: "DEV-0@7".into(),
                operand_device: "DEV-0@8".into(),
            })
        );
    }

    /// The scalar ABI's contract, bound to any block, decides every launch
    /// exactly as the signature (today's check) does, with the same refusal.
    #[test]
    fn the_scalar_contract_refuses_exactly_what_the_signature_refuses() {
        let mut rng = rand::rng();
        for _ in 0..20_000 {
            let sizes: Vec<u32> = (0..3)
                .map(|_| [1, 2, 4, 8][rng.random_range(0..4)])
                .collect();
            let sig = signature(sizes, rng.random_range(0..2));
            let contract = LaunchContract::scalar(&sig, &[]);
            let bound = BoundContract {
                contract: &contract,
                block: [1, 32, 256, 1024][rng.random_range(0..4)],
            };
            let buffers: Vec<u64> = (0..3).map(|_| rng.random_range(0..4096)).collect();
            let offsets: Vec<u64> = (0..3).map(|_| rng.random_range(0..4096)).collect();
            let n = match rng.random_range(0..100) {
                0 => rng.random_range(0..=u64::MAX),
                1 => i64::MAX as u64 + rng.random_range(0..2),
                _ => rng.random_range(0..1024),
            };
            let view = Bare(table(&buffers));
            let inputs = [(0, offsets[0]), (1, offsets[1])];
            let inputs = &inputs[..rng.random_range(1..3)];
            let scalars = rng.random_range(0..2);
            let output = (2, offsets[2]);
            let launch = shape(inputs, &output, n, scalars);
            let by_signature = check(
                &view,
                KernelCap {
                    signature: &sig,
                    placement: HERE,
                },
                &launch,
            );
            let by_contract = check(
                &view,
                KernelCap {
                    signature: &bound,
                    placement: HERE,
                },
                &launch,
            );
            assert_eq!(
                by_signature, by_contract,
                "{sig:?} {buffers:?} {offsets:?} n={n}"
            );
        }
    }

    fn narrow_index_contract() -> LaunchContract {
        use crate::ptx::contract::{Condition, Expr, Precondition, INDEX_FITS_I32};
        LaunchContract::scalar(&signature(vec![4, 4], 0), &[]).assuming(Precondition {
            name: INDEX_FITS_I32,
            condition: Condition::AtMost(Expr::product(Expr::Grid, Expr::Block), 1 << 31),
        })
    }

    /// A precondition false at the launch's values is refused naming it and
    /// the values it read; one element less passes.
    #[test]
    fn a_false_precondition_is_refused_by_name_with_its_values() {
        let contract = narrow_index_contract();
        let bound = BoundContract {
            contract: &contract,
            block: 256,
        };
        let kernel = KernelCap {
            signature: &bound,
            placement: HERE,
        };
        let big = 1u64 << 40;
        let view = Bare(table(&[big, big]));
        let one = [(0, 0)];
        // grid × block = 2^31 exactly: the last index is 2^31 - 1.
        let fits = 1u64 << 31;
        assert!(check(&view, kernel, &shape(&one, &(1, 0), fits, 0)).is_ok());
        let refused = check(&view, kernel, &shape(&one, &(1, 0), fits + 1, 0));
        assert_eq!(
            refused,
            Err(LaunchRefusal::PreconditionFailed {
                precondition: "index_fits_i32",
                condition: "index_fits_i32: grid × block <= 2^31".into(),
                values: "grid=8388609,block=256".into(),
            })
        );
        // The daemon's error names it on the wire.
        let view = table(&[big, big]);
        let refusal = check(&view, kernel, &shape(&one, &(1, 0), fits + 1, 0))
            .unwrap_err()
            .refusal();
        assert_eq!(refusal.reason, Reason::InvalidArgument);
        assert_eq!(refusal.metadata["precondition"], "index_fits_i32");
        assert_eq!(refusal.metadata["values"], "grid=8388609,block=256");
        assert_eq!(refusal.metadata["field"], "launch");
        // A count past `long long` is still today's refusal, first.
        assert_eq!(
            check(
                &Bare(table(&[big, big])),
                kernel,
                &shape(&one, &(1, 0), u64::MAX, 0)
            ),
            Err(LaunchRefusal::CountTooLarge)
        );
    }

    /// A footprint past `u128` is refused as too large for any buffer,
    /// never wrapped.
    #[test]
    fn an_overflowing_footprint_is_buffer_too_small() {
        use crate::ptx::contract::Expr;
        let mut contract = LaunchContract::scalar(&signature(vec![4, 4], 0), &[]);
        contract.footprints[1].bytes = Expr::product(
            Expr::product(Expr::Count, Expr::Const(u64::MAX)),
            Expr::product(Expr::Count, Expr::Const(u64::MAX)),
        );
        let bound = BoundContract {
            contract: &contract,
            block: 256,
        };
        let kernel = KernelCap {
            signature: &bound,
            placement: HERE,
        };
        let view = Bare(table(&[u64::MAX, u64::MAX]));
        assert_eq!(
            check(&view, kernel, &shape(&[(0, 0)], &(1, 0), 1 << 40, 0)),
            Err(LaunchRefusal::BufferTooSmall {
                operand: "output".into(),
                needed_bytes: u128::MAX,
                buffer_bytes: u64::MAX,
            })
        );
    }

    /// A Triton-like contract: `out, x, .u32 n, .f32 scale, y, .s64 shift,
    /// null, null`, operands x, y, out.
    fn typed_contract() -> LaunchContract {
        use crate::ptx::contract::{ContractParam, PointerAccess};
        let mut contract = LaunchContract::scalar(&signature(vec![4, 4, 4], 0), &[]);
        let pointer = |name: &str, access, operand| ContractParam {
            name: name.into(),
            kind: ParamKind::Pointer { access, operand },
        };
        let scalar = |name: &str, kind| ContractParam {
            name: name.into(),
            kind,
        };
        contract.params = vec![
            pointer("out", PointerAccess::Written, Some(2)),
            pointer("x", PointerAccess::Read, Some(0)),
            scalar("n", ParamKind::Count(ScalarType::U32)),
            scalar("scale", ParamKind::Scalar(ScalarType::F32)),
            pointer("y", PointerAccess::Read, Some(1)),
            scalar("shift", ParamKind::Scalar(ScalarType::S64)),
            pointer("s0", PointerAccess::UnusedNull, None),
            pointer("s1", PointerAccess::UnusedNull, None),
        ];
        contract
    }

    /// Typed args match the contract's scalar params in count and type,
    /// exactly; each mismatch is refused naming what, and on the wire
    /// SCALAR_ARGS_MISMATCH with its metadata.
    #[test]
    fn typed_args_must_match_the_scalar_params_exactly() {
        let contract = typed_contract();
        let bound = BoundContract {
            contract: &contract,
            block: 128,
        };
        let kernel = KernelCap {
            signature: &bound,
            placement: HERE,
        };
        let view = Bare(table(&[400, 400, 400]));
        let ins = [(0, 0), (1, 0)];
        let launch = shape(&ins, &(2, 0), 100, 0);
        let good = [ScalarArg::F32(0.5), ScalarArg::I64(-7)];
        assert!(check_with_args(&view, kernel, &launch, &good).is_ok());
        let type_mismatch = |index: u32, param: &str, expected: &str, given: &str| {
            Err(LaunchRefusal::ScalarArgsMismatch {
                what: "type",
                index,
                param: param.into(),
                expected: expected.into(),
                given: given.into(),
            })
        };
        // No conversion: not an f64 or an i32 for the f32, not a u64 for
        // the s64.
        assert_eq!(
            check_with_args(&view, kernel, &launch, &[ScalarArg::F64(0.5), good[1]]),
            type_mismatch(0, "scale", "f32", "f64")
        );
        assert_eq!(
            check_with_args(&view, kernel, &launch, &[ScalarArg::I32(1), good[1]]),
            type_mismatch(0, "scale", "f32", "i32")
        );
        assert_eq!(
            check_with_args(&view, kernel, &launch, &[good[0], ScalarArg::U64(7)]),
            type_mismatch(1, "shift", "i64", "u64")
        );
        assert_eq!(
            check_with_args(&view, kernel, &launch, &good[..1]),
            Err(LaunchRefusal::ScalarArgsMismatch {
                what: "count",
                index: 0,
                param: String::new(),
                expected: "2".into(),
                given: "1".into(),
            })
        );
        // f32 params are f32 args: the s64 refuses them.
        assert_eq!(
            check(&view, kernel, &shape(&ins, &(2, 0), 100, 2)),
            type_mismatch(1, "shift", "i64", "f32")
        );
        // Both at once.
        let refused = check_with_args(&view, kernel, &shape(&ins, &(2, 0), 100, 2), &good);
        assert!(
            matches!(
                &refused,
                Err(LaunchRefusal::ScalarArgsMismatch { what: "both", .. })
            ),
            "{refused:?}"
        );
        // On the wire.
        let view = table(&[400, 400, 400]);
        let refusal = check_with_args(&view, kernel, &launch, &[ScalarArg::I32(1), good[1]])
            .unwrap_err()
            .refusal();
        assert_eq!(refusal.reason, Reason::ScalarArgsMismatch);
        assert_eq!(refusal.code, tonic::Code::InvalidArgument);
        for (key, value) in [
            ("what", "type"),
            ("index", "0"),
            ("param", "scale"),
            ("expected", "f32"),
            ("given", "i32"),
        ] {
            assert_eq!(refusal.metadata[key], value, "{key}");
        }
        let refusal = check_with_args(&view, kernel, &launch, &[])
            .unwrap_err()
            .refusal();
        // No args and no params: the scalar ABI's arity refusal, as before.
        assert_eq!(refusal.reason, Reason::AbiMismatch);
        let refusal = check_with_args(&view, kernel, &launch, &good[..1])
            .unwrap_err()
            .refusal();
        assert_eq!(refusal.reason, Reason::ScalarArgsMismatch);
        assert_eq!(
            (
                refusal.metadata["what"].as_str(),
                refusal.metadata["expected"].as_str()
            ),
            ("count", "2")
        );
        assert!(!refusal.metadata.contains_key("index"));
    }

    /// The scalar ABI: f32 args are its params (the same check passes),
    /// any other type is refused naming `p<k>`.
    #[test]
    fn f32_args_are_the_scalar_abis_params() {
        let sig = signature(vec![4, 4], 2);
        let contract = LaunchContract::scalar(&sig, &["x", "y", "n", "a", "b"]);
        let bound = BoundContract {
            contract: &contract,
            block: 256,
        };
        let view = Bare(table(&[400, 400]));
        let ins = [(0, 0)];
        let args = [ScalarArg::F32(1.0), ScalarArg::F32(2.0)];
        for kernel in [
            KernelCap {
                signature: &sig as &dyn LaunchTerms,
                placement: HERE,
            },
            KernelCap {
                signature: &bound as &dyn LaunchTerms,
                placement: HERE,
            },
        ] {
            let by_params = check(&view, kernel, &shape(&ins, &(1, 0), 100, 2));
            let by_args = check_with_args(&view, kernel, &shape(&ins, &(1, 0), 100, 0), &args);
            assert!(by_params.is_ok());
            assert_eq!(by_params, by_args);
            let refused = check_with_args(
                &view,
                kernel,
                &shape(&ins, &(1, 0), 100, 0),
                &[ScalarArg::F32(1.0), ScalarArg::U32(2)],
            );
            let Err(LaunchRefusal::ScalarArgsMismatch {
                what: "type",
                index: 1,
                param,
                ..
            }) = refused
            else {
                panic!("{refused:?}");
            };
            assert!(param == "b" || param == "p1", "{param}");
        }
    }

    /// The count param's type bounds n: a `.u32` count takes u32::MAX
    /// elements and refuses one more, naming `count_fits_u32`.
    #[test]
    fn a_u32_count_refuses_n_past_u32_max() {
        let contract = typed_contract();
        let bound = BoundContract {
            contract: &contract,
            block: 128,
        };
        let kernel = KernelCap {
            signature: &bound,
            placement: HERE,
        };
        let big = 1u64 << 40;
        let view = Bare(table(&[big, big, big]));
        let ins = [(0, 0), (1, 0)];
        let args = [ScalarArg::F32(0.5), ScalarArg::I64(-7)];
        let max = u64::from(u32::MAX);
        assert!(check_with_args(&view, kernel, &shape(&ins, &(2, 0), max, 0), &args).is_ok());
        assert_eq!(
            check_with_args(&view, kernel, &shape(&ins, &(2, 0), max + 1, 0), &args),
            Err(LaunchRefusal::PreconditionFailed {
                precondition: "count_fits_u32",
                condition: "count_fits_u32: n <= 4294967295".into(),
                values: "n=4294967296".into(),
            })
        );
    }

    #[test]
    fn each_refusal_becomes_the_daemons_error_it_always_was() {
        let cases = [
            (
                LaunchRefusal::NoOutput,
                "invalid output: a launch needs an output",
                Reason::InvalidArgument,
            ),
            (
                LaunchRefusal::CountTooLarge,
                "invalid n: n must fit a long long",
                Reason::InvalidArgument,
            ),
            (
                LaunchRefusal::Misaligned {
                    operand: "input 0".into(),
                    offset: 2,
                    element_size: 4,
                },
                "invalid offset: input 0: offset 2 is not a multiple of the element size 4",
                Reason::InvalidArgument,
            ),
            (
                LaunchRefusal::Arity {
                    what: "scalar params",
                    expected: 2,
                    found: 1,
                },
                "the kernel takes 2 scalar params, the launch gives 1",
                Reason::AbiMismatch,
            ),
            (
                LaunchRefusal::BufferTooSmall {
                    operand: "output".into(),
                    needed_bytes: 404,
                    buffer_bytes: 400,
                },
                "operand output needs 404 bytes but its buffer holds 400",
                Reason::BufferTooSmall,
            ),
            (
                LaunchRefusal::DeviceMismatch {
                    operand: "input 0".into(),
                    kernel_device: "A@1".into(),
                    operand_device: "B@2".into(),
                },
                "operand input 0 is on B@2, the kernel on A@1",
                Reason::DeviceMismatch,
            ),
            (
                LaunchRefusal::PreconditionFailed {
                    precondition: "index_fits_i32",
                    condition: "index_fits_i32: grid × block <= 2^31".into(),
                    values: "grid=8388609,block=256".into(),
                },
                "invalid launch: precondition index_fits_i32 (index_fits_i32: grid × block <= 2^31) \
                 does not hold at grid=8388609,block=256",
                Reason::InvalidArgument,
            ),
            (
                LaunchRefusal::Internal("signature without an output"),
                "internal error: signature without an output",
                Reason::Internal,
            ),
        ];
        for (refusal, text, reason) in cases {
            let error = Error::from(refusal.clone());
            assert_eq!(error.to_string(), text, "{refusal:?}");
            assert_eq!(error.refusal().reason, reason, "{refusal:?}");
        }
    }
}
