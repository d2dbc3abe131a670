"""The GPU checks, on whatever machine this runs on, as one report: ``make gpu-check``.

    python scripts/gpu_check.py [--python PYTHON] [--wheelhouse DIR] [--report FILE]

Meant for a lent GPU machine that has a torch (any CUDA build, not necessarily the pinned one)
and no network. In order:

1. **probe**: the torch of ``--python``, its CUDA version, the GPUs it sees and the driver.
2. **build**: unless that Python's Horovod was built with NCCL already (the GPU image), a venv
   that sees that Python's packages (under ``.gpu_check/``), and
   in it the patched Horovod built with ``HOROVOD_GPU_OPERATIONS=NCCL`` by the package's own
   installer, which compiles against ``HOROVOD_CUDA_HOME`` (and ``HOROVOD_NCCL_HOME``) where
   set, else an nvcc on the PATH of torch's CUDA major, else the CUDA wheels torch pins
   (``horovod_accordion/tools/cuda_toolkit.py``). Without network, ``--wheelhouse`` is the
   folder pip takes everything from: Horovod's sdist, its dependencies, pytest and, without a
   system toolkit, those CUDA wheels. Skipped, with the reason, where torch is a CPU build.
3. **test-gpu**: ``tests/test_gpu.py`` under ``HOROVOD_ACCORDION_GPU_TESTS=1`` in that venv (or
   with ``--python`` where the build was skipped): the DDP hook, Lightning and FSDP on one GPU,
   and the torch and TF checks over NCCL on two ranks where two GPUs exist. Each test that
   cannot run says why (no GPU, one GPU, no NCCL).

The report (``--report``, by default ``$OUT/gpu_check.json`` where ``$OUT`` is set, else
``gpu_check.json``) names the device and holds each step's outcome, time and reason, and every
test's outcome. The exit status is 1 where a step or a test failed, or, with ``--require-gpu``
(``make gpu-check``), where no GPU test ran; else 0.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

REPO = pathlib.Path(__file__).resolve().parent.parent
PROBE = """
import json, subprocess
answer = {}
try:
    import torch
except ImportError as error:
    answer["error"] = f"no torch: {error}"
else:
    answer.update(torch=torch.__version__, cuda=torch.version.cuda, gpus=[
        torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [])
try:
    answer["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                      capture_output=True, text=True, timeout=60).stdout.strip() or None
except (OSError, subprocess.TimeoutExpired):
    answer["driver"] = None
print(json.dumps(answer))
"""


# A venv that sees the packages of the Python that makes it, wherever they are: a
# --system-site-packages venv made from another venv's Python sees the base installation's only.
VENV_BESIDE = """
import pathlib, sys, sysconfig, venv
venv.create(sys.argv[1], system_site_packages=True, with_pip=True)
[site] = pathlib.Path(sys.argv[1]).glob("lib/python*/site-packages")
parents = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
(site / "gpu_check_parent.pth").write_text("\\n".join(parents) + "\\n")
"""


class Report:
    def __init__(self, path):
        self.path = path
        self.data = {"device": None, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": [], "tests": []}

    def step(self, name, status, started, reason=None, **details):
        self.data["steps"].append({"step": name, "status": status, "seconds": round(time.monotonic() - started, 1),
                                   **({"reason": reason} if reason else {}), **details})
        print(f"gpu_check: {name}: {status}{f' ({reason})' if reason else ''}", flush=True)
        self.write()

    def write(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")

    def failed(self):
        return any(s["status"] == "failed" for s in self.data["steps"]) or \
            any(t["outcome"] == "failed" for t in self.data["tests"])


def run(command, log, env=None, timeout=3600):
    """``command``'s exit status, its output appended to ``log``."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(map(str, command))}\n")
        out.flush()
        try:
            return subprocess.run(list(map(str, command)), stdout=out, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout, cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout} s\n")
            return 124


def probe(python, report):
    started = time.monotonic()
    answer = subprocess.run([python, "-c", PROBE], capture_output=True, text=True)
    found = json.loads(answer.stdout) if answer.returncode == 0 else {"error": answer.stderr.strip()[-500:]}
    report.data["device"] = ", ".join(found.get("gpus") or []) or "none: no CUDA GPU visible to torch"
    report.step("probe", "failed" if "error" in found else "passed", started, found.get("error"),
                torch=found.get("torch"), cuda=found.get("cuda"), driver=found.get("driver"))
    return found


def build(python, found, work, env, report):
    """The venv's python with Horovod built for NCCL, or ``None`` where the build was skipped or failed."""
    started = time.monotonic()
    if "error" in found:
        report.step("build", "skipped", started, "no torch to build against")
        return None
    if found.get("cuda") is None:
        report.step("build", "skipped", started, f"torch {found['torch']} is a CPU build: Horovod's NCCL operations "
                                                 f"need torch's CUDA build")
        return None
    built = subprocess.run([python, "-c", "import horovod.torch as h; print(h.nccl_built())"], capture_output=True,
                           text=True, env=env)
    if built.returncode == 0 and built.stdout.strip() not in ("0", "False"):
        report.step("build", "passed", started, f"Horovod with NCCL {built.stdout.strip()} is installed already")
        return python
    if built.returncode != 0 and "No module named 'horovod'" not in built.stderr:
        print(f"gpu_check: the installed Horovod does not import, so it is built anew: {built.stderr[-300:]}")
    venv = work / "venv"
    log = work / "build.log"
    steps = [[python, "-c", VENV_BESIDE, venv],
             [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps", "-e",
              REPO],
             [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "pytest"],
             [venv / "bin" / "python", "-m", "horovod_accordion.tools.install_horovod", "--gpu-operations", "NCCL",
              "--cache", work / "cache"]]
    for what, command in zip(["making the venv", "installing the project", "installing pytest",
                              "building Horovod with NCCL"], steps):
        if run(command, log, env) != 0:
            report.step("build", "failed", started, f"{what} failed: see {log}", log=str(log))
            return None
    report.step("build", "passed", started, log=str(log))
    return venv / "bin" / "python"


def test_gpu(python, work, env, report):
    started = time.monotonic()
    if subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode != 0:
        report.step("test-gpu", "failed", started, f"no pytest for {python}: install it, or put its wheel in "
                                                   f"--wheelhouse for the build's venv")
        return
    junit = work / "test_gpu.xml"
    status = run([python, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", f"--junitxml={junit}",
                  "tests/test_gpu.py"], work / "test_gpu.log", dict(env, HOROVOD_ACCORDION_GPU_TESTS="1"))
    if not junit.is_file():
        report.step("test-gpu", "failed", started, f"pytest wrote no results (exit {status}): see "
                                                   f"{work / 'test_gpu.log'}")
        return
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome = next(((child.tag, child.get("message", "")) for child in case
                        if child.tag in ("failure", "error", "skipped")), ("passed", ""))
        report.data["tests"].append({"test": f"{case.get('classname')}::{case.get('name')}",
                                     "outcome": {"failure": "failed", "error": "failed"}.get(outcome[0], outcome[0]),
                                     "seconds": float(case.get("time", 0)),
                                     **({"reason": outcome[1][:500]} if outcome[1] else {})})
    counts = {o: sum(t["outcome"] == o for t in report.data["tests"]) for o in ("passed", "failed", "skipped")}
    if counts["failed"] or status not in (0, 5):
        outcome, reason = "failed", None
    elif counts["passed"]:
        outcome, reason = "passed", None
    else:  # a report of skips must not read as a GPU run that passed
        outcome, reason = "skipped", next((t["reason"] for t in report.data["tests"] if "reason" in t), "no tests")
    report.step("test-gpu", outcome, started, reason, log=str(work / "test_gpu.log"), **counts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the Python whose torch is used (default: this one)")
    parser.add_argument("--wheelhouse", type=pathlib.Path,
                        help="without network: the folder pip installs from (Horovod's sdist and dependencies)")
    parser.add_argument("--work", type=pathlib.Path, default=REPO / ".gpu_check")
    parser.add_argument("--require-gpu", action="store_true",
                        help="exit 1 unless a GPU test ran and passed (make gpu-check: a device run that tested "
                             "nothing, for a driver too old for torch's CUDA say, fails)")
    parser.add_argument("--report", type=pathlib.Path,
                        default=pathlib.Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT")
                        else pathlib.Path("gpu_check.json"))
    args = parser.parse_args(argv)

    args.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if args.wheelhouse:
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(args.wheelhouse.resolve()))
    report = Report(args.report.resolve())
    found = probe(args.python, report)
    python = build(args.python, found, args.work, env, report)
    venv = {"PATH": os.pathsep.join([str(pathlib.Path(python).parent), env["PATH"]])} if python else {}
    test_gpu(python or args.python, args.work, dict(env, **venv), report)
    print(f"gpu_check: report in {args.report}", flush=True)
    ran = any(step["step"] == "test-gpu" and step["status"] == "passed" for step in report.data["steps"])
    return 1 if report.failed() or (args.require_gpu and not ran) else 0


if __name__ == "__main__":
    sys.exit(main())
