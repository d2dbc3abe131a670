"""Accordion for Keras 3 on the TensorFlow backend, TensorFlow 2.21's default Keras:
``import horovod_accordion.keras3 as hvd``.

Horovod's own Keras integration fails under Keras 3 (horovod#4290), so this module does not
re-export it: it has Horovod's basics and collectives (``init``, ``rank``, ``allreduce``, ...), Accordion's
``DistributedOptimizer``, ``AccordionCallback`` and ``BroadcastGlobalVariablesCallback``, and a
``load_model`` for ``.keras`` files. Gradients go through the same ``AccordionState`` as on
the tf_keras and TensorFlow paths. For tf_keras (Keras 2), use ``horovod_accordion.keras``.
"""
from horovod.tensorflow import (  # noqa: F401 - Horovod's basics and collectives, as horovod.tensorflow.keras has them
    init, shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank, cross_size,
    mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built, ddl_built, ccl_built,
    cuda_built, rocm_built, start_timeline, stop_timeline, Average, Sum, Adasum, ProcessSet, global_process_set,
    add_process_set, remove_process_set, allreduce, grouped_allreduce, allgather, broadcast, broadcast_variables,
    allgather_object, broadcast_object)

from horovod_accordion.keras3.callbacks import AccordionCallback, BroadcastGlobalVariablesCallback  # noqa: F401
from horovod_accordion.keras3.optimizer import DistributedOptimizer, load_model  # noqa: F401
from horovod_accordion.tensorflow.compression import Compression  # noqa: F401
from horovod_accordion.core.batch import BatchSwitch  # noqa: F401
from horovod_accordion.core.policies import ErrorBudget, PhaseSchedule  # noqa: F401
