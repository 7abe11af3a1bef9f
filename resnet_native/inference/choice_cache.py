"""An engine's timed choices, kept in the algorithm cache file beside the conv choices: where the 8-bit part of
InferenceEngine(quantize_from='auto') begins, and which kernel runs each int8 convolution (kernel_choice.py).

Timing costs a build or many launches per candidate, and the result depends only on the problem, so an engine built
with algorithm_cache=PATH stores it there and the next engine of the same problem on the same machine reuses it
without timing. A key's first token is its kind (KIND, KERNEL_KIND), the rest the problem (choice_key,
kernel_key); the machine is the file's header (GPU model, cuDNN version), checked as for the conv entries. The
choices live in the file's "engine_choices" section only, not in an in-process registry, so there is no second copy
to keep in step: the engine reads the section before building and merges its choices in after (store_choices),
and ops.conv.save_algorithm_cache carries over sections it does not own. There is no lock: two processes storing
at once may lose one choice, which costs one timing later. Nothing in the file is executed; a malformed section
is a ValueError, raised before anything from the file is used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys

from ..ops import algo_cache
from ..quantization.prefix import FLOAT, QUANTIZE_FROM

SECTION = "engine_choices"
KIND = "quantize_from.v1"  # a key's first token: what is chosen, and how the key is spelled
KERNEL_KIND = "qconv_kernel.v1"
_KERNEL_NAME = re.compile(r"cudnn|own:[a-z0-9_]{1,64}")
# kind -> (the record's field holding the choice, whether a name can be one of its candidates)
_KINDS = {KIND: ("quantize_from", lambda name: name in QUANTIZE_FROM + (FLOAT,)),
          KERNEL_KIND: ("kernel", lambda name: _KERNEL_NAME.fullmatch(name) is not None)}


def plan_fingerprint(plan) -> str:
    """16 hex digits of a SHA-256 over the plan's structure: stem, precision, classes, every value's shape and
    dtype and every step's fields (kinds, geometry, state_dict names); the same for any weights of one
    architecture."""
    structure = {"stem": plan.stem, "precision": plan.precision, "num_classes": plan.num_classes,
                 "input": plan.input, "values": [dataclasses.asdict(v) for v in plan.values],
                 "steps": [dataclasses.asdict(s) for s in plan.steps]}
    return hashlib.sha256(json.dumps(structure, sort_keys=True).encode()).hexdigest()[:16]


def choice_key(plan, *, dtype: str, batch: int, cuda_graph: bool, candidates, conv_engine: str,
               deterministic: bool, tune_fusion: bool) -> str:
    """The readable key of a quantize_from='auto' problem: `plan` the calibration (fp32) plan, `batch` the batch
    size whose choice it is (each is timed on its own), `dtype` the 8-bit type. The plan enters as its structure
    (plan_fingerprint: every step and value shape, not the weights, which do not change the timing), with the
    ConvSpec fields and fusion tuning the float prefix runs with and the candidate set."""
    _, height, width = plan.values[plan.input].shape
    fields = {"plan": plan_fingerprint(plan), "stem": plan.stem, "image": f"{height}x{width}",
              "classes": plan.num_classes, "convs": len(plan.conv_steps()), "dtype": dtype, "batch": int(batch),
              "cuda_graph": int(bool(cuda_graph)), "conv_engine": conv_engine, "det": int(bool(deterministic)),
              "tune_fusion": int(bool(tune_fusion)), "candidates": ",".join(candidates)}
    return " ".join([KIND] + [f"{k}={v}" for k, v in fields.items()])


def kernel_key(x_shape, w_shape, *, pad, stride, residual: bool, relu: bool, out: str, cudnn_algo: str,
               deterministic: bool, candidates) -> str:
    """The readable key of one int8 convolution's kernel choice: NHWC x and KRSC w shapes (the batch included),
    its geometry and epilogue, the 8-bit or float output, how cuDNN's candidate chose its plan, and the candidates
    ('cudnn', 'own:<kernel name>'), so a build with other kernels times again. pad and stride: (height, width)."""
    def dims(values):
        return "x".join(str(int(v)) for v in values)

    fields = {"x": dims(x_shape), "w": dims(w_shape), "pad": dims(pad), "stride": dims(stride),
              "residual": int(bool(residual)), "relu": int(bool(relu)), "out": out,
              "cudnn_algo": cudnn_algo, "det": int(bool(deterministic)), "candidates": ",".join(candidates)}
    return " ".join([KERNEL_KIND] + [f"{k}={v}" for k, v in fields.items()])


def _key_kind(key, where: str) -> tuple:
    """(kind, candidates) of a key; ValueError for a key choice_key / kernel_key cannot have written."""
    tokens = key.split(" ") if isinstance(key, str) else []
    fields = dict(t.split("=", 1) for t in tokens[1:] if "=" in t)
    names = tuple(fields.get("candidates", "").split(","))
    kind = tokens[0] if tokens and tokens[0] in _KINDS else None
    if (kind is None or len(fields) != len(tokens) - 1 or ("plan" if kind == KIND else "x") not in fields
            or not all(map(_KINDS[kind][1], names)) or len(set(names)) != len(names)):
        raise ValueError(f"{where}: key {key!r} is not a {KIND} key ('{KIND} plan=... candidates=stem,layer1,...') "
                         f"or a {KERNEL_KIND} key ('{KERNEL_KIND} x=... candidates=cudnn,own:...')")
    return kind, names


def check_choices(section, path) -> dict:
    """The choices of a file's section as {key: {field: chosen, "times_ms": {candidate: ms}}}, the field
    'quantize_from' or 'kernel' by the key's kind; ValueError naming the file, the key and what was expected for
    anything choice_key / kernel_key / store_choices cannot have written."""
    where = f"algorithm cache file {path}: {SECTION!r}"
    if not isinstance(section, dict):
        raise ValueError(f"{where} is not an object of {{key: choice}}")
    choices = {}
    for key, record in section.items():
        kind, candidates = _key_kind(key, where)
        field = _KINDS[kind][0]
        if not isinstance(record, dict):
            raise ValueError(f"{where}: {key!r} is not an object with {field!r} and 'times_ms'")
        chosen, times = record.get(field), record.get("times_ms")
        if chosen not in candidates:
            raise ValueError(f"{where}: {key!r}: {field!r} {chosen!r} is not one of its candidates "
                             f"{', '.join(candidates)}")
        if not isinstance(times, dict) or set(times) != set(candidates):
            raise ValueError(f"{where}: {key!r}: 'times_ms' is not an object of one time per candidate "
                             f"({', '.join(candidates)})")
        for name, ms in times.items():
            if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 < ms <= sys.float_info.max:
                raise ValueError(f"{where}: {key!r}: 'times_ms' of {name!r} ({ms!r}) is not a positive duration")
        choices[key] = {field: chosen, "times_ms": {name: float(times[name]) for name in candidates}}
    return choices


def load_choices(path) -> dict:
    """The choices stored in the cache file at `path` (check_choices' dict): none when it is missing, has no
    section, or was written on another GPU model or cuDNN version (conv.load_algorithm_cache warns about that).
    ValueError for a file that is no algorithm cache or a malformed section."""
    sections = algo_cache.read_sections(path)
    return {} if sections is None else check_choices(sections.get(SECTION, {}), path)


def store_choices(path, choices: dict) -> bool:
    """Add (or replace) choices {key: (chosen, {candidate: ms})} in the cache file at `path`, which
    conv.save_algorithm_cache has written, keeping everything else it holds; one atomic write. False, writing
    nothing, when the file is missing or another machine's (replaced since this process saved it)."""
    records = {}
    for key, (chosen, times_ms) in choices.items():
        field = _KINDS[_key_kind(key, f"algorithm cache file {path}: {SECTION!r}")[0]][0]
        records[key] = {field: chosen, "times_ms": {name: float(ms) for name, ms in times_ms.items()}}
    check_choices(records, path)  # what is written is what a load accepts
    sections = algo_cache.read_sections(path)
    if sections is None:
        return False
    return algo_cache.store_section(path, SECTION, {**check_choices(sections.get(SECTION, {}), path), **records})


def store_choice(path, key: str, chosen: str, times_ms: dict) -> bool:
    """store_choices of one choice."""
    return store_choices(path, {key: (chosen, times_ms)})


__all__ = ["KERNEL_KIND", "KIND", "SECTION", "check_choices", "choice_key", "kernel_key", "load_choices",
           "plan_fingerprint", "store_choice", "store_choices"]
