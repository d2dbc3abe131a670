"""Accordion for PyTorch: ``import horovod_accordion.torch as hvd`` in place of ``horovod.torch``.

Everything of ``horovod.torch`` is re-exported; ``DistributedOptimizer``, ``Compression``
and ``broadcast_optimizer_state`` are replaced by Accordion's, with the same arguments and
defaults.
"""
from horovod.torch import *  # noqa: F401,F403 - the one-import-line drop-in
from horovod.torch import init, rank, size, local_rank, Average, Sum  # noqa: F401

from horovod_accordion.torch.compression import Compression, FP16Compressor, NoneCompressor  # noqa: F401
from horovod_accordion.torch.optimizer import DistributedOptimizer  # noqa: F401
from horovod_accordion.torch.optimizer_state import broadcast_optimizer_state  # noqa: F401
from horovod_accordion.core.batch import BatchSwitch  # noqa: F401
from horovod_accordion.core.policies import ErrorBudget, PhaseSchedule  # noqa: F401
import horovod_accordion.torch.elastic as elastic  # noqa: E402,F401 - hvd.elastic, with our state handler

import horovod.torch as _horovod_torch  # noqa: E402


def __getattr__(name):
    """Every other name of ``horovod.torch``, the private ones that ``import *`` skips included
    (``_executing_eagerly``, ``_DistributedOptimizer``...): code written for Horovod reads them."""
    return getattr(_horovod_torch, name)
