"""The demo's data, for every framework: noisy clusters around fixed random centres, made with
numpy alone, so that no example needs a download or a package outside its extra."""
import numpy as np

CLASSES, FEATURES, SAMPLES = 10, 32, 4096


def synthetic_shards(rank, size, seed=0):
    """(x_train, y_train, x_test, y_test), float32 features and int64 labels: this rank's share
    of the training set, as a DistributedSampler would give it, and the whole test set."""
    generator = np.random.default_rng(seed)
    centres = 1.5 * generator.standard_normal((CLASSES, FEATURES))
    labels = generator.integers(CLASSES, size=SAMPLES)
    inputs = (centres[labels] + 2 * generator.standard_normal((SAMPLES, FEATURES))).astype(np.float32)
    split = SAMPLES * 3 // 4
    return inputs[:split][rank::size], labels[:split][rank::size], inputs[split:], labels[split:]
