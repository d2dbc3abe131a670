"""Accordion for TensorFlow 2: ``import horovod_accordion.tensorflow as hvd`` in place of
``horovod.tensorflow``. Everything of ``horovod.tensorflow`` is re-exported;
``DistributedGradientTape``, ``DistributedOptimizer`` and ``Compression`` are Accordion's.
"""
from horovod.tensorflow import *  # noqa: F401,F403 - the one-import-line drop-in
from horovod.tensorflow import init, rank, size, local_rank, Average, Sum  # noqa: F401

from horovod_accordion.tensorflow.compression import Compression  # noqa: F401
from horovod_accordion.tensorflow.optimizer import (  # noqa: F401 - horovod.tensorflow's signature
    tensorflow_distributed_optimizer as DistributedOptimizer)
from horovod_accordion.tensorflow.state import AccordionState  # noqa: F401
from horovod_accordion.tensorflow.tape import DistributedGradientTape  # noqa: F401
from horovod_accordion.core.batch import BatchSwitch  # noqa: F401
from horovod_accordion.core.policies import ErrorBudget, PhaseSchedule  # noqa: F401

import horovod.tensorflow as _horovod_tensorflow  # noqa: E402


def __getattr__(name):
    """Every other name of ``horovod.tensorflow``, the private ones that ``import *`` skips included
    (``_executing_eagerly``, ``_DistributedOptimizer``...): code written for Horovod reads them."""
    return getattr(_horovod_tensorflow, name)
