"""A CUDA toolkit for Horovod's NCCL build, assembled from the package index's ``nvidia-*`` wheels.

Horovod compiles its GPU operations with nvcc, against CUDA's headers, its static runtime and
NCCL's header. A GPU node often has the driver and no toolkit, and a toolkit of another CUDA
major than torch's builds a Horovod that torch's NCCL does not match. torch's Linux wheel pins
the CUDA parts it was built with (its ``cuda-toolkit[...]`` and ``nvidia-nccl-cu*``
requirements); the wheels of those versions carry nvcc, the headers, the static runtime and
NCCL. This installs them into a folder of the cache and adds the unversioned library names that
CMake and the linker look for, which the wheels leave out.
"""
import base64
import hashlib
import importlib.metadata
import pathlib
import subprocess
import sys

from packaging.requirements import Requirement

from horovod_accordion.tools import published_folder

# torch's cuda-toolkit requirement names the libraries torch loads; Horovod's build needs the
# compiler, the runtime and CCCL's headers, which nvcc puts on its include path.
BUILD_PARTS = "nvcc,cudart,cccl"


def pins(distribution, path=None):
    """``{name: version}`` of what ``distribution`` (found on ``path``, ``sys.path`` by default)
    requires at one exact version on this machine, extras left out."""
    found = next(iter(importlib.metadata.distributions(name=distribution, path=sys.path if path is None else path)),
                 None)
    exact = {}
    for line in (found.requires if found else None) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        versions = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        if versions:
            exact[requirement.name.lower()] = versions[0]
    return exact


def requirements_of(distribution="torch"):
    """The pip requirements of the CUDA compiler, runtime and NCCL ``distribution`` was built
    with, from its own pins; ``None`` where it pins no ``cuda-toolkit`` (a CPU build, or a CUDA
    build whose parts are per-library ``-cu12`` wheels, as PyTorch's own index and TensorFlow's
    ``and-cuda`` have them)."""
    exact = pins(distribution)
    nccls = [f"{name}=={version}" for name, version in exact.items() if name.startswith("nvidia-nccl-")]
    if "cuda-toolkit" not in exact or len(nccls) != 1:
        return None
    return [f"cuda-toolkit[{BUILD_PARTS}]=={exact['cuda-toolkit']}", *nccls]


def major(requirements):
    """The CUDA major of a toolkit's ``requirements`` (``requirements_of``'s)."""
    return requirements[0].split("==")[1].split(".")[0]


def assemble(cache, requirements):
    """The build locations of a toolkit made of ``requirements``, installed under ``cache`` once
    and found there afterwards. The folder appears whole or not at all (``published_folder``), so
    an interrupted install leaves nothing that a later build would take for a toolkit."""
    folder = pathlib.Path(cache).resolve() / "cuda" / hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    if not (folder / "requirements.txt").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with published_folder(folder, "requirements.txt") as staging:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target",
                            str(staging), *requirements], check=True)
            add_unversioned_names(staging)
            (staging / "requirements.txt").write_text("\n".join(requirements) + "\n")
    return locations(folder)


def cuda_home(folder):
    """The CUDA home (where ``bin/nvcc`` is) in an assembled ``folder``: the wheels of CUDA 13
    and later put the whole toolkit in one ``nvidia/cu<major>``."""
    homes = [nvcc.parent.parent for nvcc in folder.glob("nvidia/*/bin/nvcc")]
    if len(homes) != 1:
        raise RuntimeError(f"the CUDA wheels in {folder} hold {len(homes)} nvidia/*/bin/nvcc, not one: set "
                           f"HOROVOD_CUDA_HOME and HOROVOD_NCCL_HOME to a CUDA toolkit and NCCL instead")
    return homes[0]


def locations(folder):
    """The build's variables for the toolkit in ``folder``: CUDA's home, for Horovod and for
    torch's extension settings (``CUDA_HOME``, which Horovod's CMake asks for torch's CUDA
    libraries), and NCCL's, linked as a shared library (the wheel has no static one; torch loads
    the same one)."""
    home = str(cuda_home(folder))
    return {"HOROVOD_CUDA_HOME": home, "CUDA_HOME": home, "HOROVOD_NCCL_HOME": str(folder / "nvidia" / "nccl"),
            "HOROVOD_NCCL_LINK": "SHARED"}


def add_unversioned_names(folder):
    """``libcudart.so`` (CMake's FindCUDAToolkit requires it), ``libnccl.so`` (the linker's
    ``-lnccl``) and ``lib64`` (nvcc's library path): the wheels ship only the versioned names."""
    home = cuda_home(folder)
    links = [(home / "lib64", "lib")] + [
        (library.with_name(library.name.split(".so.")[0] + ".so"), library.name)
        for library in [*home.glob("lib/libcudart.so.*"), *folder.glob("nvidia/nccl/lib/libnccl.so.*")]]
    for link, target in links:
        if not link.exists():
            link.symlink_to(target)


def overwritten_pins(distribution="torch", path=None):
    """``distribution``'s exact ``nvidia-*`` requirements whose files another distribution has
    overwritten, among those installed on ``path`` (``sys.path``). TF's CUDA 12 wheels and torch's
    CUDA 13 ones both ship ``nvidia/nccl`` and ``nvidia/cudnn`` (the sonames ``libnccl.so.2`` and
    ``libcudnn.so.9``), and whichever pip installed last owns the files."""
    path = sys.path if path is None else path
    nvidia = {name: f"{name}=={version}" for name, version in pins(distribution, path).items()
              if name.startswith("nvidia-")}
    owners = {}
    for dist in importlib.metadata.distributions(path=path):
        name = dist.metadata["Name"].lower()
        for file in dist.files or []:
            # Python modules (the namespace's __init__.py) are shared on purpose and alike.
            if str(file).startswith("nvidia/") and file.hash and not str(file).endswith(".py"):
                owners.setdefault(str(file), []).append((name, dist, file))
    overwritten = set()
    for claims in owners.values():
        for name, dist, file in claims:
            located = dist.locate_file(file)
            if len(claims) > 1 and name in nvidia and not (located.is_file() and matches(located, file.hash)):
                overwritten.add(nvidia[name])
    return sorted(overwritten)


def matches(file, expected):
    """Whether ``file`` has the content its distribution's RECORD lists (``expected``, a FileHash)."""
    digest = hashlib.new(expected.mode)
    with open(file, "rb") as content:
        for block in iter(lambda: content.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() == expected.value
