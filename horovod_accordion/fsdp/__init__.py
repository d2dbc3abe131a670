"""Accordion for FSDP2's hybrid sharding (replicas × shards), without Horovod.

``AccordionState(mesh, compression=PowerSGD(4, 1), model=model, optimizer=optimizer)`` on a
model that ``fully_shard`` has wrapped on ``mesh["shard"]``: each rank's gradient shards are
averaged across the replicas with Accordion's compression. This package imports no Horovod.
"""
from horovod_accordion.core.compression import PowerSGD, Quantized, TopK
from horovod_accordion.hooks.fsdp_state import AccordionState
from horovod_accordion.core.policies import ErrorBudget, PhaseSchedule
from horovod_accordion.torch_common.compression import Compression

__all__ = ["AccordionState", "Compression", "ErrorBudget", "PhaseSchedule", "PowerSGD", "Quantized", "TopK"]
