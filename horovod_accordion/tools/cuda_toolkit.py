"""A CUDA toolkit for Horovod's NCCL build, assembled from the package index's ``nvidia-*`` wheels.

Horovod compiles its GPU operations with nvcc, against CUDA's headers, its static runtime and
NCCL's header. A GPU node often has the driver and no toolkit, and a toolkit of another CUDA
major than torch's builds a Horovod that torch's NCCL does not match. torch's Linux wheel names
the CUDA parts it was built with (``cuda-toolkit[...]==13.0.3``, ``nvidia-nccl-cu13==2.29.7``);
the wheels of those versions carry nvcc, the headers, the static runtime and NCCL. This installs
them into a folder of the cache and adds the unversioned library names that CMake and the linker
look for, which the wheels leave out.
"""
import base64
import hashlib
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

# torch's cuda-toolkit requirement names the libraries torch loads; Horovod's build needs the
# compiler, the runtime and CCCL's headers, which nvcc puts on its include path.
BUILD_PARTS = "nvcc,cudart,cccl"


def requirements_of(distribution="torch"):
    """The pip requirements of the CUDA compiler, runtime and NCCL ``distribution`` was built
    with, read from its own pins; ``None`` for a build that pins none (a CPU build, or CUDA
    parts of another layout, such as the ``-cu12`` wheels of TensorFlow's ``and-cuda``)."""
    toolkit = nccl = None
    for line in importlib.metadata.requires(distribution) or []:
        requirement, _, marker = line.partition(";")
        if "extra ==" in marker:
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower()
        version = re.search(r"==\s*([\w.]+)", requirement)
        if name == "cuda-toolkit" and version:
            toolkit = f"cuda-toolkit[{BUILD_PARTS}]=={version[1]}"
        elif name.startswith("nvidia-nccl-") and version:
            nccl = f"{name}=={version[1]}"
    return [toolkit, nccl] if toolkit and nccl else None


def assemble(cache, requirements):
    """The build locations of a toolkit made of ``requirements``, installed under ``cache`` once
    and found there afterwards. The folder appears whole or not at all (a rename), so an
    interrupted install leaves nothing that a later build would take for a toolkit."""
    folder = pathlib.Path(cache) / "cuda" / hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    if not (folder / "requirements.txt").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target",
                            str(staging), *requirements], check=True)
            add_unversioned_names(staging)
            (staging / "requirements.txt").write_text("\n".join(requirements) + "\n")
            try:
                os.rename(staging, folder)
            except OSError:
                if not (folder / "requirements.txt").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return locations(folder)


def locations(folder):
    """The build's variables for the toolkit in ``folder``: CUDA's home (where ``bin/nvcc`` is), for
    Horovod and for torch's extension settings (``CUDA_HOME``, which Horovod's CMake asks for
    torch's CUDA libraries), and NCCL's, linked as a shared library (the wheel has no static one;
    torch loads the same one)."""
    [nvcc] = folder.glob("nvidia/*/bin/nvcc")
    home = str(nvcc.parent.parent)
    return {"HOROVOD_CUDA_HOME": home, "CUDA_HOME": home, "HOROVOD_NCCL_HOME": str(folder / "nvidia" / "nccl"),
            "HOROVOD_NCCL_LINK": "SHARED"}


def add_unversioned_names(folder):
    """``libcudart.so`` (CMake's FindCUDAToolkit requires it), ``libnccl.so`` (the linker's
    ``-lnccl``) and ``lib64`` (nvcc's library path): the wheels ship only the versioned names."""
    nvccs = list(folder.glob("nvidia/*/bin/nvcc"))
    if len(nvccs) != 1:
        sys.exit(f"install_horovod: the CUDA wheels hold {len(nvccs)} nvcc under {folder}/nvidia/*/bin (one was "
                 f"expected): set HOROVOD_CUDA_HOME and HOROVOD_NCCL_HOME to a CUDA toolkit and NCCL instead")
    home = nvccs[0].parent.parent
    (home / "lib64").symlink_to("lib")
    for library in [*home.glob("lib/libcudart.so.*"), *folder.glob("nvidia/nccl/lib/libnccl.so.*")]:
        library.with_name(library.name.split(".so.")[0] + ".so").symlink_to(library.name)


def overwritten_pins(distribution="torch", path=None):
    """``distribution``'s pinned ``nvidia-*`` requirements whose files another distribution has
    overwritten, among those installed on ``path`` (``sys.path``). TF's CUDA 12 wheels and torch's
    CUDA 13 ones both ship ``nvidia/nccl`` and ``nvidia/cudnn`` (the sonames ``libnccl.so.2`` and
    ``libcudnn.so.9``), and whichever pip installed last owns the files."""
    path = sys.path if path is None else path
    framework = next(iter(importlib.metadata.distributions(name=distribution, path=path)), None)
    pins = {}
    for line in (framework.requires if framework else None) or []:
        requirement, _, marker = line.partition(";")
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower()
        if name.startswith("nvidia-") and "==" in requirement and "extra ==" not in marker:
            pins[name] = requirement.strip()
    owners = {}
    for dist in importlib.metadata.distributions(path=path):
        name = dist.metadata["Name"].lower()
        for path in dist.files or []:
            if str(path).startswith("nvidia/") and path.hash and not str(path).endswith(".py"):
                owners.setdefault(str(path), []).append((name, dist, path))
    overwritten = set()
    for claims in owners.values():
        for name, dist, path in claims:
            if len(claims) > 1 and name in pins and not matches(dist.locate_file(path), path.hash):
                overwritten.add(pins[name])
    return sorted(overwritten)


def matches(file, expected):
    """Whether ``file`` has the content its distribution's RECORD lists (``expected``, a FileHash)."""
    digest = hashlib.new(expected.mode)
    with open(file, "rb") as content:
        for block in iter(lambda: content.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() == expected.value
