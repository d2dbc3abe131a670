"""The bucket layout: DDP's, from the parameters' sizes alone."""
import pytest

from horovod_accordion.core.buckets import assign_buckets

MB = 2 ** 20


def test_buckets_fill_from_the_last_layer_with_a_small_first_one():
    sizes = [3 * MB, 10 * MB, 10 * MB, 10 * MB, 0.5 * MB, 0.2 * MB]
    # The first bucket closes at 1 MB, the others at 25 MB; a layer is never split.
    assert assign_buckets(sizes, 25) == [[4, 5], [2, 3], [0, 1]]


def test_a_layer_larger_than_the_cap_is_a_bucket_of_its_own():
    assert assign_buckets([1, 40 * MB, 1], 25) == [[2], [1], [0]]


def test_none_is_one_bucket_and_every_layer_is_in_exactly_one():
    sizes = [5 * MB] * 7
    assert assign_buckets(sizes, None) == [list(range(7))]
    assert sorted(layer for bucket in assign_buckets(sizes, 12) for layer in bucket) == list(range(7))
    assert assign_buckets([], 25) == []


@pytest.mark.parametrize("cap", [0, -1, float("nan")])
def test_a_cap_that_is_not_positive_raises(cap):
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        assign_buckets([1], cap)
