"""Real multi-process tests: ``horovodrun -np N`` launches, each with a timeout.

One launch runs all checks of a worker module (see ``tests/workers/runner.py``), since a
launch costs seconds before any code runs (the summary at the end of the run says how many,
per launch). Results are cached per (module, controller) for the session, and each check is
reported as its own test.
"""
import ast
import json
import os
import pathlib
import re
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# Each worker launch of the session: (module, controller, processes, start-up s, checks s, wall s).
LAUNCH_TIMES = []
WORKERS = REPO / "tests" / "workers"
CONTROLLERS = ["gloo", "mpi"]


def check_names(module_names):
    """The ``check_*`` functions of a worker module (or of ``a+b``, modules that share a launch),
    read without importing it."""
    return sorted(node.name for name in module_names.split("+")
                  for node in ast.parse((WORKERS / f"{name}.py").read_text()).body
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("check_"))


# Ray Train's controller collects each worker's report when it polls, every 2 s, and a worker's next
# report waits for that: short epochs mostly wait (benchmarks/results/test_suite.md).
RAY_TRAIN_POLL = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}


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
        # Four ranks share two cores: at 0.2 ms the TensorFlow launches took a fifth more CPU
        # (benchmarks/results/test_suite.md has the measurements behind 5 ms).
        "HOROVOD_CYCLE_TIME": "5",
        # Open MPI polls in a busy loop unless it knows the cores are shared; they are: with two pytest
        # workers, four ranks run on two cores, and a spinning rank takes the core a slower one needs.
        "OMPI_MCA_mpi_yield_when_idle": "1",
        **RAY_TRAIN_POLL,
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
    launched = time.time()
    process = subprocess.Popen(command, cwd=REPO, env=worker_env(dict(env or {}, ACCORDION_LAUNCHED_AT=str(launched))),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        timed_out = True
    wall = time.time() - launched
    results = {}
    for rank in range(np):
        path = pathlib.Path(out_dir) / f"rank{rank}.json"
        results[rank] = json.loads(path.read_text()) if path.exists() else {}
    startup = max((r.pop("_startup_s") for r in results.values() if "_startup_s" in r), default=None)
    checks = max((sum(c["seconds"] for c in r.values()) for r in results.values()), default=0.0)
    LAUNCH_TIMES.append((module_name, controller, np, startup, checks, wall))
    return Launch(results, output, timed_out, process.returncode, timeout)


class Runs:
    """One launch's output, in which an example trained ``names`` in turn: each rank announces
    each run (``[rank R] training with <name>``) before its lines of it. ``runs[name]``: rank 0's
    part; ``runs.of_rank(rank, name)``: that rank's, its lines of that run and no others of its own
    (other ranks' lines interleave)."""

    def __init__(self, output, names):
        self.output, self.names = output, list(names)

    def __getitem__(self, name):
        return self.of_rank(0, name)

    def of_rank(self, rank, name):
        # Not up to the newline: torchrun's unbuffered ranks write a line and its newline apart,
        # and another rank's text can come between them.
        starts, position = [], 0
        for each in self.names:
            found = re.compile(rf"\[rank {rank}\] training with {re.escape(each)}(?![\w-])").search(self.output, position)
            assert found, f"rank {rank} announced no run of {each}:\n" + self.output[-4000:]
            position = found.start()
            starts.append(position)
        index = self.names.index(name)
        return self.output[starts[index]:(starts + [len(self.output)])[index + 1]]


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


# The test files that take longest, longest first: on two pytest workers, each takes the next file
# when it runs dry (``--dist loadfile --no-loadscope-reorder``), so the long ones must not come last.
LONGEST_FIRST = ["test_release.py", "test_fault_tolerance.py", "test_examples.py", "test_tensorflow_workers.py",
                 "test_ray_train.py", "test_study.py", "test_usage.py", "test_torch_workers.py", "test_keras3.py",
                 "test_snippets.py"]


def pytest_collection_modifyitems(items):
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands its launches' times to the controller, which prints them."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["launch_times"] = LAUNCH_TIMES


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    LAUNCH_TIMES.extend(tuple(launch) for launch in getattr(node, "workeroutput", {}).get("launch_times", []))


# Seconds spent in each test file (setup, call and teardown of its tests), of wall time and of CPU:
# the test process's and that of the processes it waited for (launches included; not daemons such as
# a Ray cluster's, which nobody waits for). Summed on the controller, to which xdist hands each
# worker's reports once. On two cores the suite is bound by its CPU time.
FILE_TIMES = {}


def cpu_seconds():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


CPU_AT_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    item.stash[CPU_AT_START] = cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when == "teardown":  # a test's last report: its CPU, fixtures' set-up and tear-down included
        report.user_properties.append(("cpu", cpu_seconds() - item.stash[CPU_AT_START]))


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    wall, cpu = FILE_TIMES.get(path, (0.0, 0.0))
    FILE_TIMES[path] = (wall + report.duration, cpu + dict(report.user_properties).get("cpu", 0.0))


def pytest_terminal_summary(terminalreporter):
    """The wall and CPU time of each test file, then each worker launch's start-up (launcher,
    imports, init: until its first check began) apart from its checks, slowest first."""
    if FILE_TIMES:
        terminalreporter.section("test files: wall and CPU of the processes waited for (s)")
        for path, (wall, cpu) in sorted(FILE_TIMES.items(), key=lambda item: -item[1][1]):
            terminalreporter.write_line(f"{wall:7.1f} wall  {cpu:7.1f} CPU  {path}")
        terminalreporter.write_line(f"all files: {sum(w for w, _ in FILE_TIMES.values()):.0f} s wall, "
                                    f"{sum(c for _, c in FILE_TIMES.values()):.0f} s CPU")
    if not LAUNCH_TIMES:
        return
    terminalreporter.section("worker launches: start-up and checks (s)")
    for module, controller, np, startup, checks, wall in sorted(LAUNCH_TIMES, key=lambda t: -t[5]):
        started = "?" if startup is None else f"{startup:6.1f}"
        terminalreporter.write_line(f"{wall:7.1f} wall  {started} start-up  {checks:7.1f} checks  "
                                    f"{module} ({controller}, {np} processes)")
    total_startup = sum(t[3] or 0 for t in LAUNCH_TIMES)
    terminalreporter.write_line(f"{len(LAUNCH_TIMES)} launches: {sum(t[5] for t in LAUNCH_TIMES):.0f} s wall, "
                                f"{total_startup:.0f} s of it start-up")
