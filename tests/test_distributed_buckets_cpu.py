"""Gradient all-reduce bucket plans and the offsets inside a bucket's flat buffer
(resnet_native.distributed.buckets)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resnet_native.distributed import bucket_offsets, plan_buckets
from resnet_native.distributed.buckets import ALIGN


def test_reverse_order_and_bucket_limit():
    sizes = [100, 300, 200, 256, 1000, 50]  # aligned: 256, 512, 256, 256, 1024, 256
    assert plan_buckets(sizes, 768) == [[5], [4], [3, 2], [1, 0]]  # 1024 alone: larger than a bucket
    assert plan_buckets(sizes, 768, reverse=False) == [[0, 1], [2, 3], [4], [5]]
    assert plan_buckets(sizes, 10**9) == [[5, 4, 3, 2, 1, 0]]
    assert plan_buckets(sizes, 1100, align=1) == [[5, 4], [3, 2, 1, 0]]  # raw sizes: 1050, 856
    assert plan_buckets([], 1024) == []


def test_offsets_are_aligned_and_packed():
    sizes = [100, 300, 200, 256]
    assert bucket_offsets(sizes, [3, 2, 1, 0]) == ([0, 256, 512, 1024], 1280)
    assert bucket_offsets(sizes, [1, 0], align=4) == ([0, 300], 400)
    assert bucket_offsets(sizes, []) == ([], 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(1, 8192), st.booleans(),
       st.sampled_from([1, 4, 256]))
def test_every_parameter_once_in_gradient_order_within_the_limit(sizes, bucket_bytes, reverse, align):
    buckets = plan_buckets(sizes, bucket_bytes, reverse=reverse, align=align)
    flat = [i for bucket in buckets for i in bucket]
    assert flat == (list(reversed(range(len(sizes)))) if reverse else list(range(len(sizes))))
    for bucket in buckets:
        offsets, total = bucket_offsets(sizes, bucket, align=align)
        assert all(o % align == 0 for o in offsets) and total % align == 0
        assert all(offsets[k] + sizes[i] <= (offsets[k + 1] if k + 1 < len(bucket) else total)
                   for k, i in enumerate(bucket))  # no overlap, all inside the buffer
        assert total <= bucket_bytes or len(bucket) == 1  # only a lone oversized parameter exceeds it
    # Greedy: a bucket closes only when its successor's first parameter would not fit.
    for bucket, following in zip(buckets, buckets[1:], strict=False):
        total = bucket_offsets(sizes, bucket, align=align)[1]
        assert total + bucket_offsets(sizes, following[:1], align=align)[1] > bucket_bytes


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"sizes_bytes\[1\]: expected a number of bytes"):
        plan_buckets([4, -1], 1024)
    with pytest.raises(TypeError, match="sizes_bytes: expected a sequence"):
        plan_buckets(b"\x04", 1024)
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets([4], 0)
    with pytest.raises(TypeError, match="reverse: expected a bool"):
        plan_buckets([4], 16, reverse=None)
    with pytest.raises(ValueError, match="bucket index"):
        bucket_offsets([4], [1])
    assert ALIGN == 256
