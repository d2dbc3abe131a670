"""The only module of the torch adapter that talks to Horovod's collectives.

Every phase of a step is one fused collective (one per wire dtype), like torch's
``powerSGD_hook``, instead of one call per layer. Each call counts the bytes this
rank contributes, which is what the optimizer reports as traffic.
"""

import torch
import horovod.torch as hvd

from horovod_accordion.torch.compression import NoneCompressor

__all__ = ["Communicator"]

# Horovod 0.28.1 rejects bf16 allreduce, so bf16 tensors travel as fp32.
_WIRE_DTYPES = {torch.bfloat16: torch.float32}


class Communicator:
    def __init__(self, process_set=hvd.global_process_set, gradient_predivide_factor=1.0):
        self.process_set = process_set
        self.gradient_predivide_factor = gradient_predivide_factor
        self.bytes_sent = 0

    def size(self):
        return self.process_set.size()

    def allreduce_mean(self, tensors, name, compression=NoneCompressor):
        """Average each tensor over ranks with one allreduce per wire dtype."""
        outputs = [None] * len(tensors)
        for wire_dtype, indices in _group_by_wire_dtype(tensors).items():
            flat = torch.cat([tensors[i].reshape(-1).to(wire_dtype) for i in indices])
            wire, ctx = compression.compress(flat)
            self.bytes_sent += wire.numel() * wire.element_size()
            # Pre/post-scaling splits the average, as Horovod's optimizer does, so that
            # fp16 sums of many workers do not overflow (horovod#1699).
            reduced = hvd.allreduce(
                wire, name=f"{name}.{wire_dtype}", op=hvd.Average,
                prescale_factor=1.0 / self.gradient_predivide_factor,
                postscale_factor=self.gradient_predivide_factor, process_set=self.process_set)
            flat = compression.decompress(reduced, ctx)
            for i, chunk in zip(indices, flat.split([tensors[i].numel() for i in indices])):
                outputs[i] = chunk.view(tensors[i].shape).to(tensors[i].dtype)
        return outputs

    def allgather(self, tensor, name):
        """Concatenate every rank's 1-D ``tensor``; returns shape (size, len)."""
        self.bytes_sent += tensor.numel() * tensor.element_size()
        gathered = hvd.allgather(tensor, name=name, process_set=self.process_set)
        return gathered.view(self.size(), -1)

    def take_bytes_sent(self):
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent


def _group_by_wire_dtype(tensors):
    groups = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault(_WIRE_DTYPES.get(tensor.dtype, tensor.dtype), []).append(i)
    return groups
