//! The kernel's shape before its body is read: launch bounds and the param
//! list.
//!
//! Invariants: an accepted kernel's params are `ints` 64-bit integers (every
//! input pointer, the output pointer, then the count; with the 32-bit index
//! family the count may be a 32-bit integer) followed by `floats` `.f32`
//! params and nothing else, with `2 <= ints <= MAX_INPUTS + 2` and
//! `floats <= MAX_SCALAR_PARAMS`; so a param's index alone says which
//! integer it may be, and every one has a bit in a `ParamSet`. A launch
//! bound, when present, is one-dimensional and one a 1-D launch can honour.

use crate::ptx::ir::Kernel;
use crate::ptx::{Families, PtxError};

use super::{refuse, SubReason, MAX_INPUTS, MAX_SCALAR_PARAMS};

/// The largest `.reqntid`/`.maxntid` x-extent a CUDA block can have.
const MAX_BLOCK: u32 = 1024;

pub(super) fn launch_bounds(k: &Kernel) -> Result<(Option<u32>, Option<u32>), PtxError> {
    let line = Some(k.line);
    if let Some([x, y, z]) = k.reqntid {
        if y != 1 || z != 1 || x == 0 || x > MAX_BLOCK {
            return Err(refuse(
                SubReason::ReqntidConflict,
                None,
                line,
                format!(".reqntid {x},{y},{z} cannot be honoured by a 1-D launch of one thread per element"),
            ));
        }
    }
    if let Some([x, y, z]) = k.maxntid {
        if y != 1 || z != 1 || x == 0 {
            return Err(refuse(
                SubReason::Maxntid,
                None,
                line,
                format!(".maxntid {x},{y},{z} cannot be honoured by a 1-D launch"),
            ));
        }
    }
    if k.reqntid.is_some() && k.maxntid.is_some() {
        return Err(refuse(
            SubReason::ReqntidConflict,
            None,
            line,
            "`.reqntid` and `.maxntid` together: ptxas refuses a kernel that names both",
        ));
    }
    Ok((k.reqntid.map(|d| d[0]), k.maxntid.map(|d| d[0])))
}

/// The param shape: `ints` integer params (64-bit, but for a 32-bit count
/// last), then `floats` f32 params.
pub(super) struct Layout {
    pub(super) ints: usize,
    pub(super) floats: usize,
    /// The count's PTX type when it is 32 bits (`int n`, the 32-bit index
    /// family only).
    pub(super) count32: Option<&'static str>,
}

pub(super) fn param_layout(k: &Kernel, families: Families) -> Result<Layout, PtxError> {
    let mut ints = 0usize;
    let mut floats = 0usize;
    let mut count32 = None;
    for (j, p) in k.params.iter().enumerate() {
        // The 32-bit index family takes an `int n`: a 32-bit integer as the
        // last integer param, only floats after it.
        let last_int = k
            .params
            .get(j + 1..)
            .is_some_and(|rest| rest.iter().all(|q| q.ty == "f32" && q.array.is_none()));
        if families.index32 && floats == 0 && last_int && p.array.is_none() {
            let ty = match p.ty.as_str() {
                "u32" | "b32" => Some("u32"),
                "s32" => Some("s32"),
                _ => None,
            };
            if let Some(ty) = ty {
                ints += 1;
                count32 = Some(ty);
                continue;
            }
        }
        let name = Some(p.name.as_str());
        let line = Some(p.line);
        if p.array.is_some() {
            return Err(refuse(
                SubReason::ParamType,
                name,
                line,
                "a by-value aggregate param is not part of the scalar ABI",
            ));
        }
        match p.ty.as_str() {
            "u64" | "s64" | "b64" if floats == 0 => ints += 1,
            "u64" | "s64" | "b64" => {
                return Err(refuse(
                    SubReason::ExtraParams,
                    name,
                    line,
                    "an integer param after the float params",
                ))
            }
            "f32" => floats += 1,
            "u32" | "s32" | "b32" | "u16" | "s16" | "b16" | "u8" | "s8" | "b8" => {
                return Err(refuse(
                    SubReason::CountNot64bit,
                    name,
                    line,
                    format!(
                        "a .{} integer param; the element count must be a 64-bit `long long`",
                        p.ty
                    ),
                ))
            }
            other => {
                return Err(refuse(
                    SubReason::ParamType,
                    name,
                    line,
                    format!("a .{other} param is not part of the scalar ABI"),
                ))
            }
        }
    }
    if ints < 2 {
        return Err(refuse(
            SubReason::MissingParams,
            None,
            Some(k.line),
            format!("{ints} pointer/count params; the scalar ABI needs at least an output pointer and a count"),
        ));
    }
    if ints - 2 > MAX_INPUTS || floats > MAX_SCALAR_PARAMS {
        return Err(refuse(
            SubReason::ParamCount,
            None,
            Some(k.line),
            format!(
                "{} inputs and {floats} float params exceed the limits ({MAX_INPUTS}, {MAX_SCALAR_PARAMS})",
                ints - 2
            ),
        ));
    }
    Ok(Layout {
        ints,
        floats,
        count32,
    })
}
