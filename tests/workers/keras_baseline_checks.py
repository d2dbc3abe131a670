"""Every compression kind, the baselines included, closes windows in a Keras fit: a launch of
its own, since its twelve fits would take the shared TF launch past its timeout."""
from tests.workers.tf_checks import make_keras_model, rank_dataset, setup, weights_identical_across_ranks  # noqa: F401

import tf_keras

import horovod_accordion.keras as hvd_keras
import horovod_accordion.tensorflow as hvd

EVERY_COMPRESSION = {
    "none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
    "powersgd static": hvd.Compression.powersgd(2, min_compression_rate=0),
    "powersgd adaptive": hvd.Compression.powersgd(2, 1, min_compression_rate=0),
    "topk static": hvd.Compression.topk(0.1), "topk adaptive": hvd.Compression.topk(0.5, 0.1),
}


def check_every_compression_closes_windows_in_keras_fit_by_epoch_and_by_steps():
    """The baselines of every comparison run the same fit with AccordionCallback; only the
    adaptive kinds record checks."""
    x, y = rank_dataset(64)
    for label, compression in EVERY_COMPRESSION.items():
        for window_steps in (None, 2):
            model = make_keras_model()
            optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.SGD(0.05), compression=compression,
                                                       interval=1, window_steps=window_steps)
            model.compile(optimizer=optimizer,
                          loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                      callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                                 hvd_keras.AccordionCallback()])
            assert weights_identical_across_ranks(model), label
            if label in ("none", "fp16"):  # Horovod's own optimizer, which the callback leaves alone
                assert not hasattr(optimizer, "accordion_state"), label
                continue
            checks = [c for c in optimizer.accordion_state.stats()["checks"] if c["event"] == "check"]
            adaptive = "adaptive" in label
            assert len(checks) == ((2 if window_steps is None else 4) if adaptive else 0), (label, window_steps)

