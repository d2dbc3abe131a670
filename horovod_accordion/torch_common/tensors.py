"""Torch tensor maths and state for the reducers, shared by the Horovod backend
(``horovod_accordion/torch/ops.py``) and the DDP backend (``horovod_accordion/hooks/ops.py``).

It imports no Horovod, so the DDP hook runs where Horovod was never built. Compressed
layers are computed and sent in fp32; bf16 tensors travel as fp32, which every backend
accepts (Horovod 0.28.1 rejects bf16 allreduce), or as bf16 where asked (``bf16_wire``).
"""

import torch

from horovod_accordion.core.compression import kept_count, matrix_shape

__all__ = ["Level", "TorchTensorOps", "map_leaves", "summary_writer"]

# Horovod 0.28.1 rejects a bf16 allreduce; torch.distributed takes one if asked (``bf16_wire``).
_WIRE_DTYPES = {torch.bfloat16: torch.float32}
_SUM_DTYPES = {torch.float64: torch.float64}


def map_leaves(value, leaf_type, function):
    """``value`` with every ``leaf_type`` inside its dicts, lists and tuples replaced by ``function(leaf)``."""
    if isinstance(value, leaf_type):
        return function(value)
    if isinstance(value, dict):
        return {key: map_leaves(item, leaf_type, function) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_leaves(item, leaf_type, function) for item in value)
    return value


def summary_writer(logdir):
    """torch's TensorBoard writer (it needs the ``tensorboard`` package), imported only when asked for."""
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(logdir)


def _end_to_end(tensors, dtype):
    """The 1-D span of one storage that ``tensors`` (contiguous, of ``dtype``) cover one after
    another, or ``None``."""
    first = tensors[0] if tensors else None
    if first is None or any(t.dtype != dtype or not t.is_contiguous() for t in tensors):
        return None
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for t in tensors:
        if t.untyped_storage().data_ptr() != storage or t.storage_offset() != offset:
            return None
        offset += t.numel()
    return first.as_strided((offset - first.storage_offset(),), (1,), first.storage_offset())


def _on_cpu(tensor):
    """Where the CPU path is cheaper: reading a flag costs nothing there, so an ``if`` spares the
    full-size ``where`` that an accelerator needs to decide without waiting for the device; and
    MKL wants a thin factor transposed (see ``matmul``)."""
    return tensor.device.type == "cpu"


def _pack(unsigned, bits):
    """Codes below 2^bits, each row's packed into bytes: 8/bits to a byte where bits divides 8,
    else as ``bits`` bit planes of each 8 codes (``bits`` bytes per 8 codes either way). The codes
    of a byte occupy disjoint bits, so an or of shifted strided views packs them without a
    reduction kernel."""
    rows = unsigned.shape[0]
    if bits == 8:
        return unsigned
    if 8 % bits == 0:
        per_byte = unsigned.reshape(rows, -1, 8 // bits)
        packed = per_byte[:, :, 0].clone()
        for position in range(1, 8 // bits):
            packed |= per_byte[:, :, position] << (position * bits)
        return packed
    planes = (unsigned.reshape(rows, -1, 8, 1) >> torch.arange(bits, dtype=torch.uint8, device=unsigned.device)) & 1
    packed = planes[:, :, 0].clone()  # (rows, groups of 8, bits): byte b of a group holds bit b of its 8 codes
    for position in range(1, 8):
        packed |= planes[:, :, position] << position
    return packed.reshape(rows, -1)


def _unpack(packed, bits):
    """``_pack``'s codes, as uint8."""
    rows = packed.shape[0]
    if bits == 8:
        return packed
    if 8 % bits == 0:
        shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
        return ((packed.reshape(rows, -1, 1) >> shifts) & (2 ** bits - 1)).reshape(rows, -1)
    positions = torch.arange(8, dtype=torch.uint8, device=packed.device).reshape(8, 1)
    planes = (packed.reshape(rows, -1, 1, bits) >> positions) & 1
    weights = torch.arange(bits, dtype=torch.uint8, device=packed.device)
    return (planes << weights).sum(dim=3, dtype=torch.uint8).reshape(rows, -1)


class Level:
    """A value that a step reads and the bookkeeping between steps sets, shared by reference: a
    layer's level (rank or kept fraction), its count of random Qs, whether the window adds to Δ.
    TensorFlow's is a variable, so that its traced step reads the value in force."""

    def __init__(self, value):
        self.value = value


class _HostState:
    """A host state (``TorchTensorOps.host_state``): pinned where the backend's device is a GPU,
    with the event after the last asynchronous copy from or into it, which the host waits for
    before it reads or writes it."""

    def __init__(self, values, device):
        self.values = values.pin_memory() if torch.device(device).type == "cuda" else values
        self.last_copy = None

    def copied(self):
        if self.values.is_pinned():
            self.last_copy = torch.cuda.Event()
            self.last_copy.record()

    def wait(self):
        if self.last_copy is not None:
            self.last_copy.synchronize()
            self.last_copy = None


class TorchTensorOps:
    """The tensor backend of the reducers and the exchange: state, levels and maths, on
    ``device``. The collectives over it are Horovod's (``torch/ops.py``) or torch.distributed's
    (``hooks/ops.py``)."""

    def __init__(self, device="cpu", bf16_wire=False):
        self.device = device  # where the parameters, hence the compression state, live
        self._buffers = {}  # each bucket phase's flat buffer (``pack_products``), by name
        # bf16 tensors travel as fp32 unless ``bf16_wire``: PowerSGD's P and Q are fp32 either way.
        self._wire_dtypes = {} if bf16_wire else _WIRE_DTYPES

    # State that survives a step.
    def state(self, array, name):
        return torch.from_numpy(array).to(device=self.device, dtype=torch.float32)

    def read(self, state):
        return state

    def assign(self, state, value):
        state.copy_(value)

    def copy(self, state):
        return state.clone()

    def zero(self, state):
        state.zero_()

    def level(self, value, name):
        return Level(value)

    def set_level(self, level, value):
        level.value = value

    def leading_columns(self, q, rank):
        return q[:, :rank.value]

    def random_normal(self, like, stream, counter):
        """The ``counter``-th standard normal draw of ``stream``, shaped like ``like``: the same on
        every rank and device (drawn on the CPU). Advances ``counter``."""
        generator = torch.Generator().manual_seed(stream * 1_000_003 + counter.value)
        counter.value += 1
        return torch.randn(like.shape, generator=generator).to(like)

    def assign_leading_columns(self, q, value):
        q[:, :value.shape[1]].copy_(value)

    # Tensor maths.
    def matrix_shape(self, shape):
        """Output channels first: a conv kernel (out, in, kh, kw) is out × (in·kh·kw)."""
        return matrix_shape(shape)

    def as_matrix(self, grad, shape):
        return grad.reshape(shape).to(torch.float32)

    def like(self, value, grad):
        return value.reshape(grad.shape).to(grad.dtype)

    def matmul(self, a, b, out=None):
        """``a @ b``, written into ``out`` (a flat tensor of its size) if given. On the CPU, a
        product with a tall, thin right operand (M Q and Mᵀ P, r columns) is computed as (bᵀ aᵀ)ᵀ
        with bᵀ contiguous, the layout MKL's single-threaded sgemm is fast in (figures:
        ``benchmarks/results/matmul_layouts.json``). A GPU's BLAS reads either layout, where the
        copy of bᵀ would only add a kernel."""
        (rows, _), (_, columns) = a.shape, b.shape
        if _on_cpu(a) and columns < b.shape[0]:
            product_t = None if out is None else out.view(columns, rows)
            return torch.matmul(b.T.contiguous(), a.T, out=product_t).T
        return torch.matmul(a, b, out=None if out is None else out.view(rows, columns))

    def transpose(self, a):
        return a.T

    def unscaled(self, grads, scale):
        """``grads`` × 1/``scale``, the reciprocal taken as ``GradScaler.unscale_`` takes it."""
        inverse = scale.double().reciprocal().float()
        return [grad * inverse for grad in grads]

    def scaled(self, value, scale):
        return value * scale

    def orthogonalize(self, p):
        """Householder QR: stable, and a zero P gives unit columns, so that a Q left at 0 by a
        step whose M was 0 on every rank picks M up again at the next step. One column is only
        normalised, with the same unit fallback, as torch's ``powerSGD_hook`` does for rank 1:
        on a GPU each QR is a solver call with a host sync, per layer and step."""
        if p.shape[1] == 1:
            # In fp64, where the norm of fp32 values neither overflows nor underflows; a NaN or
            # inf in P stays non-finite, as QR leaves it, so the step is seen as one to skip.
            column = p.to(torch.float64)
            norm = torch.linalg.vector_norm(column)
            unit = torch.zeros_like(column)
            unit[0] = 1.0
            return torch.where(norm == 0, unit, column / norm).to(p.dtype)
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
        beyond fp32's range, which only values that are useless as gradients reach. Summed in
        fp32 at least: fp16 gradients that are finite may sum beyond fp16's 65504."""
        flags = [torch.isfinite(t.sum(dtype=_SUM_DTYPES.get(t.dtype, torch.float32))) for t in tensors if t is not None]
        return flags[0] if len(flags) == 1 else torch.stack(flags).all()

    def finite_or(self, value, fallback):
        """``value`` if all of it is finite, else ``fallback``."""
        finite = self.all_finite(value)
        if _on_cpu(finite):
            return value if finite else fallback
        return torch.where(finite, value, fallback)

    def assign_if_finite(self, state, value, also=None):
        """``state = value`` if all of ``value`` (and of ``also``) is finite, written in place."""
        finite = self.all_finite(value, also)
        if _on_cpu(finite):
            if finite:
                state.copy_(value)
        else:
            torch.where(finite, value, state, out=state)

    def add_at(self, total, indices, values):
        """``total[indices] += values``; a run of consecutive indices (Horovod's buckets) is a view."""
        first, last = indices[0], indices[-1]
        if list(indices) == list(range(first, last + 1)):
            total[first:last + 1].add_(values)
        else:
            total.index_add_(0, torch.tensor(list(indices), device=total.device), values)

    def delta_like(self, param):
        """A zero Δ for ``param``: fp64 for fp64 parameters, else fp32, whatever the gradients' precision."""
        return torch.zeros_like(param, dtype=torch.float64 if param.dtype == torch.float64 else torch.float32)

    def counters(self, count):
        return torch.zeros(count, device=self.device)

    def add_if(self, total, flag, value):
        """``total += value`` where the device flag ``flag`` is true, without a host sync."""
        if _on_cpu(flag):
            if flag:
                total.add_(value)
        else:
            total.add_(torch.where(flag, value, 0.0))

    def when(self, flag, action):
        """Run ``action`` if the level holder ``flag`` is true."""
        if flag.value:
            action()

    # Quantization (``QuantizedReducer``).
    def level_value(self, level):
        return level.value

    def as_columns(self, tensors, widths, rows, plus=None):
        """(``rows``, Σ ``widths``) fp32: each 1-D tensor (plus its ``plus`` counterpart, added in
        fp32), zero-padded to ``rows`` × its width, in its columns. The sum is written straight
        into the columns: on a CPU a new full-size tensor costs more than the addition."""
        out = torch.empty(rows, sum(widths), dtype=torch.float32, device=self.device)
        tensors = [t.detach() for t in tensors]  # out= takes no autograd history (see pack_products)
        column = 0
        for k, (tensor, width) in enumerate(zip(tensors, widths)):
            whole, rest = divmod(tensor.numel(), width)  # full rows, and the values of a partial one
            block = out[:, column:column + width]
            if plus is None:
                block[:whole] = tensor[:whole * width].view(whole, width)
            else:
                torch.add(tensor[:whole * width].view(whole, width), plus[k][:whole * width].view(whole, width),
                          out=block[:whole])
            if whole < rows:
                block[whole:] = 0
                tail = tensor[whole * width:]
                block[whole, :rest] = tail if plus is None else tail + plus[k][whole * width:]
            column += width
        return out

    def difference(self, a, b):
        return a.sub_(b)

    def placed(self, pieces, length):
        """Zeros of ``length`` in fp32, with each 1-D tensor of ``pieces`` (``(offset, tensor)``) at its offset."""
        flat = torch.zeros(length, dtype=torch.float32, device=self.device)
        for offset, tensor in pieces:
            flat[offset:offset + tensor.numel()] = tensor
        return flat

    def reshape(self, tensor, shape):
        return tensor.reshape(shape)

    def part(self, flat, first, last):
        """``flat[first:last]``, a view: assigning to it writes ``flat``."""
        return flat[first:last]

    def quantize(self, rows, bits, block):
        """Each row of fp32 ``rows`` (whole blocks) as ``bits``-bit codes packed into bytes, then
        its fp32 scales' bytes: ``(wire, sent)``, ``wire`` uint8 with one row per row, ``sent``
        the values it stands for. The ops are IEEE fp32 ones in a fixed order (no fused
        multiply-add), so ``tests/quantized_reference.py`` reproduces them exactly; a constant
        divides as a product with its fp32 reciprocal, which is what TF's graph optimizer makes of
        a division by a constant, so an eager step, a traced one and torch's agree."""
        levels = 2 ** (bits - 1) - 1
        blocks = rows.reshape(rows.shape[0], -1, block)
        # absmax as max(max, −min), without the copy that abs() would write first; abs_() makes a
        # zero block's scale +0 whichever zero the maximum returns. A NaN propagates (its payload
        # may differ from abs().amax()'s; any NaN scale dequantizes its block to NaN).
        absmax = torch.maximum(blocks.amax(dim=2, keepdim=True), blocks.amin(dim=2, keepdim=True).neg_()).abs_()
        # A Python number multiplies an fp32 tensor as an fp32 number: fp32(1/L).
        scales = absmax * (1.0 / levels)
        # A zero block has a zero scale and zero codes; a non-finite one a non-finite scale,
        # which dequantizes the whole block to NaN, so that the step is seen as one to skip.
        divisor = torch.where(scales > 0, scales, torch.ones_like(scales))
        # In place where a value is not kept: on a CPU a new tensor of this size costs several
        # times the arithmetic (the allocator maps fresh pages for it each time).
        codes = torch.div(blocks, divisor).round_().clamp_(-levels, levels)
        sent = (codes * scales).reshape(rows.shape)
        unsigned = codes.add_(levels).to(torch.uint8).reshape(rows.shape[0], -1)
        wire = torch.cat([_pack(unsigned, bits), scales.reshape(rows.shape[0], -1).view(torch.uint8)], dim=1)
        return wire, sent

    def dequantize(self, wire, bits, block):
        """``quantize``'s values from its ``wire``."""
        values = wire.shape[1] * 8 * block // (bits * block + 32)
        codes = _unpack(wire[:, :values * bits // 8], bits).to(torch.float32).sub_(2 ** (bits - 1) - 1)
        # A copy: the scales' bytes start at any offset, and a view as fp32 needs one divisible by 4.
        scales = wire[:, values * bits // 8:].reshape(-1).clone().view(torch.float32).reshape(wire.shape[0], -1)
        return codes.reshape(wire.shape[0], -1, block).mul_(scales.unsqueeze(2)).reshape(wire.shape[0], values)

    def move_outside(self, source, target, first, last, factor):
        """``target += factor · source`` outside ``first:last``, where ``source`` becomes 0."""
        for part in (slice(0, first), slice(last, None)):
            target[part] += factor * source[part]
            source[part] = 0

    def mean_of_rows(self, rows):
        """The rows' mean, summed in row order (rank order): the same on every rank and machine."""
        total = rows[0]
        for row in rows[1:]:
            total = total + row
        return total * (1.0 / rows.shape[0])

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
        """In the tensors' own precision, squared in fp64: ``vector_norm(dtype=float64)`` would copy
        the tensor to fp64 first, and a check compares norms relatively, far above fp32's
        accumulated rounding (~1e-6)."""
        return torch.stack([torch.linalg.vector_norm(t) for t in tensors]).double().square()

    def finite_flags(self, tensors):
        """One device flag per tensor: whether all of it is finite."""
        return torch.stack([self.all_finite(t) for t in tensors])

    def false_as_ones(self, flags):
        return (~flags).to(torch.float32)

    # Host state: values the host sets or reads between steps, which the step sends or writes
    # without waiting (``horovod_accordion.core.rates``).
    def host_state(self, array, name):
        """On the host, fp64; pinned where the state lives on a GPU, so that copies to and from
        the device are asynchronous."""
        return _HostState(torch.from_numpy(array).to(torch.float64), self.device)

    def set_host_state(self, holder, values):
        holder.wait()  # no copy from or into it may still be in flight
        holder.values.copy_(torch.tensor(values, dtype=torch.float64))

    def read_host_state(self, holder):
        holder.wait()
        return holder.values.tolist()

    def hold_for_host(self, holder, value):
        """Copy the device's ``value`` into ``holder`` without waiting: ``read_host_state`` waits."""
        holder.values.copy_(value.reshape(-1), non_blocking=True)
        holder.copied()

    def values_like(self, holder, like=None):
        """A copy of the host state's values as a 1-D tensor in the wire dtype of ``like``, on its
        device (fp64 on the backend's device without one)."""
        values = holder.values.to(device=self.device if like is None else like.device, non_blocking=True,
                                  dtype=torch.float64 if like is None else getattr(torch, self.wire_dtype(like)),
                                  copy=True)
        holder.copied()
        return values

    def with_leading_columns(self, rows, holder):
        """``rows`` (2-D) with the host state's values in front of every row, in the rows' dtype."""
        lead = self.values_like(holder, rows)
        return torch.cat([lead.expand(rows.shape[0], -1), rows], dim=1)

    def column_means(self, rows):
        """The mean of each column, in fp64."""
        return rows.to(torch.float64).mean(dim=0)

    def to_floats(self, tensor):
        return tensor.tolist()

    def from_floats(self, values):
        return torch.tensor(values, dtype=torch.float64, device=self.device)

    # Fused collectives: what the backends' allreduces and allgathers send.
    def wire_dtype(self, tensor):
        return str(self._wire_dtypes.get(tensor.dtype, tensor.dtype)).replace("torch.", "")

    def pack_products(self, name, products, tensors):
        """``[a @ b for a, b in products] + tensors``, the products computed into one flat buffer
        kept for ``name`` across steps and the tensors of their dtype copied in after them, as
        torch's PowerSGD hook computes a bucket's P and Q into its own: the allreduce then reads
        the buffer whole, with no ``cat``, and averages them in place. A tensor of another dtype
        is returned as it is, for the collective of its wire dtype."""
        if not products:
            return list(tensors)
        dtype = products[0][0].dtype

        def packed(t):
            return self._wire_dtypes.get(t.dtype, t.dtype) == dtype

        sizes = [a.shape[0] * b.shape[1] for a, b in products] + [t.numel() for t in tensors if packed(t)]
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() != sum(sizes) or buffer.dtype != dtype:  # a new level, DDP's new buckets
            buffer = self._buffers[name] = torch.empty(sum(sizes), dtype=dtype, device=self.device)
        chunks = iter(buffer.split(sizes))
        # Detached: a gradient made with create_graph=True has a history, which out= refuses.
        out = [self.matmul(a.detach(), b.detach(), out=next(chunks)) for a, b in products]
        return out + [next(chunks).view(t.shape).copy_(t.detach()) if packed(t) else t for t in tensors]

    def _packed_buffer(self, tensors):
        """The ``pack_products`` buffer that ``tensors`` fill exactly, in order, or ``None``."""
        base = tensors[0]._base
        if base is None or not any(base is buffer for buffer in self._buffers.values()):
            return None
        offset = 0
        for t in tensors:
            if t._base is not base or t.storage_offset() != offset:
                return None
            offset += t.numel()
        return base if offset == base.numel() else None

    def flat_concat(self, tensors, wire_dtype):
        """The tensors as one flat buffer, which the collectives overwrite with their result.
        The tensors of a ``pack_products`` buffer are that buffer, and tensors already in
        ``wire_dtype`` that lie end to end in one storage (a lone contiguous one, or the
        gradients of a DDP bucket or an FSDP unit, views of its buffer) are the span they cover,
        with no copy, as Horovod's optimizer reduces ``p.grad`` in place: the reducers only pass
        tensors whose average replaces them (gradients) or that are theirs (P, Q)."""
        dtype = getattr(torch, wire_dtype)
        packed = self._packed_buffer(tensors)
        if packed is not None and packed.dtype == dtype:
            return packed
        span = _end_to_end(tensors, dtype)
        if span is not None:
            return span
        return torch.cat([t.reshape(-1).to(dtype) for t in tensors])

    def split_like(self, flat, tensors):
        packed = self._packed_buffer(tensors)
        if packed is not None:
            # The P and Q of the CPU layout are transposed in the buffer: a collective that gave
            # back another tensor than the buffer has its result read in the buffer's layout.
            if flat is not packed:
                packed.copy_(flat)
            return list(tensors)
        chunks = flat.split([t.numel() for t in tensors])
        return [chunk.view(t.shape).to(t.dtype) for chunk, t in zip(chunks, tensors)]

    # Checkpoints.
    def export_state(self, groups):
        return {group: {i: (v.value if isinstance(v, Level) else self.copy(v)) for i, v in entries.items()}
                for group, entries in groups.items()}

    def import_state(self, groups, saved):
        for group, entries in groups.items():
            for i, holder in entries.items():
                value = saved[group][i]
                if isinstance(holder, Level):
                    holder.value = value
                else:
                    holder.copy_(value)
