//! The kernel's shape before its body is read: launch bounds and the param
//! list.
//!
//! Invariants: an accepted kernel's params are `ints` 64-bit integers (every
//! input pointer, the output pointer, then the count) followed by `floats`
//! `.f32` params and nothing else, with `2 <= ints <= MAX_INPUTS + 2` and
//! `floats <= MAX_SCALAR_PARAMS`; so a param's index alone says which
//! integer it may be, and every one has a bit in a `ParamSet`. A launch
//! bound, when present, is one-dimensional and one a 1-D launch can honour.

use crate::ptx::ir::Kernel;
use crate::ptx::PtxError;

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

/// The param shape: `ints` 64-bit integer params, then `floats` f32 params.
pub(super) struct Layout {
    pub(super) ints: usize,
    pub(super) floats: usize,
}

pub(super) fn param_layout(k: &Kernel) -> Result<Layout, PtxError> {
    let mut ints = 0usize;
    let mut floats = 0usize;
    for p in &k.params {
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
    Ok(Layout { ints, floats })
}
