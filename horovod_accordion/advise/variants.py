"""The compressions the advisor compares, named on the command line:
``none``, ``fp16``, ``powersgd:R``, ``topk:F``, ``quantized:B``, ``accordion:powersgd:LOW/HIGH``,
``accordion:topk:LOW/HIGH`` and ``accordion:quantized:LOW/HIGH`` (ℓ_low/ℓ_high, e.g.
``accordion:powersgd:2/1``, ``accordion:quantized:8/4``)."""

import math
from dataclasses import dataclass

from horovod_accordion.core.compression import PowerSGD, Quantized, TopK

__all__ = ["Variant", "parse_variant", "LAYOUTS", "hsdp_layout", "shard_shape", "shards_of"]

# Which backend's buckets: ours (Horovod's optimizer: dense gradients one by one with Horovod's
# tensor fusion, compressed ones in 25 MB buckets) or DDP's (25 MB buckets for everything).
LAYOUTS = ("horovod", "ddp")


def hsdp_layout(shards):
    """The profile's layout name of FSDP2's hybrid-sharded exchange on ``shards`` shards."""
    return f"hsdp:{shards}"


def shards_of(layout):
    """The shards of an ``hsdp:S`` layout, or ``None`` for another layout."""
    family, _, shards = layout.partition(":")
    return int(shards) if family == "hsdp" else None


def shard_shape(shape, shards):
    """FSDP2's padded shard of a parameter of ``shape``: ⌈rows / shards⌉ rows of dim 0."""
    return (math.ceil(shape[0] / shards), *shape[1:]) if shape else ()


@dataclass(frozen=True)
class Variant:
    """``cast`` (``"none"`` or ``"fp16"``) for a dense allreduce, else ``compression`` (a
    ``PowerSGD``, ``TopK`` or ``Quantized`` of the core, ℓ_low and ℓ_high in its ``levels``)."""
    name: str
    cast: str = None
    compression: object = None

    @property
    def adaptive(self):
        return self.compression is not None and self.compression.levels[0] != self.compression.levels[-1]

    @property
    def level_keys(self):
        """The levels profiled: ``low`` and ``high`` for Accordion, one ``fixed`` otherwise."""
        return ("low", "high") if self.adaptive else ("fixed",)

    def level(self, key):
        return None if self.compression is None else self.compression.levels[-1 if key == "high" else 0]


ACCEPTED = ("accepted: none, fp16, powersgd:R (R a rank, e.g. powersgd:1), topk:F (F the fraction kept, "
            "e.g. topk:0.01), quantized:B (B bits per value, 2 to 8, e.g. quantized:4), "
            "accordion:powersgd:LOW/HIGH (e.g. accordion:powersgd:4/1), accordion:topk:LOW/HIGH "
            "(e.g. accordion:topk:0.99/0.1) and accordion:quantized:LOW/HIGH (e.g. accordion:quantized:8/4)")


def _number(text, kind, what):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{what} is not a number: {text!r}" if text else f"{what} is missing") from None


def _variant(name, family, argument):
    """The ``Variant`` that ``name`` spells, or None if it spells none."""
    if family in ("none", "fp16") and not argument:
        return Variant(name, cast=family)
    if family == "powersgd":
        return Variant(name, compression=PowerSGD(_number(argument, int, "the rank")))
    if family == "topk":
        return Variant(name, compression=TopK(_number(argument, float, "the fraction kept")))
    if family == "quantized":
        return Variant(name, compression=Quantized(_number(argument, int, "the bit width")))
    if family == "accordion":
        inner, _, levels = argument.partition(":")
        low, _, high = levels.partition("/")
        if inner == "powersgd":
            return Variant(name, compression=PowerSGD(_number(low, int, "ℓ_low's rank"),
                                                      _number(high, int, "ℓ_high's rank")))
        if inner == "topk":
            return Variant(name, compression=TopK(_number(low, float, "ℓ_low's fraction"),
                                                  _number(high, float, "ℓ_high's fraction")))
        if inner == "quantized":
            return Variant(name, compression=Quantized(_number(low, int, "ℓ_low's bit width"),
                                                       _number(high, int, "ℓ_high's bit width")))
    return None


def parse_variant(text):
    """The ``Variant`` named on the command line; a ValueError that lists the accepted forms."""
    name = text.strip().lower()
    family, _, argument = name.partition(":")
    try:
        variant = _variant(name, family, argument)
    except ValueError as error:  # a number that does not parse, or levels the compression refuses
        raise ValueError(f"compression {text!r}: {error}; {ACCEPTED}") from None
    if variant is None:
        raise ValueError(f"unknown compression {text!r}; {ACCEPTED}")
    return variant
