"""TopK sparsification with a switchable kept fraction and error feedback.

Per step, for every compressed layer::

    M = grad + residual                     error feedback (missing from the authors' release)
    idx = the k largest |M|;  val = M[idx]
    residual = M with M[idx] set to 0
    out = (Σ_workers scatter(idx_w, val_w)) / W       averaged (the release summed)

The values (as fp32 bits) and indices (int32) of all layers go into one int32 buffer
and one allgather; the uncompressed 1-D tensors go into one allreduce.
"""

import torch

from horovod_accordion.compression import is_matrix, kept_count

__all__ = ["TopKReducer"]


class TopKReducer:
    """State: ``residual``, the unsent part of each compressed layer's gradient, and
    ``fractions``, each layer's current level."""

    def __init__(self, shapes, config, communicator):
        self.config = config
        self.communicator = communicator
        self.shapes = [tuple(s) for s in shapes]
        self.compressed = [i for i, s in enumerate(self.shapes) if is_matrix(s)]
        compressed = set(self.compressed)
        self.uncompressed = [i for i in range(len(self.shapes)) if i not in compressed]
        self.fractions = {i: config.low_fraction for i in self.compressed}
        self.residual = {}

    def set_levels(self, levels):
        for i in self.compressed:
            self.fractions[i] = levels[i]

    def reduce(self, grads):
        outputs = [None] * len(grads)
        flats, counts, payload = [], [], []
        for i in self.compressed:
            m = grads[i].reshape(-1).to(torch.float32)
            if self.config.use_error_feedback and i in self.residual:
                m = m + self.residual[i]
            k = kept_count(self.fractions[i], m.numel())
            indices = torch.topk(m.abs(), k, sorted=False).indices
            if self.config.use_error_feedback:
                residual = m.clone()
                residual[indices] = 0
                self.residual[i] = residual
            flats.append(m)
            counts.append(k)
            payload += [m[indices].view(torch.int32), indices.to(torch.int32)]
        if payload:
            gathered = self.communicator.allgather(torch.cat(payload), "accordion.topk")
            offset = 0
            for i, m, k in zip(self.compressed, flats, counts):
                values = gathered[:, offset:offset + k].reshape(-1).view(torch.float32)
                indices = gathered[:, offset + k:offset + 2 * k].reshape(-1).to(torch.int64)
                offset += 2 * k
                total = torch.zeros_like(m).index_add_(0, indices, values)
                outputs[i] = (total / gathered.shape[0]).view(self.shapes[i]).to(grads[i].dtype)
        dense = self.communicator.allreduce_mean([grads[i] for i in self.uncompressed], "accordion.topk.dense")
        for i, value in zip(self.uncompressed, dense):
            outputs[i] = value
        return outputs

    def state_dict(self):
        return {"residual": dict(self.residual), "fractions": dict(self.fractions)}

    def load_state_dict(self, state):
        self.residual = dict(state["residual"])
        self.fractions = dict(state["fractions"])
