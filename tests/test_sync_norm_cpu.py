"""Synchronized batch norm's arithmetic on the host (resnet_native.norm.sync_bn_*, the float64 references): a
batch split between two ranks, whose sums are added as the all-reduce adds them, gives every output of the
ordinary batch norm of the whole batch (forward, saved and running statistics, dx, dz; dgamma / dbeta as the sum of
the ranks' shares)."""

import numpy as np
import pytest

from resnet_native.ops import norm

EPS = 1e-5


def _split(a, layout):
    return np.array_split(a, 2, axis=0)  # the batch axis is first in both layouts


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("relu, residual", [(False, False), (True, False), (True, True)])
def test_two_ranks_equal_one_batch_norm_of_the_whole_batch(layout, relu, residual, rng):
    shape = (6, 5, 4, 3) if layout == "NCHW" else (6, 4, 3, 5)
    c = 5
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    z = rng.standard_normal(shape).astype(np.float32) if residual else None
    dy = rng.standard_normal(shape).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    rm0, rv0 = (rng.standard_normal(c) * 0.1).astype(np.float32), rng.uniform(0.5, 2, c).astype(np.float32)

    rm, rv = rm0.copy(), rv0.copy()
    y, mean, invstd, _ = norm.batch_norm_train(x, gamma, beta, rm, rv, layout=layout, eps=EPS, z=z, relu=relu)
    dx, dgamma, dbeta, dz = norm.batch_norm_backward(x, dy, gamma, beta, mean, invstd, layout=layout, eps=EPS,
                                                     y=y if relu else None, relu=relu, has_z=residual)

    xs, dys = _split(x, layout), _split(dy, layout)
    zs = _split(z, layout) if residual else [None, None]
    count = x.size // c
    sums = [norm.sync_bn_sums(xr, rm0, layout=layout) for xr in xs]
    total = sums[0] + sums[1]  # the all-reduce
    ranks = []
    for xr, zr in zip(xs, zs, strict=True):
        rrm, rrv = rm0.copy(), rv0.copy()
        yr, mr, ir = norm.sync_bn_forward(xr, total, gamma, beta, rrm, rrv, count=count, layout=layout, eps=EPS, z=zr,
                                          relu=relu)
        ranks.append((yr, mr, ir, rrm, rrv))
    np.testing.assert_allclose(np.concatenate([r[0] for r in ranks]), y, rtol=1e-5, atol=1e-5)
    for _, mr, ir, rrm, rrv in ranks:
        np.testing.assert_allclose(mr, mean, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ir, invstd, rtol=1e-6)
        np.testing.assert_allclose(rrm, rm, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rrv, rv, rtol=1e-6)

    grads = [norm.sync_bn_grad_sums(xr, dyr, mr, ir, layout=layout, y=r[0] if relu else None, relu=relu,
                                    has_z=residual)
             for xr, dyr, r in zip(xs, dys, ranks, strict=True) for mr, ir in [(r[1], r[2])]]
    grad_total = grads[0][0] + grads[1][0]
    dxs = [norm.sync_bn_backward(xr, dyr, gamma, r[1], r[2], grad_total, count=count, layout=layout,
                                 y=r[0] if relu else None, relu=relu)
           for xr, dyr, r in zip(xs, dys, ranks, strict=True)]
    np.testing.assert_allclose(np.concatenate(dxs), dx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[0][1] + grads[1][1], dgamma, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[0][2] + grads[1][2], dbeta, rtol=1e-5, atol=1e-5)
    if residual:
        np.testing.assert_array_equal(np.concatenate([g[3] for g in grads]), dz)


def test_the_sums_are_taken_about_the_shift(rng):
    x = (rng.standard_normal((4, 3, 2, 2)) + 100).astype(np.float32)
    shift = np.full(3, 100, np.float32)
    sums = norm.sync_bn_sums(x, shift, layout="NCHW")
    d = x.astype(np.float64) - 100
    np.testing.assert_allclose(sums, np.stack([d.sum(axis=(0, 2, 3)), (d * d).sum(axis=(0, 2, 3))]), rtol=1e-6)


def test_refusals(rng):
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    c = np.ones(3, np.float32)
    sums = norm.sync_bn_sums(x, np.zeros(3, np.float32), layout="NCHW")
    with pytest.raises(ValueError, match="count: expected the elements per channel over all ranks, at least this"):
        norm.sync_bn_forward(x, sums, c, c, c.copy(), c.copy(), count=3, layout="NCHW")
    with pytest.raises(ValueError, match=r"sums: expected a float array of shape \(2, 3\)"):
        norm.sync_bn_forward(x, sums[:1], c, c, c.copy(), c.copy(), count=8, layout="NCHW")
    with pytest.raises(ValueError, match="y: the forward output is required with relu=True"):
        norm.sync_bn_grad_sums(x, x, c, c, layout="NCHW", relu=True)
    with pytest.raises(ValueError, match="accumulate: needs dgamma and dbeta"):
        norm.sync_bn_grad_sums(x, x, c, c, layout="NCHW", accumulate=True)
