"""TensorFlow tensor maths and state for the reducers; the collectives are in
``horovod_accordion/tensorflow/ops.py``, as torch's are apart from ``horovod_accordion.torch_common.tensors``.

What a step runs is graph-safe: state and levels are ``tf.Variable``s, so the reducers run
inside ``tf.function`` and a level switch (a variable assignment) reuses the traced graph.
``to_floats`` and ``from_floats`` are for the eager checks between steps. Compressed layers
are computed in fp32, as in the torch backend.
"""

import numpy as np
import tensorflow as tf

from horovod_accordion.core.compression import matrix_shape

__all__ = ["TensorFlowTensorOps"]

_WIRE_DTYPES = {tf.bfloat16: tf.float32}  # Horovod's TF ops reject bf16


def _pack(unsigned, bits):
    """As the torch backend's ``_pack``: 8/bits codes to a byte where bits divides 8, else bit
    planes. In int32, where TF's shifts and sums take every width."""
    rows = unsigned.shape[0]
    if bits == 8:
        return unsigned
    codes = tf.cast(unsigned, tf.int32)
    if 8 % bits == 0:
        shifted = tf.bitwise.left_shift(tf.reshape(codes, [rows, -1, 8 // bits]), tf.constant(list(range(0, 8, bits))))
        return tf.cast(tf.reduce_sum(shifted, axis=2), tf.uint8)
    planes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.reshape(codes, [rows, -1, 8, 1]),
                                                           tf.constant(list(range(bits)))), 1)
    weighted = tf.bitwise.left_shift(planes, tf.constant([[k] for k in range(8)]))
    return tf.reshape(tf.cast(tf.reduce_sum(weighted, axis=2), tf.uint8), [rows, -1])


def _unpack(packed, bits):
    rows = packed.shape[0]
    if bits == 8:
        return packed
    words = tf.cast(packed, tf.int32)
    if 8 % bits == 0:
        codes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.reshape(words, [rows, -1, 1]),
                                                              tf.constant(list(range(0, 8, bits)))), 2 ** bits - 1)
        return tf.cast(tf.reshape(codes, [rows, -1]), tf.uint8)
    planes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.reshape(words, [rows, -1, 1, bits]),
                                                           tf.constant([[k] for k in range(8)])), 1)
    weighted = tf.bitwise.left_shift(planes, tf.constant(list(range(bits))))
    return tf.reshape(tf.cast(tf.reduce_sum(weighted, axis=3), tf.uint8), [rows, -1])


class TensorFlowTensorOps:
    """The tensor backend of the reducers and the exchange in TensorFlow; the collectives over it
    are ``tensorflow.ops.TensorFlowCollectives``."""

    # State that survives a step.
    def state(self, array, name):
        return tf.Variable(array.astype(np.float32), trainable=False, name=name)

    def read(self, state):
        return tf.convert_to_tensor(state)

    def assign(self, state, value):
        state.assign(value)

    def zero(self, state):
        state.assign(tf.zeros_like(state))

    def level(self, value, name):
        # TopK fractions are float64 so that k = floor(fraction·numel) equals Python's int().
        dtype = tf.bool if isinstance(value, bool) else tf.float64 if isinstance(value, float) else tf.int32
        return tf.Variable(value, dtype=dtype, trainable=False, name=name)

    def set_level(self, level, value):
        level.assign(value)

    def leading_columns(self, q, rank):
        return q[:, :rank]

    def random_normal(self, like, stream, counter):
        """The ``counter``-th standard normal draw of ``stream``, shaped like ``like``, in the graph:
        the same on every rank. Advances ``counter``."""
        seed = tf.stack([tf.constant(stream, tf.int64), tf.cast(counter, tf.int64)])
        value = tf.random.stateless_normal(tf.shape(like), seed=seed, dtype=like.dtype)
        counter.assign_add(1)
        return value

    def assign_leading_columns(self, q, value):
        q.assign(tf.concat([value, q[:, tf.shape(value)[1]:]], axis=1))

    # Tensor maths.
    def matrix_shape(self, shape):
        """Output channels last: a conv kernel (kh, kw, in, out) is (kh·kw·in) × out, a plain reshape."""
        return matrix_shape(shape, channels_last=True)

    def as_matrix(self, grad, shape):
        return tf.reshape(tf.cast(tf.convert_to_tensor(grad), tf.float32), shape)

    def like(self, value, grad):
        return tf.cast(tf.reshape(value, tf.shape(grad)), grad.dtype)

    def matmul(self, a, b):
        return tf.matmul(a, b)

    def pack_products(self, name, products, tensors):
        """``[a @ b for a, b in products] + tensors``: a traced step has no buffers to keep."""
        return [tf.matmul(a, b) for a, b in products] + list(tensors)

    def transpose(self, a):
        return tf.transpose(a)

    def orthogonalize(self, p):
        return tf.linalg.qr(p)[0]

    def kept_count(self, fraction, m):
        numel = tf.cast(tf.size(m), tf.float64)
        return tf.maximum(1, tf.cast(tf.floor(fraction * numel), tf.int32))

    def top_abs_indices(self, m, k):
        return tf.math.top_k(tf.abs(m), k, sorted=False).indices

    def gather(self, m, indices):
        return tf.gather(m, indices)

    def zeroed_at(self, m, indices):
        return tf.tensor_scatter_nd_update(m, indices[:, None], tf.zeros(tf.shape(indices), m.dtype))

    def all_finite(self, *tensors):
        """Whether every entry of the tensors (``None`` skipped) is finite, in the graph; the
        sum's test, as in the torch backend, summed in fp32 at least."""
        return tf.reduce_all([tf.math.is_finite(tf.reduce_sum(tf.cast(t, tf.float64 if t.dtype == tf.float64 else
                                                                      tf.float32)))
                              for t in tensors if t is not None])

    def finite_or(self, value, fallback):
        """``value`` if all of it is finite, else ``fallback``."""
        return tf.where(self.all_finite(value), value, fallback)

    def assign_if_finite(self, state, value, also=None):
        state.assign(tf.where(self.all_finite(value, also), value, state))

    def add_at(self, total, indices, values):
        total.scatter_add(tf.IndexedSlices(tf.cast(values, total.dtype), tf.constant(list(indices), tf.int32)))

    def delta_like(self, param):
        return tf.Variable(tf.zeros(param.shape, tf.float32), trainable=False, name="accumulated")

    def counters(self, count):
        return tf.Variable(tf.zeros(count), trainable=False, name="non_finite_counts")

    def add_if(self, total, flag, value):
        """``total += value`` where the device flag ``flag`` is true."""
        total.assign_add(tf.cast(tf.where(flag, value, tf.zeros_like(value)), total.dtype))

    def when(self, flag, action):
        """Run ``action`` (assignments) if the boolean variable ``flag`` is true when the step runs."""
        def run():
            action()
            return tf.constant(True)
        tf.cond(tf.convert_to_tensor(flag), run, lambda: tf.constant(False))

    # Quantization (``QuantizedReducer``), as the torch backend's: the same IEEE fp32 operations
    # in the same order, so both give the float64 reference's values bit for bit.
    def level_value(self, level):
        """The level's value when the step is traced: a traced step keeps the bits it was traced
        with, so the TF adapters take a fixed ``Quantized`` level only."""
        with tf.init_scope():
            return int(level.numpy())

    def reshape(self, tensor, shape):
        return tf.reshape(tensor, shape)

    def part(self, flat, first, last):
        """``flat[first:last]``; of a variable, a slice that ``assign`` writes into it."""
        return flat[first:last]

    def as_columns(self, tensors, widths, rows, plus=None):
        if plus is not None:
            tensors = [t + p for t, p in zip(tensors, plus)]
        blocks = [tf.reshape(tf.pad(t, [[0, rows * width - t.shape[0]]]), [rows, width])
                  for t, width in zip(tensors, widths)]
        return tf.concat(blocks, axis=1)

    def difference(self, a, b):
        return a - b

    def placed(self, pieces, length):
        """One concatenation of the pieces and the zeros between them (``pieces`` in order)."""
        parts, end = [], 0
        for offset, tensor in sorted(pieces, key=lambda piece: piece[0]):
            parts += [tf.zeros([offset - end], tf.float32), tf.convert_to_tensor(tensor)]
            end = offset + tensor.shape[0]
        return tf.concat(parts + [tf.zeros([length - end], tf.float32)], axis=0)

    def quantize(self, rows, bits, block):
        levels = 2 ** (bits - 1) - 1
        count = rows.shape[0]
        blocks = tf.reshape(rows, [count, -1, block])
        scales = tf.reduce_max(tf.abs(blocks), axis=2, keepdims=True) * tf.constant(1.0 / levels, tf.float32)
        divisor = tf.where(scales > 0, scales, tf.ones_like(scales))
        codes = tf.clip_by_value(tf.round(blocks / divisor), -levels, levels)
        sent = tf.reshape(codes * scales, tf.shape(rows))
        unsigned = tf.reshape(tf.cast(codes + levels, tf.uint8), [count, -1])
        scale_bytes = tf.reshape(tf.bitcast(tf.reshape(scales, [count, -1]), tf.uint8), [count, -1])
        return tf.concat([_pack(unsigned, bits), scale_bytes], axis=1), sent

    def dequantize(self, wire, bits, block):
        count, width = wire.shape[0], wire.shape[1]
        values = width * 8 * block // (bits * block + 32)
        codes = tf.cast(_unpack(wire[:, :values * bits // 8], bits), tf.float32) - (2 ** (bits - 1) - 1)
        scales = tf.bitcast(tf.reshape(wire[:, values * bits // 8:], [count, -1, 4]), tf.float32)
        return tf.reshape(tf.reshape(codes, [count, -1, block]) * scales[:, :, None], [count, values])

    def move_outside(self, source, target, first, last, factor):
        size = source.shape[0]
        outside = tf.concat([tf.ones([first]), tf.zeros([last - first]), tf.ones([size - last])], axis=0) > 0
        target.assign(tf.where(outside, target + factor * source, target))
        source.assign(tf.where(outside, tf.zeros_like(source), source))

    def mean_of_rows(self, rows):
        total = rows[0]
        for r in range(1, rows.shape[0]):
            total = total + rows[r]
        return total * tf.constant(1.0 / rows.shape[0], tf.float32)

    # Branches of the TopK wire format, decided in the graph from the level in force.
    def cond(self, flag, if_true, if_false):
        return tf.cond(flag, if_true, if_false)

    def constant_flag(self, value):
        return tf.constant(value)

    def any_flag(self, flags):
        """The flags are decided in the graph, so the collective always runs (perhaps empty)."""
        return True

    def zero_count(self):
        return tf.constant(0, tf.int32)

    def empty_words(self):
        return tf.zeros([0], tf.int32)

    def empty_floats(self):
        return tf.zeros([0], tf.float32)

    def pack_indices(self, indices, dtype):
        """Indices as int32 words: int16 ones two to a word (the last padded with 0)."""
        if dtype == "int32":
            return indices
        narrow = tf.cast(indices, tf.int16)
        narrow = tf.pad(narrow, [[0, tf.size(narrow) % 2]])
        return tf.bitcast(tf.reshape(narrow, [-1, 2]), tf.int32)

    def unpack_indices(self, words, count, dtype):
        if dtype == "int32":
            return words
        narrow = tf.reshape(tf.bitcast(words, tf.int16), [tf.shape(words)[0], -1])
        return tf.cast(narrow[:, :count], tf.int32)

    def float_bits(self, values):
        return tf.bitcast(values, tf.int32)

    def bits_float(self, bits):
        return tf.bitcast(tf.reshape(bits, [-1]), tf.float32)

    def concat(self, tensors):
        return tf.concat(tensors, axis=0)

    def columns(self, matrix, start, stop):
        return matrix[:, start:stop]

    def scatter_mean(self, like, indices, values):
        total = tf.tensor_scatter_nd_add(tf.zeros_like(like), tf.reshape(indices, [-1, 1]), values)
        return total / tf.cast(tf.shape(indices)[0], like.dtype)

    def squared_norms(self, tensors):
        return tf.stack([tf.reduce_sum(tf.square(tf.cast(t, tf.float64))) for t in tensors])

    def finite_flags(self, tensors):
        """One flag per tensor: whether all of it is finite."""
        return tf.stack([self.all_finite(t) for t in tensors])

    def false_as_ones(self, flags):
        return tf.cast(tf.logical_not(flags), tf.float32)

    # Host state: values the host sets or reads between steps (``horovod_accordion.core.rates``).
    def host_state(self, array, name):
        with tf.device("/cpu:0"):
            return tf.Variable(array.astype(np.float64), trainable=False, name=name)

    def set_host_state(self, holder, values):
        holder.assign(values)

    def read_host_state(self, holder):
        return holder.numpy().tolist()

    def hold_for_host(self, holder, value):
        holder.assign(tf.cast(tf.reshape(value, [-1]), tf.float64))

    def values_like(self, holder, like=None):
        return tf.cast(tf.convert_to_tensor(holder), tf.float64 if like is None else tf.as_dtype(self.wire_dtype(like)))

    def with_leading_columns(self, rows, holder):
        count = rows.shape[0] if rows.shape[0] is not None else tf.shape(rows)[0]
        lead = tf.broadcast_to(self.values_like(holder, rows)[None, :], [count, holder.shape[0]])
        return tf.concat([lead, rows], axis=1)

    def column_means(self, rows):
        return tf.reduce_mean(tf.cast(rows, tf.float64), axis=0)

    def to_floats(self, tensor):
        return tensor.numpy().tolist()

    def from_floats(self, values):
        return tf.constant(values, tf.float64)

    # What the collectives send.
    def wire_dtype(self, tensor):
        return _WIRE_DTYPES.get(tensor.dtype, tensor.dtype).name

    def flat_concat(self, tensors, wire_dtype):
        return tf.concat([tf.reshape(tf.cast(t, wire_dtype), [-1]) for t in tensors], axis=0)

    def split_like(self, flat, tensors):
        chunks = tf.split(flat, [tf.size(t) for t in tensors])
        return [tf.cast(tf.reshape(chunk, tf.shape(t)), t.dtype) for chunk, t in zip(chunks, tensors)]
