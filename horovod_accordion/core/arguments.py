"""Checks shared by every adapter: Horovod's optimizer arguments, and the cross-rank
consistency of what will be exchanged. Pure Python; the adapters run the collectives."""

import collections
import hashlib
import os

__all__ = ["check_on_one_device", "check_optimizer_arguments", "check_real_floating", "check_same_exchange_on_all_ranks",
           "check_same_on_all_ranks", "collective_prefix", "exchange_signature", "under_elastic"]

_exchanges_built = collections.Counter()  # per layer-name hash, in this process


def collective_prefix(names):
    """The prefix of an exchange's collective names, the same on every rank: Horovod matches
    collectives by name, so two optimizers whose buckets are in flight in one backward (a GAN,
    one optimizer per module) must not both send ``powersgd.P.b0``. It is a hash of the layer
    names, as Horovod names its allreduces by parameter, numbered from the second exchange
    this process builds over the same names; ``check_same_exchange_on_all_ranks`` then gives
    every rank the first rank's, should the ranks have built different numbers of exchanges."""
    base = "accordion." + hashlib.sha1("\0".join(names).encode()).hexdigest()[:10]
    _exchanges_built[base] += 1
    return base if _exchanges_built[base] == 1 else f"{base}.{_exchanges_built[base]}"


def under_elastic():
    """Whether this worker runs under ``horovodrun --min-np/--max-np`` (Horovod sets it). There
    a joining worker builds its optimizer while the others train, so the cross-rank checks
    move from construction to each state sync."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def check_optimizer_arguments(op_name, gradient_predivide_factor, backward_passes_per_step):
    """``op_name``: "average", "sum" or "adasum"."""
    if op_name == "adasum":
        raise ValueError("op=Adasum is not supported by horovod_accordion; use Average or Sum")
    if op_name not in ("average", "sum"):
        raise ValueError(f"op must be Average or Sum, got {op_name!r}")
    if gradient_predivide_factor != 1.0 and op_name != "average":
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}")
    if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")


def check_real_floating(names, dtypes, is_real_floating):
    """Gradients are averaged, compressed and checked for finiteness as real floats; an
    integer or complex tensor would be cast and lose its meaning silently."""
    bad = [f"{name!r} ({dtype})" for name, dtype, ok in zip(names, dtypes, is_real_floating) if not ok]
    if bad:
        raise TypeError(f"horovod_accordion averages real floating-point gradients only; these parameters are "
                        f"not: {', '.join(bad)}. Freeze them (requires_grad=False / trainable=False) or keep "
                        f"them out of the optimizer.")


def check_on_one_device(names, devices, levels):
    """A compressing or adaptive exchange keeps its state (Q, memories, the window's Δ and its
    counts) on one device per process, so a model spread over several devices is refused here,
    naming them, instead of failing at its first step with a device mismatch. The plain
    compressions (``levels == (None, None)``) keep no state and run anywhere, as Horovod's own."""
    if tuple(levels) == (None, None):
        return
    first_on = {}
    for name, device in zip(names, devices):
        first_on.setdefault(str(device), name)
    if len(first_on) > 1:
        spread = ", ".join(f"{device} ({name!r}, ...)" for device, name in first_on.items())
        raise ValueError(f"the parameters are on {len(first_on)} devices: {spread}. Accordion keeps its compression "
                         f"state on one device per process: put the model on one device, or use Compression.none or "
                         f"Compression.fp16, which keep no state")


def exchange_signature(names, shapes, dtypes, compression, policy):
    """What every rank must agree on: the fused buffers are laid out in this order, and the
    policy decides which collectives a check runs (an error table or none) and at which levels."""
    return {"parameters": [(name, tuple(int(d) for d in shape), str(dtype))
                           for name, shape, dtype in zip(names, shapes, dtypes)],
            "compression": repr(compression), "policy": repr(policy)}


def check_same_exchange_on_all_ranks(collectives, names, shapes, dtypes, compression, policy):
    """A collective, through ``collectives``' ``broadcast_object`` and ``sum_over_ranks``: every
    rank must exchange the same tensors, in the same order, with the same compression and level
    policy. Then every rank takes the first rank's collective names (``collectives.name_prefix``),
    whatever other exchanges each process has built before."""
    check_same_on_all_ranks(exchange_signature(names, shapes, [str(d) for d in dtypes], compression, policy),
                            collectives.rank(), collectives.broadcast_object, collectives.sum_over_ranks)
    collectives.name_prefix = collectives.broadcast_object(collectives.name_prefix)


def check_same_on_all_ranks(local, rank, broadcast_from_root, sum_over_ranks):
    """Raise on every rank if any rank's ``local`` signature differs from rank 0's: the odd
    rank says where, the others say that one did. Raising on one rank only would leave
    the others waiting in the first collective of the next step."""
    problem = first_difference(broadcast_from_root(local), local, rank)
    mismatched = sum_over_ranks(int(problem is not None))
    if problem is not None:
        raise ValueError(problem)
    if mismatched:
        raise ValueError(f"{mismatched} other rank(s) registers its parameters differently from rank 0 or uses "
                         f"another compression or policy; their error says where")


def first_difference(reference, local, rank):
    """``None`` if ``local`` matches rank 0's ``reference``, else a message saying where it differs."""
    for part in ("compression", "policy"):
        if local[part] != reference[part]:
            return f"rank {rank} uses {part} {local[part]}, rank 0 uses {reference[part]}; all ranks must use the same"
    ours, theirs = local["parameters"], reference["parameters"]
    if ours == theirs:
        return None
    position = next((k for k, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(ours), len(theirs)))
    return (f"rank {rank} registers its parameters differently from rank 0: at position {position}, "
            f"rank 0 has {_describe(theirs, position)} and rank {rank} has {_describe(ours, position)}. "
            f"{_frozen_on_one_side(theirs, ours, rank)}"
            f"Build the model and the optimizer the same way on every rank (same parameter order).")


def _frozen_on_one_side(theirs, ours, rank):
    """Where one side lacks parameters the other has: most often frozen (``requires_grad=False``)
    on some ranks only, since the exchange takes the trainable parameters."""
    ours_names, theirs_names = {p[0] for p in ours}, {p[0] for p in theirs}
    only = [(name, side) for names, other, side in ((theirs_names, ours_names, f"rank {rank}"),
                                                     (ours_names, theirs_names, "rank 0"))
            for name in sorted(names - other)]
    if not only:
        return ""
    listed = ", ".join(f"{name!r} (not on {side})" for name, side in only[:5])
    return (f"Parameters only one of them trains: {listed}; a parameter frozen (requires_grad=False) on some "
            f"ranks only is left out of their exchange: freeze the same parameters on every rank. ")


def _describe(signature, position):
    return repr(signature[position]) if position < len(signature) else "nothing"
