"""Which layers are reduced together, and when: DDP's bucketing, for any backend.

Backward produces gradients roughly in the reverse order of the parameters' registration,
so the buckets are filled in that order. Each holds up to ``bucket_cap_mb`` of gradients;
the first is capped at 1 MB, as DDP's is, so the first collective starts after the last
layers' backward instead of after a quarter of the model. The layout depends only on the
parameters' order and sizes, so it is the same on every rank.
"""

__all__ = ["FIRST_BUCKET_MB", "assign_buckets"]

FIRST_BUCKET_MB = 1.0


def assign_buckets(byte_sizes, bucket_cap_mb):
    """Lists of layer indices, each a run of consecutive layers in ascending order; the
    first bucket holds the last layers. ``bucket_cap_mb=None`` puts every layer in one bucket."""
    if bucket_cap_mb is not None and not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of megabytes or None, got {bucket_cap_mb!r}")
    buckets, current, filled = [], [], 0
    for layer in reversed(range(len(byte_sizes))):
        cap = float("inf") if bucket_cap_mb is None else \
            min(bucket_cap_mb, FIRST_BUCKET_MB) * 2 ** 20 if not buckets else bucket_cap_mb * 2 ** 20
        if current and filled + byte_sizes[layer] > cap:
            buckets.append(current[::-1])
            current, filled = [], 0
        current.append(layer)
        filled += byte_sizes[layer]
    if current:
        buckets.append(current[::-1])
    return buckets
