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
        assert not re.search(r"pip3? install|build_horovod|patch_horovod|horovod==", text), dockerfile.name
        specs = dict(re.findall(r"\b(\w+)_SPEC=([^\s\\]+)", text))
        for spec in specs.values():
            name, version = re.fullmatch(r"([\w.-]+?)(?:\[[\w,-]+\])?==([\d.]+)", spec).groups()
            assert pins[name] == version, f"{dockerfile.name}: {spec} drifts from setup.sh's {pins[name]}"
        assert "EXPOSE 22" in text and "openssh-server" in text, f"{dockerfile.name}: no sshd for multi-node"
        assert re.search(r'CMD \["horovodrun", .*"examples/pytorch_demo.py"\]', text), dockerfile.name
    gpu = (REPO / "docker" / "Dockerfile.gpu").read_text()
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in gpu and "cudnn" in gpu and "TENSORFLOW_SPEC" in gpu


def test_the_gpu_flag_joins_the_horovod_build_and_its_cache_key():
    script = (REPO / "scripts" / "build_horovod.sh").read_text()
    flags = re.search(r'^BUILD_FLAGS="(.*)"$', script, re.M).group(1)
    assert flags.endswith("${HOROVOD_GPU_OPERATIONS:+ HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS}"), flags
    assert "$BUILD_FLAGS" in script.split("key=", 1)[1].split("PYEOF", 2)[1], "the flags must key the wheel cache"
