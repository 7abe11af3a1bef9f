"""How to convolve: ConvSpec (geometry, layout, precision, algorithm choice, engine, determinism), checked when it
is created, and the native spec of each direction that the ops in conv.py pass to the core.

Algorithm choice (ConvSpec.algo), per direction:
  'find'       time the candidates on the call's own arrays (cudnnFind*AlgorithmEx) once per problem;
  'heuristic'  cuDNN's heuristic ranking (cudnnGet*Algorithm_v7), no timing;
  a name       that algorithm, e.g. 'IMPLICIT_PRECOMP_GEMM' (forward), 'ALGO_1' (backward-data and -filter),
               or one per direction: 'fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=heuristic'
               (directions left out use 'heuristic'); 'ENGINE_<n>' names a graph-engine engine id.
Within untimed_search(), 'find' is taken as 'heuristic': for problems that run too rarely to repay a search.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from dataclasses import dataclass, field
from functools import cache, lru_cache

from .._core.loader import _C
from .._core.names import CONV_PRECISIONS, DIRECTION_ALIASES, DIRECTIONS, ENGINES, LAYOUTS, QUANT_PRECISIONS, choice

# The native core's typed enums by name (their member names are the names above).
_NATIVE_LAYOUT = dict(_C.Layout.__members__)
_NATIVE_PRECISION = dict(_C.Precision.__members__)
_NATIVE_ENGINE = dict(_C.Engine.__members__)
_NATIVE_ALGO_MODE = dict(_C.AlgoMode.__members__)
_NATIVE_DIRECTION = dict(_C.Direction.__members__)

_default_engine = "auto"
_untimed = contextvars.ContextVar("resnet_native_untimed_search", default=False)


@contextlib.contextmanager
def untimed_search():
    """Within the block, convolutions whose spec asks for 'find' choose by cuDNN's heuristic ranking instead: no
    candidate is timed, and the choice is cached under 'heuristic' (a fixed algorithm or 'heuristic' is
    unchanged). For problems that run too rarely to repay a search, such as an epoch's last, partial batch: the
    search of a shape costs as much as hundreds of its steps. Every call of such a problem, its graph capture
    included, must run within the block, or the first one outside it searches."""
    token = _untimed.set(True)
    try:
        yield
    finally:
        _untimed.reset(token)


def set_default_engine(engine: str) -> None:
    """The engine of ConvSpecs (and so of Conv2d layers) created from now on without engine=: 'auto' (the
    default: the faster engine per problem, timed once), 'legacy' or 'graph'."""
    global _default_engine
    _default_engine = choice("engine", engine, ENGINES)


def default_engine() -> str:
    return _default_engine


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pair(value, name: str) -> tuple:
    """(int, int) from an int or a pair of ints; the native spec checks the range."""
    if _is_int(value):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_is_int(v) for v in value):
        raise ValueError(f"{name}: expected an int or a pair of ints, got {value!r}")
    return (int(value[0]), int(value[1]))


@dataclass(frozen=True)
class ConvSpec:
    """How to convolve: geometry, layout, precision, algorithm choice, engine and determinism.

    stride, padding and dilation take an int or a pair (height, width). engine defaults to the module default
    (set_default_engine) at the time the spec is created. Every value is checked here (ValueError naming the
    field), when the native spec of each direction is built and kept on the spec; only an algorithm name that does
    not exist in a direction, or names the other engine, raises where that direction is used.
    """

    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    layout: str = "NCHW"
    precision: str = "fp32"
    algo: str = "find"
    engine: str = field(default_factory=default_engine)
    deterministic: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stride", _pair(self.stride, "stride"))
        object.__setattr__(self, "padding", _pair(self.padding, "padding"))
        object.__setattr__(self, "dilation", _pair(self.dilation, "dilation"))
        if not _is_int(self.groups):
            raise ValueError(f"groups: expected an int >= 1, got {self.groups!r}")
        object.__setattr__(self, "groups", int(self.groups))
        choice("layout", self.layout, LAYOUTS)
        choice("precision", self.precision, CONV_PRECISIONS)
        choice("engine", self.engine, ENGINES)
        if self.precision in QUANT_PRECISIONS and (self.engine != "graph" or self.layout != "NHWC"):
            raise ValueError(f"precision: {self.precision!r} convolutions run on engine='graph' in layout='NHWC' "
                             f"(ops.quantized_conv.conv2d), got engine={self.engine!r}, layout={self.layout!r}")
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic: expected a bool, got {self.deterministic!r}")
        _parse_algo(self.algo)
        # The native specs check the ranges (geometry first, then each direction's algorithm); a direction whose
        # algorithm does not resolve raises where it is used.
        _native_spec(self, _GEOMETRY)
        for direction in DIRECTIONS:
            with contextlib.suppress(_UnresolvedAlgo):
                _native_spec(self, direction)

    def __getstate__(self):
        # The native specs kept by _native_spec are not part of a spec: never pickled or copied along.
        return {k: v for k, v in self.__dict__.items() if k != "_native_specs"}


# ----------------------------------------------------------------------------------------------------------------
# Algorithm names


@cache
def _legacy_algo_names(direction: str) -> tuple:
    return tuple(_C.conv_algo_names(_NATIVE_DIRECTION[direction]))


def _named_algo(name: str, direction: str):
    """('fixed', index, engine) for an algorithm name valid in `direction`, else None."""
    upper = name.strip().upper()
    if upper.startswith("ENGINE_") and upper[len("ENGINE_") :].isdigit():
        return ("fixed", int(upper[len("ENGINE_") :]), "graph")
    names = _legacy_algo_names(direction)
    if upper in names:
        return ("fixed", names.index(upper), "legacy")
    return None


def _algo_for(text: str, direction: str, whole: str):
    if text in ("find", "heuristic"):
        return (text, 0, None)
    named = _named_algo(text, direction)
    if named is None:
        raise ValueError(
            f"algo: {text!r} (in {whole!r}) is not 'find', 'heuristic' or a {direction} algorithm "
            f"({', '.join(_legacy_algo_names(direction))}, or ENGINE_<n> for the graph engine)"
        )
    return named


def _parse_algo(algo) -> dict:
    """{direction: (mode, fixed index, engine the name belongs to or None)}; a direction a single algorithm name
    does not exist in maps to ('invalid', 0, None) and raises when used."""
    if not isinstance(algo, str):
        raise ValueError(f"algo: expected a string, got {algo!r}")
    return _parse_algo_text(algo)


@lru_cache(maxsize=256)
def _parse_algo_text(algo: str) -> dict:
    text = algo.strip()
    if text in ("find", "heuristic"):
        return {d: (text, 0, None) for d in DIRECTIONS}
    if "=" in text:
        result = {d: ("heuristic", 0, None) for d in DIRECTIONS}
        given = {}  # direction -> the part that named it
        for part in text.split(";"):
            key, sep, name = part.partition("=")
            direction = DIRECTION_ALIASES.get(key.strip())
            if not sep or direction is None or not name.strip():
                raise ValueError(
                    f"algo: expected 'direction=name' parts separated by ';' with directions fwd, bwd_data, "
                    f"bwd_filter, got {algo!r}"
                )
            if direction in given:
                raise ValueError(
                    f"algo: the {direction} direction is given twice ({given[direction]!r} and {part.strip()!r}) "
                    f"in {algo!r}; give each direction once"
                )
            given[direction] = part.strip()
            result[direction] = _algo_for(name.strip(), direction, algo)
        return result
    result = {}
    for direction in DIRECTIONS:
        named = _named_algo(text, direction)
        result[direction] = named if named is not None else ("invalid", 0, None)
    if all(v[0] == "invalid" for v in result.values()):
        names = sorted({n for d in DIRECTIONS for n in _legacy_algo_names(d)})
        raise ValueError(
            f"algo: expected 'find', 'heuristic' or an algorithm name ({', '.join(names)}, ENGINE_<n>), "
            f"or one per direction like 'fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=ALGO_1'; "
            f"got {algo!r}"
        )
    return result


def _direction(direction) -> str:
    resolved = DIRECTION_ALIASES.get(direction) if isinstance(direction, str) else None
    if resolved is None:
        raise ValueError(f"direction: expected one of {', '.join(repr(d) for d in DIRECTIONS)}, got {direction!r}")
    return resolved


def _check_spec(spec) -> ConvSpec:
    if not isinstance(spec, ConvSpec):
        raise TypeError(f"spec: expected a resnet_native.ConvSpec, got {type(spec).__name__}")
    return spec


_GEOMETRY = "geometry"  # the native spec for shape arithmetic only (whatever the algorithm)


class _UnresolvedAlgo(ValueError):
    """A spec's algorithm does not resolve in one direction (raised where that direction is used)."""


def _native_spec(spec: ConvSpec, direction: str):
    """The _C.ConvSpec the native ops take for one direction ('forward', 'backward_data', 'backward_filter'), or
    for shape arithmetic only (_GEOMETRY).

    Built once per spec and direction and kept on the spec (a ConvSpec is immutable): the ops call this on every
    call, and an lru_cache keyed by the spec would hash all of its fields each time.
    """
    specs = spec.__dict__.get("_native_specs")
    if specs is None:
        # Outside the dataclass fields: not part of eq / hash / repr; a frozen dataclass's __dict__ is writable.
        specs = spec.__dict__["_native_specs"] = {}
    key = (direction, _untimed.get())
    native = specs.get(key)
    if native is None:
        engine, mode, fixed = ("legacy", "heuristic", 0) if direction == _GEOMETRY else _resolve_algo(spec, direction)
        if key[1] and mode == "find":
            mode = "heuristic"
        native = specs[key] = _C.ConvSpec(
            stride=spec.stride, padding=spec.padding, dilation=spec.dilation, groups=spec.groups,
            layout=_NATIVE_LAYOUT[spec.layout], precision=_NATIVE_PRECISION[spec.precision],
            engine=_NATIVE_ENGINE[engine], algo_mode=_NATIVE_ALGO_MODE[mode], fixed_algo=fixed,
            deterministic=spec.deterministic,
        )
    return native


def _resolve_algo(spec: ConvSpec, direction: str) -> tuple:
    """(engine, mode, fixed algorithm index) of one direction; _UnresolvedAlgo when the algorithm does not exist
    there or names the other engine."""
    mode, fixed, name_engine = _parse_algo(spec.algo)[direction]
    if mode == "invalid":
        raise _UnresolvedAlgo(
            f"algo: {spec.algo!r} is not a {direction} algorithm ({', '.join(_legacy_algo_names(direction))}); "
            f"name one per direction, e.g. 'fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=ALGO_1'"
        )
    engine = spec.engine
    if name_engine is not None:
        if engine == "auto":
            engine = name_engine  # a fixed algorithm names its engine
        elif engine != name_engine:
            raise _UnresolvedAlgo(
                f"algo: {spec.algo!r} names a {name_engine}-engine algorithm, but engine={engine!r}"
            )
    return engine, mode, fixed


def _shape4(shape, name: str) -> tuple:
    if not isinstance(shape, (tuple, list)) or len(shape) != 4 or not all(_is_int(v) for v in shape):
        raise ValueError(f"{name}: expected a tuple of 4 ints, got {shape!r}")
    return tuple(int(v) for v in shape)
