"""Runs every ``check_*`` function of a worker module inside one Horovod process.

Launched by ``tests/conftest.py`` as ``horovodrun -np N python -m tests.workers.runner
MODULE[+MODULE...] OUTDIR``: modules that share a setup function share a launch. Each rank writes
``OUTDIR/rank<r>.json`` after every check, so a check that hangs still leaves the results of
the ones before it.
"""
import importlib
import json
import os
import sys
import time
import traceback


def main(module_names, out_dir):
    """``module_names``: one module, or several joined by ``+`` whose ``setup`` is one function
    (a module imports the other's): a second setup could initialize the framework otherwise."""
    modules = [importlib.import_module(f"tests.workers.{name}") for name in module_names.split("+")]
    setups = {module.setup for module in modules}
    assert len(setups) == 1, f"{module_names}: the modules of one launch must share one setup function"
    rank = setups.pop()()
    # Until here, the launch's start-up: the launcher, the imports and the frameworks' init.
    launched = os.environ.get("ACCORDION_LAUNCHED_AT")
    results = {"_startup_s": round(time.time() - float(launched), 3)} if launched else {}
    path = os.path.join(out_dir, f"rank{rank}.json")
    checks = [(module, name) for module in modules for name in sorted(n for n in vars(module) if n.startswith("check_"))]
    names = [name for _, name in checks]
    assert len(set(names)) == len(names), f"two modules of {module_names} have a check of the same name"
    for module, name in checks:
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
