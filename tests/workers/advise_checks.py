"""The advisor's bytes against our torch optimizer's own count, on a real ``horovodrun -np 2``."""
import torch
import torch.nn.functional as F

import horovod_accordion.torch as hvd
from horovod_accordion.advise.profile import measure_exchange
from horovod_accordion.advise.variants import Variant, parse_variant
from horovod_accordion.core.compression import PowerSGD
from tests.workers.models import batch_of_rank, make_model

# Each compression, and the fixed level whose run the Accordion variant's ℓ_high is compared with.
# Every matrix is compressed at both ranks (min_compression_rate=0): with the default, ℓ_low's
# rank decides which layers are compressed, so Accordion at rank 1 is not fixed rank 1.
VARIANTS = {text: parse_variant(text) for text in ("none", "fp16", "topk:0.1", "topk:0.5", "accordion:topk:0.5/0.1",
                                                   "quantized:4", "accordion:quantized:8/4")}
VARIANTS.update({"powersgd:1": Variant("powersgd:1", compression=PowerSGD(1, min_compression_rate=0)),
                 "powersgd:2": Variant("powersgd:2", compression=PowerSGD(2, min_compression_rate=0)),
                 "accordion:powersgd:2/1": Variant("accordion:powersgd:2/1",
                                                   compression=PowerSGD(2, 1, min_compression_rate=0))})
HIGH_AS_FIXED = {"accordion:powersgd:2/1": "powersgd:1", "accordion:topk:0.5/0.1": "topk:0.1",
                 "accordion:quantized:8/4": "quantized:4"}


def setup():
    hvd.init()
    torch.set_num_threads(1)
    return hvd.rank()


def first_step(variant):
    """One step of our optimizer: its logged bytes, and the gradients it exchanged. Without the
    decay rule, as the advisor profiles: the learning rate's 65 values (``core.rates``) are left
    out of its predictions."""
    model = make_model()
    compression = variant.compression or getattr(hvd.Compression, variant.cast)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(), compression=compression,
                                         window_steps=10, lr_decay_factor=None)
    x, y = batch_of_rank(hvd.rank(), 0)
    F.cross_entropy(model(x), y).backward()
    names = [name for name, _ in model.named_parameters()]
    grads = [p.grad.detach().clone() for p in model.parameters()]  # before the step averages them
    optimizer.step()
    return optimizer.accordion_stats()["bytes_per_step"][-1], names, grads


def check_bytes_per_variant():
    """{compression/level: [optimizer's bytes, advisor's bytes]}; an Accordion run starts at ℓ_low."""
    real, counted = {}, {}
    for text, variant in VARIANTS.items():
        real[text], names, grads = first_step(variant)
        for key in variant.level_keys:
            counted[f"{text}/{key}"] = measure_exchange(names, grads, variant, "horovod", hvd.size(), key,
                                                        repeats=1, warmup=0)["step_bytes"]
    pairs = {}
    for name, advised in counted.items():
        text, _, key = name.rpartition("/")
        pairs[name] = [real[HIGH_AS_FIXED[text]] if key == "high" else real[text], advised]
    return pairs
