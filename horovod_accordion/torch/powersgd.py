"""PowerSGD with a switchable rank, batched over all layers (Vogels et al. 2019, Alg. 1).

Per step, for every compressed layer (M viewed as n×m, Q of shape m×r)::

    M = grad + memory                 error feedback
    P = M Q;     allreduce(P)         one fused allreduce for all layers (+ the 1-D tensors)
    P = orthogonalize(P)
    Q = Mᵀ P;    allreduce(Q)         one fused allreduce for all layers
    out = P Qᵀ;  memory = M − out

Two collectives per step, whatever the number of layers. The authors' release made
two blocking calls per layer, which is why their PowerSGD speedups were 1.03–1.14×.
"""

import torch

from horovod_accordion.compression import clamped_rank, matrix_shape, powersgd_compresses

__all__ = ["PowerSGDReducer"]


def orthogonalize(p):
    """An orthonormal basis of P's columns. Householder QR is stable and never divides
    by a zero column, so a zero gradient gives out = 0 instead of NaN."""
    return torch.linalg.qr(p).Q


class PowerSGDReducer:
    """Holds every piece of PowerSGD state, one entry per compressed layer:

    - ``memory``: the error-feedback buffer, M − out. Kept across rank switches, as the
      authors do, so no gradient signal is lost when the level changes.
    - ``q``: the warm-started right factor. On a rank switch the old columns are kept
      and missing ones drawn, so most of the warm start survives.
    - ``generators``: one seeded generator per layer, identical on every rank, so every
      rank draws the same Q columns without any communication.
    """

    def __init__(self, shapes, config, communicator):
        self.config = config
        self.communicator = communicator
        self.shapes = [tuple(s) for s in shapes]
        self.compressed = [i for i, s in enumerate(self.shapes) if powersgd_compresses(s, config)]
        compressed = set(self.compressed)
        self.uncompressed = [i for i in range(len(self.shapes)) if i not in compressed]
        self.ranks = {i: clamped_rank(config.low_rank, self.shapes[i]) for i in self.compressed}
        self.memory = {}
        self.q = {}
        self.generators = {i: torch.Generator().manual_seed(config.seed * 1_000_003 + i)
                           for i in self.compressed}

    def set_levels(self, levels):
        for i in self.compressed:
            self.ranks[i] = clamped_rank(levels[i], self.shapes[i])

    def reduce(self, grads):
        """Average ``grads`` (one tensor per layer, in order) over ranks; returns new tensors."""
        outputs = [None] * len(grads)
        matrices, ps = [], []
        for i in self.compressed:
            m = grads[i].reshape(matrix_shape(self.shapes[i])).to(_compute_dtype(grads[i]))
            if self.config.use_error_feedback and i in self.memory:
                m = m + self.memory[i]
            matrices.append(m)
            ps.append(m @ self._query(i, m))
        dense = [grads[i] for i in self.uncompressed]
        reduced = self.communicator.allreduce_mean(ps + dense, "accordion.powersgd.P")
        ps = [orthogonalize(p) for p in reduced[:len(ps)]]
        for i, value in zip(self.uncompressed, reduced[len(ps):]):
            outputs[i] = value
        qs = self.communicator.allreduce_mean(
            [m.T @ p for m, p in zip(matrices, ps)], "accordion.powersgd.Q")
        for i, m, p, q in zip(self.compressed, matrices, ps, qs):
            approximation = p @ q.T
            if self.config.use_error_feedback:
                self.memory[i] = m - approximation
            if self.config.warm_start:
                self.q[i] = q
            else:
                del self.q[i]
            outputs[i] = approximation.view(self.shapes[i]).to(grads[i].dtype)
        return outputs

    def _query(self, i, m):
        """The Q for this step, reshaped to the layer's current rank."""
        rank = self.ranks[i]
        q = self.q.get(i)
        if q is None:
            q = self._random_columns(i, m.shape[1], rank, m.dtype)
        elif q.shape[1] > rank:
            q = q[:, :rank]
        elif q.shape[1] < rank:
            q = torch.cat([q, self._random_columns(i, m.shape[1], rank - q.shape[1], m.dtype)], dim=1)
        self.q[i] = q
        return q

    def _random_columns(self, i, rows, columns, dtype):
        return torch.randn(rows, columns, generator=self.generators[i], dtype=dtype)

    def state_dict(self):
        return {"memory": dict(self.memory), "q": dict(self.q), "ranks": dict(self.ranks),
                "generators": {i: g.get_state() for i, g in self.generators.items()}}

    def load_state_dict(self, state):
        self.memory = dict(state["memory"])
        self.q = dict(state["q"])
        self.ranks = dict(state["ranks"])
        for i, generator_state in state["generators"].items():
            self.generators[i].set_state(generator_state)


def _compute_dtype(tensor):
    """fp64 stays fp64; everything else is compressed in fp32 (QR needs it for fp16/bf16)."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32
