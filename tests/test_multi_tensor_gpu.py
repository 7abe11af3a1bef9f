"""Multi-tensor optimizer kernels on a GPU against float64 NumPy references (and torch.optim when torch imports)
over several steps: SGD (momentum, Nesterov, weight decay, dampening), AdamW, gradient unscaling, skipped steps
on found_inf, low-precision model copies, check_finite, zero_, scale_."""

import numpy as np
import pytest
from device_values import check_close, host_values, poisoned, to_device

from resnet_native import reference
from resnet_native.ops import multi_tensor as mt
from resnet_native.reference import to_storage

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

# Odd sizes, a scalar-like tensor, tensors spanning several chunks (mt.CHUNK_ELEMENTS), one over a million elements.
SHAPES = [(3,), (7, 5), (64, 3, 3, 3), (1,), (33_000,), (70_001,), (1_000_003,), (512, 256)]
FP32_TOL = 1e-5


def fp32(value) -> float:
    """A hyperparameter as the kernels see it (fp32), as a Python float for float64 reference math."""
    return float(np.float32(value))


def host_list(arrays):
    """The reference's TensorList of float64 host arrays, which its steps update in place (None: no list)."""
    return None if arrays is None else reference.multi_tensor.TensorList(arrays)


def host_params(rng, shapes=SHAPES):
    return [rng.standard_normal(s).astype(np.float32).astype(np.float64) for s in shapes]


def device_f32(hosts):
    return [cp.asarray(h.astype(np.float32)) for h in hosts]


def grads_of(rng, shapes, dtypes, scale=1.0):
    """(device grads, exact float64 values) with per-tensor dtypes; values are `scale` times larger than the
    gradient the optimizer should see (the loss scale)."""
    devs, hosts = [], []
    for s, dt in zip(shapes, dtypes, strict=True):
        d, h = to_device(rng.standard_normal(s) * scale, dt)
        devs.append(d)
        hosts.append(h)
    return devs, hosts


def assert_close_lists(got_devs, want_hosts, tol, what):
    for i, (d, w) in enumerate(zip(got_devs, want_hosts, strict=True)):
        check_close(d, w, tol, f"{what}[{i}] shape {w.shape}")


GRAD_DTYPES = {
    "fp32": ["fp32"] * len(SHAPES),
    "fp16": ["fp16"] * len(SHAPES),
    "bf16": ["bf16"] * len(SHAPES),
    "mixed": ["fp16", "fp32", "bf16", "fp32", "fp16", "bf16", "fp32", "fp16"],
}


@pytest.mark.parametrize("grads_kind", list(GRAD_DTYPES))
@pytest.mark.parametrize(
    "momentum, nesterov, weight_decay, dampening, first_step",
    [(0.9, False, 0.0, 0.0, False), (0.9, True, 1e-2, 0.0, False), (0.8, False, 5e-4, 0.1, True),
     (0.0, False, 1e-2, 0.0, False)],
)
def test_sgd_matches_reference_over_steps(momentum, nesterov, weight_decay, dampening, first_step, grads_kind, rng):
    dtypes = GRAD_DTYPES[grads_kind]
    hp = host_params(rng)
    params = device_f32(hp)
    bufs = [cp.zeros(s, cp.float32) for s in SHAPES] if momentum else None
    hbufs = [np.zeros(s) for s in SHAPES] if momentum else None
    p_list = mt.TensorList(params)
    b_list = mt.TensorList(bufs) if bufs else None
    lrs = [0.1, 0.05, cp.asarray(np.array([0.02], np.float32))]  # the last one read on the device
    for step, lr in enumerate(lrs):
        grads, hg = grads_of(rng, SHAPES, dtypes)
        g_list = mt.TensorList(grads, dtype=dtypes)
        mt.sgd_step(p_list, g_list, b_list, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                    dampening=dampening, first_step=first_step and step == 0)
        lr_value = float(np.float32(lr if isinstance(lr, float) else cp.asnumpy(lr)[0]))
        # Zero-initialised buffers: without first_step, step 0 is buf = (1 - dampening) * g.
        reference.multi_tensor.sgd_step(host_list(hp), host_list(hg), host_list(hbufs), lr=fp32(lr_value),
                                        momentum=fp32(momentum), weight_decay=fp32(weight_decay), nesterov=nesterov,
                                        dampening=fp32(dampening), first_step=first_step and step == 0)
    assert_close_lists(params, hp, FP32_TOL, "params")
    if bufs:
        assert_close_lists(bufs, hbufs, FP32_TOL, "momentum_bufs")


@pytest.mark.parametrize("step_on_device", [False, True])
@pytest.mark.parametrize("grads_kind", ["fp32", "mixed"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_adamw_matches_reference_over_steps(weight_decay, grads_kind, step_on_device, rng):
    dtypes = GRAD_DTYPES[grads_kind]
    beta1, beta2, eps, lr = 0.9, 0.99, 1e-8, 1e-2
    hp = host_params(rng)
    params = device_f32(hp)
    ms, vs = [cp.zeros(s, cp.float32) for s in SHAPES], [cp.zeros(s, cp.float32) for s in SHAPES]
    hm, hv = [np.zeros(s) for s in SHAPES], [np.zeros(s) for s in SHAPES]
    p_list, m_list, v_list = mt.TensorList(params), mt.TensorList(ms), mt.TensorList(vs)
    step_dev = cp.zeros((1,), cp.float32)
    for step in range(1, 5):
        grads, hg = grads_of(rng, SHAPES, dtypes)
        step_dev += 1
        mt.adamw_step(p_list, mt.TensorList(grads, dtype=dtypes), m_list, v_list, lr=lr, beta1=beta1, beta2=beta2,
                      eps=eps, weight_decay=weight_decay, step=step_dev if step_on_device else step)
        reference.multi_tensor.adamw_step(host_list(hp), host_list(hg), host_list(hm), host_list(hv), lr=fp32(lr),
                                          beta1=fp32(beta1), beta2=fp32(beta2), eps=fp32(eps),
                                          weight_decay=fp32(weight_decay), step=step)
    assert_close_lists(params, hp, FP32_TOL, "params")
    assert_close_lists(ms, hm, FP32_TOL, "exp_avgs")
    assert_close_lists(vs, hv, FP32_TOL, "exp_avg_sqs")


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_inv_scale_unscales_gradients_and_copies_follow_the_masters(optimizer, rng):
    scale = 1024.0
    hp = host_params(rng)
    params = device_f32(hp)
    state = [[cp.zeros(s, cp.float32) for s in SHAPES] for _ in range(2)]
    hstate = [[np.zeros(s) for s in SHAPES] for _ in range(2)]
    # Copies: fp16, bf16 and, for two parameters, none (None entries).
    copy_dtypes = ["fp16", "bf16", None, "fp16", "bf16", None, "fp16", "bf16"]
    copies = [None if dt is None else poisoned(s, dt) for s, dt in zip(SHAPES, copy_dtypes, strict=True)]
    c_list = mt.TensorList(copies, dtype=[dt for dt in copy_dtypes])
    inv_scale = cp.asarray(np.array([1.0 / scale], np.float32))  # read on the device
    for step in (1, 2):
        grads, hg = grads_of(rng, SHAPES, ["fp16"] * len(SHAPES), scale=scale)
        g_list = mt.TensorList(grads)
        if optimizer == "sgd":
            mt.sgd_step(mt.TensorList(params), g_list, mt.TensorList(state[0]), lr=0.1, momentum=0.9,
                        weight_decay=1e-3, inv_scale=inv_scale, model_copies=c_list)
            reference.multi_tensor.sgd_step(host_list(hp), host_list(hg), host_list(hstate[0]), lr=fp32(0.1),
                                            momentum=fp32(0.9), weight_decay=fp32(1e-3), inv_scale=1.0 / scale)
        else:
            mt.adamw_step(mt.TensorList(params), g_list, mt.TensorList(state[0]), mt.TensorList(state[1]), lr=1e-2,
                          step=step, inv_scale=1.0 / scale, model_copies=c_list)
            # The kernel's default hyperparameters, as fp32.
            reference.multi_tensor.adamw_step(host_list(hp), host_list(hg), host_list(hstate[0]),
                                              host_list(hstate[1]), lr=fp32(1e-2), beta1=fp32(0.9), beta2=fp32(0.999),
                                              eps=fp32(1e-8), weight_decay=fp32(0.01), step=step,
                                              inv_scale=1.0 / scale)
    assert_close_lists(params, hp, FP32_TOL, "params")
    masters = [cp.asnumpy(p) for p in params]
    for i, (copy, dt) in enumerate(zip(copies, copy_dtypes, strict=True)):
        if dt is None:
            continue
        got = cp.asnumpy(copy)
        # Exactly the rounded masters (round to nearest even).
        want = to_storage(masters[i], dt)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), f"copy {i} ({dt})"


def misaligned_like(arrays, dtypes):
    """Copies of `arrays` whose data starts one element into a buffer of their own: an address that four elements'
    width does not divide, which the kernels take one element at a time."""
    out = []
    for a, dt in zip(arrays, dtypes, strict=True):
        flat = cp.empty(a.size + 1, a.dtype)[1:]
        assert flat.data.ptr % (4 * a.dtype.itemsize) != 0, dt
        flat[...] = a.reshape(-1)
        out.append(flat.reshape(a.shape))
    return out


def bits(arrays):
    return [cp.asnumpy(a).view(f"u{a.dtype.itemsize}") for a in arrays]


@pytest.mark.parametrize("grads_kind", ["fp16", "bf16", "mixed"])
def test_aligned_and_misaligned_tensors_update_to_the_same_bits(grads_kind, rng):
    """Aligned tensors are updated four elements at a time (one 16- or 8-byte access each), misaligned ones one at
    a time: SGD with momentum, Nesterov, decay, unscaling and low-precision copies, and the finite check, give the
    same bits either way."""
    dtypes = GRAD_DTYPES[grads_kind]
    copy_dtypes = ["fp16", "bf16", "fp16", "bf16", "fp16", "bf16", "fp32", "fp16"]
    params = device_f32(host_params(rng))
    bufs = [cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
    grads, _ = grads_of(rng, SHAPES, dtypes, scale=512.0)
    copies = [poisoned(s, dt) for s, dt in zip(SHAPES, copy_dtypes, strict=True)]
    aligned = (params, bufs, grads, copies)
    misaligned = tuple(misaligned_like(a, d) for a, d in zip(aligned, (["fp32"] * 8, ["fp32"] * 8, dtypes,
                                                                      copy_dtypes), strict=True))
    runs = []
    for p, b, g, c in (aligned, misaligned):
        for _ in range(2):
            mt.sgd_step(mt.TensorList(p), mt.TensorList(g, dtype=dtypes), mt.TensorList(b), lr=0.1, momentum=0.9,
                        nesterov=True, weight_decay=5e-4, inv_scale=1.0 / 512.0,
                        model_copies=mt.TensorList(c, dtype=copy_dtypes))
        found_inf = cp.zeros((1,), cp.int32)
        mt.check_finite(mt.TensorList(g, dtype=dtypes), found_inf)
        runs.append((bits(p), bits(b), bits(c), int(found_inf[0])))
    (p0, b0, c0, f0), (p1, b1, c1, f1) = runs
    for what, x, y in (("params", p0, p1), ("momentum", b0, b1), ("copies", c0, c1)):
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            np.testing.assert_array_equal(u, v, err_msg=f"{what}[{i}]")
    assert f0 == f1 == 0
    misaligned[2][5].reshape(-1)[-3] = to_storage(np.array([np.nan]), dtypes[5])[0]  # the misaligned path sees it
    found_inf = cp.zeros((1,), cp.int32)
    mt.check_finite(mt.TensorList(misaligned[2], dtype=dtypes), found_inf)
    assert int(found_inf[0]) == 1


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_found_inf_skips_the_whole_update(optimizer, rng):
    params = device_f32(host_params(rng))
    state = [cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
    state2 = [cp.asarray(rng.uniform(0.1, 1.0, s).astype(np.float32)) for s in SHAPES]
    copies = [cp.asarray(rng.standard_normal(s).astype(np.float16)) for s in SHAPES]
    before = [cp.asnumpy(a).copy() for a in params + state + state2 + copies]
    grads, _ = grads_of(rng, SHAPES, ["fp32"] * len(SHAPES))
    found_inf = cp.ones((1,), cp.int32)
    lists = [mt.TensorList(params), mt.TensorList(grads)]
    if optimizer == "sgd":
        mt.sgd_step(*lists, mt.TensorList(state), lr=0.1, found_inf=found_inf, model_copies=mt.TensorList(copies))
    else:
        mt.adamw_step(*lists, mt.TensorList(state), mt.TensorList(state2), lr=0.1, step=3, found_inf=found_inf,
                      model_copies=mt.TensorList(copies))
    after = [cp.asnumpy(a) for a in params + state + state2 + copies]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    found_inf[...] = 0  # and with the flag clear, the same call updates
    if optimizer == "sgd":
        mt.sgd_step(*lists, mt.TensorList(state), lr=0.1, found_inf=found_inf)
    else:
        mt.adamw_step(*lists, mt.TensorList(state), mt.TensorList(state2), lr=0.1, step=3, found_inf=found_inf)
    assert not np.array_equal(cp.asnumpy(params[-1]), before[len(SHAPES) - 1])


@pytest.mark.parametrize("bad_dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_check_finite_sets_the_flag_and_never_clears_it(bad, bad_dtype, rng):
    dtypes = ["fp32", "fp16", "bf16", "fp32", "fp16", "bf16", "fp32", "fp16"]
    grads, _ = grads_of(rng, SHAPES, dtypes)
    g_list = mt.TensorList(grads, dtype=dtypes)
    found_inf = cp.zeros((1,), cp.int32)
    mt.check_finite(g_list, found_inf)
    assert int(found_inf[0]) == 0
    # One bad element deep inside the last chunk of a multi-chunk tensor of the chosen dtype.
    index = max(i for i, dt in enumerate(dtypes) if dt == bad_dtype and np.prod(SHAPES[i]) > 40_000)
    flat = grads[index].reshape(-1)
    value = to_storage(np.array([bad]), bad_dtype)[0]
    flat[flat.size - 2] = value
    mt.check_finite(g_list, found_inf)
    assert int(found_inf[0]) == 1
    flat[flat.size - 2] = 0
    mt.check_finite(g_list, found_inf)
    assert int(found_inf[0]) == 1  # never reset


def test_zero_and_scale_cover_every_tensor_in_place(rng):
    dtypes = ["fp32", "fp16", "bf16", "fp32", "fp16", "bf16", "fp32", "fp16"]
    # Magnitudes in [0.25, 4]: scaling by 0.5 and -4 stays exact in every dtype (no subnormals, no overflow).
    arrays, hosts = [], []
    for shape, dt in zip(SHAPES, dtypes, strict=True):
        d, h = to_device(rng.uniform(0.25, 4.0, shape) * rng.choice([-1.0, 1.0], shape), dt)
        arrays.append(d)
        hosts.append(h)
    pointers = [a.data.ptr for a in arrays]
    lst = mt.TensorList(arrays, dtype=dtypes)
    mt.scale_(lst, 0.5)
    for a, h in zip(arrays, hosts, strict=True):
        assert np.array_equal(host_values(a), h * 0.5)  # halving is exact
    factor = cp.asarray(np.array([-4.0], np.float32))
    mt.scale_(lst, factor)
    for a, h in zip(arrays, hosts, strict=True):
        assert np.array_equal(host_values(a), h * -2.0)
    mt.zero_(lst)
    for a in arrays:
        assert not host_values(a).any()
    assert [a.data.ptr for a in arrays] == pointers  # no reallocation
    assert lst.num_chunks == sum(-(-int(np.prod(s)) // mt.CHUNK_ELEMENTS) for s in SHAPES)
    assert max(np.prod(s) for s in SHAPES) > 2 * mt.CHUNK_ELEMENTS


def test_runs_on_the_current_cupy_stream(rng):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        hp = host_params(rng)
        params = device_f32(hp)
        grads, hg = grads_of(rng, SHAPES, ["fp32"] * len(SHAPES))
        grads = [g * 1 for g in grads]  # produced on the stream just before the step
        mt.sgd_step(mt.TensorList(params), mt.TensorList(grads), None, lr=0.5, momentum=0.0)
        got = [p.get(stream=stream) for p in params]
        stream.synchronize()
    reference.multi_tensor.sgd_step(host_list(hp), host_list(hg), None, lr=0.5, momentum=0.0)
    assert_close_lists(got, hp, FP32_TOL, "params updated on a side stream")


def test_errors_with_real_device_arrays(rng):
    params = mt.TensorList(device_f32(host_params(rng)))
    short = mt.TensorList([cp.zeros(s, cp.float32) for s in SHAPES[:-1]])
    with pytest.raises(ValueError, match="grads has 7 tensors but params has 8"):
        mt.sgd_step(params, short, None, lr=0.1, momentum=0.0)
    wrong = mt.TensorList([cp.zeros(s, cp.float32) for s in SHAPES[:-1]] + [cp.zeros((3,), cp.float32)])
    with pytest.raises(ValueError, match=r"grads\[7\] has 3 elements"):
        mt.sgd_step(params, wrong, None, lr=0.1, momentum=0.0)
    half_params = mt.TensorList([cp.zeros(s, cp.float16) for s in SHAPES])
    with pytest.raises(TypeError, match=r"params\[0\]: expected float32, got float16"):
        mt.sgd_step(half_params, params, None, lr=0.1, momentum=0.0)
    with pytest.raises(ValueError, match="momentum_bufs: required when momentum"):
        mt.sgd_step(params, params, None, lr=0.1, momentum=0.9)
    with_none = mt.TensorList([None] + [cp.zeros(s, cp.float32) for s in SHAPES[1:]])
    with pytest.raises(ValueError, match="grads: every entry must be an array"):
        mt.sgd_step(params, with_none, None, lr=0.1, momentum=0.0)
    with pytest.raises(ValueError, match=r"lr: expected shape \(1,\)"):
        mt.sgd_step(params, params, None, lr=cp.zeros((2,), cp.float32), momentum=0.0)
    with pytest.raises(TypeError, match="found_inf: expected an int32 array"):
        mt.check_finite(params, cp.zeros((1,), cp.float32))


# ---- against torch.optim -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["sgd", "sgd_nesterov", "adamw"])
def test_matches_torch_optim(optimizer, rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    shapes = SHAPES[:-2] + [(256, 128)]
    hp = host_params(rng, shapes)
    params = device_f32(hp)
    tparams = [torch.tensor(h.astype(np.float32), device="cuda", requires_grad=True) for h in hp]
    if optimizer == "adamw":
        topt = torch.optim.AdamW(tparams, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
        state = [[cp.zeros(s, cp.float32) for s in shapes] for _ in range(2)]
    else:
        nesterov = optimizer == "sgd_nesterov"
        topt = torch.optim.SGD(tparams, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=nesterov)
        state = [[cp.zeros(s, cp.float32) for s in shapes]]
    p_list = mt.TensorList(params)
    s_lists = [mt.TensorList(s) for s in state]
    for step in range(1, 4):
        hg = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for tp, g in zip(tparams, hg, strict=True):
            tp.grad = torch.tensor(g, device="cuda")
        topt.step()
        g_list = mt.TensorList([cp.asarray(g) for g in hg])
        if optimizer == "adamw":
            mt.adamw_step(p_list, g_list, *s_lists, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05,
                          step=step)
        else:
            mt.sgd_step(p_list, g_list, s_lists[0], lr=0.05, momentum=0.9, weight_decay=1e-3,
                        nesterov=optimizer == "sgd_nesterov")
    torch.cuda.synchronize()
    for i, (p, tp) in enumerate(zip(params, tparams, strict=True)):
        check_close(p, tp.detach().cpu().numpy(), FP32_TOL, f"param {i} against torch")
