"""Property-based tests of the array boundary on any machine: malformed array descriptions, fed to every array
argument of every op, are refused with a TypeError or ValueError that names the argument.

What is generated, per argument (each case starts from a description the argument would accept, then breaks it):
- __cuda_array_interface__ dicts with a required field missing or mistyped, a bad typestr (garbage, big-endian,
  a dtype the argument does not take, text that is not UTF-8), shapes with negative, zero, overflowing or
  non-integer entries, strides of the wrong length or type or not C-contiguous, bad data tuples (length,
  types, NULL, misaligned, wrapping past the end of the address space, beyond 64 bits), an unknown version, a
  mask, a non-dict interface; unknown extra keys are added as noise;
- DLPack producers (tests/fake_arrays.FakeDLPackArray) with a NULL shape, a negative or huge rank, bad extents,
  a NULL or misaligned data pointer, bad byte_offsets, vector lanes, wrong dtypes, non-contiguous strides, a
  host or unknown device (in __dlpack_device__ or in the struct), a consumed capsule, DLPack 2.x;
- for outputs, descriptions their producer marks read-only (or, through DLPack, as a copy);
- plain Python values: numbers, bools, strings, bytes, None where the argument is required, nested lists,
  tuples, dicts, sets, objects whose __cuda_array_interface__ is not a dict or raises.

Property: the call raises TypeError or ValueError whose message starts with the argument's name. Never another
exception type (NoGPUError would mean the description was accepted and the op went on to the device), never a
crash (the fuzz runs in-process: a segfault takes pytest down, which is a failure too). One exception: an
exception a producer's own __dlpack__ / __dlpack_device__ raises is passed on unchanged.

Budget: EXAMPLES cases per argument (RESNET_NATIVE_FUZZ_EXAMPLES, default 150), seeded by RESNET_NATIVE_FUZZ_SEED
(a random seed otherwise); the seed and the cases tried per argument are written at the end of the module's run
(and to the JSON file $RESNET_NATIVE_FUZZ_REPORT when set).
"""

import collections
import contextlib
import json
import os
import random
import re

import pytest
from boundary_cases import DeviceOverride, InterfaceRaises, ProducerError, malformed
from boundary_targets import TARGETS
from fake_arrays import (
    KDL_CUDA,
    FakeCudaArray,
    FakeDLPackArray,
    next_address,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from resnet_native.ops import kernels, pool
from resnet_native.ops import multi_tensor as mt

SEED = (int(os.environ["RESNET_NATIVE_FUZZ_SEED"]) if os.environ.get("RESNET_NATIVE_FUZZ_SEED")
        else random.SystemRandom().getrandbits(32))
EXAMPLES = int(os.environ.get("RESNET_NATIVE_FUZZ_EXAMPLES", "150"))

CASES = collections.Counter()  # target label -> generated cases run
KNOWN = collections.Counter()  # target label -> fixed known cases run
KINDS = collections.Counter()  # kind of malformation -> cases run
FAILURES = collections.Counter()  # target label -> failing cases seen (shrinking included)


# ---- the property ---------------------------------------------------------------------------------------------
def check(target, kind, value):
    (KNOWN if kind.startswith("known.") else CASES)[target.label] += 1
    KINDS[".".join(kind.split(".")[:2])] += 1
    pattern = target.name_pattern or re.escape(target.name) + ": "
    try:
        target.call(value)
    except ProducerError:
        if kind != "dlpack.producer_raises":
            FAILURES[target.label] += 1
            raise
        return
    except (TypeError, ValueError) as e:
        if not re.match(pattern, str(e)):
            FAILURES[target.label] += 1
            raise AssertionError(f"{target.label} ({kind}): the error does not name {target.name!r}: "
                                 f"{type(e).__name__}: {e} (seed {SEED})") from e
        return
    except BaseException:
        FAILURES[target.label] += 1
        raise
    FAILURES[target.label] += 1
    raise AssertionError(f"{target.label} ({kind}): a malformed value was accepted (seed {SEED})")


FUZZ_SETTINGS = settings(max_examples=EXAMPLES, derandomize=False, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def fuzz_report(request):
    """Writes the seed and the figures once the module's tests have run."""
    yield
    per_op = collections.Counter()
    for label, n in CASES.items():
        per_op[label.split(":")[0]] += n
    lines = [f"boundary fuzz: seed {SEED} (set RESNET_NATIVE_FUZZ_SEED={SEED} to repeat), {sum(CASES.values())} "
             f"generated cases over {len(CASES)} arguments ({EXAMPLES} per argument) and {sum(KNOWN.values())} "
             f"known cases, {sum(FAILURES.values())} failing cases (shrinking included)",
             "boundary fuzz cases by op: " + ", ".join(f"{k} {v}" for k, v in sorted(per_op.items())),
             "boundary fuzz cases by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(KINDS.items()))]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + "\n".join(lines))
    path = os.environ.get("RESNET_NATIVE_FUZZ_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({"seed": SEED, "examples_per_argument": EXAMPLES, "cases": dict(CASES), "known": dict(KNOWN),
                       "kinds": dict(KINDS), "failures": dict(FAILURES)}, fh, indent=1, sort_keys=True)


@pytest.mark.parametrize("target", TARGETS, ids=[t.label for t in TARGETS])
@hypothesis_seed(SEED)
@FUZZ_SETTINGS
@given(data=st.data())
def test_malformed_arrays_are_refused_naming_the_argument(target, data):
    kind, value = data.draw(malformed(target), label="value")
    check(target, kind, value)


def known_cases(target):
    """Values every argument must refuse, tried whatever the seed (each is a case the parser needs care for)."""
    shape, dtype = target.shape, target.dtype
    return {
        "typestr_not_utf8": FakeCudaArray(shape, dtype, typestr="<f\ud8004"),  # no UTF-8 to read it as
        "device_type_wraps": DeviceOverride((KDL_CUDA + 2**32, 0), shape, dtype),  # kDLCUDA in its low 32 bits
        "interface_raises": InterfaceRaises(),  # read as no interface, as hasattr would
        "not_iterable": FakeDLPackArray(None, dtype, ndim=4),  # not a sequence either (TensorList's `arrays`)
        "version_true": FakeCudaArray(shape, dtype, version=True),
        "read_only_flag_int": FakeCudaArray(shape, dtype, data=(next_address(), 0)),
        "plain_object": object(),
    }


@pytest.mark.parametrize("target", TARGETS, ids=[t.label for t in TARGETS])
def test_known_cases_are_refused_naming_the_argument(target):
    for kind, value in known_cases(target).items():
        check(target, f"known.{kind}", value)


def test_every_op_with_array_arguments_is_covered():
    """A new op function with array arguments must get its targets here."""
    covered = {t.label.split(":")[0] for t in TARGETS}
    ops = {f"kernels.{n}" for n in kernels.__all__} | {f"pool.{n}" for n in pool.__all__ if "shape" not in n}
    ops |= {f"norm.{n}" for n in ("batch_norm_train", "batch_norm_infer", "batch_norm_backward", "sync_bn_sums",
                                  "sync_bn_forward", "sync_bn_grad_sums", "sync_bn_backward")}
    ops |= {f"conv.{n}" for n in ("conv2d", "conv2d_backward_data", "conv2d_backward_filter", "conv2d_backward_bias")}
    ops |= {f"multi_tensor.{n}" for n in mt.__all__}
    ops |= {"loss.cross_entropy_forward", "loss.cross_entropy_backward", "data.augment_u8", "data.downscale_u8"}
    assert ops <= covered, sorted(ops - covered)
