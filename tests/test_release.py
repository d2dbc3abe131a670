"""The install path a user takes: the built wheel in a new virtual environment outside the
checkout, one per extra, the packaged Horovod installer (which reuses the wheel `make setup`
cached), and the packaged demo and trainer examples on 2 ranks, run as
docs/getting-started/install.md and the trainer pages write them."""
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

import horovod_accordion
from tests.conftest import RAY_TRAIN_POLL, REPO
from tests.test_docs import code_blocks
from tests.test_snippets import script_of

pytestmark = pytest.mark.release

INSTALL_PAGE = REPO / "docs" / "getting-started" / "install.md"
TRAINER_PAGES = [REPO / page for page in (
    "docs/trainers/lightning.md", "docs/trainers/accelerate.md", "docs/trainers/ray_train.md")]


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


def test_the_wheel_holds_the_patches_the_installer_the_demo_and_examples_and_no_tests(dist):
    wheel = next(dist.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for path in ["horovod_accordion/tools/horovod_patches.json", "horovod_accordion/tools/install_horovod.py",
                 "horovod_accordion/examples/demo.py", *(f"horovod_accordion/examples/{name}.py" for name in (
                     "data", "ddp_loop", "lightning", "accelerate", "ray_train"))]:
        assert path in names, path
    assert not [n for n in names if n.startswith(("tests/", "examples/", "benchmarks/"))]
    metadata = zipfile.ZipFile(wheel).read(f"horovod_accordion-{horovod_accordion.__version__}.dist-info/METADATA")
    assert b"Requires-Python: <3.12,>=3.11" in metadata
    assert b"horovod" not in re.sub(rb"horovod[_-]accordion", b"", b"\n".join(
        line for line in metadata.splitlines() if line.startswith(b"Requires-Dist"))), "Horovod is not an extra"


def release_blocks(page):
    """The blocks of ``page`` that this file runs, as written."""
    return [block for marker, language, block in code_blocks(page)
            if marker.startswith("test:") and "tests/test_release.py" in marker]


def run_as_a_user(commands, directory, wheel):
    """``commands`` in bash, in ``directory`` beside the wheel, from a user's shell: none of this
    checkout's paths, or its venv, reachable."""
    assert wheel.name in commands, f"the page installs another wheel than {wheel.name}:\n{commands}"
    if not (directory / wheel.name).exists():
        (directory / wheel.name).symlink_to(wheel)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("OMP_")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not p.startswith(str(REPO)) and p != str(pathlib.Path(sys.executable).parent))
    env["RAY_DISABLE_USAGE_STATS"] = "1"  # no usage report from a test machine (and no internet here)
    env.update(RAY_TRAIN_POLL)  # Ray Train's own setting, not the page's: it only makes short epochs wait less
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=directory, env=env,
                            capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "no cached wheel" not in output, "the installer compiled instead of reusing make setup's wheel"
    return output


def test_the_torch_and_trainer_pages_run_from_the_wheel_as_written(dist, tmp_path):
    """The install page's torch block, then each trainer page's in the environment it made, as a
    user follows them."""
    wheel = next(dist.glob("*.whl"))
    torch_block = release_blocks(INSTALL_PAGE)[0]
    output = run_as_a_user(torch_block, tmp_path, wheel)
    assert re.search(r"^\[X\] PyTorch", output.replace("    [X]", "[X]"), re.M), output[-3000:]
    epochs = re.findall(r"<stdout>:epoch \d+: .* PowerSGD rank\(s\) \[([\d, ]+)\]", output)
    assert epochs and epochs[0] == "2" and "1" in epochs, epochs
    assert re.search(r"trained on 2 ranks with Accordion PowerSGD 2/1: \d+ checks", output), output[-3000:]

    for page in TRAINER_PAGES:
        [block] = release_blocks(page)
        output = run_as_a_user(block, tmp_path, wheel)
        assert re.search(r"\[rank 0\] check after epoch 0: levels per layer: \S+=2", output), (page.name, output[-3000:])
        assert re.search(r"\[rank 0\] accordion: test accuracy 0\.9\d+, [0-9.]+ kB sent per rank", output), \
            (page.name, output[-3000:])
        if page.stem == "ray_train":
            # Ray folds the workers' lines that differ only in numbers ("[repeated 2x across cluster]").
            assert re.search(r"\[rank \d\] epoch 15 ", output), (page.name, output[-3000:])
            continue
        for rank in (0, 1):
            assert len(re.findall(rf"\[rank {rank}\] epoch +\d+ ", output)) == 16, (page.name, output[-3000:])


def test_the_torch_only_block_of_the_install_page_trains_the_ddp_page_without_horovod(dist, tmp_path):
    """The install page's DDP and FSDP2 block makes an environment without Horovod, in which the
    DDP page's script trains on 2 ranks with torchrun, switching from ℓ_low to ℓ_high."""
    wheel = next(dist.glob("*.whl"))
    ddp_block = release_blocks(INSTALL_PAGE)[2]
    (tmp_path / "train.py").write_text(script_of(REPO / "docs" / "getting-started" / "ddp.md"))
    output = run_as_a_user(ddp_block + "\nif python -c 'import horovod' 2>/dev/null; then echo HOROVOD IMPORTS; fi\n"
                           "torchrun --standalone --nproc_per_node 2 train.py\n", tmp_path, wheel)
    assert "HOROVOD IMPORTS" not in output, output[-3000:]
    levels = re.findall(r"^epoch \d+: PowerSGD rank per layer \[([\d, ]+)\]", output, re.M)
    assert len(levels) == 8 and set(levels[0].split(", ")) == {"2"} and set(levels[-1].split(", ")) == {"1"}, \
        output[-3000:]


def test_the_tensorflow_block_of_the_install_page_runs_from_the_wheel_as_written(dist, tmp_path):
    wheel = next(dist.glob("*.whl"))
    tensorflow_block = release_blocks(INSTALL_PAGE)[1]
    output = run_as_a_user(tensorflow_block, tmp_path, wheel)
    assert re.search(r"^\[X\] TensorFlow", output.replace("    [X]", "[X]"), re.M), output[-3000:]
    assert "No module named 'torch'" not in output
    epochs = re.findall(r"<stdout>:epoch \d+: .* PowerSGD rank\(s\) \[([\d, ]+)\]", output)
    assert epochs and epochs[0] == "2" and "1" in epochs, epochs
    assert re.search(r"trained on 2 ranks with Accordion PowerSGD 2/1: \d+ checks", output), output[-3000:]


def imported_distributions(path):
    """The distributions whose modules ``path`` imports, at any depth, outside the standard library
    and this project."""
    from importlib.metadata import packages_distributions
    import ast
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    owners = packages_distributions()
    return {owners[m][0].lower().replace("_", "-") for m in modules
            if m not in sys.stdlib_module_names and m in owners and m != "horovod_accordion"}


def extras_requirements(*extras):
    """The distributions that ``extras`` (and the install requirements) of setup.cfg bring."""
    import configparser
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    lines = setup["options"]["install_requires"].split() + [
        line for extra in extras for line in setup["options.extras_require"][extra].split()]
    return {re.match(r"[A-Za-z0-9_.-]+", line).group().lower().replace("_", "-") for line in lines}


@pytest.mark.parametrize("directory,extras", [
    ("horovod_accordion/examples", ("torch", "tensorflow", "trainers")),
    ("examples", ("torch", "tensorflow", "trainers", "examples", "plot")),
])
def test_no_example_imports_a_package_outside_its_extras(directory, extras):
    # Horovod is the installer's (not an extra), and a framework brings its own dependencies.
    allowed = extras_requirements(*extras) | {"horovod", "ray", "tensorflow", "keras"}
    paths = sorted((REPO / directory).glob("*.py"))
    outside = {path.name: sorted(imported_distributions(path) - allowed) for path in paths}
    assert not any(outside.values()), outside
