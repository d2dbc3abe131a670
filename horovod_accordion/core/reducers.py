"""PowerSGD, TopK, quantized and dense reducers, written once for every framework.

A reducer averages a list of gradients over ranks at each layer's current level. The
maths live here; the framework adapters supply two backends, so torch and TensorFlow run the
same algorithm and a fix is made once: the tensor maths and the state that survives a step
(``horovod_accordion/torch_common/tensors.py``, ``horovod_accordion/tensorflow/tensors.py``), and the
collectives over them (``horovod_accordion.core.collectives``: ``torch/ops.py`` for Horovod,
``hooks/ops.py`` for torch.distributed, ``tensorflow/ops.py`` for Horovod's TF ops).
"""

import warnings
from typing import Sequence

import numpy as np

from horovod_accordion.core.arguments import under_elastic
from horovod_accordion.core.backends import CollectiveOps, TensorOps
from horovod_accordion.core.compression import (PowerSGD, Quantized, TopK, clamped_rank, index_bytes,
                                                index_dtype, is_matrix, kept_count, packed_index_words, padded_length,
                                                powersgd_compresses, quantized_bytes, sparse_is_cheaper)

__all__ = ["BucketReduction", "DenseReducer", "PowerSGDReducer", "QuantizedReducer", "TopKReducer", "initial_query",
           "make_reducer",
           "query_stream", "split_state", "warn_if_nothing_is_compressed"]


def make_reducer(compression, shapes, tensors: TensorOps, collectives: CollectiveOps, plain_compressor):
    """The reducer for ``compression`` and its (ℓ_low, ℓ_high), on the backends ``tensors`` and
    ``collectives``; ``plain_compressor`` is the base class of the framework's plain compressors
    (none, fp16): Horovod's ``Compressor``, or ``torch_common.compression.PlainCompressor`` where there
    is no Horovod (DDP, the advisor)."""
    reducers = ((PowerSGD, PowerSGDReducer), (TopK, TopKReducer), (Quantized, QuantizedReducer))
    for config_class, reducer_class in reducers:
        if isinstance(compression, config_class):
            reducer = reducer_class(shapes, compression, tensors, collectives)
            warn_if_nothing_is_compressed(compression, shapes, reducer.compressed)
            return reducer, compression.levels
    if plain_compressor is not None and isinstance(compression, type) and issubclass(compression, plain_compressor):
        return DenseReducer(shapes, compression, tensors, collectives), (None, None)
    raise ValueError(
        f"compression must be Compression.none, Compression.fp16, Compression.powersgd(...), "
        f"Compression.topk(...) or Compression.quantized(...), got {compression!r}")


def warn_if_nothing_is_compressed(compression, shapes, compressed):
    """A compression that leaves every tensor whole sends what ``Compression.none`` would, and
    its levels never change: said here, where every backend builds its reducer, since nothing
    else shows it (the levels are just empty). The same shapes on every rank, so every rank
    warns alike."""
    if compressed or not shapes:
        return
    largest = tuple(max(shapes, key=lambda shape: int(np.prod(shape))))
    if isinstance(compression, PowerSGD):
        rule = (f"PowerSGD compresses an n×m matrix only where (n + m)·low_rank·min_compression_rate < n·m, "
                f"here (n + m)·{compression.low_rank}·{compression.min_compression_rate:g} < n·m: lower low_rank "
                f"or min_compression_rate")
    else:
        rule = "TopK compresses tensors of two or more dimensions only"
    warnings.warn(f"{compression!r} compresses none of the {len(shapes)} gradients: all of them are averaged "
                  f"uncompressed, as Compression.none would, and no level ever applies; the largest is of shape "
                  f"{largest}. {rule}", RuntimeWarning)


def split_state(reducer):
    """A reducer's state groups as ``(shared, per_rank)``: the shared ones are alike on every
    rank (Q, levels) and may be broadcast; the per-rank ones (error-feedback memory, TopK
    residuals, ``reducer.per_rank``) are each rank's own."""
    groups = reducer.state()
    return ({g: e for g, e in groups.items() if g not in reducer.per_rank},
            {g: e for g, e in groups.items() if g in reducer.per_rank})


def initial_query(seed, layer, rows, columns):
    """The random Q of one layer, from numpy: identical on every rank and in every framework."""
    return np.random.RandomState((seed * 1_000_003 + layer) % 2 ** 32).standard_normal((rows, columns))


def query_stream(seed, layer):
    """The seed of one layer's later random Qs (``warm_start=False``), the same on every rank."""
    return (seed * 1_000_003 + layer) % 2 ** 31


class BucketReduction:
    """A reducer's work on one bucket of layers, run phase by phase.

    ``reducer.phases(layers, grads, name)`` is a generator that starts its collectives and
    yields before it waits on them. Starting a bucket runs its first phase (PowerSGD's P,
    TopK's values and indices, the dense allreduce), so a backend with asynchronous
    collectives (torch) sends it while backward computes the next bucket; ``finish``
    advances every started bucket one phase at a time, so each phase of a later bucket is in
    flight while an earlier one waits. A backend whose collectives are graph ops (TF) runs
    one bucket of every layer, for the same maths.
    """

    def __init__(self, phases):
        self._phases = phases
        self.outputs = None
        self.advance()

    def advance(self):
        """Run the next phase; ``False`` once the bucket's outputs (``{layer: average}``) are in."""
        if self.outputs is not None:
            return False
        try:
            next(self._phases)
            return True
        except StopIteration as done:
            self.outputs = done.value
            return False

    @staticmethod
    def finish(reductions):
        """Every started bucket's outputs, as one ``{layer: average}``. An average may be a view
        of a buffer that the next step overwrites (``pack_products``): copy what you keep."""
        running = list(reductions)
        while running:
            running = [reduction for reduction in running if reduction.advance()]
        return {layer: value for reduction in reductions for layer, value in reduction.outputs.items()}


class _Reducer:
    """What every reducer shares: its two backends, and ``reduce``, all layers as one bucket."""

    fuses_itself = False  # whether Horovod's tensor fusion, rather than our buckets, should batch it
    compressed: Sequence[int] = ()  # the layers it compresses, which have levels

    def __init__(self, shapes, config, tensors: TensorOps, collectives: CollectiveOps):
        self.config = config
        self.tensors: TensorOps = tensors
        self.collectives: CollectiveOps = collectives
        self.shapes = None if shapes is None else [tuple(s) for s in shapes]

    def phases(self, layers, grads, name):
        """The bucket's work, as a generator: each phase starts its collectives and yields before it
        waits on them; the generator returns ``{layer: average}``."""
        raise NotImplementedError

    def restored(self):
        """Its state was just assigned from a checkpoint or an elastic commit."""

    def start(self, layers, grads, name=""):
        """Start reducing ``grads`` of the layers ``layers`` (one bucket), as a ``BucketReduction``."""
        return BucketReduction(self.phases(list(layers), list(grads), name))

    def reduce(self, grads):
        """``grads`` averaged, as a list; an average may be a view of a buffer that the next
        step overwrites: copy what you keep."""
        outputs = BucketReduction.finish([self.start(range(len(grads)), grads)])
        return [outputs[i] for i in range(len(grads))]


class DenseReducer(_Reducer):
    """A plain Horovod compressor (none, fp16): one fused allreduce, no levels.

    Its buckets are single layers (``fuses_itself``): like Horovod's optimizer, each gradient
    starts as soon as it is ready, and Horovod's tensor fusion batches what is ready together
    (``HOROVOD_FUSION_THRESHOLD``), so nothing waits for a bucket to fill.
    """

    per_rank = ()
    fuses_itself = True

    def __init__(self, shapes, compression, tensors, collectives):
        super().__init__(shapes, compression, tensors, collectives)
        # As Horovod's optimizer and tape: one process has nothing to average with (unless
        # elastic, where the world may grow).
        self.may_skip_alone = not under_elastic()
        # Compression.none hands over the gradient itself: its allreduce may carry a rider.
        probe = tensors.from_floats([0.0])
        self.wire_compression = None if compression is None or compression.compress(probe)[0] is probe \
            else compression

    def set_levels(self, levels):
        pass

    def level_costs(self, ladder):
        return {}

    def approximation_errors(self, accumulated, ladder):
        return None

    def phases(self, layers, grads, name):
        if self.may_skip_alone and self.collectives.size() == 1:
            yield
            return dict(zip(layers, grads))
        pending = self.collectives.start_allreduce_means(grads, f"dense{name}", self.wire_compression)
        yield
        return dict(zip(layers, pending.wait()))

    def state(self):
        return {}


class PowerSGDReducer(_Reducer):
    """PowerSGD with a switchable rank, batched over the layers of a bucket (Vogels et al. 2019, Alg. 1).

    Per step, for every compressed layer (M viewed as n×m in its framework's layout, see
    ``compression.matrix_shape``; Q of shape m×r)::

        M = grad + memory                 error feedback
        P = M Q;     allreduce(P)         one fused allreduce per bucket (+ its 1-D tensors)
        P = orthogonalize(P)
        Q = Mᵀ P;    allreduce(Q)         one fused allreduce per bucket
        out = P Qᵀ;  memory = M − out

    Two collectives per bucket and step, whatever the number of layers.

    A layer whose M or result is not finite this step (an fp16 overflow under AMP, on any
    rank) keeps its memory and Q as they were: the step's output is still non-finite, so a
    ``GradScaler`` sees it and skips the step, and the next steps start from clean state.

    State, one entry per compressed layer:
    - ``memory``: M − out. Kept across rank switches, as the authors do, so no gradient
      signal is lost when the level changes.
    - ``q``: the warm-started Q, stored with ℓ_low's columns; rank r uses the first r.
      A switch down keeps the leading columns; a switch up finds the trailing ones where
      it left them, so the warm start survives both ways. With ``warm_start=False`` a new
      random Q replaces it after every step, as torch's ``powerSGD_hook`` draws one: a fixed
      Q would never send the part of M outside its span, and error feedback would let that
      part grow.
    - ``draws`` (``warm_start=False`` only): how many Qs each layer has drawn, so every rank
      draws the same next one, and a restored run the one it would have drawn.
    - ``ranks``: each layer's current rank, a framework level holder (a tf.Variable in
      TensorFlow, so that a switch does not retrace the step).

    Q and the ranks are identical on every rank; the memory is each rank's own
    (``per_rank``): a broadcast must not overwrite it.
    """

    per_rank = ("memory",)

    def __init__(self, shapes, config, tensors, collectives):
        super().__init__(shapes, config, tensors, collectives)
        # Each tensor's n×m matrix in its framework's layout (``tensors.matrix_shape``).
        self.matrices = {i: tensors.matrix_shape(s) for i, s in enumerate(self.shapes) if is_matrix(s)}
        self.compressed = [i for i, nm in self.matrices.items() if powersgd_compresses(nm, config)]
        self.memory, self.q, self.ranks, self.draws = {}, {}, {}, {}
        for i in self.compressed:
            n, m = self.matrices[i]
            width = clamped_rank(config.low_rank, self.matrices[i])
            self.memory[i] = tensors.state(np.zeros((n, m)), f"powersgd_memory_{i}")
            self.q[i] = tensors.state(initial_query(config.seed, i, m, width), f"powersgd_q_{i}")
            self.ranks[i] = tensors.level(width, f"powersgd_rank_{i}")
            if not config.warm_start:
                self.draws[i] = tensors.level(0, f"powersgd_draws_{i}")
        clamped = sorted({self.shapes[i] for i in self.compressed if clamped_rank(config.low_rank, self.matrices[i])
                          < config.low_rank})
        if clamped:
            warnings.warn(f"PowerSGD rank {config.low_rank} exceeds min(n, m) of the layers of shapes {clamped}: "
                          f"they use rank min(n, m), which is exact (no compression)")

    def set_levels(self, levels):
        for i in self.compressed:
            self.tensors.set_level(self.ranks[i], clamped_rank(levels[i], self.matrices[i]))

    def level_costs(self, ladder):
        """Each compressed layer's bytes per step at each rank of ``ladder``: P and Q in fp32."""
        return {i: [4 * sum(self.matrices[i]) * clamped_rank(rank, self.matrices[i]) for rank in ladder]
                for i in self.compressed}

    def approximation_errors(self, accumulated, ladder):
        """‖Δ − P (Δᵀ P)ᵀ‖² of each compressed layer at each rank of ``ladder``, with P =
        orthogonalize(Δ Q) from the layer's own Q: one power iteration, as a step runs it, on
        this rank's window gradient Δ. One fp64 vector, layer-major; ``None`` with no layer."""
        tensors, residuals = self.tensors, []
        for i in self.compressed:
            delta, q = tensors.as_matrix(accumulated[i], self.matrices[i]), tensors.read(self.q[i])
            for rank in ladder:
                query = tensors.columns(q, 0, clamped_rank(rank, self.matrices[i]))
                p = tensors.orthogonalize(tensors.matmul(delta, query))
                q_of_delta = tensors.matmul(tensors.transpose(delta), p)
                residuals.append(delta - tensors.matmul(p, tensors.transpose(q_of_delta)))
        return tensors.squared_norms(residuals) if residuals else None

    def phases(self, layers, grads, name):
        tensors = self.tensors
        compressed = [(i, g) for i, g in zip(layers, grads) if i in self.ranks]
        dense = [(i, g) for i, g in zip(layers, grads) if i not in self.ranks]
        matrices = []
        for i, grad in compressed:
            m = tensors.as_matrix(grad, self.matrices[i])
            if self.config.use_error_feedback:
                m = m + tensors.read(self.memory[i])
            matrices.append(m)
        # P = M Q of every layer, and the bucket's 1-D gradients, in the buffer the allreduce reads.
        queries = [tensors.leading_columns(self.q[i], self.ranks[i]) for i, _ in compressed]
        pending = self.collectives.start_allreduce_means(
            tensors.pack_products(f"P{name}", list(zip(matrices, queries)), [g for _, g in dense]), f"powersgd.P{name}")
        yield
        reduced = pending.wait()
        outputs = {i: tensors.like(value, grad) for (i, grad), value in zip(dense, reduced[len(matrices):])}
        ps = [tensors.orthogonalize(p) for p in reduced[:len(matrices)]]
        products = [(tensors.transpose(m), p) for m, p in zip(matrices, ps)]
        pending = self.collectives.start_allreduce_means(tensors.pack_products(f"Q{name}", products, []),
                                                         f"powersgd.Q{name}")
        yield
        for (i, grad), m, p, q in zip(compressed, matrices, ps, pending.wait()):
            approximation = tensors.matmul(p, tensors.transpose(q))
            if self.config.use_error_feedback:
                tensors.assign_if_finite(self.memory[i], m - approximation)
            if self.config.warm_start:
                kept = tensors.leading_columns(self.q[i], self.ranks[i])
                tensors.assign_leading_columns(self.q[i], tensors.finite_or(q, kept))
            else:
                drawn = tensors.random_normal(self.q[i], query_stream(self.config.seed, i), self.draws[i])
                tensors.assign(self.q[i], drawn)
            outputs[i] = tensors.like(approximation, grad)
        return outputs

    def state(self):
        groups = {"memory": self.memory, "q": self.q, "ranks": self.ranks}
        if self.draws:
            groups["draws"] = self.draws
        return groups


class TopKReducer(_Reducer):
    """TopK sparsification with a switchable kept fraction and error feedback.

    Per step, for every compressed layer::

        M = grad + residual                  error feedback (missing from the authors' release)
        idx = the k largest |M|;  val = M[idx];  residual = M with M[idx] set to 0
        out = (Σ_workers scatter(idx_w, val_w)) / W       averaged (the release summed)

    On the wire, a layer's values (as fp32 bits) and indices (int16 below 32,768 entries,
    two to an int32 word, else int32) go into one int32 buffer for one allgather, while
    that costs less than a dense allreduce of the layer at this world size (see
    ``sparse_is_cheaper``). Otherwise, as TopK 99 % would, the sparsified M (its kept
    entries, zeros elsewhere) joins the uncompressed 1-D tensors in the one allreduce: the
    same average, for fewer bytes than values plus indices. The way is chosen per layer at
    every step, from the kept count of the level in force, and is the same on every rank.

    A layer whose M or average is not finite this step (on any rank) keeps its residual as
    it was on every rank, as a skipped step should: its non-finite values still reach the
    output.

    The residuals are each rank's own (``per_rank``); the fractions are shared.
    """

    per_rank = ("residual",)

    def __init__(self, shapes, config, tensors, collectives):
        super().__init__(shapes, config, tensors, collectives)
        self.compressed = [i for i, s in enumerate(self.shapes) if is_matrix(s) and np.prod(s) > 0]
        self.numels = {i: int(np.prod(self.shapes[i])) for i in self.compressed}
        self.residual = {i: tensors.state(np.zeros(self.numels[i]), f"topk_residual_{i}") for i in self.compressed}
        self.fractions = {i: tensors.level(float(config.low_fraction), f"topk_fraction_{i}") for i in self.compressed}
        self.index_dtypes = {i: index_dtype(self.numels[i]) for i in self.compressed}

    def set_levels(self, levels):
        for i in self.compressed:
            self.tensors.set_level(self.fractions[i], levels[i])

    def level_costs(self, ladder):
        """Each compressed layer's cost per step at each fraction of ``ladder``, on the wire this
        world size would choose (values and indices, or the dense layer), weighed as the links
        carry it: an allgather carries (W − 1)× its payload on each rank's link and a ring
        allreduce 2(W − 1)/W× its buffer, so a sparse level counts W/2 × its payload bytes
        against the dense layer's bytes (the same at W = 2)."""
        size = int(self.collectives.size())
        costs = {}
        for i in self.compressed:
            dtype, row = self.index_dtypes[i], []
            for fraction in ladder:
                k = kept_count(fraction, self.numels[i])
                sparse = self.config.wire == "sparse" or (
                    self.config.wire == "auto" and sparse_is_cheaper(k, self.numels[i], index_bytes(dtype), size))
                row.append(4 * (k + packed_index_words(k, dtype)) * size / 2 if sparse else 4 * self.numels[i])
            costs[i] = row
        return costs

    def approximation_errors(self, accumulated, ladder):
        """‖Δ − TopK(Δ)‖² of each compressed layer at each fraction of ``ladder``, on this
        rank's window gradient Δ. One fp64 vector, layer-major; ``None`` with no layer."""
        tensors, residuals = self.tensors, []
        for i in self.compressed:
            delta = tensors.as_matrix(accumulated[i], (-1,))
            residuals += [tensors.zeroed_at(delta, tensors.top_abs_indices(delta, kept_count(fraction, self.numels[i])))
                          for fraction in ladder]
        return tensors.squared_norms(residuals) if residuals else None

    def _sparse(self, i, k):
        if self.config.wire != "auto":
            return self.tensors.constant_flag(self.config.wire == "sparse")
        return sparse_is_cheaper(k, self.numels[i], index_bytes(self.index_dtypes[i]), self.collectives.size())

    def phases(self, layers, grads, name):
        tensors, collectives = self.tensors, self.collectives
        sparsified, payload, dense = [], [], []
        for i, grad in zip(layers, grads):
            if i not in self.fractions:
                continue
            m = tensors.as_matrix(grad, (-1,))
            if self.config.use_error_feedback:
                m = m + tensors.read(self.residual[i])
            k = tensors.kept_count(self.fractions[i], m)
            indices = tensors.top_abs_indices(m, k)
            rest = tensors.zeroed_at(m, indices)
            sparse = self._sparse(i, k)
            payload.append(tensors.cond(
                sparse, lambda m=m, i=i, indices=indices: tensors.concat(
                    [tensors.float_bits(tensors.gather(m, indices)),
                     tensors.pack_indices(indices, self.index_dtypes[i])]),
                tensors.empty_words))
            dense.append(tensors.cond(sparse, tensors.empty_floats, lambda m=m, rest=rest: m - rest))
            sparsified.append((i, grad, m, k, rest, sparse))
        uncompressed = [(i, g) for i, g in zip(layers, grads) if i not in self.fractions]
        averaging = collectives.start_allreduce_means(dense + [g for _, g in uncompressed], f"topk.dense{name}")
        # At ℓ_low (TopK 99 %) every layer may go dense: then torch makes no empty allgather.
        any_sparse = payload and tensors.any_flag([sparse for *_, sparse in sparsified])
        gathering = collectives.start_allgather(tensors.concat(payload), f"topk{name}") if any_sparse else None
        yield
        reduced = averaging.wait()
        gathered = gathering.wait() if gathering is not None else None
        outputs = {i: value for (i, _), value in zip(uncompressed, reduced[len(sparsified):])}
        offset = 0
        for (i, grad, m, k, rest, sparse), dense_average in zip(sparsified, reduced):
            words = k + packed_index_words(k, self.index_dtypes[i])

            def sparse_average(m=m, i=i, k=k, offset=offset, words=words):
                values = tensors.bits_float(tensors.columns(gathered, offset, offset + k))
                indices = tensors.unpack_indices(tensors.columns(gathered, offset + k, offset + words), k,
                                             self.index_dtypes[i])
                return tensors.scatter_mean(m, indices, values)

            average = tensors.cond(sparse, sparse_average, lambda dense_average=dense_average: dense_average)
            offset = offset + tensors.cond(sparse, lambda words=words: words, lambda: tensors.zero_count())
            if self.config.use_error_feedback:
                tensors.assign_if_finite(self.residual[i], rest, also=average)
            outputs[i] = tensors.like(average, grad)
        return outputs

    def state(self):
        return {"residual": self.residual, "fractions": self.fractions}


class QuantizedReducer(_Reducer):
    """Blockwise quantization (``Quantized``), exchanged in two shots, with error feedback at both.

    Per step, for the layers of a bucket at the same bits b (every layer is quantized, 1-D ones
    too), on W ranks, rank r::

        M = grad + memory                          each rank's error feedback
        x = each layer's M, zero-padded to W equal parts of whole blocks; row j of x (W rows)
            holds part j of every layer
        memory = M − Q_b(x);   all-to-all(Q_b(x))  row j goes to rank j, the owner of the parts j
        A = Σ_w deQ(chunk r from rank w) / W + owner_memory      the owner's error feedback
        owner_memory = A − Q_b(A);  all-gather(Q_b(A))
        out = every owner's deQ(Q_b(A)), end to end

    Q_b is round-to-nearest to −L … L (L = 2^(b−1) − 1) under one fp32 scale per block,
    absmax × fp32(1/L), computed in fp32. Two collectives per bucket and level in force. The sum is
    taken over the ranks in order, so every rank's result, and a float64 reference that rounds
    to fp32 where the state and the wire are fp32, agree bit for bit. No block holds two layers
    (a small layer's values would round to zero under a large one's scale, and one layer's
    overflow would spoil the other), and who owns an entry depends on its layer and W alone, not
    on the bucket or the levels, so a checkpoint resumes bitwise whatever DDP's buckets were.
    Padding each layer to W blocks costs up to W·block values per layer on the wire.

    A layer whose output is not finite this step (an fp16 overflow under AMP, on any rank)
    keeps both memories as they were, and its non-finite output reaches the ``GradScaler``.

    State, one entry per layer, each the layer's size in fp32:
    - ``memory``: this rank's M − Q_b(M);
    - ``owner_memory``: the error of the second quantization, at the entries this rank owns
      (zero elsewhere). Where the world size changes (elastic), so does who owns what: a rank
      then moves what it no longer owns into its own memory, times W, which the next step's
      average divides by W again, so no error is lost (Σ out = Σ average − mean_r memory_r −
      Σ_r owner_memory_r holds across the move);
    - ``bits``: each layer's bits now.
    Both memories are each rank's own (``per_rank``): a broadcast must not overwrite them.
    """

    per_rank = ("memory", "owner_memory")

    def __init__(self, shapes, config, tensors, collectives):
        super().__init__(shapes, config, tensors, collectives)
        self.numels = {i: int(np.prod(s)) for i, s in enumerate(self.shapes)}
        self.compressed = [i for i, numel in self.numels.items() if numel > 0]
        self.memory, self.owner_memory, self.bits = {}, {}, {}
        for i in self.compressed:
            self.memory[i] = tensors.state(np.zeros(self.numels[i]), f"quantized_memory_{i}")
            self.owner_memory[i] = tensors.state(np.zeros(self.numels[i]), f"quantized_owner_memory_{i}")
            self.bits[i] = tensors.level(config.low_bits, f"quantized_bits_{i}")
        self.owned = {}  # each layer's entries whose owner memory this rank held at its last step

    def set_levels(self, levels):
        for i in self.compressed:
            self.tensors.set_level(self.bits[i], levels[i])

    def level_costs(self, ladder):
        """Each layer's bytes at each bits of ``ladder``: its quantized values (padded to W parts
        of whole blocks) and scales, which the two shots carry 2(W − 1)/W× over each rank's link,
        as a ring allreduce carries fp32."""
        block, size = self.config.block_size, int(self.collectives.size())
        return {i: [quantized_bytes(padded_length(self.numels[i], size, block), bits, block) for bits in ladder]
                for i in self.compressed}

    def approximation_errors(self, accumulated, ladder):
        """‖Δ − Q_b(Δ)‖² of each layer at each bits of ``ladder``: one quantization of this
        rank's window gradient Δ. One fp64 vector, layer-major; ``None`` with no layer."""
        tensors, block, residuals = self.tensors, self.config.block_size, []
        for i in self.compressed:
            delta = tensors.as_matrix(accumulated[i], (-1,))
            blocks = tensors.placed([(0, delta)], padded_length(self.numels[i], 1, block))
            for bits in ladder:
                _, sent = tensors.quantize(tensors.reshape(blocks, (1, -1)), bits, block)
                residuals.append(blocks - tensors.reshape(sent, (-1,)))
        return tensors.squared_norms(residuals) if residuals else None

    def phases(self, layers, grads, name):
        by_bits = {}
        for i, grad in zip(layers, grads):
            if i in self.bits:
                by_bits.setdefault(self.tensors.level_value(self.bits[i]), []).append((i, grad))
        outputs = {i: grad for i, grad in zip(layers, grads) if i not in self.bits}  # empty layers
        # One exchange per level in force, their phases interleaved, so each collective is in flight
        # while the next exchange's maths run.
        exchanges = [self._two_shot(members, bits, f"{name}.{bits}") for bits, members in sorted(by_bits.items())]
        for _ in range(2):
            for exchange in exchanges:
                next(exchange)
            yield
        for exchange in exchanges:
            try:
                next(exchange)
            except StopIteration as done:
                outputs.update(done.value)
        return outputs

    def _two_shot(self, members, bits, name):
        tensors, collectives, block = self.tensors, self.collectives, self.config.block_size
        feedback = self.config.use_error_feedback
        size, rank = int(collectives.size()), int(collectives.rank())
        sizes = [self.numels[i] for i, _ in members]
        widths = [padded_length(numel, size, block) // size for numel in sizes]
        columns = [sum(widths[:k]) for k in range(len(widths))]
        owned = [(k, min(rank * width, numel), min((rank + 1) * width, numel), column)
                 for k, (numel, width, column) in enumerate(zip(sizes, widths, columns))]
        if feedback:
            self._keep_owner_memory_of(members, owned, size)
        # M = grad + memory, in its owners' columns (the fp32 copies of bf16 gradients not kept: a
        # generator's locals live through the collectives)
        x = tensors.as_columns([tensors.as_matrix(grad, (-1,)) for _, grad in members], widths, size,
                               plus=[tensors.read(self.memory[i]) for i, _ in members] if feedback else None)
        wire, sent = tensors.quantize(x, bits, block)
        if not feedback:
            del x, sent
        pending = collectives.start_alltoall(wire, f"quantized.alltoall{name}")
        yield
        a = tensors.mean_of_rows(tensors.dequantize(pending.wait(), bits, block))
        if feedback:
            a = a + tensors.placed([(column, tensors.part(self.owner_memory[members[k][0]], first, last))
                                    for k, first, last, column in owned if first < last], sum(widths))
        wire, sent_average = tensors.quantize(tensors.reshape(a, (1, -1)), bits, block)
        pending = collectives.start_allgather(tensors.reshape(wire, (-1,)), f"quantized.allgather{name}")
        yield
        # The shape in full: a traced TF step knows no length of an all-gather's result.
        gathered = tensors.dequantize(
            tensors.reshape(pending.wait(), (size, quantized_bytes(sum(widths), bits, block))), bits, block)

        def layer(rows, k):
            """Layer ``k`` of a (W, chunk) buffer: its columns, row after row, without the padding."""
            flat = tensors.reshape(tensors.columns(rows, columns[k], columns[k] + widths[k]), (-1,))
            return tensors.part(flat, 0, sizes[k])

        outputs = {i: layer(gathered, k) for k, (i, _) in enumerate(members)}
        if feedback:
            residual = tensors.difference(x, sent)  # M − Q_b(M); x is not read again
            for k, (i, _) in enumerate(members):
                tensors.assign_if_finite(self.memory[i], layer(residual, k), also=outputs[i])
            rest = a - tensors.reshape(sent_average, (-1,))
            for k, first, last, column in owned:
                if first < last:
                    i = members[k][0]
                    tensors.assign_if_finite(tensors.part(self.owner_memory[i], first, last),
                                             tensors.part(rest, column, column + last - first), also=outputs[i])
        return {i: tensors.like(outputs[i], grad) for i, grad in members}

    def restored(self):
        """The restored owner memory may be another world size's, or one the move below had not
        reached yet (a step that failed after it): the next step checks every layer again."""
        self.owned = {}

    def _keep_owner_memory_of(self, members, owned, size):
        """Move the owner memory of the entries this rank no longer owns into its own memory, W
        times over (see the class's docstring): where the world size changed (elastic), and at a
        reducer's first step, where a restored state may have been saved at another size."""
        for k, first, last, _ in owned:
            i = members[k][0]
            if self.owned.get(i) != (first, last):
                self.tensors.move_outside(self.owner_memory[i], self.memory[i], first, last, size)
                self.owned[i] = (first, last)

    def state(self):
        return {"memory": self.memory, "owner_memory": self.owner_memory, "bits": self.bits}
