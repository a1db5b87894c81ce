//! A kernel's param layout: what an executor passes for each of its params,
//! in order, derived from the launch contract by the front
//! ([`slots_of`]) and checked by the executor when it loads the module
//! ([`decode`]).
//!
//! Invariants:
//! - A decoded layout names every launch operand (inputs, then the output)
//!   exactly once, at most one count, and exactly the module's number of
//!   scalars; anything else is refused at load, so a launch can never pass
//!   an address the front did not check or read an argument it was not
//!   given.
//! - An empty layout on the wire is the scalar ABI's for the module's
//!   `inputs` and `scalar_params` (operand pointers, `long long n`, f32
//!   scalars): what every executor did before layouts existed.

use ptxd_proto::executor as exec;

use crate::ptx::contract::{LaunchContract, ParamKind, ScalarType};

/// What one kernel param is passed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The address of launch operand k (inputs in order, then the output).
    Operand(u32),
    /// A null pointer (a param the kernel never dereferences).
    Null,
    /// The launch's count, as this type.
    Count(ScalarType),
    /// The launch's next scalar argument, as this type.
    Scalar(ScalarType),
}

impl Slot {
    /// Bytes the param occupies (and its alignment: every PTX param type
    /// here is aligned to its size).
    pub fn size(self) -> usize {
        match self {
            Slot::Operand(_) | Slot::Null => 8,
            Slot::Count(ty) | Slot::Scalar(ty) => type_size(ty),
        }
    }
}

/// Bytes of a value of `ty`.
pub fn type_size(ty: ScalarType) -> usize {
    match ty {
        ScalarType::U32 | ScalarType::S32 | ScalarType::F32 => 4,
        ScalarType::U64 | ScalarType::S64 | ScalarType::F64 => 8,
    }
}

/// The scalar ABI's layout: `inputs + 1` operand pointers, `long long n`,
/// then `scalar_params` floats.
pub fn scalar_abi(inputs: u32, scalar_params: u32) -> Vec<Slot> {
    (0..=inputs)
        .map(Slot::Operand)
        .chain([Slot::Count(ScalarType::S64)])
        .chain((0..scalar_params).map(|_| Slot::Scalar(ScalarType::F32)))
        .collect()
}

fn kind_of(ty: ScalarType) -> exec::ScalarKind {
    match ty {
        ScalarType::U32 => exec::ScalarKind::U32,
        ScalarType::S32 => exec::ScalarKind::S32,
        ScalarType::U64 => exec::ScalarKind::U64,
        ScalarType::S64 => exec::ScalarKind::S64,
        ScalarType::F32 => exec::ScalarKind::F32,
        ScalarType::F64 => exec::ScalarKind::F64,
    }
}

fn type_of(kind: i32) -> Option<ScalarType> {
    Some(match exec::ScalarKind::try_from(kind).ok()? {
        exec::ScalarKind::U32 => ScalarType::U32,
        exec::ScalarKind::S32 => ScalarType::S32,
        exec::ScalarKind::U64 => ScalarType::U64,
        exec::ScalarKind::S64 => ScalarType::S64,
        exec::ScalarKind::F32 => ScalarType::F32,
        exec::ScalarKind::F64 => ScalarType::F64,
        exec::ScalarKind::Unspecified => return None,
    })
}

/// The contract's params as the load message carries them.
pub fn slots_of(contract: &LaunchContract) -> Vec<exec::ParamSlot> {
    use exec::param_slot::Slot as Wire;
    contract
        .params
        .iter()
        .map(|p| {
            let slot = match p.kind {
                ParamKind::Pointer {
                    operand: Some(k), ..
                } => Wire::Operand(k),
                ParamKind::Pointer { operand: None, .. } => Wire::Null(exec::Empty {}),
                ParamKind::Count(ty) => Wire::Count(kind_of(ty) as i32),
                ParamKind::Scalar(ty) => Wire::Scalar(kind_of(ty) as i32),
            };
            exec::ParamSlot { slot: Some(slot) }
        })
        .collect()
}

/// The layout a load message asks for, checked against the module's
/// `inputs` and `scalar_params` (see the module's invariants).
pub fn decode(load: &exec::LoadModule) -> Result<Vec<Slot>, String> {
    use exec::param_slot::Slot as Wire;
    if load.params.is_empty() {
        return Ok(scalar_abi(load.inputs, load.scalar_params));
    }
    let operands = load.inputs as usize + 1;
    let mut seen = vec![false; operands];
    let (mut counts, mut scalars) = (0usize, 0usize);
    let mut layout = Vec::with_capacity(load.params.len());
    for (i, p) in load.params.iter().enumerate() {
        let slot = match p.slot {
            Some(Wire::Operand(k)) => {
                match seen.get_mut(k as usize) {
                    Some(seen) if !*seen => *seen = true,
                    Some(_) => return Err(format!("param {i}: operand {k} is passed twice")),
                    None => {
                        return Err(format!(
                            "param {i}: operand {k} of a launch with {operands} operands"
                        ))
                    }
                }
                Slot::Operand(k)
            }
            Some(Wire::Null(_)) => Slot::Null,
            Some(Wire::Count(kind)) => {
                counts += 1;
                match type_of(kind) {
                    Some(ScalarType::F32 | ScalarType::F64) => {
                        return Err(format!("param {i}: a count of a float type"))
                    }
                    Some(ty) => Slot::Count(ty),
                    None => return Err(format!("param {i}: a count without a type")),
                }
            }
            Some(Wire::Scalar(kind)) => {
                scalars += 1;
                Slot::Scalar(type_of(kind).ok_or(format!("param {i}: a scalar without a type"))?)
            }
            None => return Err(format!("param {i} has no slot")),
        };
        layout.push(slot);
    }
    if let Some(k) = seen.iter().position(|s| !s) {
        return Err(format!("the layout never passes operand {k}"));
    }
    if counts > 1 {
        return Err(format!("the layout passes the count {counts} times"));
    }
    if scalars != load.scalar_params as usize {
        return Err(format!(
            "the layout has {scalars} scalars; the module takes {}",
            load.scalar_params
        ));
    }
    Ok(layout)
}

/// A hand-built Triton-like contract, for the layout's and the packer's
/// tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use crate::ptx::contract::{
        ContractParam, LaunchContract, ParamKind, PointerAccess, ScalarType,
    };
    use crate::ptx::Signature;

    /// Triton's shape: three operands, a `.u32` count, an f32 scalar, two
    /// null scratch pointers; the output is passed first.
    pub(crate) fn triton_like() -> LaunchContract {
        let mut contract = LaunchContract::scalar(
            &Signature {
                inputs: 2,
                element_sizes: vec![4, 4, 4],
                scalar_params: 0,
                reqntid: Some(128),
                maxntid: None,
            },
            &[],
        );
        let pointer = |name: &str, access, operand| ContractParam {
            name: name.into(),
            kind: ParamKind::Pointer { access, operand },
        };
        contract.params = vec![
            pointer("out", PointerAccess::Written, Some(2)),
            pointer("x", PointerAccess::Read, Some(0)),
            ContractParam {
                name: "n".into(),
                kind: ParamKind::Count(ScalarType::U32),
            },
            ContractParam {
                name: "scale".into(),
                kind: ParamKind::Scalar(ScalarType::F32),
            },
            pointer("y", PointerAccess::Read, Some(1)),
            ContractParam {
                name: "shift".into(),
                kind: ParamKind::Scalar(ScalarType::S64),
            },
            pointer("scratch0", PointerAccess::UnusedNull, None),
            pointer("scratch1", PointerAccess::UnusedNull, None),
        ];
        contract
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::tests_support::triton_like;
    use super::*;
    use crate::ptx::Signature;

    fn load(inputs: u32, scalar_params: u32, params: Vec<exec::ParamSlot>) -> exec::LoadModule {
        exec::LoadModule {
            inputs,
            scalar_params,
            params,
            ..Default::default()
        }
    }

    #[test]
    fn the_scalar_contract_is_the_scalar_abis_layout() {
        let signature = Signature {
            inputs: 2,
            element_sizes: vec![4, 4, 4],
            scalar_params: 2,
            reqntid: None,
            maxntid: None,
        };
        let contract = LaunchContract::scalar(&signature, &[]);
        let wire = slots_of(&contract);
        assert_eq!(decode(&load(2, 2, wire)).unwrap(), scalar_abi(2, 2));
        assert_eq!(decode(&load(2, 2, vec![])).unwrap(), scalar_abi(2, 2));
        assert_eq!(
            scalar_abi(1, 1),
            vec![
                Slot::Operand(0),
                Slot::Operand(1),
                Slot::Count(ScalarType::S64),
                Slot::Scalar(ScalarType::F32)
            ]
        );
    }

    #[test]
    fn a_triton_like_contract_round_trips() {
        let wire = slots_of(&triton_like());
        assert_eq!(
            decode(&load(2, 2, wire)).unwrap(),
            vec![
                Slot::Operand(2),
                Slot::Operand(0),
                Slot::Count(ScalarType::U32),
                Slot::Scalar(ScalarType::F32),
                Slot::Operand(1),
                Slot::Scalar(ScalarType::S64),
                Slot::Null,
                Slot::Null,
            ]
        );
    }

    /// The launch ring carries f32 scalars only: a contract with typed
    /// params (a `.u32` count, an `.s64` scalar, null pointers) is never one
    /// its signature check covers, so the front grants it to no ring
    /// (`src/front/ring.rs`), whatever signature it comes with.
    #[test]
    fn a_triton_like_contract_is_never_granted_to_a_ring() {
        let contract = triton_like();
        for scalar_params in 0..3 {
            let signature = Signature {
                inputs: 2,
                element_sizes: vec![4, 4, 4],
                scalar_params,
                reqntid: Some(128),
                maxntid: None,
            };
            assert!(!contract.checked_by_signature(&signature));
            assert!(!contract.checked_by_signature_and_max_count(&signature));
        }
    }

    /// A layout that would pass an unchecked address, skip an operand, pass
    /// two counts or read an argument the module was not given is refused.
    #[test]
    fn a_layout_that_does_not_match_the_module_is_refused() {
        use exec::param_slot::Slot as Wire;
        let slot = |s| exec::ParamSlot { slot: Some(s) };
        let f32 = exec::ScalarKind::F32 as i32;
        let s64 = exec::ScalarKind::S64 as i32;
        let cases = [
            (
                vec![Wire::Operand(0), Wire::Operand(2)],
                "operand 2 of a launch with 2",
            ),
            (vec![Wire::Operand(0), Wire::Operand(0)], "passed twice"),
            (vec![Wire::Operand(1)], "never passes operand 0"),
            (
                vec![
                    Wire::Operand(0),
                    Wire::Operand(1),
                    Wire::Count(s64),
                    Wire::Count(s64),
                ],
                "count 2 times",
            ),
            (
                vec![Wire::Operand(0), Wire::Operand(1), Wire::Scalar(f32)],
                "1 scalars; the module takes 0",
            ),
            (
                vec![Wire::Operand(0), Wire::Operand(1), Wire::Count(0)],
                "without a type",
            ),
            (
                vec![
                    Wire::Operand(0),
                    Wire::Operand(1),
                    Wire::Count(exec::ScalarKind::F32 as i32),
                ],
                "a count of a float type",
            ),
        ];
        for (wire, want) in cases {
            let err = decode(&load(1, 0, wire.into_iter().map(slot).collect())).unwrap_err();
            assert!(err.contains(want), "{err} (want {want})");
        }
        let err = decode(&load(0, 0, vec![exec::ParamSlot { slot: None }])).unwrap_err();
        assert!(err.contains("no slot"), "{err}");
    }
}
