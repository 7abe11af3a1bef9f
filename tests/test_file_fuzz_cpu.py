"""Property-based tests of the files the package reads: a file the package's own writer made, then damaged, is
either accepted, and what the reader returns passes the schema again, or refused with a ValueError whose message
names the file. Never another exception type (KeyError, TypeError, OverflowError, UnicodeDecodeError,
RecursionError, zipfile.BadZipFile...), never a hang (a read taking more than HANG_S seconds fails).

Formats (each starts from a valid file; tests/file_mutations.py says how it is damaged):
- a release's config.yaml (release()), read by load_release_config: its mapping edited (fields dropped, added,
  retyped, NaN / inf / huge / negative numbers, long strings, deep nesting), YAML tokens no writer emits (anchors,
  aliases, tags, impossible dates, 5000-digit ints), bytes damaged;
- the weights, model.safetensors (save_weights) and an older release's model.npz, read by load_weights: the
  safetensors header edited (dtypes NumPy has no type for, shapes, offsets, its length), the npz's zip fields,
  .npy headers and arrays edited, bytes damaged;
- calibration_int8.json (save_calibration), read by release_calibration: load_calibration, then the fit to the
  release's network; an accepted calibration has one scale per output channel of every quantised layer;
- a training checkpoint (save_checkpoint), read by load_checkpoint (an accepted state saves again) and by the
  trainer's --resume (Trainer._resumed_state: the configuration, then check_resumed_state);
- the algorithm cache (save_algorithm_cache, with an engine-choice section), read by load_algorithm_cache and
  choice_cache.load_choices (through ops/algo_cache.read_sections);
- CIFAR-10 python and binary batches (parse_python_batch, parse_binary_batch), and the decode cache (load_cached),
  which never raises: a damaged cache is None (the source is decoded again), an accepted one holds valid arrays.

Budget: EXAMPLES cases per format (RESNET_NATIVE_FUZZ_EXAMPLES, default 60), seeded by RESNET_NATIVE_FUZZ_SEED
(a random seed otherwise), as test_boundary_fuzz_cpu.py is. The seed and the cases tried, accepted and failing
per format and per kind of damage are printed at the end of the module's run, and written to the JSON file
$RESNET_NATIVE_FILE_FUZZ_REPORT when set (not $RESNET_NATIVE_FUZZ_REPORT, which the boundary fuzz rewrites whole).
"""

import collections
import contextlib
import dataclasses
import json
import math
import os
import pickle
import random
import shutil
import signal
import struct
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import test_file_schemas_cpu as schemas
import yaml
from file_mutations import (
    ARRAYS,
    JSON_SCALAR,
    JSON_TOKENS,
    VALUES,
    YAML_SCALAR,
    YAML_TOKENS,
    byte_mutation,
    npz_damage,
    token_mutation,
    tree_mutation,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from quant_helpers import tiny_resnet18_state
from test_choice_cache_cpu import TIMES
from test_choice_cache_cpu import key as choice_key
from test_conv_cache_cpu import insert_samples
from test_data_formats_cpu import fake_arrays, write_binary_batches, write_python_batches

from resnet_native.data import cifar10
from resnet_native.formats.checkpoint import load_checkpoint, save_checkpoint
from resnet_native.formats.release_folder import check_release_config, load_release_config, load_weights
from resnet_native.inference import choice_cache
from resnet_native.inference.plan import build_plan
from resnet_native.inference.simulate import quantized_steps, step_weight_scales
from resnet_native.inference.source import model_source, release_calibration
from resnet_native.ops import conv
from resnet_native.quantization.calibration_file import calibration_from_json, save_calibration
from resnet_native.release.build import save_weights
from resnet_native.training import loop
from resnet_native.training.config import TrainConfig

SEED = (int(os.environ["RESNET_NATIVE_FUZZ_SEED"]) if os.environ.get("RESNET_NATIVE_FUZZ_SEED")
        else random.SystemRandom().getrandbits(32))
EXAMPLES = int(os.environ.get("RESNET_NATIVE_FUZZ_EXAMPLES", "60"))
HANG_S = 20  # a read of these small files taking longer is a hang

CASES = collections.Counter()  # format -> damaged files read
ACCEPTED = collections.Counter()  # format -> damaged files the reader accepted (and the result passed)
KINDS = collections.Counter()  # kind of damage -> damaged files read
FAILURES = collections.Counter()  # format -> failing cases seen (shrinking included)

run_and_release = schemas.run_and_release  # the module's fake run and its release (a fixture)


@dataclasses.dataclass(repr=False)
class Format:
    label: str
    path: object  # the file the damaged bytes replace
    read: Callable  # () -> what the reader returns
    accepted: Callable  # (what the reader returned) -> None; AssertionError when it is not valid
    damage: Callable  # (valid bytes) -> strategy of (kind, damaged bytes)
    raises: bool = True  # False: the reader refuses by returning None, never by raising
    valid: bytes = b""  # the file as the writer made it (set by the fmt fixture)

    def __repr__(self):
        return f"Format({self.label!r})"


class Blob(bytes):
    """A file's bytes, shown by size in hypothesis' reports."""

    def __repr__(self):
        return f"<{len(self)} bytes: {bytes(self[:48])!r}...>"


class Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    def alarm(signum, frame):
        raise Hang(f"still reading after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- the property ------------------------------------------------------------------------------------------------
def check(fmt: Format, kind: str) -> None:
    CASES[fmt.label] += 1
    KINDS[kind] += 1
    name = os.path.basename(fmt.path)
    try:
        with warnings.catch_warnings(), time_limit(HANG_S):
            warnings.simplefilter("ignore")  # a foreign algorithm cache, a refused decode cache
            result = fmt.read()
    except ValueError as e:
        if fmt.raises and name in str(e):
            return
        FAILURES[fmt.label] += 1
        what = "the reader raised" if not fmt.raises else f"the error does not name {name}"
        raise AssertionError(f"{fmt.label} ({kind}): {what}: {type(e).__name__}: {str(e)[:500]} (seed {SEED})") from e
    except BaseException:
        FAILURES[fmt.label] += 1
        raise
    try:
        fmt.accepted(result)
    except BaseException:
        FAILURES[fmt.label] += 1
        raise
    ACCEPTED[fmt.label] += result is not None or fmt.raises  # None: the decode cache refused


@st.composite
def rewritten(draw, obj, write, **mutation):
    """(kind, bytes) of obj damaged by tree_mutation, written by `write`; cases the writer refuses are skipped."""
    kind, new = draw(tree_mutation(obj, **mutation))
    try:
        return kind, write(new)
    except (TypeError, ValueError, RecursionError, OverflowError, yaml.YAMLError, pickle.PicklingError):
        assume(False)


def json_damage(raw: bytes, **dumps):
    return st.one_of(rewritten(json.loads(raw), lambda d: json.dumps(d, **dumps).encode()),
                     token_mutation(raw, JSON_SCALAR, JSON_TOKENS, "json.token"), byte_mutation(raw))


# ---- the formats -------------------------------------------------------------------------------------------------
def config_yaml(tmp, shared):
    shutil.copy(shared["release"] / "config.yaml", tmp / "config.yaml")

    def damage(raw):
        return st.one_of(rewritten(yaml.safe_load(raw), lambda c: yaml.safe_dump(c, sort_keys=False).encode()),
                         token_mutation(raw, YAML_SCALAR, YAML_TOKENS, "yaml.token"), byte_mutation(raw))

    def accepted(config):
        assert check_release_config(config, tmp / "config.yaml") is config

    return Format("release.config_yaml", tmp / "config.yaml", lambda: load_release_config(tmp), accepted, damage)


def weights_accepted(weights):
    assert isinstance(weights, dict) and all(isinstance(k, str) for k in weights)
    for name, w in weights.items():
        assert isinstance(w, np.ndarray) and (w.dtype.kind not in "fc" or np.isfinite(w).all()), name


# The safetensors dtypes, by bytes per element (F4 / F6: fractions of a byte, left out).
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
                      "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
                      "C64": 8, "F64": 8, "I64": 8, "U64": 8}


@st.composite
def safetensors_header(draw, raw: bytes):
    """The JSON header edited (a tensor's dtype changed with its shape kept to the same bytes, or any tree edit),
    its length prefix right or wrong."""
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        start, end = header[name]["data_offsets"]
        dtype = draw(st.sampled_from(sorted(SAFETENSORS_DTYPES)))
        header[name] = dict(header[name], dtype=dtype, shape=[(end - start) // SAFETENSORS_DTYPES[dtype]])
        kind = "safetensors.dtype"
    else:
        kind, header = draw(tree_mutation(header, values=VALUES | st.sampled_from(sorted(SAFETENSORS_DTYPES))))
        kind = "safetensors." + kind
    text = json.dumps(header).encode()
    size = draw(st.sampled_from([len(text)] * 3 + [len(text) - 1, len(text) + 8, 2**63, 0]))
    return kind, struct.pack("<Q", size) + text + raw[8 + n:]


def weights_safetensors(tmp, shared):
    save_weights(shared["tiny"], tmp)
    return Format("release.weights_safetensors", tmp / "model.safetensors", lambda: load_weights(tmp),
                  weights_accepted, lambda raw: st.one_of(byte_mutation(raw), safetensors_header(raw)))


def weights_npz(tmp, shared):
    np.savez(tmp / "model.npz", **shared["tiny"])
    return Format("release.weights_npz", tmp / "model.npz", lambda: load_weights(tmp), weights_accepted, npz_damage)


def calibration(tmp, shared):
    shutil.copy(shared["release"] / "config.yaml", tmp / "config.yaml")
    save_weights(shared["tiny"], tmp)
    path = save_calibration(schemas.make_calibration(tmp), tmp / "calibration_int8.json")
    source = model_source(tmp)
    steps = quantized_steps(build_plan(source.state, source.stem, "fp32", image_size=(32, 32)))

    def accepted(cal):
        calibration_from_json(cal.to_json(), path)
        for s in steps:  # what the int8 engine reads of it
            step_weight_scales(cal, s, source.state[s.weight].shape[0])

    return Format("release.calibration", path, lambda: release_calibration(tmp, None, "int8", source), accepted,
                  lambda raw: json_damage(raw, indent=2))


def checkpoint_writer(scratch):
    def write(state):
        save_checkpoint(scratch, state)
        return scratch.read_bytes()

    return write


def checkpoint(tmp, shared):
    state = dict(shared["state"], optimizer={"state": {0: {"momentum": np.zeros(4, np.float32)}}, "step": (3, 1.5)})
    path = tmp / "state.npz"
    save_checkpoint(path, state)

    def accepted(loaded):  # what was accepted saves again
        save_checkpoint(tmp / "again.npz", loaded)
        load_checkpoint(tmp / "again.npz")

    def damage(raw):
        return st.one_of(rewritten(state, checkpoint_writer(tmp / "written.npz"), values=VALUES | ARRAYS),
                         npz_damage(raw))

    return Format("checkpoint", path, lambda: load_checkpoint(path), accepted, damage)


def resume(tmp, shared):
    state = shared["state"]
    save_checkpoint(tmp / "last.npz", state)
    trainer = loop.Trainer(TrainConfig.from_saved(state["config"]), tmp, progress=False, tensorboard=False)

    def accepted(resumed):  # what the trainer goes on to read
        loop.check_resumed_state(resumed, tmp / "last.npz", trainer.cfg.epochs)
        loop._Progress.from_state(resumed)

    def damage(raw):
        return rewritten(state, checkpoint_writer(tmp / "written.npz"), values=VALUES | ARRAYS, skip=("model",))

    return Format("checkpoint.resume", tmp / "last.npz", trainer._resumed_state, accepted, damage)


def algo_cache_file(path):
    insert_samples()
    conv.save_algorithm_cache(path)
    assert choice_cache.store_choice(path, choice_key(), "layer3", TIMES)
    conv.clear_algorithm_cache()


def algo_cache_entries(tmp, shared):
    algo_cache_file(tmp / "algos.json")

    def read():
        conv.clear_algorithm_cache()
        return conv.load_algorithm_cache(tmp / "algos.json")

    def accepted(n):  # what was loaded saves and loads again
        assert isinstance(n, int) and n >= 0
        assert all(math.isfinite(e["time_ms"]) for e in conv.algorithm_cache_entries() if e["time_ms"] is not None)
        conv.save_algorithm_cache(tmp / "again.json")
        conv.clear_algorithm_cache()
        conv.load_algorithm_cache(tmp / "again.json")

    return Format("algo_cache.entries", tmp / "algos.json", read, accepted, lambda raw: json_damage(raw, indent=1))


def algo_cache_choices(tmp, shared):
    algo_cache_file(tmp / "algos.json")

    def accepted(choices):
        assert choice_cache.check_choices(choices, tmp / "algos.json") == choices

    return Format("algo_cache.choices", tmp / "algos.json", lambda: choice_cache.load_choices(tmp / "algos.json"),
                  accepted, lambda raw: json_damage(raw, indent=1))


def batch_accepted(parsed):
    images, labels = parsed
    assert images.dtype == np.uint8 and images.ndim == 4 and images.shape[1:] == (32, 32, 3)
    assert labels.dtype == np.int32 and labels.shape == (len(images),)
    assert labels.size == 0 or (labels.min() >= 0 and labels.max() < len(cifar10.CLASSES))


PICKLE_VALUES = VALUES | ARRAYS | st.sampled_from([{1, 2}, 1j, np.float32(2.5), np.int64(3), b"\xff\xfe", b""])


def python_batch(tmp, shared):
    path = write_python_batches(tmp / "py", shared["cifar"]) / "data_batch_1"

    def damage(raw):
        keys = st.text(max_size=6) | st.binary(max_size=6) | st.integers()
        return st.one_of(byte_mutation(raw), *(rewritten(pickle.loads(raw), lambda d, p=p: pickle.dumps(d, protocol=p),
                                                         values=PICKLE_VALUES, keys=keys) for p in (2, 5)))

    return Format("cifar.python_batch", path, lambda: cifar10.parse_python_batch(path.read_bytes(), str(path)),
                  batch_accepted, damage)


def binary_batch(tmp, shared):
    path = write_binary_batches(tmp / "bin", shared["cifar"]) / "data_batch_1.bin"
    return Format("cifar.binary_batch", path, lambda: cifar10.parse_binary_batch(path.read_bytes(), str(path)),
                  batch_accepted, byte_mutation)


def decode_cache(tmp, shared):
    source = write_python_batches(tmp / "cifar-10-batches-py", shared["cifar"])
    cifar10.load_cifar10(source, cache_dir=tmp / "cache")
    (path,) = (tmp / "cache").glob("*.npz")

    def accepted(data):
        if data is not None:
            batch_accepted((data.train_images, data.train_labels))
            batch_accepted((data.test_images, data.test_labels))

    return Format("cifar.decode_cache", path, lambda: cifar10.load_cached(source, tmp / "cache"), accepted,
                  npz_damage, raises=False)


FORMATS = {f.__name__: f for f in (config_yaml, weights_safetensors, weights_npz, calibration, checkpoint, resume,
                                   algo_cache_entries, algo_cache_choices, python_batch, binary_batch, decode_cache)}


@pytest.fixture(scope="module")
def shared(run_and_release):
    """What the formats start from: the release's folder, a resumable training state (the fake run's last.npz
    with a tiny network: the readers check no weights' architecture), a tiny CIFAR-10."""
    run, release = run_and_release
    state = dict(load_checkpoint(run / "last.npz"), model=tiny_resnet18_state())
    return {"release": release, "tiny": tiny_resnet18_state(), "state": state,
            "cifar": fake_arrays(np.random.default_rng(0))}


@pytest.fixture
def fmt(request, shared, tmp_path, empty_cache, fake_gpu):
    """The format, its valid file written (the algorithm cache's under fake_gpu); the file is left valid after."""
    fmt = FORMATS[request.param](tmp_path, shared)
    fmt.valid = Blob(fmt.path.read_bytes())
    yield fmt
    fmt.path.write_bytes(fmt.valid)


FUZZ_SETTINGS = settings(max_examples=EXAMPLES, derandomize=False, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def fuzz_report(request):
    """Writes the seed and the figures once the module's tests have run."""
    yield
    lines = [f"file fuzz: seed {SEED} (set RESNET_NATIVE_FUZZ_SEED={SEED} to repeat), {sum(CASES.values())} damaged "
             f"files over {len(CASES)} formats ({EXAMPLES} per format), {sum(ACCEPTED.values())} accepted, "
             f"{sum(FAILURES.values())} failing cases (shrinking included)",
             "file fuzz cases by format (accepted): " + ", ".join(f"{k} {v} ({ACCEPTED[k]})"
                                                                   for k, v in sorted(CASES.items())),
             "file fuzz cases by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(KINDS.items()))]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + "\n".join(lines))
    path = os.environ.get("RESNET_NATIVE_FILE_FUZZ_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({"seed": SEED, "examples_per_format": EXAMPLES, "cases": dict(CASES),
                       "accepted": dict(ACCEPTED), "kinds": dict(KINDS), "failures": dict(FAILURES)}, fh,
                      indent=1, sort_keys=True)


@st.composite
def damaged(draw, fmt):
    kind, raw = draw(fmt.damage(fmt.valid))
    return kind, Blob(raw)


@pytest.mark.parametrize("fmt", sorted(FORMATS), indirect=True)
@pytest.mark.filterwarnings("ignore:Generating overly large repr")  # of strategies holding a whole state
@hypothesis_seed(SEED)
@FUZZ_SETTINGS
@given(data=st.data())
def test_damaged_files_are_refused_naming_the_file(fmt, data):
    kind, raw = data.draw(damaged(fmt), label="file")
    fmt.path.write_bytes(raw)
    check(fmt, kind)


def test_the_valid_files_are_accepted(shared, tmp_path_factory, empty_cache, fake_gpu):
    """Each format's own file passes its reader: the fuzz starts from files the readers accept."""
    for name, build in FORMATS.items():
        fmt = build(tmp_path_factory.mktemp(name), shared)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = fmt.read()
        assert result is not None, name
        fmt.accepted(result)
