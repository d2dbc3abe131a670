"""The wire bytes of the study's TopK runs recorded before wire bytes were counted, derived from
what each record holds, and checked against it.

A run's record gives, per epoch, the levels in force and the bytes each rank had handed to the
collectives so far; the model's shapes and the world size give, per step and level, how each layer
travels: a kept fraction whose values and indices cost less than the dense layer on a ring goes
in an all-gather (``sparse_is_cheaper``), else the sparsified layer in the allreduce with the 1-D
tensors, and each check's norms go in an allreduce. Per epoch the handed bytes this implies are
compared with the record's, exactly; only where every epoch agrees are the wire bytes written
(``wire_bytes_sent_per_rank`` and ``"wire_bytes_derived": true`` on the record's ``done`` line):
an all-gather carries W − 1 times each rank's part over its link, an allreduce 2(W − 1)/W of its
buffer.

    python benchmarks/topk_wire_bytes.py mnist1d-cnn1d mnist1d-cnn1d-wide
"""
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
from pytorch_train import MODELS  # noqa: E402

from horovod_accordion.core.collectives import wire_share  # noqa: E402
from horovod_accordion.core.compression import (index_bytes, index_dtype, kept_count,  # noqa: E402
                                                packed_index_words, sparse_is_cheaper)

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "study"


def step_traffic(shapes, levels, workers):
    """(handed, wire) bytes of one step at ``levels`` ({layer name: fraction})."""
    handed = wire = 0
    for name, shape in shapes.items():
        numel = math.prod(shape)
        if name in levels and len(shape) > 1:  # older records list the 1-D layers' levels too
            k, dtype = kept_count(levels[name], numel), index_dtype(numel)
            if sparse_is_cheaper(k, numel, index_bytes(dtype), workers):
                part = 4 * (k + packed_index_words(k, dtype))
                handed, wire = handed + part, wire + wire_share("allgather", workers) * part
                continue
        handed, wire = handed + 4 * numel, wire + wire_share("allreduce", workers) * 4 * numel
    return handed, wire


def derive(path, shapes, workers):
    """The run's wire bytes, or the reason the record and the derivation disagree."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    epochs = [r for r in records if r["event"] == "epoch"]
    checks = {r["epoch"]: r for r in records if r["event"] == "check"}
    # Steps per epoch: the first epoch's bytes over one step's (the checks' own are after it).
    first = epochs[0]["bytes_sent_per_rank"] - checks.get(0, {}).get("bytes_sent", 0)
    steps, rest = divmod(first, step_traffic(shapes, epochs[0]["levels"], workers)[0])
    if rest:
        return None, f"epoch 0's {first} bytes are no whole number of steps"
    handed = wire = 0
    for epoch in epochs:
        step_handed, step_wire = step_traffic(shapes, epoch["levels"], workers)
        check = checks.get(epoch["epoch"], {}).get("bytes_sent", 0)
        handed += steps * step_handed + check
        wire += steps * step_wire + wire_share("allreduce", workers) * check
        if handed != epoch["bytes_sent_per_rank"]:
            return None, (f"epoch {epoch['epoch']}: derived {handed} handed bytes, recorded "
                          f"{epoch['bytes_sent_per_rank']}")
    return round(wire), records


def main(settings):
    for setting in settings:
        model = MODELS[setting.split("-", 1)[1]]()
        shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        for path in sorted((RESULTS / setting / "runs").glob("topk-*/seed*.jsonl")):
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if "wire_bytes_sent_per_rank" in records[-1]:
                continue
            wire, checked = derive(path, shapes, records[0]["workers"])
            if wire is None:
                print(f"{path}: not derived: {checked}")
                continue
            records[-1].update(wire_bytes_sent_per_rank=wire, wire_bytes_derived=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            print(f"{path}: {wire} wire bytes ({wire / records[-1]['bytes_sent_per_rank']:.3f}× the handed)")


if __name__ == "__main__":
    main(sys.argv[1:])
