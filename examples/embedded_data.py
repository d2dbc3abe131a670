"""The demo's dataset: scikit-learn's 8x8 digits, shipped with the package, no download.

Each rank gets its own shard, as a DistributedSampler would give it.
"""
import numpy as np


def digits_shards(rank, size, test_fraction=0.2, seed=0):
    """(x_train, y_train, x_test, y_test) for this rank: float32 features in [0, 1], int labels."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(len(x) * (1 - test_fraction))
    return x[rank:split:size], y[rank:split:size], x[split:], y[split:]
