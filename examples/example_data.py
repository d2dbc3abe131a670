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
import pathlib
import pickle

import numpy as np

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


def _mnist1d():
    """Generated from a fixed seed, never downloaded, and kept in the cache folder: generating it
    took 3.4 s of each rank's start (the study starts two ranks per run), reading it back 0.01 s."""
    from importlib.metadata import version
    cache = pathlib.Path(os.environ.get("HOROVOD_ACCORDION_CACHE", pathlib.Path.home() / ".cache" / "horovod_accordion"))
    path = cache / "datasets" / f"mnist1d-{version('mnist1d')}.npz"
    if not path.is_file():
        from mnist1d.data import get_dataset_args, make_dataset
        data = make_dataset(get_dataset_args())
        path.parent.mkdir(parents=True, exist_ok=True)
        # Ranks of one job may write it at once: each writes its own file, and a rename is atomic.
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npz")
        np.savez(partial, **{key: data[key] for key in ("x", "y", "x_test", "y_test")})
        os.replace(partial, path)
    with np.load(path) as data:
        return (data["x"].astype(np.float32)[:, None, :], data["y"].astype(np.int64),
                data["x_test"].astype(np.float32)[:, None, :], data["y_test"].astype(np.int64))


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
