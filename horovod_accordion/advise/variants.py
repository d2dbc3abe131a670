"""The compressions the advisor compares, named on the command line:
``none``, ``fp16``, ``powersgd:R``, ``topk:F``, ``accordion:powersgd:LOW/HIGH`` and
``accordion:topk:LOW/HIGH`` (ℓ_low/ℓ_high, e.g. ``accordion:powersgd:2/1``)."""

from dataclasses import dataclass

from horovod_accordion.compression import PowerSGD, TopK

__all__ = ["Variant", "parse_variant", "LAYOUTS"]

# Which backend's buckets: ours (Horovod's optimizer: dense gradients one by one with Horovod's
# tensor fusion, compressed ones in 25 MB buckets) or DDP's (25 MB buckets for everything).
LAYOUTS = ("horovod", "ddp")


@dataclass(frozen=True)
class Variant:
    """``cast`` (``"none"`` or ``"fp16"``) for a dense allreduce, else ``compression`` (a
    ``PowerSGD`` or ``TopK`` of the core, ℓ_low and ℓ_high in its ``levels``)."""
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


def parse_variant(text):
    name = text.strip().lower()
    family, _, argument = name.partition(":")
    try:
        if family in ("none", "fp16") and not argument:
            return Variant(name, cast=family)
        if family == "powersgd":
            return Variant(name, compression=PowerSGD(int(argument)))
        if family == "topk":
            return Variant(name, compression=TopK(float(argument)))
        if family == "accordion":
            inner, _, levels = argument.partition(":")
            low, _, high = levels.partition("/")
            if inner == "powersgd":
                return Variant(name, compression=PowerSGD(int(low), int(high)))
            if inner == "topk":
                return Variant(name, compression=TopK(float(low), float(high)))
    except ValueError as error:
        raise ValueError(f"compression {text!r}: {error}") from None
    raise ValueError(f"unknown compression {text!r}: use none, fp16, powersgd:R, topk:F, "
                     f"accordion:powersgd:LOW/HIGH or accordion:topk:LOW/HIGH")
