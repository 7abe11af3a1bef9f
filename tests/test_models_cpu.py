"""CPU tests of the ResNet models: construction (no GPU needed), parameter counts, torchvision state_dict
names and shapes, state_dict round trips, argument validation and the layer table."""

import numpy as np
import pytest

import resnet_native as rn
from resnet_native.nn.models import ResNet, ResNet18, ResNet34, ResNet50, ResNet101, ResNet152
from resnet_native.nn.models.registry import create_model

CONSTRUCTORS = {18: ResNet18, 34: ResNet34, 50: ResNet50, 101: ResNet101, 152: ResNet152}
# sum(p.numel() for p in torchvision.models.resnetXX().parameters()) (ImageNet stem, 1000 classes).
TORCHVISION_PARAMS = {18: 11_689_512, 34: 21_797_672, 50: 25_557_032, 101: 44_549_160, 152: 60_192_808}
STAGES = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def torchvision_state_shapes(depth, num_classes=1000, stem="imagenet"):
    """{key: shape} of torchvision's resnetXX state_dict, in its order, written out from the architecture."""
    bottleneck = depth >= 50
    out = {}

    def bn(prefix, c):
        out.update(
            {
                f"{prefix}.weight": (c,),
                f"{prefix}.bias": (c,),
                f"{prefix}.running_mean": (c,),
                f"{prefix}.running_var": (c,),
                f"{prefix}.num_batches_tracked": (),
            }
        )

    out["conv1.weight"] = (64, 3, 7, 7) if stem == "imagenet" else (64, 3, 3, 3)
    bn("bn1", 64)
    inplanes = 64
    for i, (planes, count) in enumerate(zip((64, 128, 256, 512), STAGES[depth], strict=True)):
        for j in range(count):
            p = f"layer{i + 1}.{j}"
            stride = 2 if i > 0 and j == 0 else 1
            if bottleneck:
                convs = [(planes, inplanes, 1), (planes, planes, 3), (planes * 4, planes, 1)]
            else:
                convs = [(planes, inplanes, 3), (planes, planes, 3)]
            for k, (cout, cin, r) in enumerate(convs, start=1):
                out[f"{p}.conv{k}.weight"] = (cout, cin, r, r)
                bn(f"{p}.bn{k}", cout)
            outplanes = planes * (4 if bottleneck else 1)
            if stride != 1 or inplanes != outplanes:
                out[f"{p}.downsample.0.weight"] = (outplanes, inplanes, 1, 1)
                bn(f"{p}.downsample.1", outplanes)
            inplanes = outplanes
    out["fc.weight"] = (num_classes, inplanes)
    out["fc.bias"] = (num_classes,)
    return out


@pytest.mark.parametrize("depth", sorted(CONSTRUCTORS))
def test_parameter_counts_match_torchvision(depth):
    imagenet = CONSTRUCTORS[depth](num_classes=1000, stem="imagenet")
    assert imagenet.num_parameters() == TORCHVISION_PARAMS[depth]
    cifar10 = CONSTRUCTORS[depth](num_classes=10, stem="cifar")
    features = 512 if depth < 50 else 2048
    expected = TORCHVISION_PARAMS[depth] - 64 * 3 * (49 - 9) - (features + 1) * (1000 - 10)
    assert cifar10.num_parameters() == expected
    assert all(p.placement is None for p in cifar10.parameters())  # built on the host, not placed yet


def test_known_cifar_parameter_counts():
    assert ResNet18(num_classes=10).num_parameters() == 11_173_962
    assert ResNet50(num_classes=10).num_parameters() == 23_520_842


@pytest.mark.parametrize("depth", sorted(CONSTRUCTORS))
@pytest.mark.parametrize("stem,num_classes", [("imagenet", 1000), ("cifar", 10)])
def test_state_dict_names_and_shapes_match_torchvision(depth, stem, num_classes):
    model = CONSTRUCTORS[depth](num_classes=num_classes, stem=stem, layout="NHWC")
    state = model.state_dict()
    expected = torchvision_state_shapes(depth, num_classes, stem)
    assert list(state) == list(expected)
    assert {k: v.shape for k, v in state.items()} == expected
    assert all(
        v.dtype == (np.int64 if k.endswith("num_batches_tracked") else np.float32) for k, v in state.items()
    )
    assert [name for name, _ in model.named_parameters()] == [
        k for k in expected if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    ]


def test_state_dict_is_layout_independent_and_seeded():
    a = ResNet18(num_classes=10, layout="NHWC", seed=3).state_dict()
    b = ResNet18(num_classes=10, layout="NCHW", seed=3).state_dict()
    c = ResNet18(num_classes=10, layout="NHWC", seed=4).state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["layer1.0.conv1.weight"], c["layer1.0.conv1.weight"])


def test_initialisation_follows_torchvision():
    state = ResNet50(num_classes=10, seed=0).state_dict()
    w = state["layer3.0.conv2.weight"]  # 256 x 256 x 3 x 3, kaiming normal, fan_out = 256 * 9
    assert abs(w.std() - np.sqrt(2 / (256 * 9))) < 0.01 * w.std()
    assert np.all(state["layer3.0.bn2.weight"] == 1) and np.all(state["layer3.0.bn2.bias"] == 0)
    assert np.all(state["bn1.running_var"] == 1) and int(state["bn1.num_batches_tracked"]) == 0
    assert np.abs(state["fc.weight"]).max() <= 1 / np.sqrt(2048)


@pytest.mark.parametrize("depth", [18, 50])
def test_an_uninitialised_model_has_the_architecture_and_zero_weights(depth):
    """initialize=False (the weight average's shadow): the same names, shapes and dtypes, every conv and fc weight
    zero; the batch-norm parameters and statistics as initialised, since they are not drawn."""
    drawn = CONSTRUCTORS[depth](num_classes=10, seed=0).state_dict()
    blank = create_model(f"resnet{depth}", layout="NHWC", precision="fp16", initialize=False).state_dict()
    assert [(k, v.shape, v.dtype) for k, v in blank.items()] == [(k, v.shape, v.dtype) for k, v in drawn.items()]
    for k, v in blank.items():
        if k.endswith("weight") and ("conv" in k or "downsample.0" in k or k.startswith("fc")) or k == "fc.bias":
            assert not v.any(), k
            assert drawn[k].any(), k  # not vacuous: the seeded model draws them
        else:
            np.testing.assert_array_equal(v, drawn[k], err_msg=k)


@pytest.mark.parametrize("depth, last", [(18, "bn2"), (50, "bn3")])
def test_zero_residual_scale_zeroes_only_each_blocks_residual_norm(depth, last):
    model = CONSTRUCTORS[depth](num_classes=10, seed=0)
    model.zero_residual_scales()
    zeroed = {k for k, v in model.state_dict().items() if k.endswith(".weight") and v.ndim == 1 and not v.any()}
    assert zeroed == {f"layer{i + 1}.{j}.{last}.weight" for i, n in enumerate(STAGES[depth]) for j in range(n)}


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_state_dict_round_trip_through_npz(tmp_path, rng, layout):
    src = ResNet50(num_classes=10, layout=layout, seed=1)
    state = src.state_dict()
    state = {
        k: (v + rng.standard_normal(v.shape).astype(np.float32) if v.dtype == np.float32 else v + 5)
        for k, v in state.items()
    }
    path = tmp_path / "resnet50.npz"
    np.savez(path, **state)
    dst = ResNet50(num_classes=10, layout="NCHW" if layout == "NHWC" else "NHWC", seed=2)
    with np.load(path) as f:
        dst.load_state_dict(dict(f))
    back = dst.state_dict()
    assert list(back) == list(state)
    for k in state:
        np.testing.assert_array_equal(back[k], state[k], err_msg=k)


def test_load_state_dict_errors():
    model = ResNet18(num_classes=10)
    state = model.state_dict()
    bad = dict(state)
    del bad["layer1.0.bn1.running_var"]
    with pytest.raises(KeyError, match="layer1.0.bn1.running_var"):
        model.load_state_dict(bad)
    with pytest.raises(KeyError, match="extra.weight"):
        model.load_state_dict({**state, "extra.weight": np.zeros(1)})
    with pytest.raises(ValueError, match=r"fc.weight: expected shape \(10, 512\)"):
        model.load_state_dict({**state, "fc.weight": np.zeros((1000, 512))})
    model.load_state_dict({"fc.bias": np.arange(10.0)}, strict=False)
    np.testing.assert_array_equal(model.state_dict()["fc.bias"], np.arange(10.0))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(depth=19), "depth"),
        (dict(depth=18, stem="tiny"), "stem"),
        (dict(depth=18, layout="CHWN"), "layout"),
        (dict(depth=18, precision="fp64"), "precision"),
        (dict(depth=18, precision="float16"), "precision"),
        (dict(depth=18, engine="cudnn"), "engine"),
        (dict(depth=18, num_classes=0), "num_classes"),
    ],
)
def test_argument_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNet(**kwargs)


def test_num_classes_must_be_an_int():
    with pytest.raises(TypeError, match="num_classes: expected an int >= 1, got 2.5"):
        ResNet(depth=18, num_classes=2.5)


def test_constructors_defaults_and_exports():
    model = rn.ResNet34()
    assert (model.depth, model.num_classes, model.stem, model.layout, model.precision) == (
        34,
        1000,
        "cifar",
        "NHWC",
        "fp32",
    )
    assert rn.ResNet50.__name__ == "ResNet50" and rn.ResNet152 is ResNet152 and rn.ResNet101 is ResNet101
    assert rn.optim.SGD and rn.optim.AdamW and rn.optim.GradScaler
    model = ResNet18(num_classes=10, precision="bf16", layout="NCHW", engine="legacy")
    assert all(
        m.engine == "legacy" and m.precision == "bf16" and m.layout == "NCHW"
        for _, m in model.named_modules()
        if type(m).__name__ == "Conv2d"
    )
    assert model.input_dtype == np.uint16


def test_train_eval_modes():
    model = ResNet18(num_classes=10)
    assert model.training
    assert model.eval() is model and not any(m.training for _, m in model.named_modules())
    model.train()
    assert all(m.training for _, m in model.named_modules())


def test_repr_prints_the_layer_table():
    text = repr(ResNet50(num_classes=10, stem="imagenet"))
    lines = text.splitlines()
    assert lines[0].startswith("ResNet-50(") and "23,528,522 parameters" in lines[0]
    assert any(line.split()[:2] == ["layer4.2.conv3", "Conv2d"] for line in lines)
    assert any(line.split()[:2] == ["maxpool", "MaxPool2d"] for line in lines)
    assert any(line.split()[:2] == ["fc", "Linear"] and line.endswith("20,490") for line in lines)
    assert sum(1 for line in lines if " Conv2d " in line) == 53


def test_forward_without_gpu_raises_clearly():
    if rn.cuda_available():
        pytest.skip("a GPU is present")
    model = ResNet18(num_classes=10)
    with pytest.raises(rn.NoGPUError):
        model.cuda()


@pytest.mark.parametrize("fused_residual", [True, False])
@pytest.mark.parametrize("block,inplanes,planes,stride", [("BasicBlock", 4, 4, 1), ("BasicBlock", 4, 6, 2),
                                                          ("Bottleneck", 8, 2, 1), ("Bottleneck", 4, 3, 2)])
def test_a_block_backward_is_the_gradient_of_its_forward(rng, block, inplanes, planes, stride, fused_residual):
    """The block's input gradient, whose two summands (main path and shortcut) the first convolution's
    backward-data adds (beta = 1), against a central difference of <forward(x), g> along a random direction; in
    float64 on the host (batch statistics included)."""
    from resnet_native.nn.models import blocks

    cls = getattr(blocks, block)
    b = cls(inplanes, planes, stride, layout="NHWC", fused_residual=fused_residual,
            rng=np.random.default_rng(1)).to_host()
    x, v = rng.standard_normal((3, 6, 6, inplanes)), rng.standard_normal((3, 6, 6, inplanes))
    g = rng.standard_normal(b.forward(x, train=True).shape)
    dx = np.array(b.backward(g))

    def loss(x_):
        return float(np.sum(b.forward(x_, train=True) * g))

    eps = 1e-6
    numeric = (loss(x + eps * v) - loss(x - eps * v)) / (2 * eps)
    assert np.isclose(np.sum(dx * v), numeric, rtol=1e-6, atol=1e-8), (np.sum(dx * v), numeric)
