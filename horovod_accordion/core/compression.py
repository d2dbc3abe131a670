"""Framework-agnostic descriptions of the switchable compressors and their levels.

A level is what Accordion switches: the PowerSGD rank, the TopK kept fraction, or the
bits of a quantized value.
``low`` is ℓ_low (low compression, used in critical regimes) and ``high`` is ℓ_high.
These objects only validate and describe; the torch and TensorFlow adapters build
the reducers that do the maths. Validation happens here, at construction, so a bad
configuration raises before any collective is started.
"""

import math
from dataclasses import dataclass

__all__ = ["PowerSGD", "Quantized", "SWITCHABLE", "TopK", "padded_length", "quantized_bytes", "is_matrix",
           "powersgd_compresses", "clamped_rank", "kept_count", "cast_compressor", "index_dtype", "index_bytes",
           "packed_index_words", "sparse_is_cheaper"]


@dataclass(frozen=True)
class PowerSGD:
    """Rank-r PowerSGD (Vogels et al., 2019) with error feedback and a warm-started Q.

    Args:
        low_rank: rank used in critical regimes (ℓ_low, e.g. 2 or 4).
        high_rank: rank used elsewhere (ℓ_high, e.g. 1). Defaults to ``low_rank``,
            which is fixed-rank PowerSGD with no switching.
        min_compression_rate: a matrix n×m is compressed only if
            (n + m)·low_rank·min_compression_rate < n·m, as in torch's ``powerSGD_hook``;
            the rest, and every 1-D tensor, is averaged uncompressed in fp32.
        use_error_feedback: add the previous step's compression error to the gradient.
        warm_start: reuse the last step's Q instead of drawing a new one each step.
        seed: seed of the random Q; identical on every rank, so all ranks draw the same Q.
        ladder: the ranks a level policy may choose from, ``low_rank`` first and ``high_rank``
            last, decreasing, for example ``(4, 2, 1)``. ``None``: ``(low_rank, high_rank)``,
            Accordion's two levels. See ``horovod_accordion.core.policies``.
    """
    low_rank: int
    high_rank: int = None
    min_compression_rate: float = 2.0
    use_error_feedback: bool = True
    warm_start: bool = True
    seed: int = 0
    ladder: tuple = None

    def __post_init__(self):
        _check_levels(self, "rank", lambda value: _is_integer(value) and value >= 1, "an integer >= 1")
        if not (self.min_compression_rate >= 0 and math.isfinite(self.min_compression_rate)):
            raise ValueError(f"min_compression_rate must be >= 0, got {self.min_compression_rate!r}")
        _check_ladder(self, "rank", self.low_rank, self.high_rank)

    @property
    def levels(self):
        """The ladder, ℓ_low first and ℓ_high last."""
        return self.ladder


@dataclass(frozen=True)
class TopK:
    """TopK sparsification with error-feedback residuals, averaged over workers.

    Args:
        low_fraction: kept fraction in critical regimes (ℓ_low, e.g. 0.99).
        high_fraction: kept fraction elsewhere (ℓ_high, e.g. 0.1). Defaults to ``low_fraction``.
        use_error_feedback: keep the unsent remainder and add it to the next gradient.
        wire: how a layer's kept values travel. ``"auto"`` (the default): as values and
            indices (an allgather) while that costs less on a ring than a dense allreduce of
            the layer at the current world size, else as the sparsified layer through the
            allreduce; the maths are the same. ``"sparse"`` or ``"dense"`` force one way.
        ladder: the fractions a level policy may choose from, ``low_fraction`` first and
            ``high_fraction`` last, decreasing, for example ``(0.5, 0.25, 0.1)``. ``None``:
            ``(low_fraction, high_fraction)``, Accordion's two levels.
    """
    low_fraction: float
    high_fraction: float = None
    use_error_feedback: bool = True
    wire: str = "auto"
    ladder: tuple = None

    def __post_init__(self):
        _check_levels(self, "fraction",
                      lambda value: not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= 1,
                      "a fraction in (0, 1]")
        if self.wire not in ("auto", "sparse", "dense"):
            raise ValueError(f"TopK wire must be 'auto', 'sparse' or 'dense', got {self.wire!r}")
        _check_ladder(self, "fraction", self.low_fraction, self.high_fraction)

    @property
    def levels(self):
        """The ladder, ℓ_low first and ℓ_high last."""
        return self.ladder


@dataclass(frozen=True)
class Quantized:
    """Blockwise integer quantization, exchanged in two shots, with error feedback at both.

    Each rank adds its error memory to its gradient and quantizes it, block by block (no block
    holds two layers), to
    ``bits``-bit symmetric integers (−L … L, L = 2^(bits−1) − 1) under one fp32 scale per
    ``block_size`` values (the block's largest magnitude ÷ L), rounding to nearest. Each layer
    is cut into W parts of whole blocks; an all-to-all sends every layer's part j to rank j, its
    owner; the owner dequantizes the W copies of its parts, averages them, adds its own memory
    of them and quantizes again; an all-gather returns every part. Each value is quantized twice
    whatever the world size, and each rank's link carries 2(W − 1)/W of the quantized buffer, as a ring allreduce carries fp32: (bits + 32
    / block_size) / 32 of fp32's bytes.

    Rounding to nearest rather than stochastically: error feedback sends each rounding error at
    a later step, so its bias does not accumulate, and no rank needs a random stream. An fp32
    scale costs 32 / block_size bits a value; an fp16 or bf16 one would halve that and lose range
    (fp16) or exactness (bf16), and the error feedback would have to follow its rounding.

    Args:
        low_bits: bits per value in critical regimes (ℓ_low, e.g. 8), 2 to 8.
        high_bits: bits elsewhere (ℓ_high, e.g. 4). Defaults to ``low_bits``: a fixed level.
        block_size: values per scale, a multiple of 8 (so that any ``bits`` packs into whole bytes).
        use_error_feedback: keep both quantizations' errors (each rank's, and each owner's of its
            chunk of the average) and add them at the next step.
        ladder: the bits a level policy may choose from, ``low_bits`` first and ``high_bits``
            last, decreasing, for example ``(8, 4, 2)``.
    """
    low_bits: int = 8
    high_bits: int = None
    block_size: int = 64
    use_error_feedback: bool = True
    ladder: tuple = None

    def __post_init__(self):
        _check_levels(self, "bits", _is_bits, "an integer from 2 to 8")
        block = self.block_size
        if not _is_integer(block) or block < 8 or block % 8:
            raise ValueError(f"Quantized block_size must be a positive multiple of 8, got {block!r}")
        _check_ladder(self, "bits", self.low_bits, self.high_bits)
        if not all(_is_bits(b) for b in self.ladder):
            raise ValueError(f"Quantized ladder {self.ladder!r} must hold integers from 2 to 8")

    @property
    def levels(self):
        """The ladder, ℓ_low first and ℓ_high last."""
        return self.ladder


SWITCHABLE = (PowerSGD, TopK, Quantized)  # the compressions with levels, which keep state across steps


def padded_length(count, size, block):
    """The length a layer of ``count`` values is padded to (with zeros) for ``size`` ranks: the
    same whole number of blocks for each rank."""
    whole = size * block
    return -(-count // whole) * whole


def quantized_bytes(count, bits, block):
    """The bytes of ``count`` values (whole blocks) quantized to ``bits``, with their fp32 scales."""
    return count * bits // 8 + 4 * (count // block)


def _is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bits(value):
    return _is_integer(value) and 2 <= value <= 8


def _check_levels(config, level, valid, requirement):
    """Fill in ``high_<level>`` (default: ``low_<level>``), check that both are ``valid`` (else say
    they must be ``requirement``), and that ℓ_high is not the lower compression."""
    kind, low, high = type(config).__name__, f"low_{level}", f"high_{level}"
    if getattr(config, high) is None:
        object.__setattr__(config, high, getattr(config, low))
    for name in (low, high):
        value = getattr(config, name)
        if not valid(value):
            raise ValueError(f"{kind} {name} must be {requirement}, got {value!r}")
    if getattr(config, high) > getattr(config, low):
        raise ValueError(
            f"{kind} {high} ({getattr(config, high)}) is ℓ_high, the *higher* compression, so it "
            f"must not exceed {low} ({getattr(config, low)}); swap them")


def _check_ladder(config, level, low, high):
    """Fill in the default ladder (low, high), or check a given one: from ``low`` down to
    ``high``, each level a higher compression than the one before."""
    if config.ladder is None:
        object.__setattr__(config, "ladder", (low, high))
        return
    ladder = tuple(config.ladder)
    object.__setattr__(config, "ladder", ladder)
    # Checked even when it repeats (low, high): a rank of 4.0 equals 4 yet cannot slice a matrix.
    whole = level != "rank" or all(isinstance(r, int) and not isinstance(r, bool) for r in ladder)
    if ladder == (low, high) and whole:
        return
    decreasing = all(a > b for a, b in zip(ladder, ladder[1:]))
    if not whole or len(ladder) < 2 or ladder[0] != low or ladder[-1] != high or not decreasing:
        raise ValueError(f"{type(config).__name__} ladder {ladder!r} must run from ℓ_low ({low}) down to ℓ_high "
                         f"({high}), each {level} below the one before")


def cast_compressor(dtype_name, compressors):
    """The Horovod compressor of ``compressors`` ({dtype name: compressor}) that sends ``dtype_name``."""
    if dtype_name == "bfloat16":
        raise ValueError(
            "bf16 gradient compression is not available: Horovod 0.28.1 rejects bf16 allreduce. "
            "Use Compression.fp16 (with gradient_predivide_factor if fp16 sums overflow); bf16 "
            "parameters are supported and their gradients travel as fp32.")
    if dtype_name not in compressors:
        raise ValueError(f"unknown compression dtype {dtype_name!r}; choose one of {sorted(compressors)}")
    return compressors[dtype_name]


def is_matrix(shape):
    """Only tensors with two or more dimensions are compressed, as in the paper."""
    return len(shape) > 1


def matrix_shape(shape, channels_last=False):
    """The (n, m) matrix PowerSGD compresses a tensor as. Output channels first (torch's conv
    kernels, (out, in, kh, kw)): n = shape[0], m = the product of the rest. ``channels_last``
    (TensorFlow's, (kh, kw, in, out)): n = the product of all but the last, m = shape[-1].
    Either way a conv kernel is out × (in·kh·kw) or its transpose, as torch's ``powerSGD_hook``
    views it, and a 2-D tensor is itself."""
    if channels_last:
        return math.prod(shape[:-1]), shape[-1]
    return shape[0], math.prod(shape[1:])


def powersgd_compresses(shape, config):
    if not is_matrix(shape):
        return False
    n, m = matrix_shape(shape)
    return (n + m) * config.low_rank * config.min_compression_rate < n * m


def clamped_rank(rank, shape):
    """A rank above min(n, m) carries no more information, so it is clamped."""
    return min(rank, *matrix_shape(shape))


def index_dtype(numel):
    """The narrowest integer type for a layer's indices: int16 under 32,768 entries."""
    return "int16" if numel <= 2 ** 15 else "int32"


def index_bytes(dtype):
    return 2 if dtype == "int16" else 4


def packed_index_words(count, dtype):
    """How many int32 words ``count`` indices take: int16 ones go two to a word. Works on
    numbers and on framework tensors."""
    return (count + 1) // 2 if dtype == "int16" else count


def sparse_is_cheaper(kept, numel, index_bytes, size):
    """Whether ``kept`` fp32 values and their indices, allgathered over a ring of ``size``
    ranks ((size − 1)·kept·(4 + index_bytes) bytes sent per rank), cost less than a dense
    fp32 allreduce of ``numel`` entries (2·(size − 1)/size·4·numel). Works on numbers and on
    framework tensors: ``kept`` is compared with a threshold computed in Python, as
    kept·a < b ⇔ kept < ⌈b / a⌉ for integers, since the product would wrap past 2³¹ in an
    int32 tensor (a large embedding on 8 ranks)."""
    per_kept = (4 + index_bytes) * size
    return kept < -(-8 * numel // per_kept)


def kept_count(fraction, numel):
    """The number of entries TopK sends: int(fraction·numel), as the authors, but at least one."""
    return max(1, int(fraction * numel))
