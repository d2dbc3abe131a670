"""A worker module's Gloo and MPI launches at once, as `make test`'s two pytest workers run them
(four ranks on two cores): wall and CPU seconds, and each launch's start-up and checks.

    python benchmarks/launch_pair.py torch_checks+torch_overlap_checks HOROVOD_CYCLE_TIME=5

Extra ``NAME=VALUE`` arguments override ``tests/conftest.py``'s worker environment.
Figures: benchmarks/results/test_suite.md.
"""
import pathlib
import resource
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from tests.conftest import LAUNCH_TIMES, run_workers  # noqa: E402


def main(module, *overrides):
    env = dict(override.split("=", 1) for override in overrides)
    launches = {}

    def launch(controller):
        launches[controller] = run_workers(module, tempfile.mkdtemp(), controller=controller, env=env, timeout=900)

    started = time.time()
    threads = [threading.Thread(target=launch, args=(controller,)) for controller in ("gloo", "mpi")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{module} {env}: wall {time.time() - started:.0f} s, CPU {used.ru_utime + used.ru_stime:.0f} s")
    for controller, result in launches.items():
        failed = sorted({name for outcomes in result.results.values() for name, outcome in outcomes.items()
                         if not outcome["ok"]})
        print(f"  {controller}: exit code {result.returncode}, failed checks {failed}")
    for _, controller, _, startup, checks, wall in LAUNCH_TIMES:
        print(f"  {controller}: start-up {startup if startup is not None else '?'} s, checks {checks:.1f} s, "
              f"wall {wall:.1f} s")


if __name__ == "__main__":
    main(*sys.argv[1:])
