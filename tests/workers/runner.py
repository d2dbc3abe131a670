"""Runs every ``check_*`` function of a worker module inside one Horovod process.

Launched by ``tests/conftest.py`` as ``horovodrun -np N python -m tests.workers.runner
MODULE OUTDIR``. Each rank writes ``OUTDIR/rank<r>.json`` after every check, so a check
that hangs still leaves the results of the ones before it.
"""
import importlib
import json
import os
import sys
import time
import traceback


def main(module_name, out_dir):
    module = importlib.import_module(f"tests.workers.{module_name}")
    rank = module.setup()
    results = {}
    path = os.path.join(out_dir, f"rank{rank}.json")
    for name in sorted(n for n in vars(module) if n.startswith("check_")):
        started = time.time()
        try:
            value = getattr(module, name)()
            results[name] = {"ok": True, "value": value}
        except Exception:  # reported per check, with this rank's traceback
            results[name] = {"ok": False, "error": traceback.format_exc()}
        results[name]["seconds"] = round(time.time() - started, 3)
        with open(path + ".tmp", "w") as stream:
            json.dump(results, stream, default=repr)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
