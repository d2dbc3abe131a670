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
        assert re.search(r"^RUN (.*\\\n)*.*\bbash scripts/setup\.sh\b", text, re.M), dockerfile.name
        # The install logic lives in the scripts only: no second copy of it here.
        assert not re.search(r"pip3? install|install_horovod|horovod_patches|horovod==", text), dockerfile.name
        specs = dict(re.findall(r"\b(\w+)_SPEC=([^\s\\]+)", text))
        for spec in specs.values():
            name, version = re.fullmatch(r"([\w.-]+?)(?:\[[\w,-]+\])?==([\d.]+)", spec).groups()
            assert pins[name] == version, f"{dockerfile.name}: {spec} drifts from setup.sh's {pins[name]}"
        assert "EXPOSE 22" in text and "openssh-server" in text, f"{dockerfile.name}: no sshd for multi-node"
        assert re.search(r'CMD \["horovodrun", .*"examples/pytorch_demo.py"\]', text), dockerfile.name
    gpu = (REPO / "docker" / "Dockerfile.gpu").read_text()
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in gpu and "TENSORFLOW_SPEC=tensorflow[and-cuda]" in gpu


def test_the_gpu_image_builds_on_the_cpu_images_base_and_keeps_no_build_tools_or_pip_cache():
    cpu, gpu = ((REPO / "docker" / name).read_text() for name in ("Dockerfile.cpu", "Dockerfile.gpu"))
    base = re.compile(r"^ARG BASE_IMAGE=.*$|^FROM .*$", re.M)
    assert base.findall(gpu) == base.findall(cpu), "no CUDA base image: CUDA comes from the package index's wheels"
    assert "PIP_EXTRA_INDEX_URL" not in gpu and "PIP_NO_CACHE_DIR=1" in gpu, "PyPI's torch is its CUDA build"
    [run] = [block for block in re.split(r"\n(?=[A-Z]+ )", gpu) if block.startswith("RUN ")]
    installed = set(re.search(r"--no-install-recommends\s+([^&]+)&&", run)[1].replace("\\", " ").split())
    purged = set(re.search(r"apt-get purge -y ([^&]+)&&", run)[1].replace("\\", " ").split())
    # Kept: what runs (MPI, sshd, make) and what Triton compiles its launcher with at torch.compile's first GPU run.
    kept = {"make", "openmpi-bin", "openssh-client", "openssh-server", "gcc", "libc6-dev"}
    assert kept <= installed and purged == installed - kept, purged
    assert run.index("scripts/setup.sh") < run.index("apt-get purge") < run.index("rm -rf /var/lib/apt/lists/*")


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
    gpu_targets = re.search(r"^image-gpu:\n(.*)\n(?:.*\n)*?^test-image-gpu: setup\n(.*)$", makefile, re.M)
    assert gpu_targets and "DOCKERFILE=docker/Dockerfile.gpu" in gpu_targets[1], "make image-gpu"
    assert "NCCL" in gpu_targets[2] and "scripts/test_image.sh" in gpu_targets[2], "make test-image-gpu"
    build = (REPO / "scripts" / "build_image.sh").read_text()
    assert '-v "$CACHE:/opt/cache"' in build and "--isolation chroot" in build
    for dockerfile in DOCKERFILES:
        assert "HOROVOD_ACCORDION_CACHE=/opt/cache" in dockerfile.read_text(), dockerfile.name
    base = (REPO / "scripts" / "local_base_image.sh").read_text()
    assert "debootstrap --variant=minbase" in base and "buildah from scratch" in base and "python3-venv" in base
