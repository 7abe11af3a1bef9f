"""Bad input from files (issue 39): every file the package reads is refused with a ValueError naming the file, the
field and what was expected. YAML that expands (aliases), a release's config.yaml outside its schema, calibration
files for another dtype or network, non-finite weights and logits, inconsistent training states and deeply nested
JSON."""

import json
import re
import shutil
import struct
import time

import numpy as np
import pytest
import yaml
from test_release_cpu import make_fake_run

from resnet_native.formats import checkpoint
from resnet_native.formats.release_folder import check_release_config, load_release_config, load_weights
from resnet_native.formats.yaml_file import load_plain_yaml
from resnet_native.inference.simulate import value_names
from resnet_native.inference.source import release_calibration
from resnet_native.quantization.calibration_file import Calibration, load_calibration, save_calibration
from resnet_native.release import build as release
from resnet_native.release.classifier import CIFAR10Classifier
from resnet_native.training import loop
from resnet_native.training.config import TrainConfig, load_recipe

BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


@pytest.fixture(scope="module")
def run_and_release(tmp_path_factory):
    root = tmp_path_factory.mktemp("schemas")
    make_fake_run(root / "run")
    folder = release.release(root / "run", "A", root / "models", benchmark=False).resolve()
    return root / "run", folder


@pytest.fixture
def copy(run_and_release, tmp_path):
    """A writable copy of the release folder."""
    folder = tmp_path / "version_X"
    shutil.copytree(run_and_release[1], folder)
    return folder


def edit_config(folder, change):
    config = yaml.safe_load((folder / "config.yaml").read_text())
    change(config)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))


# 1. YAML that cannot expand.

def test_yaml_aliases_are_refused_quickly(copy, tmp_path):
    assert len(BILLION_LAUGHS) < 1500
    (copy / "config.yaml").write_text(BILLION_LAUGHS)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"config\.yaml: YAML aliases are not allowed"):
        load_release_config(copy)
    assert time.perf_counter() - start < 1.0
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text(BILLION_LAUGHS)
    with pytest.raises(ValueError, match=rf"^recipe {re.escape(str(recipe))}: YAML aliases are not allowed"):
        load_recipe(recipe)


def test_yaml_anchors_tags_and_size_are_bounded(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("a: &anchor 1\n")
    with pytest.raises(ValueError, match=r"x\.yaml: YAML aliases are not allowed \(anchor &anchor at line 1\)"):
        load_plain_yaml(p)
    p.write_text("a: !!binary aGk=\n")
    with pytest.raises(ValueError, match=r"x\.yaml: not valid YAML .*tag.*not allowed"):
        load_plain_yaml(p)
    p.write_text("a: !!str 1\nb: [1, {c: 2.5}]\n")
    assert load_plain_yaml(p) == {"a": "1", "b": [1, {"c": 2.5}]}
    p.write_text("a: " + "x" * 2000 + "\n")
    with pytest.raises(ValueError, match=r"x\.yaml: \d+ bytes, more than the 1000"):
        load_plain_yaml(p, max_bytes=1000)
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"x\.yaml: (nested too deeply|not valid YAML)"):
        load_plain_yaml(p)


@pytest.mark.parametrize("scalar", ["2001-02-30", "2001-02-03 25:00:00", "!!float x", "1" * 5000, "0x" + "f" * 5000])
def test_yaml_scalars_no_type_can_hold_name_the_file(tmp_path, scalar):
    """An impossible date, an int of more digits than Python converts or prints: a ValueError naming the file (the
    constructors' own ValueError named none; a 5000-digit hex int loaded, then failed every message naming it)."""
    p = tmp_path / "x.yaml"
    p.write_text(f"a: {scalar}\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(p))}: not valid YAML"):
        load_plain_yaml(p)


# 2. One schema for a release's config.yaml.

@pytest.mark.parametrize("field, change", [
    ("model.layout", lambda c: c["model"].update(layout="NHWC'; import os; x='")),
    ("model.name", lambda c: c["model"].update(name="resnet9000")),
    ("model.name", lambda c: c["model"].update(name=["resnet18"])),
    ("model.precision", lambda c: c["model"].update(precision="fp64")),
    ("model.num_classes", lambda c: c["model"].update(num_classes=0)),
    ("model.num_classes", lambda c: c["model"].update(num_classes="10")),
    ("classes[3]", lambda c: c["classes"].__setitem__(3, "x" * 65)),
    ("classes[0]", lambda c: c["classes"].__setitem__(0, 7)),
    ("input.mean", lambda c: c["input"].update(mean=[0.5, 0.5])),
    ("input.mean", lambda c: c["input"].update(mean=[0.5, float("nan"), 0.5])),
    ("input.mean", lambda c: c["input"].update(mean=[10**400, 0.5, 0.5])),  # no float holds it
    ("input.std", lambda c: c["input"].update(std=[0.2, 0.0, 0.2])),
    ("input.std", lambda c: c["input"].update(std=[0.2, "x", 0.2])),
    ("input", lambda c: c.pop("input")),
])
def test_release_config_schema(copy, field, change):
    edit_config(copy, change)
    with pytest.raises(ValueError, match=rf"config\.yaml: field '{re.escape(field)}': expected"):
        load_release_config(copy)


def test_an_older_release_s_dtype_key_is_accepted_and_checked(copy):
    edit_config(copy, lambda c: c["model"].update(dtype=c["model"].pop("precision")))
    assert load_release_config(copy)["model"]["dtype"] == "fp16"
    edit_config(copy, lambda c: c["model"].update(dtype="int4"))
    with pytest.raises(ValueError, match=r"config\.yaml: field 'model\.dtype': expected"):
        load_release_config(copy)


def test_release_refuses_a_checkpoint_config_with_bad_values(tmp_path):
    make_fake_run(tmp_path / "run")
    for name in ("best.npz", "last.npz"):
        state = checkpoint.load_checkpoint(tmp_path / "run" / name)
        state["config"]["layout"] = "NHWC'; import os; x='"
        checkpoint.save_checkpoint(tmp_path / "run" / name, state)
    with pytest.raises(ValueError, match=r"best\.npz.*field 'model\.layout': expected one of 'NCHW', 'NHWC'"):
        release.release(tmp_path / "run", "A", tmp_path / "models", benchmark=False)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_check_release_config_accepts_what_release_writes(run_and_release):
    config = load_release_config(run_and_release[1])
    assert check_release_config(config) is config


# 3. Calibration files.

def make_calibration(folder, dtype="int8", drop=None, extra=None) -> Calibration:
    """A calibration fitting the release's network (unit scales), optionally without or with one more layer."""
    from resnet_native.inference.plan import build_plan
    from resnet_native.inference.simulate import quantized_steps

    weights = load_weights(folder)
    plan = build_plan(weights, "cifar", "fp32", image_size=(32, 32))
    names = value_names(plan)
    steps = quantized_steps(plan)
    w_scales = {s.name: (1.0,) * int(weights[f"{s.name}.weight"].shape[0]) if f"{s.name}.weight" in weights
                else (1.0,) for s in steps}
    if drop:
        w_scales.pop(drop)
    if extra:
        w_scales[extra] = (1.0,)
    return Calibration(dtype, "max", None, names, {n: 1.0 for n in names}, w_scales)


def test_a_calibration_for_another_dtype_is_refused_naming_both(copy):
    save_calibration(make_calibration(copy, "fp8"), copy / "calibration_int8.json")
    with pytest.raises(ValueError, match=r"calibration_int8\.json: field 'dtype': made for 'fp8', but 'int8'"):
        load_calibration(copy / "calibration_int8.json", "int8")
    with pytest.raises(ValueError, match=r"calibration_int8\.json: field 'dtype'"):
        release_calibration(copy, None, "int8")


def test_a_calibration_must_fit_the_release_s_layers(copy):
    good = make_calibration(copy)
    save_calibration(good, copy / "calibration_int8.json")
    assert release_calibration(copy, None, "int8").weight_scales.keys() == good.weight_scales.keys()
    layer = next(iter(good.weight_scales))
    save_calibration(make_calibration(copy, extra="layer9.0.conv1"), copy / "calibration_int8.json")
    with pytest.raises(ValueError, match=r"calibration_int8\.json: field 'weight_scales': layer 'layer9\.0\.conv1'"):
        release_calibration(copy, None, "int8")
    save_calibration(make_calibration(copy, drop=layer), copy / "calibration_int8.json")
    with pytest.raises(ValueError, match=rf"calibration_int8\.json: field 'weight_scales': no scales for layer "
                                         rf"'{re.escape(layer)}'"):
        release_calibration(copy, None, "int8")
    data = good.to_json()
    for bad in (0.0, 10**400):  # 10**400: no float holds it (math.isfinite raised OverflowError)
        data["activation_scales"]["input"] = bad
        (copy / "calibration_int8.json").write_text(json.dumps(data))
        with pytest.raises(ValueError, match=r"calibration_int8\.json: field 'activation_scales\.input'"):
            release_calibration(copy, None, "int8")


def test_a_calibration_has_one_weight_scale_per_output_channel(copy):
    """One scale short passed the fit and failed building the int8 engine, with an error naming no file."""
    good = make_calibration(copy)
    layer, scales = next(iter(good.weight_scales.items()))
    short = Calibration(good.dtype, good.method, None, good.values, good.activation_scales,
                        dict(good.weight_scales, **{layer: scales[:-1]}))
    save_calibration(short, copy / "calibration_int8.json")
    with pytest.raises(ValueError, match=rf"calibration_int8\.json: field 'weight_scales\.{re.escape(layer)}': "
                                         rf"expected {len(scales)} scales \(one per output channel\), got "
                                         rf"{len(scales) - 1}"):
        release_calibration(copy, None, "int8")


# 4. Non-finite values.

@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weights_are_refused_naming_the_tensor(copy, bad):
    from safetensors.numpy import load_file, save_file

    weights = dict(load_file(str(copy / "model.safetensors")))
    name = next(k for k, v in weights.items() if v.dtype.kind == "f")
    weights[name] = weights[name].copy()
    weights[name].flat[0] = bad
    save_file(weights, str(copy / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{re.escape(name)}' holds NaN or infinite"):
        load_weights(copy)


def with_dtype(path, dtype: str, shape: list):
    """The safetensors file at `path` with its first tensor's dtype and shape set in the header (same bytes)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name].update(dtype=dtype, shape=shape)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    return name


@pytest.mark.parametrize("dtype, per_byte", [("BF16", 2), ("F8_E4M3", 1), ("F8_E5M2", 1)])
def test_weights_of_a_dtype_numpy_cannot_hold_are_refused_naming_the_tensor(tmp_path, dtype, per_byte):
    """safetensors reads these for NumPy with a TypeError or AttributeError that names no file."""
    from safetensors.numpy import save_file

    save_file({"fc.bias": np.zeros(4, np.float32)}, str(tmp_path / "model.safetensors"))
    name = with_dtype(tmp_path / "model.safetensors", dtype, [16 // per_byte])
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{name}' is of dtype {dtype}, which NumPy "
                                         "cannot hold"):
        load_weights(tmp_path)


class NaNNet:
    def forward(self, x, train=None, *, copy=True):
        x = np.asarray(x.get() if hasattr(x, "get") else x)
        out = np.zeros((len(x), 10), np.float32)
        out[-1, 3] = np.nan
        return out


def test_predict_refuses_non_finite_logits(run_and_release):
    clf = CIFAR10Classifier(run_and_release[1], model=NaNNet())
    images = np.zeros((2, 32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match="non-finite logits .* index 1"):
        clf.predict(images)
    with pytest.raises(ValueError, match="non-finite logits"):
        clf.predict_proba(images[0])


# 5. Checkpoint consistency on resume.

@pytest.mark.parametrize("field, change", [
    ("epoch", lambda s: s.update(epoch=10**9)),
    ("epoch", lambda s: s.update(epoch=3)),  # a 3-epoch run's last epoch is 2
    ("epoch", lambda s: s.update(epoch=-1)),
    ("metrics.history", lambda s: s.update(epoch=1)),  # three rows for two epochs
    ("metrics.history", lambda s: s["metrics"]["history"].pop(1)),
    ("scaler.scale", lambda s: s.update(scaler={"scale": 0.0})),
    ("scaler.scale", lambda s: s.update(scaler={"scale": np.array(np.nan, np.float32)})),
    ("scaler.scale", lambda s: s.update(scaler={"scale": float("inf")})),
    ("scaler.scale", lambda s: s.update(scaler={"scale": 10**400})),  # beyond float: was an OverflowError
    ("metrics.train_time_s", lambda s: s["metrics"].update(train_time_s=10**400)),
    ("metrics.history", lambda s: s["metrics"]["history"][0].update(epoch=np.array([1, 2]))),  # was ambiguous
])
def test_an_inconsistent_training_state_is_refused_on_resume(tmp_path, field, change):
    make_fake_run(tmp_path)
    state = checkpoint.load_checkpoint(tmp_path / "last.npz")
    trainer = loop.Trainer(TrainConfig.from_saved(state["config"]), tmp_path, progress=False, tensorboard=False)
    assert trainer._resumed_state()["epoch"] == 2  # the fake run's own last.npz is consistent
    change(state)
    checkpoint.save_checkpoint(tmp_path / "last.npz", state)
    with pytest.raises(ValueError, match=rf"last\.npz: field '{re.escape(field)}': expected"):
        trainer._resumed_state()


def test_a_checkpoint_configuration_that_cannot_resume_names_the_file(tmp_path):
    make_fake_run(tmp_path)
    state = dict(checkpoint.load_checkpoint(tmp_path / "last.npz"), model={})  # the resume checks read no weights
    trainer = loop.Trainer(TrainConfig.from_saved(state["config"]), tmp_path, progress=False, tensorboard=False)
    for change, message in [
        (lambda s: s.pop("config"), "configuration: expected a mapping of settings, got None"),  # was a KeyError
        (lambda s: s.update(config=[1, 2]), r"configuration: expected a mapping of settings, got \[1, 2\]"),
        (lambda s: s["config"]["optimizer"].update(lr=10**400), "optimizer.lr: expected a number"),  # OverflowError
        (lambda s: s["config"].update(epochs=5), r"--resume: the configuration differs .* in \['epochs'\]"),
    ]:
        changed = json.loads(json.dumps(state, default=lambda a: None))  # a deep copy (no arrays are left)
        change(changed)
        checkpoint.save_checkpoint(tmp_path / "last.npz", changed)
        with pytest.raises(ValueError, match=rf"last\.npz: .*{message}"):
            trainer._resumed_state()


# 6. Deeply nested JSON.

def test_deeply_nested_json_names_the_file(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000
    p = tmp_path / "calibration_int8.json"
    p.write_text(deep)
    with pytest.raises(ValueError, match=r"calibration_int8\.json: not a calibration JSON file"):
        load_calibration(p)
    # A checkpoint whose tree member is nested past the recursion limit.
    path = tmp_path / "deep.npz"
    tree = json.dumps({"format": checkpoint.FORMAT, "tree": {"a": 1}}).replace("1", deep)
    np.savez(path, **{checkpoint._TREE: np.frombuffer(tree.encode(), np.uint8)})
    with pytest.raises(ValueError, match=r"deep\.npz: .*nested too deeply"):
        checkpoint.load_checkpoint(path)
