"""The torch backend of ``horovod_accordion.reducers``: tensor ops, state, collectives.

This module and ``optimizer.py`` are the only torch code; the compression maths are in
the framework-agnostic reducers. Compressed layers are computed and sent in fp32;
bf16 tensors travel as fp32 because Horovod 0.28.1 rejects bf16 allreduce.
"""

import torch
import horovod.torch as hvd

from horovod_accordion.compression import kept_count
from horovod_accordion.torch.compression import NoneCompressor

__all__ = ["TorchOps", "Level"]

_WIRE_DTYPES = {torch.bfloat16: torch.float32}


class Level:
    """A layer's current level (rank or kept fraction), shared by reference."""

    def __init__(self, value):
        self.value = value


class _Pending:
    """A started Horovod collective and what to do with its output."""

    def __init__(self, handle, finish):
        self.handle, self.finish = handle, finish

    def wait(self):
        return self.finish(hvd.synchronize(self.handle))


class TorchOps:
    def __init__(self, process_set=hvd.global_process_set, gradient_predivide_factor=1.0, device="cpu"):
        self.process_set = process_set
        self.device = device  # where the parameters, hence the compression state, live
        self.gradient_predivide_factor = gradient_predivide_factor
        self.bytes_sent = 0

    # State that survives a step.
    def state(self, array, name):
        return torch.from_numpy(array).to(device=self.device, dtype=torch.float32)

    def read(self, state):
        return state

    def assign(self, state, value):
        state.copy_(value)

    def zero(self, state):
        state.zero_()

    def level(self, value, name):
        return Level(value)

    def set_level(self, level, value):
        level.value = value

    def leading_columns(self, q, rank):
        return q[:, :rank.value]

    def assign_leading_columns(self, q, value):
        q[:, :value.shape[1]].copy_(value)

    # Tensor maths.
    def as_matrix(self, grad, shape):
        return grad.reshape(shape).to(torch.float32)

    def like(self, value, grad):
        return value.reshape(grad.shape).to(grad.dtype)

    def matmul(self, a, b):
        return a @ b

    def transpose(self, a):
        return a.T

    def orthogonalize(self, p):
        """Householder QR: stable, and a zero P gives out = 0 rather than NaN."""
        return torch.linalg.qr(p).Q

    def kept_count(self, fraction, m):
        return kept_count(fraction.value, m.numel())

    def top_abs_indices(self, m, k):
        return torch.topk(m.abs(), k, sorted=False).indices.to(torch.int32)

    def gather(self, m, indices):
        return m[indices.long()]

    def zeroed_at(self, m, indices):
        return m.index_fill(0, indices.long(), 0)

    def all_finite(self, *tensors):
        """Whether every entry of the tensors (``None`` skipped) is finite, as a device flag (no
        host sync). One read per tensor: a NaN or inf makes the sum non-finite; so does a sum
        beyond fp32's range, which only values that are useless as gradients reach."""
        flags = [torch.isfinite(t.sum()) for t in tensors if t is not None]
        return flags[0] if len(flags) == 1 else torch.stack(flags).all()

    def finite_or(self, value, fallback):
        """``value`` if all of it is finite, else ``fallback``."""
        return torch.where(self.all_finite(value), value, fallback)

    def assign_if_finite(self, state, value, also=None):
        """``state = value`` if all of ``value`` (and of ``also``) is finite, written in place."""
        torch.where(self.all_finite(value, also), value, state, out=state)

    def add_to(self, total, value):
        total.add_(value)

    def zeros_like(self, value):
        return torch.zeros_like(value)

    # Branches of the TopK wire format: plain Python here, tf.cond in TensorFlow.
    def cond(self, flag, if_true, if_false):
        return if_true() if flag else if_false()

    def constant_flag(self, value):
        return value

    def any_flag(self, flags):
        """Whether any of ``flags`` may be true: a collective that none needs is skipped."""
        return any(flags)

    def zero_count(self):
        return 0

    def empty_words(self):
        return torch.zeros(0, dtype=torch.int32, device=self.device)

    def empty_floats(self):
        return torch.zeros(0, dtype=torch.float32, device=self.device)

    def pack_indices(self, indices, dtype):
        """Indices as int32 words: int16 ones two to a word (the last padded with 0)."""
        if dtype == "int32":
            return indices
        narrow = indices.to(torch.int16)
        if narrow.numel() % 2:
            narrow = torch.cat([narrow, narrow.new_zeros(1)])
        return narrow.view(torch.int32)

    def unpack_indices(self, words, count, dtype):
        if dtype == "int32":
            return words
        return words.contiguous().view(torch.int16)[:, :count]

    def float_bits(self, values):
        return values.view(torch.int32)

    def bits_float(self, bits):
        return bits.reshape(-1).view(torch.float32)

    def concat(self, tensors):
        return torch.cat(tensors)

    def columns(self, matrix, start, stop):
        return matrix[:, start:stop]

    def scatter_mean(self, like, indices, values):
        total = torch.zeros_like(like).index_add_(0, indices.reshape(-1).long(), values)
        return total / indices.shape[0]

    def squared_norms(self, tensors):
        return torch.stack([t.double().pow(2).sum() for t in tensors])

    def non_finite_flags(self, tensors):
        return torch.stack([~self.all_finite(t) for t in tensors]).to(torch.float32)

    def to_floats(self, tensor):
        return tensor.tolist()

    def from_floats(self, values):
        return torch.tensor(values, dtype=torch.float64, device=self.device)

    # Collectives: one fused call per phase; each counts the bytes this rank contributes.
    def size(self):
        return self.process_set.size()

    def rank(self):
        return self.process_set.rank()

    def wire_dtype(self, tensor):
        return str(_WIRE_DTYPES.get(tensor.dtype, tensor.dtype)).replace("torch.", "")

    def flat_concat(self, tensors, wire_dtype):
        return torch.cat([t.reshape(-1).to(getattr(torch, wire_dtype)) for t in tensors])

    def split_like(self, flat, tensors):
        chunks = flat.split([t.numel() for t in tensors])
        return [chunk.view(t.shape).to(t.dtype) for chunk, t in zip(chunks, tensors)]

    def start_allreduce_mean(self, flat, name, compression=None):
        """Start Horovod's asynchronous allreduce; the result's ``wait()`` gives the average."""
        compression = compression or NoneCompressor
        wire, ctx = compression.compress(flat)
        self.bytes_sent += wire.numel() * wire.element_size()
        # Pre/post-scaling splits the average, as Horovod's optimizer does, so that fp16
        # sums of many workers do not overflow (horovod#1699).
        # In place, as Horovod's optimizer does: ``flat`` is always a buffer of our own.
        handle = hvd.allreduce_async_(wire, name=name, op=hvd.Average,
                                      prescale_factor=1.0 / self.gradient_predivide_factor,
                                      postscale_factor=self.gradient_predivide_factor, process_set=self.process_set)
        return _Pending(handle, lambda reduced: compression.decompress(reduced, ctx))

    def start_allgather(self, flat, name):
        """Start gathering every rank's 1-D ``flat``; ``wait()`` gives them as shape (size, len)."""
        self.bytes_sent += flat.numel() * flat.element_size()
        handle = hvd.allgather_async(flat, name=name, process_set=self.process_set)
        return _Pending(handle, lambda gathered: gathered.view(self.size(), -1))

    def take_bytes_sent(self):
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    # Checkpoints.
    def export_state(self, groups):
        return {group: {i: (v.value if isinstance(v, Level) else v.clone()) for i, v in entries.items()}
                for group, entries in groups.items()}

    def import_state(self, groups, saved):
        for group, entries in groups.items():
            for i, holder in entries.items():
                value = saved[group][i]
                if isinstance(holder, Level):
                    holder.value = value
                else:
                    holder.copy_(value)
