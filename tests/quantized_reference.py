"""A float64 reference of ``Quantized``'s two-shot exchange (``core.reducers.QuantizedReducer``),
written from its description, not its code.

The algorithm's state and wire are fp32: the memories, the scales, and the values it averages.
So the reference computes each elementary operation (+, −, ×, ÷) in float64 and rounds the
result to fp32 where the algorithm keeps fp32 (a constant divides as a product with its fp32
reciprocal, as the implementation does). For these operations on fp32 inputs, float64's
53 bits are more than 2·24 + 2, so rounding the float64 result to fp32 gives the correctly
rounded fp32 result (double rounding is innocuous): the reference and an IEEE fp32
implementation that does the same operations in the same order agree bit for bit. Rounding
to an integer is half to even in numpy as in torch.
"""
import numpy as np


def fp32(values):
    return np.asarray(values, dtype=np.float64).astype(np.float32).astype(np.float64)


def quantize(rows, bits, block):
    """The values that ``bits``-bit codes with one fp32 scale per ``block`` stand for, row by row."""
    levels = 2 ** (bits - 1) - 1
    blocks = rows.reshape(rows.shape[0], -1, block)
    scales = fp32(np.abs(blocks).max(axis=2, keepdims=True) * fp32(1.0 / levels))
    divisor = np.where(scales > 0, scales, 1.0)
    codes = np.clip(np.round(fp32(blocks / divisor)), -levels, levels)
    return fp32(codes * scales).reshape(rows.shape)


def padded_length(count, size, block):
    return -(-count // (size * block)) * size * block


class TwoShot:
    """Every rank's state of one bucket of layers (sizes ``sizes``) on ``size`` ranks."""

    def __init__(self, sizes, size, block=64):
        self.sizes, self.size, self.block = list(sizes), size, block
        self.memory = [[np.zeros(n) for n in sizes] for _ in range(size)]  # each rank's own
        self.owner_memory = [[np.zeros(n) for n in sizes] for _ in range(size)]  # nonzero where the rank owns
        self.largest = []  # each step's largest magnitude that went into a quantization

    def step(self, grads, bits):
        """``grads[r][i]``: rank r's gradient of layer i (fp32 values); ``bits[i]``: layer i's bits.
        Returns the layers' average, the same on every rank; layers at the same bits share one
        exchange, as the layers of one bucket do."""
        out = [None] * len(self.sizes)
        largest = 0.0
        for b in sorted(set(bits)):
            members = [i for i in range(len(self.sizes)) if bits[i] == b]
            largest = max(largest, self._exchange(grads, members, b, out))
        self.largest.append(largest)
        return out

    def _exchange(self, grads, members, bits, out):
        """Each layer is zero-padded to W equal parts of whole blocks; rank r's row j holds part j
        of every layer, which rank j owns."""
        size, block = self.size, self.block
        widths = {i: padded_length(self.sizes[i], size, block) // size for i in members}
        sent, ms = [], []
        for r in range(size):
            m = {i: fp32(np.asarray(grads[r][i], dtype=np.float64).reshape(-1) + self.memory[r][i]) for i in members}
            rows = np.concatenate([self._rows(m[i], widths[i]) for i in members], axis=1)
            sent.append(quantize(rows, bits, block))
            ms.append(m)
        largest = max(float(np.abs(m[i]).max(initial=0)) for m in ms for i in members)
        result = np.zeros_like(sent[0])
        for owner in range(size):
            total = sent[0][owner]
            for r in range(1, size):
                total = fp32(total + sent[r][owner])
            a = fp32(fp32(total * fp32(1.0 / size)) + np.concatenate([self._rows(self.owner_memory[owner][i], widths[i])[owner]
                                                          for i in members]))
            result[owner] = quantize(a.reshape(1, -1), bits, block)[0]
            rest = fp32(a - result[owner])
            column = 0
            for i in members:
                first, last = self._owned(i, owner, widths[i])
                self.owner_memory[owner][i][first:last] = rest[column:column + last - first]
                column += widths[i]
            largest = max(largest, float(np.abs(a).max(initial=0)))
        column = 0
        for i in members:
            out[i] = result[:, column:column + widths[i]].reshape(-1)[:self.sizes[i]]
            for r in range(size):
                self.memory[r][i] = fp32(ms[r][i] - sent[r][:, column:column + widths[i]].reshape(-1)[:self.sizes[i]])
            column += widths[i]
        return largest

    def _rows(self, values, width):
        padded = np.zeros(self.size * width)
        padded[:values.size] = values
        return padded.reshape(self.size, width)

    def _owned(self, i, owner, width):
        return min(owner * width, self.sizes[i]), min((owner + 1) * width, self.sizes[i])
