"""Accordion for tf_keras: ``import horovod_accordion.keras as hvd`` in place of
``horovod.tensorflow.keras``. Needs Keras 2: set ``TF_USE_LEGACY_KERAS=1``."""
import os

if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
    raise ImportError(
        "horovod_accordion.keras needs Keras 2 (tf_keras): Keras 3, which TensorFlow >= 2.16 uses by "
        "default, breaks horovod.tensorflow.keras (horovod#4290). Set TF_USE_LEGACY_KERAS=1 before "
        "importing TensorFlow and pip install tf-keras; or, with Keras 3, import horovod_accordion.keras3.")

from horovod.tensorflow.keras import *  # noqa: F401,F403,E402 - the one-import-line drop-in
from horovod.tensorflow.keras import init, rank, size, Average, Sum  # noqa: F401,E402

from horovod_accordion.keras import callbacks  # noqa: F401,E402 - Horovod's callbacks and AccordionCallback
from horovod_accordion.keras.callbacks import AccordionCallback  # noqa: F401,E402
from horovod_accordion.tensorflow.compression import Compression  # noqa: F401,E402
from horovod_accordion.tensorflow.optimizer import DistributedOptimizer, load_model  # noqa: F401,E402
from horovod_accordion.core.batch import BatchSwitch  # noqa: F401,E402
from horovod_accordion.core.policies import ErrorBudget, PhaseSchedule  # noqa: F401,E402
import horovod_accordion.keras.elastic as elastic  # noqa: F401,E402 - hvd.elastic, with Accordion's KerasState

import horovod.tensorflow.keras as _horovod_keras  # noqa: E402


def __getattr__(name):
    """Every other name of ``horovod.tensorflow.keras``, the private ones that ``import *`` skips
    included: code written for Horovod reads them."""
    return getattr(_horovod_keras, name)
