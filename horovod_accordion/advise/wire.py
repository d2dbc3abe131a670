"""The wire time of one collective: a latency-bandwidth (α–β) model.

A ring over W ranks runs in steps, each costing one hop's latency α plus the bytes it moves
over one rank's bandwidth β:

- allreduce of B bytes per rank: 2(W−1) steps of B/W bytes (reduce-scatter, then allgather),
  so 2(W−1)·α + 2(W−1)/W·B/β;
- allgather of B bytes per rank (W·B gathered): W−1 steps of B bytes, so
  (W−1)·α + (W−1)/W·(W·B)/β;
- reduce-scatter of B bytes per rank (B/W kept): W−1 steps of B/W bytes, so
  (W−1)·α + (W−1)/W·B/β (FSDP's, inside a replica).

An all-to-all of B bytes per rank (B/W for each rank) runs pairwise: W−1 steps, in each of
which a rank sends its B/W bytes for one other rank, so (W−1)·α + (W−1)/W·B/β, a
reduce-scatter's cost. Quantized's two shots, an all-to-all of its B quantized bytes and an
allgather of one rank's B/W, thus move 2(W−1)/W·B, as a ring allreduce of B.

NCCL's tree (a double binary tree, used for allreduce only) is modelled with the ring's
bandwidth term, which both reach in the large-message limit, and 2·⌈log2 W⌉ latency steps.
"""

import math
import re
from dataclasses import dataclass

__all__ = ["Link", "parse_link", "collective_seconds"]

_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(k|m|g|t)?bit$")
_SCALE = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


@dataclass(frozen=True)
class Link:
    """One rank's link: ``bits_per_s`` of bandwidth, ``latency_s`` per hop (α), and
    ``shared_by`` ranks sending through it at once (2 on this machine's benchmarks, where
    both ranks share one rate-limited loopback; 1 on a switched network)."""
    name: str
    bits_per_s: float
    latency_s: float = 5e-6
    shared_by: int = 1

    @property
    def bytes_per_s(self):
        return self.bits_per_s / 8 / self.shared_by


def parse_link(text, latency_s=5e-6, shared_by=1):
    """``10gbit``, ``100mbit``, ``400gbit`` (bits per second, as tc writes them)."""
    match = _RATE.match(text.strip().lower())
    if not match:
        raise ValueError(f"link {text!r}: a link is a rate in bits per second as tc writes it, a number and "
                         f"bit, kbit, mbit, gbit or tbit (e.g. 100mbit, 10gbit, 400gbit)")
    return Link(text.strip().lower(), float(match.group(1)) * _SCALE[match.group(2)], latency_s, shared_by)


def collective_seconds(kind, bytes_per_rank, workers, link, algorithm="ring"):
    """Seconds for one ``allreduce``, ``allgather``, ``reduce_scatter`` or ``alltoall`` of
    ``bytes_per_rank`` bytes per rank (what each rank hands over, as the profile's ``issued``)."""
    if workers < 2 or bytes_per_rank == 0:
        return 0.0
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"algorithm must be 'ring' or 'tree', got {algorithm!r}")
    if kind == "allreduce":
        steps, moved = 2 * (workers - 1), 2 * (workers - 1) / workers * bytes_per_rank
        if algorithm == "tree":
            steps = 2 * math.ceil(math.log2(workers))
    elif kind == "allgather":
        steps, moved = workers - 1, (workers - 1) * bytes_per_rank
    elif kind in ("reduce_scatter", "alltoall"):
        steps, moved = workers - 1, (workers - 1) / workers * bytes_per_rank
    else:
        raise ValueError(f"a collective is 'allreduce', 'allgather', 'reduce_scatter' or 'alltoall', got {kind!r}")
    return steps * link.latency_s + moved / link.bytes_per_s
