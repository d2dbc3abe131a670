"""The examples' datasets, all without a download at run time.

- ``digits``: scikit-learn's 8×8 digits, shipped with scikit-learn (the demo's).
- ``mnist1d``: MNIST-1D (Greydanus 2020), generated procedurally by the ``mnist1d``
  package: 4000 train and 1000 test sequences of length 40, 10 classes; kept under
  ``$HOROVOD_ACCORDION_CACHE/datasets`` (``~/.cache/horovod_accordion``) once generated.
- ``cifar10``: CIFAR-10 from ``--data-dir``, the "python version" folder
  (``cifar-10-batches-py``) that clusters keep on shared storage; nothing is fetched.

Each rank trains on its own shard, as a DistributedSampler would give it.
"""
import os
import pickle
import tempfile
import zipfile

import numpy as np

from horovod_accordion.tools import cache_folder

DATASETS = ("digits", "mnist1d", "cifar10")


def load(name, data_dir=None):
    """(x_train, y_train, x_test, y_test): float32 features, int64 labels."""
    if name == "digits":
        return _digits()
    if name == "mnist1d":
        return _mnist1d()
    if name == "cifar10":
        return _cifar10(data_dir)
    raise ValueError(f"unknown dataset {name!r}; choose one of {DATASETS}")


def shard(arrays, rank, size):
    """This rank's share of the training set; the test set is whole on every rank."""
    x_train, y_train, x_test, y_test = arrays
    return x_train[rank::size], y_train[rank::size], x_test, y_test


def digits_shards(rank, size, test_fraction=0.2, seed=0):
    return shard(_digits(test_fraction, seed), rank, size)


def _digits(test_fraction=0.2, seed=0):
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(len(x) * (1 - test_fraction))
    return x[:split], y[:split], x[split:], y[split:]


MNIST1D_ARRAYS = ("x", "y", "x_test", "y_test")


def _mnist1d():
    """Generated from a fixed seed, never downloaded; kept in the cache folder once generated,
    since generating it is a noticeable part of a short run's start on every rank."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        name = f"mnist1d-{version('mnist1d')}.npz"
    except PackageNotFoundError:
        raise ModuleNotFoundError("No module named 'mnist1d': pip install the repository's 'examples' extra") from None
    path = cache_folder() / "datasets" / name
    try:
        with np.load(path) as kept:
            data = {key: kept[key] for key in MNIST1D_ARRAYS}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # not kept yet, or unreadable: made again
        from mnist1d.data import get_dataset_args, make_dataset
        made = make_dataset(get_dataset_args())
        data = {key: made[key] for key in MNIST1D_ARRAYS}
        _keep(path, data)
    return (data["x"].astype(np.float32)[:, None, :], data["y"].astype(np.int64),
            data["x_test"].astype(np.float32)[:, None, :], data["y_test"].astype(np.int64))


def _keep(path, arrays):
    """Write ``arrays`` to ``path`` whole or not at all: ranks (of one host or of several sharing a
    home folder) may write it at once, each to its own file, and a rename is atomic. A folder that
    can't be written keeps nothing: the data were made, and the run goes on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".npz")
    except OSError:
        return
    try:
        with os.fdopen(descriptor, "wb") as stream:
            np.savez(stream, **arrays)
        os.replace(partial, path)
    except OSError:
        pass
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _cifar10(data_dir):
    if data_dir is None:
        raise ValueError("cifar10 needs --data-dir: the folder holding cifar-10-batches-py (nothing is downloaded)")
    folder = os.path.join(data_dir, "cifar-10-batches-py")
    if not os.path.isdir(folder):
        folder = data_dir
    files = [os.path.join(folder, f"data_batch_{k}") for k in range(1, 6)] + [os.path.join(folder, "test_batch")]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise FileNotFoundError(f"CIFAR-10 batches not found: {missing[0]} (extract cifar-10-python.tar.gz "
                                f"into --data-dir)")
    parts = []
    for path in files:
        with open(path, "rb") as stream:
            batch = pickle.load(stream, encoding="bytes")
        parts.append((batch[b"data"].reshape(-1, 3, 32, 32), np.asarray(batch[b"labels"], np.int64)))
    x_train = np.concatenate([x for x, _ in parts[:5]]).astype(np.float32) / 255.0
    y_train = np.concatenate([y for _, y in parts[:5]])
    x_test, y_test = parts[5][0].astype(np.float32) / 255.0, parts[5][1]
    mean = x_train.mean(axis=(0, 2, 3), keepdims=True)
    std = x_train.std(axis=(0, 2, 3), keepdims=True)
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test
