"""Typed scalar arguments of a launch (``Session.launch(..., args=[...])``).

ptxd checks each argument against the kernel's by-value scalar params, in
order, and converts nothing: an ``i32`` for an ``.f32`` param is refused
(``ScalarArgsMismatch``). Say the type with a helper (``ptxd.i32(5)``,
``ptxd.u32(n)``, ``ptxd.i64``, ``ptxd.u64``, ``ptxd.f32(0.5)``, ``ptxd.f64``),
or pass a plain Python number and let the kernel's contract name the type:
an ``int`` for an integer param (``.s32``, ``.u32``, ``.s64``, ``.u64``) takes
that param's type, a ``float`` for a float param (``.f32``, ``.f64``) takes
its type; an ``int`` for a float param, a ``float`` for an integer param, a
``bool``, or a value out of the type's range raises ``TypeError`` /
``OverflowError`` before anything is sent.
"""

from __future__ import annotations

import numbers
import re
import struct
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

__all__ = ["Arg", "i32", "u32", "i64", "u64", "f32", "f64"]


class Arg(NamedTuple):
    """One typed scalar argument: its wire type (``"i32"``, ``"u32"``,
    ``"i64"``, ``"u64"``, ``"f32"``, ``"f64"``) and value."""

    type: str
    value: Union[int, float]


_RANGES = {
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u64": (0, 2**64 - 1),
}


def _int(kind: str, value: Any) -> Arg:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"a {kind} arg takes an int, not {type(value).__name__}")
    low, high = _RANGES[kind]
    value = int(value)
    if not low <= value <= high:
        raise OverflowError(f"{value} does not fit a {kind} ({low}..{high})")
    return Arg(kind, value)


def _float(kind: str, value: Any) -> Arg:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"a {kind} arg takes a float, not {type(value).__name__}")
    value = float(value)
    if kind == "f32":
        f32_value(value, f"a {kind} arg")
    return Arg(kind, value)


def f32_value(value: float, what: str) -> float:
    """``value`` (a Python float) as the f32 the wire carries, checked: a
    finite value whose magnitude rounds past the largest f32 (3.4e38) raises
    ``OverflowError`` rather than becoming an infinity; infinities and NaN
    are f32 values and pass as they are."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        raise OverflowError(f"{what}: {value!r} is finite but does not fit an f32 "
                            "(|x| <= 3.4028235e38)") from None


def i32(value: int) -> Arg:
    """An argument for an ``.s32`` param."""
    return _int("i32", value)


def u32(value: int) -> Arg:
    """An argument for a ``.u32`` (or ``.b32``) param."""
    return _int("u32", value)


def i64(value: int) -> Arg:
    """An argument for an ``.s64`` param."""
    return _int("i64", value)


def u64(value: int) -> Arg:
    """An argument for a ``.u64`` (or ``.b64``) param."""
    return _int("u64", value)


def f32(value: float) -> Arg:
    """An argument for an ``.f32`` param (rounded to the nearest f32; a
    finite value beyond the f32 range raises ``OverflowError``)."""
    return _float("f32", value)


def f64(value: float) -> Arg:
    """An argument for an ``.f64`` param."""
    return _float("f64", value)


#: The contract text's PTX type of a scalar param -> the wire's arg type.
_PTX_TO_ARG = {"s32": "i32", "u32": "u32", "s64": "i64", "u64": "u64", "f32": "f32", "f64": "f64"}

_SCALAR = re.compile(r"^(?P<name>[^:]+): \.(?P<ty>[a-z0-9]+)$")


def scalar_params(contract: str) -> List[Tuple[str, str]]:
    """``(name, arg type)`` of each by-value scalar param of a contract's
    text form (``params(x: ptr read, n: count .u32, scale: .f32, ...); ...``),
    in order. Pointers and the count are not scalars."""
    if not contract.startswith("params("):
        return []
    inner = contract[len("params("):].split(")", 1)[0]
    out = []
    for item in inner.split(", ") if inner else []:
        match = _SCALAR.match(item)
        if match is not None:
            out.append((match["name"], _PTX_TO_ARG.get(match["ty"], match["ty"])))
    return out


def resolve(args: Sequence[Any], params: Optional[List[Tuple[str, str]]]) -> List[Arg]:
    """The typed args of a launch: each :class:`Arg` as given, each plain
    number typed by its param in ``params`` (see the module's docs)."""
    out = []
    for index, arg in enumerate(args):
        if isinstance(arg, Arg):
            out.append(arg)
            continue
        if params is None or index >= len(params):
            raise TypeError(
                f"scalar arg {index} ({arg!r}) has no param to take its type from: "
                "pass a typed arg (ptxd.i32(...), ptxd.f32(...), ...)"
            )
        name, kind = params[index]
        if kind in _RANGES:
            if isinstance(arg, bool) or not isinstance(arg, numbers.Integral):
                raise TypeError(
                    f"scalar arg {index} (param {name}, {kind}) takes an int, not "
                    f"{type(arg).__name__}; nothing is converted"
                )
            out.append(_int(kind, arg))
        elif kind in ("f32", "f64"):
            if isinstance(arg, (bool, numbers.Integral)) or not isinstance(arg, numbers.Real):
                raise TypeError(
                    f"scalar arg {index} (param {name}, {kind}) takes a float, not "
                    f"{type(arg).__name__}; nothing is converted"
                )
            out.append(_float(kind, arg))
        else:
            raise TypeError(f"scalar arg {index}: param {name} has type {kind}")
    return out
