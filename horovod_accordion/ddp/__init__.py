"""Accordion for torch ``DistributedDataParallel``, without Horovod.

``model.register_comm_hook(AccordionState(compression=PowerSGD(2, 1)), accordion_hook)``.
This package imports no Horovod: it runs wherever torch.distributed does.
"""
from horovod_accordion.core.compression import PowerSGD, Quantized, TopK
from horovod_accordion.hooks.ddp_state import AccordionState, accordion_hook
from horovod_accordion.core.policies import ErrorBudget, PhaseSchedule
from horovod_accordion.torch_common.compression import Compression

__all__ = ["AccordionState", "Compression", "ErrorBudget", "PhaseSchedule", "PowerSGD", "Quantized", "TopK",
           "accordion_hook"]
