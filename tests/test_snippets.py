"""The getting-started scripts run as written, each on 2 Gloo ranks, switching from ℓ_low to
ℓ_high: docs/getting-started/torch.md, docs/getting-started/keras.md, docs/getting-started/keras3.md
and docs/getting-started/tensorflow.md with horovodrun, docs/getting-started/ddp.md with torchrun,
docs/getting-started/fsdp.md with torchrun on 4 (2 replicas × 2 shards).
The README.md shows the first two, and must show them unchanged."""
import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, free_port, worker_env
from tests.test_docs import code_blocks

PAGES = ["torch", "keras", "keras3", "tensorflow", "ddp", "fsdp"]
TORCHRUN_PROCESSES = {"ddp": 2, "fsdp": 4}
HOROVODRUN = str(pathlib.Path(sys.executable).parent / "horovodrun")


def script_of(page):
    [code] = [code for marker, _, code in code_blocks(page) if marker.startswith("test: tests/test_snippets.py")]
    return code


@pytest.mark.multiworker
@pytest.mark.check  # one launch per backend: make check's
@pytest.mark.parametrize("name", PAGES)
def test_the_getting_started_script_switches_levels_when_run_as_written(name, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(script_of(REPO / "docs" / "getting-started" / f"{name}.md"))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(TORCHRUN_PROCESSES[name]),
                "--master_addr", "127.0.0.1", "--master_port", str(free_port())] if name in TORCHRUN_PROCESSES else \
        [HOROVODRUN, "-np", "2", "--gloo", sys.executable]
    env = worker_env({"TF_USE_LEGACY_KERAS": ""} if name == "keras3" else None)
    result = subprocess.run([*launcher, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    levels = re.findall(r"^(?:\[0\]<stdout>:)?epoch \d+: PowerSGD rank per layer \[([\d, ]+)\]", result.stdout, re.M)
    assert len(levels) == 8 and set(levels[0].split(", ")) == {"2"} and set(levels[-1].split(", ")) == {"1"}, \
        result.stdout


def test_the_readme_shows_the_getting_started_scripts_unchanged():
    readme = [code for marker, _, code in code_blocks(REPO / "README.md") if marker.startswith("test:")]
    pages = [script_of(REPO / "docs" / "getting-started" / f"{name}.md") for name in ("torch", "keras")]
    assert readme == pages
