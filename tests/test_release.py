"""The install path a user takes: the built wheel in a new virtual environment outside the
checkout, the packaged Horovod installer (which reuses the wheel `make setup` cached), and the
packaged demo on 2 ranks, run as docs/getting-started/install.md writes it."""
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

import horovod_accordion
from tests.conftest import REPO
from tests.test_docs import code_blocks

INSTALL_PAGE = REPO / "docs" / "getting-started" / "install.md"


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist, and the wheel built from it, as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    return out


def test_the_wheel_and_sdist_pass_twine_check(dist):
    files = sorted(p.name for p in dist.iterdir())
    version = horovod_accordion.__version__
    assert files == [f"horovod_accordion-{version}-py3-none-any.whl", f"horovod_accordion-{version}.tar.gz"]
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_wheel_holds_the_patches_the_installer_and_the_demo_and_no_tests(dist):
    wheel = next(dist.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for path in ["horovod_accordion/horovod_patches.json", "horovod_accordion/install_horovod.py",
                 "horovod_accordion/demo.py"]:
        assert path in names, path
    assert not [n for n in names if n.startswith(("tests/", "examples/", "benchmarks/"))]
    metadata = zipfile.ZipFile(wheel).read(f"horovod_accordion-{horovod_accordion.__version__}.dist-info/METADATA")
    assert b"Requires-Python: <3.12,>=3.11" in metadata
    assert b"horovod" not in re.sub(rb"horovod[_-]accordion", b"", b"\n".join(
        line for line in metadata.splitlines() if line.startswith(b"Requires-Dist"))), "Horovod is not an extra"


def test_the_getting_started_commands_train_the_demo_on_2_ranks_from_the_wheel(dist, tmp_path):
    [commands] = [block for marker, language, block in code_blocks(INSTALL_PAGE) if marker.startswith("test:")]
    wheel = next(dist.glob("*.whl"))
    assert wheel.name in commands, f"{INSTALL_PAGE.name} installs another wheel than {wheel.name}"
    (tmp_path / wheel.name).symlink_to(wheel)
    # A user's shell: none of this checkout's paths, or its venv, reachable.
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("OMP_")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not p.startswith(str(REPO)) and p != str(pathlib.Path(sys.executable).parent))
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "no cached wheel" not in output, "the installer compiled instead of reusing make setup's wheel"
    assert re.search(r"^\[X\] PyTorch", output.replace("    [X]", "[X]"), re.M), output[-3000:]
    epochs = re.findall(r"<stdout>:epoch \d+: .* rank\(s\) now \[([\d, ]+)\]", output)
    assert epochs and epochs[0] == "2" and epochs[-1] == "1", epochs
    assert re.search(r"trained on 2 ranks with Accordion PowerSGD 2/1: \d+ checks", output), output[-3000:]
