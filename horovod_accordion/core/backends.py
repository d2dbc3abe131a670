"""The contracts between the core (the reducers, the exchange, the schedule) and each framework's
backends, as ``typing.Protocol``s: what a tensor backend (``torch_common.tensors.TorchTensorOps``,
``tensorflow.tensors.TensorFlowTensorOps``) and a collectives backend (``torch/ops.py``,
``hooks/ops.py``, ``tensorflow/ops.py``, the advisor's ``SimulatedWorld``) must provide.
``make test`` type-checks every backend against them (``tests/test_backends.py``), so a backend
that lacks a method fails there, not at run time on some path. Imports no framework.

Words used below: a *state* is a tensor that survives a step (a framework variable); a *level*
holder is a value that a step reads and the bookkeeping between steps sets (a rank, a kept
fraction, a flag); a *flag* is a boolean the device may hold (read without a host sync where
the backend can); a *tensor* is the framework's own.
"""

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

__all__ = ["CollectiveOps", "EagerTensorOps", "Pending", "Sharding", "TensorOps"]

Tensor = Any  # the framework's tensor: torch.Tensor, tf.Tensor or tf.Variable


class Pending(Protocol):
    """A started collective."""

    def wait(self) -> Any:
        """Its result, once every rank has taken part."""


class TensorOps(Protocol):
    """The tensor maths and the state of the reducers and the exchange, in one framework."""

    # State that survives a step.
    def state(self, array: Any, name: str) -> Tensor:
        """A state holding the numpy ``array``, in fp32 (or the backend's own precision)."""

    def read(self, state: Tensor) -> Tensor:
        """The state's value, for maths."""

    def assign(self, state: Tensor, value: Tensor) -> None: ...

    def zero(self, state: Tensor) -> None: ...

    def level(self, value: Any, name: str) -> Any:
        """A level holder, set by ``set_level`` and read by the step in force."""

    def set_level(self, level: Any, value: Any) -> None: ...

    def leading_columns(self, q: Tensor, rank: Any) -> Tensor:
        """The first ``rank`` (a level holder) columns of ``q``."""

    def assign_leading_columns(self, q: Tensor, value: Tensor) -> None: ...

    def random_normal(self, like: Tensor, stream: int, counter: Any) -> Tensor:
        """The ``counter``-th standard normal draw of ``stream``, shaped like ``like``, identical on
        every rank and in every framework; advances the level holder ``counter``."""

    # Tensor maths.
    def matrix_shape(self, shape: Sequence[int]) -> Tuple[int, int]:
        """The n × m matrix PowerSGD views a tensor of ``shape`` as, in this framework's layout."""

    def as_matrix(self, grad: Tensor, shape: Sequence[int]) -> Tensor:
        """``grad`` reshaped to ``shape``, in fp32 or better."""

    def like(self, value: Tensor, grad: Tensor) -> Tensor:
        """``value`` in ``grad``'s shape and dtype."""

    def matmul(self, a: Tensor, b: Tensor) -> Tensor: ...

    def transpose(self, a: Tensor) -> Tensor: ...

    def orthogonalize(self, p: Tensor) -> Tensor:
        """P's columns orthonormalised; a zero P gives unit columns, a non-finite P stays non-finite."""

    def pack_products(self, name: str, products: List[Tuple[Tensor, Tensor]], tensors: List[Tensor]) -> List[Tensor]:
        """``[a @ b for a, b in products] + tensors``, laid out for one collective."""

    def kept_count(self, fraction: Any, m: Tensor) -> Any:
        """TopK's kept count of ``m`` at the level holder ``fraction``."""

    def top_abs_indices(self, m: Tensor, k: Any) -> Tensor: ...

    def level_value(self, level: Any) -> Any:
        """The value of the level holder ``level`` as the reducer's Python code sees it."""

    def as_columns(self, tensors: List[Tensor], widths: List[int], rows: int,
                   plus: Optional[List[Tensor]] = None) -> Tensor:
        """(``rows``, Σ ``widths``) fp32: each 1-D tensor (plus its ``plus`` counterpart, added in
        fp32), zero-padded to ``rows`` × its width, in its columns."""

    def difference(self, a: Tensor, b: Tensor) -> Tensor:
        """``a − b``, which may be written over ``a``: the caller does not read ``a`` again."""

    def placed(self, pieces: List[Tuple[int, Tensor]], length: int) -> Tensor:
        """Zeros of ``length`` in fp32, with each 1-D tensor of ``pieces`` (``(offset, tensor)``) at its offset."""

    def reshape(self, tensor: Tensor, shape: Sequence[int]) -> Tensor:
        """``tensor`` in ``shape``, its dtype kept."""

    def part(self, flat: Tensor, first: int, last: int) -> Tensor:
        """``flat[first:last]``; of a state, a part that ``assign_if_finite`` writes into the state."""

    def quantize(self, rows: Tensor, bits: int, block: int) -> Tuple[Tensor, Tensor]:
        """``(wire, sent)``: each fp32 row (whole blocks) as packed ``bits``-bit codes and fp32
        scales (uint8, one row per row), and the fp32 values they stand for (``Quantized``)."""

    def dequantize(self, wire: Tensor, bits: int, block: int) -> Tensor:
        """``quantize``'s values (fp32 rows) from its wire."""

    def move_outside(self, source: Tensor, target: Tensor, first: int, last: int, factor: Any) -> None:
        """``target += factor · source`` outside ``first:last``, where the state ``source`` becomes 0."""

    def mean_of_rows(self, rows: Tensor) -> Tensor:
        """The rows' mean, summed in row order."""

    def gather(self, m: Tensor, indices: Tensor) -> Tensor: ...

    def zeroed_at(self, m: Tensor, indices: Tensor) -> Tensor: ...

    def all_finite(self, *tensors: Tensor) -> Tensor:
        """A flag: whether every entry of the tensors (``None`` skipped) is finite, summed in fp32 or better."""

    def finite_or(self, value: Tensor, fallback: Tensor) -> Tensor: ...

    def assign_if_finite(self, state: Tensor, value: Tensor, also: Tensor = None) -> None:
        """``state = value`` if all of ``value`` (and of ``also``) is finite."""

    def add_at(self, total: Tensor, indices: Sequence[int], values: Tensor) -> None:
        """``total[indices] += values``."""

    def delta_like(self, param: Any) -> Tensor:
        """A zero Δ for a parameter: fp64 for fp64 parameters, else fp32."""

    def counters(self, count: int) -> Tensor:
        """``count`` zero counters, a state."""

    def add_if(self, total: Tensor, flag: Tensor, value: Tensor) -> None:
        """``total += value`` where the flag is true."""

    def when(self, flag: Any, action: Callable[[], None]) -> None:
        """Run ``action`` where the level holder ``flag`` is true (in a traced step: at run time)."""

    def cond(self, flag: Any, if_true: Callable[[], Any], if_false: Callable[[], Any]) -> Any: ...

    def constant_flag(self, value: bool) -> Any: ...

    def any_flag(self, flags: List[Any]) -> Any:
        """Whether any of ``flags`` may be true."""

    def zero_count(self) -> Any: ...

    def empty_words(self) -> Tensor: ...

    def empty_floats(self) -> Tensor: ...

    def pack_indices(self, indices: Tensor, dtype: str) -> Tensor:
        """Indices as int32 words (int16 ones two to a word)."""

    def unpack_indices(self, words: Tensor, count: Any, dtype: str) -> Tensor: ...

    def float_bits(self, values: Tensor) -> Tensor: ...

    def bits_float(self, bits: Tensor) -> Tensor: ...

    def concat(self, tensors: List[Tensor]) -> Tensor: ...

    def columns(self, matrix: Tensor, start: Any, stop: Any) -> Tensor: ...

    def scatter_mean(self, like: Tensor, indices: Tensor, values: Tensor) -> Tensor:
        """The ranks' sparse ``values`` at ``indices`` (one row per rank), summed densely and averaged."""

    def squared_norms(self, tensors: List[Tensor]) -> Tensor:
        """Each tensor's squared norm, as one fp64 vector."""

    def finite_flags(self, tensors: List[Tensor]) -> Tensor: ...

    def false_as_ones(self, flags: Tensor) -> Tensor: ...

    def to_floats(self, tensor: Tensor) -> List[Any]:
        """The tensor's values as Python floats (a host read)."""

    def from_floats(self, values: List[float]) -> Tensor:
        """An fp64 tensor of ``values``, on the backend's device."""

    # What the collectives send.
    def wire_dtype(self, tensor: Tensor) -> str:
        """The dtype ``tensor`` travels in, by name."""

    def flat_concat(self, tensors: List[Tensor], wire_dtype: str) -> Tensor:
        """The tensors as one flat buffer of ``wire_dtype``, which a collective may overwrite."""

    def split_like(self, flat: Tensor, tensors: List[Tensor]) -> List[Tensor]:
        """``flat`` (``flat_concat``'s result, reduced) split back into ``tensors``' shapes and dtypes."""

    # Host state: values the host sets or reads between steps, which the step sends or writes
    # without waiting for the device (``horovod_accordion.core.rates``).
    def host_state(self, array: Any, name: str) -> Any:
        """A host state holding the numpy ``array``, in fp64."""

    def set_host_state(self, holder: Any, values: List[float]) -> None: ...

    def read_host_state(self, holder: Any) -> List[float]:
        """Its values, once the last ``hold_for_host`` into it is done."""

    def hold_for_host(self, holder: Any, value: Tensor) -> None:
        """Copy the 1-D ``value`` into ``holder`` (in a traced step, when the step runs)."""

    def values_like(self, holder: Any, like: Tensor = None) -> Tensor:
        """A copy of the host state's values as a 1-D tensor in ``like``'s wire dtype
        (``wire_dtype``), on its device (fp64 without ``like``)."""

    def with_leading_columns(self, rows: Tensor, holder: Any) -> Tensor:
        """The 2-D ``rows`` with the host state's values in front of every row, in their dtype."""

    def column_means(self, rows: Tensor) -> Tensor:
        """The mean of each column of the 2-D ``rows``, in fp64."""


class EagerTensorOps(TensorOps, Protocol):
    """What the exchange asks of an eager backend (torch) besides: its own checkpoints
    (TensorFlow's state is variables that ``tf.train.Checkpoint`` tracks), and the loss scale of
    AMP (a ``torch.amp.GradScaler``'s)."""

    def unscaled(self, grads: List[Tensor], scale: Tensor) -> List[Tensor]:
        """``grads`` × 1/``scale`` (a loss scale): exact for a power of two."""

    def scaled(self, value: Tensor, scale: Tensor) -> Tensor: ...

    def copy(self, state: Tensor) -> Tensor: ...

    def export_state(self, groups: Dict[str, Dict[int, Any]]) -> Dict[str, Dict[int, Any]]:
        """The state groups' values, detached from the live states."""

    def import_state(self, groups: Dict[str, Dict[int, Any]], saved: Dict[str, Dict[int, Any]]) -> None: ...


class CollectiveOps(Protocol):
    """The collectives over one backend's tensors (``horovod_accordion.core.collectives.Collectives``
    gives the fused ones and the byte count from the two single-tensor ones)."""

    tensors: Any  # its TensorOps

    def size(self) -> Any: ...

    def rank(self) -> Any: ...

    def included(self) -> bool:
        """Whether this process takes part (a Horovod process set may leave it out)."""

    def start_allreduce_mean(self, flat: Tensor, name: str, compression: Any = None) -> Pending:
        """Start averaging the flat ``flat`` over ranks, which it may overwrite; counts the bytes sent."""

    def start_allgather(self, flat: Tensor, name: str) -> Pending:
        """Start gathering every rank's 1-D ``flat``: the result has shape (size, len)."""

    def start_alltoall(self, rows: Tensor, name: str) -> Pending:
        """Start sending row j of ``rows`` (shape (size, k)) to rank j: the result has shape
        (size, k), row r from rank r."""

    def start_allreduce_means(self, tensors: List[Tensor], name: str, compression: Any = None) -> Pending: ...

    def allreduce_means(self, tensors: List[Tensor], name: str, compression: Any = None) -> List[Tensor]: ...

    def take_traffic(self) -> Any:
        """The bytes handed to collectives and those that crossed this rank's link
        (``collectives.wire_share``) since the last call, as a ``collectives.Traffic``."""

    def carry(self, values: Any, means: Any) -> None:
        """Send the host state ``values`` on the next of the public collectives above that can
        carry them exactly, and hold their mean over ranks in the host state ``means``
        (``horovod_accordion.core.rates``)."""

    def riding(self) -> bool:
        """Whether a rider waits for a collective that can carry it."""

    def drop_rider(self) -> None: ...


class Sharding(Protocol):
    """Hybrid sharding (FSDP2 on a replicas × shards layout): each rank holds one shard of every
    layer, and the reducer's collectives average it over the shard's replicas."""

    @property
    def shards(self) -> int:
        """The ranks that share one replica of the model."""

    @property
    def world(self) -> CollectiveOps:
        """The collectives over every rank, replicas × shards."""
