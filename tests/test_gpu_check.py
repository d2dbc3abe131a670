"""`scripts/gpu_check.py` on this machine, which has no GPU: it runs every step up to where a
GPU is needed, skips there with the reason, and writes the report a device run would commit."""
import json
import subprocess
import sys

from tests.conftest import REPO, worker_env


def test_without_a_gpu_the_check_skips_the_build_and_every_gpu_test_with_its_reason(tmp_path):
    report = tmp_path / "report.json"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--work", str(tmp_path / "work"),
                             "--report", str(report), "--require-gpu"], capture_output=True, text=True, timeout=300,
                            env=worker_env())
    assert result.returncode == 1, "--require-gpu (make gpu-check): a run that tested nothing fails"
    data = json.loads(report.read_text())
    assert data["device"] == "none: no CUDA GPU visible to torch"
    probe, build, tests = data["steps"]
    assert probe["status"] == "passed" and probe["torch"].startswith("2.13.0") and probe["cuda"] is None
    assert build == dict(build, step="build", status="skipped") and "is a CPU build" in build["reason"]
    assert tests == dict(tests, step="test-gpu", status="skipped", reason="make test-gpu: no CUDA GPU visible to torch",
                         passed=0, failed=0, skipped=len(data["tests"]))
    assert data["tests"] and all(test["outcome"] == "skipped" and test["reason"] ==
                                 "make test-gpu: no CUDA GPU visible to torch" for test in data["tests"]), data["tests"]
