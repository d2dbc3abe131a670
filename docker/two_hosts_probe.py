"""Train the torch example (examples/pytorch_train.py) with Accordion, and print on every rank
what two hosts must agree on: one ``PROBE {json}`` line per rank.

    horovodrun -np 2 -H hostA:1,hostB:1 -p 2222 python docker/two_hosts_probe.py --epochs 8

The line holds the rank's host name, the levels of every Accordion check, the bytes it sent at
every step, and a SHA-256 of its final parameters. scripts/test_image.sh compares the ranks of a
run across two containers, and that run with the same one outside the containers. The arguments
are those of pytorch_train.py (default here: MNIST-1D, the 1-D CNN, PowerSGD ℓ_low 4 / ℓ_high 1).
"""
import hashlib
import json
import pathlib
import socket
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))

import torch  # noqa: E402

import horovod_accordion.torch as hvd  # noqa: E402
import pytorch_train  # noqa: E402


def main(argv):
    args = pytorch_train.parse_args(["--no-progress", *argv])
    made = []
    factory = hvd.DistributedOptimizer

    def keep(*a, **k):  # the example builds one optimizer; keep it to read its state afterwards
        made.append(factory(*a, **k))
        return made[-1]

    hvd.DistributedOptimizer = keep
    record = pytorch_train.main(args)
    optimizer, = made
    stats = optimizer.accordion_stats()
    params = torch.cat([p.detach().reshape(-1) for group in optimizer.param_groups for p in group["params"]])
    print("PROBE " + json.dumps({
        "rank": hvd.rank(), "size": hvd.size(), "host": socket.gethostname(),
        "check_levels": [{"event": c.get("event"), "levels": c.get("levels")} for c in stats["checks"]],
        "final_levels": stats["levels"],
        "steps": stats["steps"], "bytes_per_step": stats["bytes_per_step"],
        "total_bytes_sent": stats["total_bytes_sent"],
        "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "test_accuracy": record["test_accuracy"],
    }, sort_keys=True), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
