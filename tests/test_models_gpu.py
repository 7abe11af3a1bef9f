"""GPU tests of the whole ResNet: against PyTorch (torchvision's resnet18 with the CIFAR stem, in float64,
weights exchanged through state_dict), fused vs unfused residual joins, descriptor leaks, steady-state memory,
and training runs whose loss must fall."""

import gc

import cupy as cp
import numpy as np
import pytest

import resnet_native as rn
from resnet_native import reference as ref
from resnet_native.nn.models import ResNet18, ResNet50
from resnet_native.ops.losses import SoftmaxCrossEntropy
from resnet_native.optim import SGD, GradScaler
from resnet_native.optim.step import TrainStep

pytestmark = pytest.mark.gpu


def _torch_resnet18_cifar(torch, num_classes):
    """torchvision's resnet18 with the CIFAR stem (3x3 stride-1 conv1, no max pool); the same module tree
    written out here when torchvision is not installed (identical state_dict names)."""
    nn = torch.nn
    try:
        import torchvision

        model = torchvision.models.resnet18(num_classes=num_classes)
    except ImportError:

        class BasicBlock(nn.Module):
            def __init__(self, inplanes, planes, stride):
                super().__init__()
                self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(planes)
                self.relu = nn.ReLU(inplace=True)
                self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(planes)
                self.downsample = None
                if stride != 1 or inplanes != planes:
                    self.downsample = nn.Sequential(
                        nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
                    )

            def forward(self, x):
                identity = x if self.downsample is None else self.downsample(x)
                out = self.relu(self.bn1(self.conv1(x)))
                return self.relu(self.bn2(self.conv2(out)) + identity)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
                self.bn1 = nn.BatchNorm2d(64)
                self.relu = nn.ReLU(inplace=True)
                self.maxpool = nn.MaxPool2d(3, 2, 1)
                inplanes = 64
                for i, planes in enumerate((64, 128, 256, 512)):
                    blocks = [BasicBlock(inplanes, planes, 2 if i > 0 else 1), BasicBlock(planes, planes, 1)]
                    setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
                    inplanes = planes
                self.avgpool = nn.AdaptiveAvgPool2d(1)
                self.fc = nn.Linear(512, num_classes)

            def forward(self, x):
                x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
                x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
                return self.fc(torch.flatten(self.avgpool(x), 1))

        model = Net()
    model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    return model


@pytest.fixture
def torch_fp64():
    torch = pytest.importorskip("torch")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield torch
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _both_models(torch, rng, layout):
    """A ResNet-18 (CIFAR stem, fp32) and the same weights in PyTorch (float64), after one forward and
    backward on the same batch: (ours, torch model, our logits, torch logits, our loss, torch loss, initial
    state, (images, labels))."""
    n, classes = 4, 10
    model = ResNet18(num_classes=classes, stem="cifar", layout=layout, precision="fp32", seed=0)
    initial = model.state_dict()
    tmodel = _torch_resnet18_cifar(torch, classes)
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
    tmodel = tmodel.double().cuda().train()

    x32 = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, classes, n)
    x = cp.asarray(np.ascontiguousarray(x32 if layout == "NCHW" else x32.transpose(0, 2, 3, 1)))
    lossf = SoftmaxCrossEntropy()
    logits = model.forward(x, train=True, copy=False)
    loss, _ = lossf.forward(logits, cp.asarray(labels.astype(np.int32)))
    model.backward(lossf.backward())

    tlogits = tmodel(torch.from_numpy(x32.astype(np.float64)).cuda())
    tloss = torch.nn.functional.cross_entropy(tlogits, torch.from_numpy(labels.astype(np.int64)).cuda())
    tloss.backward()
    return (
        model,
        tmodel,
        cp.asnumpy(logits),
        tlogits.detach().cpu().numpy(),
        float(loss),
        float(tloss),
        initial,
        (x32, labels),
    )


def _torch_fp32_grad_errors(torch, initial, batch, tgrads) -> dict:
    """How far PyTorch's own fp32 gradients (cuDNN; torch_fp64 turned TF32 off) of the same weights and batch are
    from float64: the rounding this tiny-batch network amplifies, measured rather than assumed."""
    x32, labels = batch
    tmodel = _torch_resnet18_cifar(torch, 10)
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
    tmodel = tmodel.float().cuda().train()
    logits = tmodel(torch.from_numpy(x32).cuda())
    torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels.astype(np.int64)).cuda()).backward()
    return _grad_errors({name: p.grad.cpu().numpy().astype(np.float64) for name, p in tmodel.named_parameters()},
                        tgrads)


# fp32 against fp64: a ReLU whose input is within rounding of zero can take the other branch, which moves the
# gradients of the layers below it by up to ~1% (BN backward over 4 images amplifies it), so gradients are held
# to 1e-2 overall and 5e-2 per tensor, or to twice PyTorch's own fp32 error on the same batch where that is
# larger (real wiring errors are O(1)); logits and BN statistics, which no such flip disturbs much, to 2e-4.
GRAD_TOL_ALL, GRAD_TOL_EACH = 1e-2, 5e-2


def _grad_errors(ours: dict, theirs: dict) -> dict:
    names = sorted(theirs)
    errors = {name: ref.relative_error(ours[name], theirs[name]) for name in names}
    errors["(all)"] = ref.relative_error(
        np.concatenate([np.ravel(ours[k]) for k in names]),
        np.concatenate([np.ravel(theirs[k]) for k in names]),
    )
    return errors


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_resnet18_matches_pytorch(torch_fp64, rng, layout):
    torch = torch_fp64
    model, tmodel, logits, tlogits, loss, tloss, initial, batch = _both_models(torch, rng, layout)
    assert ref.relative_error(logits, tlogits) <= 2e-4
    assert abs(loss - tloss) <= 2e-4 * abs(tloss), (loss, tloss)
    grads = model.grads_dict()
    tgrads = {name: p.grad.cpu().numpy() for name, p in tmodel.named_parameters()}
    assert sorted(grads) == sorted(tgrads)
    errors = _grad_errors(grads, tgrads)
    worst = max((e, k) for k, e in errors.items() if k != "(all)")
    theirs = _torch_fp32_grad_errors(torch, initial, batch, tgrads)
    their_worst = max((e, k) for k, e in theirs.items() if k != "(all)")
    print(
        f"\nResNet-18 {layout} fp32 vs PyTorch fp64: logits {ref.relative_error(logits, tlogits):.2e}, gradients "
        f"{errors['(all)']:.2e}, worst tensor {worst}; PyTorch fp32: {theirs['(all)']:.2e}, worst {their_worst}"
    )
    assert errors["(all)"] <= max(GRAD_TOL_ALL, 2 * theirs["(all)"]), (errors["(all)"], theirs["(all)"])
    assert worst[0] <= max(GRAD_TOL_EACH, 2 * their_worst[0]), (worst, their_worst)
    ours = model.state_dict()
    for name, value in tmodel.state_dict().items():
        if name.endswith(("running_mean", "running_var")):
            assert ref.relative_error(ours[name], value.cpu().numpy()) <= 2e-4, name
        elif name.endswith("num_batches_tracked"):
            assert int(ours[name]) == int(value) == 1


def test_one_sgd_step_matches_pytorch(torch_fp64, rng):
    torch = torch_fp64
    model, tmodel, *_, initial, _ = _both_models(torch, rng, "NHWC")
    hyper = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    SGD(model.parameters(), **hyper).step()
    torch.optim.SGD(tmodel.parameters(), **hyper).step()
    ours, theirs = model.state_dict(), tmodel.state_dict()
    names = [name for name, _ in model.named_parameters()]
    steps = {name: ours[name].astype(np.float64) - initial[name] for name in names}
    tsteps = {name: theirs[name].cpu().numpy() - initial[name] for name in names}
    assert all(np.abs(tsteps[name]).max() > 0 for name in names)
    errors = _grad_errors(steps, tsteps)
    worst = max((e, k) for k, e in errors.items() if k != "(all)")
    assert errors["(all)"] <= GRAD_TOL_ALL and worst[0] <= GRAD_TOL_EACH, (errors["(all)"], worst)


def test_fused_residual_equals_unfused_fp16_nhwc(rng):
    """fp16 gradients of a freshly initialised BN ResNet differ from fp32 ones by several percent whatever the
    path (rounding is amplified through the backward pass), so the fused bn + add + ReLU is held to the
    unfused path's accuracy against an fp32 run of the same weights, and their logits must agree to fp16
    tolerance."""
    x32 = rng.standard_normal((8, 32, 32, 3)).astype(np.float16).astype(np.float32)
    labels = cp.asarray(rng.integers(0, 10, 8).astype(np.int32))
    results = {}
    for name, dtype, fused in (("fp32", "fp32", True), ("fused", "fp16", True), ("unfused", "fp16", False)):
        model = ResNet18(num_classes=10, precision=dtype, layout="NHWC", seed=3, fused_residual=fused)
        x = cp.asarray(x32.astype(np.float16) if dtype == "fp16" else x32)
        lossf = SoftmaxCrossEntropy()
        logits = model.forward(x, train=True, copy=False)
        if name == "fused":
            path = rn.norm.last_path()  # the last batch norm of the forward: layer4.1.bn2, residual + ReLU
            assert path["fused"], path
        lossf.forward(logits, labels)
        model.backward(lossf.backward(1024.0))  # loss-scaled, as fp16 training runs
        grads = model.grads_dict()
        results[name] = (cp.asnumpy(logits), np.concatenate([grads[k].ravel() for k in sorted(grads)]))
    logits_gap = ref.relative_error(results["fused"][0], results["unfused"][0])
    err_fused = ref.relative_error(results["fused"][1], results["fp32"][1])
    err_unfused = ref.relative_error(results["unfused"][1], results["fp32"][1])
    print(
        f"\nfp16 NHWC ResNet-18: fused vs unfused logits {logits_gap:.2e}; gradient error vs fp32: fused "
        f"{err_fused:.3f}, unfused {err_unfused:.3f}"
    )
    assert logits_gap <= 1e-2
    assert err_fused <= 2 * err_unfused + 1e-2


def test_eval_mode_is_per_sample_and_uses_running_statistics(rng):
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=1)
    x = cp.asarray(rng.standard_normal((6, 32, 32, 3)).astype(np.float32))
    model.forward(x, train=True)
    model.eval()
    full = cp.asnumpy(model.forward(x))
    part = cp.asnumpy(model.forward(x[:2].copy()))
    assert np.isfinite(full).all()
    assert ref.relative_error(part, full[:2]) <= 1e-5
    state = model.state_dict()
    assert int(state["layer2.0.bn1.num_batches_tracked"]) == 1 and not np.all(state["bn1.running_var"] == 1)


def test_resnet50_leaks_no_descriptors():
    def live():
        gc.collect()
        return {k: v for k, v in rn.live_descriptors().items() if k != "handle"}

    rn._drop_cached_descriptors()
    before = live()
    rng = np.random.default_rng(0)
    model = ResNet50(num_classes=10, stem="cifar", layout="NHWC", precision="fp16", seed=0)
    step = TrainStep(model, SGD(model.parameters(), lr=0.01), scaler=GradScaler())
    x = cp.asarray(rng.standard_normal((4, 32, 32, 3)).astype(np.float16))
    loss, _ = step(x, cp.asarray(rng.integers(0, 10, 4).astype(np.int32)))
    assert np.isfinite(float(loss))
    del step, model, loss
    rn._drop_cached_descriptors()
    after = live()
    grown = {k: (before.get(k, 0), v) for k, v in after.items() if v > before.get(k, 0)}
    assert not grown, grown


def _learnable_batches(rng, count, n, classes, layout, dtype):
    """Random images plus a fixed random pattern per class: learnable, so a working step must lower the
    loss."""
    patterns = rng.standard_normal((classes, 32, 32, 3))
    batches = []
    for _ in range(count):
        labels = rng.integers(0, classes, n)
        x = rng.standard_normal((n, 32, 32, 3)) + patterns[labels]
        if layout == "NCHW":
            x = x.transpose(0, 3, 1, 2)
        x = np.ascontiguousarray(x.astype(np.float32))
        if dtype == "bf16":
            x = ref.bf16.to_bf16_bits(x)
        elif dtype == "fp16":
            x = x.astype(np.float16)
        batches.append((cp.asarray(x), cp.asarray(labels.astype(np.int32))))
    return batches


def _train(model, steps, batches, scaler, lr):
    opt = SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    step = TrainStep(model, opt, scaler=scaler)
    losses = [step(*batches[i % len(batches)])[0] for i in range(steps)]
    return cp.asnumpy(cp.stack(losses))


@pytest.mark.parametrize("depth", [18, 50])
def test_training_lowers_the_loss_fp16_nhwc(rng, depth):
    model = (ResNet18 if depth == 18 else ResNet50)(num_classes=10, stem="cifar", layout="NHWC", precision="fp16")
    scaler = GradScaler()
    # ResNet-50 at lr 0.02 (momentum 0.9, batch 32) overshoots after its first update (loss 2.4 -> 75, measured
    # on the H200 with the separate and the fused unscale alike) and only partly recovers in 200 steps; the
    # assertion is about learning, not about surviving that spike.
    lr = 0.02 if depth == 18 else 0.005
    losses = _train(model, 200, _learnable_batches(rng, 4, 32, 10, "NHWC", "fp16"), scaler, lr=lr)
    print(
        f"\nResNet-{depth} fp16 NHWC: loss {losses[:4].mean():.3f} -> {losses[-8:].mean():.3f}, "
        f"scale {scaler.get_scale():g}"
    )
    assert np.isfinite(losses[-8:]).all()
    assert losses[-8:].mean() < 0.5 * losses[:4].mean(), losses


@pytest.mark.parametrize("dtype,layout", [("bf16", "NHWC"), ("tf32", "NCHW"), ("fp32", "NHWC")])
def test_other_precisions_train(rng, dtype, layout):
    model = ResNet18(num_classes=10, stem="cifar", layout=layout, precision=dtype, seed=2)
    losses = _train(model, 40, _learnable_batches(rng, 2, 16, 10, layout, dtype), None, lr=0.02)
    assert np.isfinite(losses).all() and losses[-4:].mean() < 0.7 * losses[:2].mean(), losses


def test_grad_scaler_skips_a_step_with_inf_gradients(rng):
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=4)
    scaler = GradScaler(init_scale=1024.0)
    step = TrainStep(model, SGD(model.parameters(), lr=0.1, momentum=0.9), scaler=scaler)
    x = rng.standard_normal((4, 16, 16, 3)).astype(np.float16)
    x[1, 2, 3, 0] = np.inf
    before = model.state_dict()
    step(cp.asarray(x), cp.asarray(rng.integers(0, 10, 4).astype(np.int32)))
    after = model.state_dict()
    assert int(cp.asnumpy(scaler.found_inf)[0]) == 1 and scaler.get_scale() == 512.0
    for name, _ in model.named_parameters():
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    x[1, 2, 3, 0] = 0
    step(cp.asarray(x), cp.asarray(rng.integers(0, 10, 4).astype(np.int32)))
    assert int(cp.asnumpy(scaler.found_inf)[0]) == 0 and scaler.get_scale() == 512.0
    assert not np.array_equal(model.state_dict()["fc.weight"], before["fc.weight"])


def test_steady_state_steps_allocate_nothing_new(rng):
    model = ResNet18(num_classes=10, layout="NHWC", precision="fp16", seed=5)
    step = TrainStep(model, SGD(model.parameters(), lr=0.01), scaler=GradScaler())
    x = cp.asarray(rng.standard_normal((8, 32, 32, 3)).astype(np.float16))
    labels = cp.asarray(rng.integers(0, 10, 8).astype(np.int32))
    for _ in range(2):
        step(x, labels)
    cp.cuda.Device().synchronize()
    pool = cp.get_default_memory_pool()
    used = pool.used_bytes()

    class CountMallocs(cp.cuda.MemoryHook):
        name = "CountMallocs"
        count = 0

        def malloc_preprocess(self, **kwargs):
            CountMallocs.count += 1

    with CountMallocs():
        for _ in range(3):
            step(x, labels)
    cp.cuda.Device().synchronize()
    print(
        f"\ncupy pool allocations per steady-state TrainStep call: {CountMallocs.count / 3:g} "
        "(2 are the returned loss and correct)"
    )
    assert pool.used_bytes() == used  # nothing kept alive beyond the buffers of the first steps


def test_readme_example():
    model = rn.ResNet50(num_classes=10, stem="cifar", layout="NHWC", precision="fp16")
    opt = rn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    step = rn.step.TrainStep(model, opt, label_smoothing=0.1, scaler=rn.optim.GradScaler())
    x = cp.random.randn(16, 32, 32, 3).astype(cp.float16)
    y = cp.random.randint(0, 10, 16).astype(cp.int32)
    loss, correct = step(x, y)
    logits = model.eval().forward(x)
    assert logits.shape == (16, 10) and logits.dtype == cp.float32 and bool(cp.isfinite(logits).all())
    assert loss.shape == () and correct.dtype == cp.int32 and 0 <= int(correct) <= 16
