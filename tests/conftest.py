"""Real multi-process tests: ``horovodrun -np N`` launches, each with a timeout.

One launch runs all checks of a worker module (see ``tests/workers/runner.py``), since a
launch costs about 10 s before any code runs. Results are cached per (module,
controller) for the session, and each check is reported as its own test.
"""
import ast
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKERS = REPO / "tests" / "workers"
CONTROLLERS = ["gloo", "mpi"]


def check_names(module_name):
    """The ``check_*`` functions of a worker module, read without importing it."""
    tree = ast.parse((WORKERS / f"{module_name}.py").read_text())
    return sorted(node.name for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("check_"))


def worker_env(extra=None):
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        "PATH": str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "OMP_NUM_THREADS": "1",  # two ranks on two cores: no oversubscription
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_USE_LEGACY_KERAS": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "HOROVOD_ACCORDION_VERIFY_LEVELS": "1",  # every check of every test compares the ranks' levels
    })
    env.update(extra or {})
    return env


def run_workers(module_name, out_dir, np=2, controller="gloo", timeout=300, env=None):
    """Launch ``module_name``'s checks on ``np`` ranks; return ``{rank: results}`` and the output.

    ``controller``: ``gloo`` or ``mpi`` (``horovodrun``), or ``torchrun``, which starts plain
    torch.distributed processes where Horovod cannot be imported (``tests/no_horovod``).
    On a timeout the whole process group is killed, so a hung collective fails the
    test instead of stalling CI; the checks finished before it keep their results.
    """
    runner = ["-m", "tests.workers.runner", module_name, str(out_dir)]
    if controller == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(np),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *runner]
        env = dict(env or {}, PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "no_horovod"), str(REPO)]))
    else:
        horovodrun = pathlib.Path(sys.executable).parent / "horovodrun"
        command = [str(horovodrun), "-np", str(np), f"--{controller}", sys.executable, *runner]
    process = subprocess.Popen(command, cwd=REPO, env=worker_env(env), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        timed_out = True
    results = {}
    for rank in range(np):
        path = pathlib.Path(out_dir) / f"rank{rank}.json"
        results[rank] = json.loads(path.read_text()) if path.exists() else {}
    return Launch(results, output, timed_out, process.returncode, timeout)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Launch:
    def __init__(self, results, output, timed_out, returncode, timeout):
        self.results, self.output, self.timed_out = results, output, timed_out
        self.returncode, self.timeout = returncode, timeout

    def check(self, name):
        """Fail with the traceback of every rank on which ``name`` failed or never finished."""
        problems = []
        for rank, results in self.results.items():
            outcome = results.get(name)
            if outcome is None:
                why = f"timed out after {self.timeout} s" if self.timed_out else f"exit code {self.returncode}"
                problems.append(f"rank {rank}: {name} did not finish ({why})")
            elif not outcome["ok"]:
                problems.append(f"rank {rank}:\n{outcome['error']}")
        if problems:
            pytest.fail("\n".join(problems) + "\n--- launcher output (tail) ---\n" + self.output[-4000:],
                        pytrace=False)
        return {rank: results[name]["value"] for rank, results in self.results.items()}


@pytest.fixture(scope="session")
def launches(tmp_path_factory):
    """``launches(module, controller)`` runs a worker module once per session and controller."""
    cache = {}

    def get(module_name, controller, np=2, timeout=300, env=None):
        key = (module_name, controller, np, tuple(sorted((env or {}).items())))
        if key not in cache:
            out_dir = tmp_path_factory.mktemp(f"{module_name}-{controller}")
            cache[key] = run_workers(module_name, out_dir, np=np, controller=controller, timeout=timeout, env=env)
        return cache[key]

    return get
