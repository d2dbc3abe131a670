"""The Docker images, checked without a Docker engine: hadolint on both Dockerfiles, and no
drift from the setup that `make test` runs (same script, same versions, same patches)."""
import pathlib
import re
import subprocess
import sys

from tests.conftest import REPO

DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile.*"))
HADOLINT = pathlib.Path(sys.executable).parent / "hadolint"


def setup_pins():
    """The versions scripts/setup.sh installs by default: {package: version}."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    return {name: version for name, version in
            re.findall(r"\$\{\w+_SPEC:-([\w.-]+?)(?:-cpu)?==([\d.]+)\}", text)}


def test_hadolint_passes_on_both_dockerfiles():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]
    result = subprocess.run([str(HADOLINT), *map(str, DOCKERFILES)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfiles_run_the_setup_script_with_its_versions():
    pins = setup_pins()
    assert pins == {"torch": "2.13.0", "tensorflow": "2.21.0", "tf-keras": "2.21.0"}, pins
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert "RUN bash scripts/setup.sh" in text, dockerfile.name
        # The install logic lives in the scripts only: no second copy of it here.
        assert not re.search(r"pip3? install|install_horovod|horovod_patches|horovod==", text), dockerfile.name
        specs = dict(re.findall(r"\b(\w+)_SPEC=([^\s\\]+)", text))
        for spec in specs.values():
            name, version = re.fullmatch(r"([\w.-]+?)(?:\[[\w,-]+\])?==([\d.]+)", spec).groups()
            assert pins[name] == version, f"{dockerfile.name}: {spec} drifts from setup.sh's {pins[name]}"
        assert "EXPOSE 22" in text and "openssh-server" in text, f"{dockerfile.name}: no sshd for multi-node"
        assert re.search(r'CMD \["horovodrun", .*"examples/pytorch_demo.py"\]', text), dockerfile.name
    gpu = (REPO / "docker" / "Dockerfile.gpu").read_text()
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in gpu and "cudnn" in gpu and "TENSORFLOW_SPEC" in gpu


def test_the_cpu_image_takes_its_base_as_an_argument_and_the_cpu_torch():
    cpu = (REPO / "docker" / "Dockerfile.cpu").read_text()
    # Users get the official base by default; scripts/local_base_image.sh builds a stand-in for it.
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim-bookworm$", cpu, re.M), "the default base changed"
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", cpu, re.M)
    # PyPI's torch for Linux is the CUDA build: the CPU image takes the CPU build of the same pin.
    assert re.search(r"^ARG PIP_EXTRA_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", cpu, re.M)
    assert "TORCH_SPEC" not in cpu, "the CPU image installs setup.sh's own pins"


def test_make_image_mounts_the_host_wheel_cache_where_the_image_looks_for_it():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^image:", makefile, re.M) and re.search(r"^test-image:", makefile, re.M)
    build = (REPO / "scripts" / "build_image.sh").read_text()
    assert '-v "$CACHE:/opt/cache"' in build and "--isolation chroot" in build
    for dockerfile in DOCKERFILES:
        assert "HOROVOD_ACCORDION_CACHE=/opt/cache" in dockerfile.read_text(), dockerfile.name
    base = (REPO / "scripts" / "local_base_image.sh").read_text()
    assert "debootstrap --variant=minbase" in base and "buildah from scratch" in base and "python3-venv" in base
