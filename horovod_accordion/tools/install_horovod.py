"""Build, cache and install the patched Horovod that horovod_accordion runs on.

    python -m horovod_accordion.tools.install_horovod        # or: horovod-accordion-install-horovod

PyPI's horovod 0.28.1 sdist does not build against torch >= 2.1 or TF >= 2.16, and no newer
Horovod has been released. This downloads that sdist, applies the edits in
``horovod_patches.json`` (each must match exactly once, so a different sdist stops here
instead of twenty minutes later in the compiler), and builds a wheel for the frameworks and
controllers of the running environment: PyTorch and TensorFlow where importable, Gloo always,
MPI where ``mpicc`` is found, and ``HOROVOD_GPU_OPERATIONS`` (e.g. ``NCCL``) when set. A GPU build
compiles against the CUDA toolkit and NCCL that ``HOROVOD_CUDA_HOME`` (or ``CUDA_HOME``) and
``HOROVOD_NCCL_HOME`` name, else against an nvcc on the PATH of torch's CUDA major, else against
the versions torch was built with, assembled from the package index's wheels (``cuda_toolkit``):
no system toolkit is needed.

The wheel is cached (``--cache``, ``$HOROVOD_ACCORDION_CACHE``, ``~/.cache/horovod_accordion``)
under a key of what changes its binary: Horovod, the patches, Python, the machine and its C
library, the controllers and the MPI version, the GPU operations and CUDA version, and each
framework's version; no other HOROVOD_* variable reaches the build. A cached wheel built for
more frameworks than this environment has, at the same versions, is reused: its extra
framework's extension is simply never loaded. Then ``horovodrun --check-build`` must list
every framework and controller that was asked for.
"""
import argparse
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile

from horovod_accordion.tools import cache_folder, cuda_toolkit, published_folder

PATCHES = importlib.resources.files("horovod_accordion.tools") / "horovod_patches.json"
# Edits to code compiled only in GPU builds: they key only those, so CPU builds keep their wheels.
GPU_PATCHES = importlib.resources.files("horovod_accordion.tools") / "horovod_gpu_patches.json"
# The names `horovodrun --check-build` prints.
FEATURE_NAMES = {"torch": "PyTorch", "tensorflow": "TensorFlow", "mpi": "MPI", "gloo": "Gloo"}
FRAMEWORK_DISTRIBUTIONS = {"torch": ["torch"], "tensorflow": ["tensorflow", "tensorflow-cpu"]}
# The variables that tell Horovod's build where CUDA and NCCL are (its own HOROVOD_* names, and
# CUDA's): they reach the build, and join the cache key.
LOCATION_VARIABLES = {"HOROVOD_CUDA_HOME", "HOROVOD_CUDA_INCLUDE", "HOROVOD_CUDA_LIB", "HOROVOD_NCCL_HOME",
                      "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_LINK", "CUDA_HOME", "NCCL_HOME"}


def log(message):
    print(f"install_horovod: {message}", flush=True)


def fail(message):
    sys.exit(f"install_horovod: {message}")


def installed_version(distributions):
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def describe_build(gpu_operations):
    """What the wheel for this environment is built from and for: its cache key's contents."""
    patches = json.loads(PATCHES.read_text())
    frameworks = {name: version for name, dists in FRAMEWORK_DISTRIBUTIONS.items()
                  if (version := installed_version(dists)) is not None}
    if not frameworks:
        fail("neither torch nor tensorflow is installed here: install the wheel file with its torch or tensorflow "
             "extra first (pip install 'horovod_accordion-<version>-py3-none-any.whl[torch]', see "
             "docs/getting-started/install.md), then run this again")
    mpi = shutil.which("mpicc") is not None
    # Where a GPU build finds CUDA, NCCL and their parts: they reach it, so they key it.
    locations, toolkit = gpu_toolkit(gpu_operations, os.environ)
    cuda_home = locations.get("HOROVOD_CUDA_HOME") or locations.get("CUDA_HOME")
    gpu = {"gpu_patches": hashlib.sha256(GPU_PATCHES.read_bytes()).hexdigest(), "cuda_toolkit": toolkit} \
        if gpu_operations else {}
    return {
        **gpu,
        "horovod": patches["horovod"],
        "patches": hashlib.sha256(PATCHES.read_bytes()).hexdigest(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "libc": "-".join(platform.libc_ver()),
        "controllers": ["gloo", "mpi"] if mpi else ["gloo"],
        "mpi": first_line(["mpirun", "--version"]) if mpi else None,
        "gpu_operations": gpu_operations or None,
        # An assembled toolkit is keyed by its requirements, wherever its cache is.
        "cuda": first_line([f"{cuda_home}/bin/nvcc" if cuda_home else "nvcc", "--version"], last=True)
        if gpu_operations and not toolkit else None,
        "compiler": first_line([*shlex.split(os.environ.get("CXX", "c++")), "--version"]),
        "locations": locations,
        "frameworks": frameworks,
    }


def gpu_toolkit(gpu_operations, environ):
    """Where a GPU build finds CUDA and NCCL: ``(given, requirements)``. ``given`` are the
    variables set in ``environ``; ``requirements`` name the toolkit of the versions torch was built
    with, which the build assembles, or are ``None`` where ``given`` names a toolkit
    (``HOROVOD_CUDA_HOME``, ``CUDA_HOME``) or an nvcc on the PATH serves: one of torch's CUDA
    major, or any where torch pins no toolkit."""
    if not gpu_operations:
        return {}, None
    given = {key: environ[key] for key in sorted(LOCATION_VARIABLES) if key in environ}
    if given.keys() & {"HOROVOD_CUDA_HOME", "CUDA_HOME"}:
        return given, None
    torch_version = installed_version(["torch"])
    requirements = cuda_toolkit.requirements_of("torch") if torch_version else None
    nvcc = shutil.which("nvcc", path=environ.get("PATH"))
    if nvcc:
        release = re.search(r"release (\d+)\.", first_line([nvcc, "--version"], last=True) or "")
        if requirements is None or (release and release[1] == cuda_toolkit.major(requirements)):
            return given, None
        log(f"{nvcc} is CUDA {release[1] if release else '(unknown)'}, torch's is CUDA "
            f"{cuda_toolkit.major(requirements)}: the build takes torch's from the package index")
    if requirements is None:
        fail(f"HOROVOD_GPU_OPERATIONS={gpu_operations} needs a CUDA toolkit and NCCL, and there is no nvcc on the "
             f"PATH: "
             + (f"torch {torch_version} pins no cuda-toolkit wheel to assemble one from (a CPU build, or a build "
                f"from PyTorch's own index)" if torch_version else "without torch, none is assembled from the "
                                                                     "package index")
             + "; set HOROVOD_CUDA_HOME (and HOROVOD_NCCL_HOME) to a toolkit and NCCL of your framework's CUDA "
               "version")
    return given, requirements


def give_torch_its_cuda_libraries():
    """Reinstall torch's NCCL and cuDNN where TF's CUDA 12 wheels overwrote them: Horovod is
    compiled against torch's NCCL, and a process loads one ``libnccl.so.2``, whichever framework
    it imports (docs/horovod-build.md)."""
    pins = cuda_toolkit.overwritten_pins("torch")
    if pins:
        log(f"{', '.join(pins)}: another distribution overwrote their files (TensorFlow's CUDA 12 wheels ship the "
            f"same nvidia/ paths); reinstalling torch's")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps", *pins],
                       check=True)


def first_line(command, last=False):
    """The first (or last) line a tool prints about its version, or None where it is missing or
    does not answer within a minute."""
    try:
        lines = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (lines[-1] if last else lines[0]) if lines else None


def cache_key(build):
    return hashlib.sha256(json.dumps(build, sort_keys=True).encode()).hexdigest()[:16]


def serves(cached, build):
    """Whether a wheel built as ``cached`` runs here: the same build, for at least our frameworks."""
    same = all(cached.get(field) == value for field, value in build.items() if field != "frameworks")
    frameworks = cached.get("frameworks", {})
    return same and all(frameworks.get(name) == version for name, version in build["frameworks"].items())


def find_cached_wheel(cache, build):
    """The cached wheel for ``build``: its own key's first, else one built for more frameworks."""
    wheels = cache / "wheels"
    own = wheels / f"horovod-{build['horovod']}-{cache_key(build)}"
    for entry in [own, *sorted(wheels.glob(f"horovod-{build['horovod']}-*"))]:
        description = entry / "build.json"
        if description.is_file() and serves(json.loads(description.read_text()), build):
            found = sorted(entry.glob("horovod-*.whl"))
            if found:
                return found[0]
    return None


def cmake_3():
    """A CMake 3.x: Gloo's cmake_minimum_required is rejected by CMake 4 (PyPI's cmake wheel)."""
    for candidate in [shutil.which("cmake"), "/usr/bin/cmake", "/usr/local/bin/cmake"]:
        if candidate and os.access(candidate, os.X_OK):
            output = subprocess.run([candidate, "--version"], capture_output=True, text=True).stdout
            if re.match(r"cmake version 3\.", output):
                return candidate
    fail("Horovod 0.28.1 needs CMake 3.x (Gloo does not configure with CMake 4); on Debian or "
         "Ubuntu: apt-get install cmake")


def apply_patches(source, gpu=False):
    edits = json.loads(PATCHES.read_text())["edits"] + (json.loads(GPU_PATCHES.read_text())["edits"] if gpu else [])
    for edit in edits:
        path = source / edit["file"]
        text = path.read_text()
        count = text.count(edit["old"])
        if count != 1:
            fail(f"expected one {edit['old']!r} in {path}, found {count}: not the sdist these patches "
                 f"were made for")
        path.write_text(text.replace(edit["old"], edit["new"]))
        log(f"patched {edit['file']}: {edit['why']}")


def build_flags(build):
    def switch(name, on):
        return {f"HOROVOD_WITH{'' if on else 'OUT'}_{name}": "1"}

    flags = {"HOROVOD_WITHOUT_MXNET": "1", **switch("PYTORCH", "torch" in build["frameworks"]),
             **switch("TENSORFLOW", "tensorflow" in build["frameworks"]),
             **switch("MPI", "mpi" in build["controllers"]), **switch("GLOO", True)}
    if build["gpu_operations"]:
        flags["HOROVOD_GPU_OPERATIONS"] = build["gpu_operations"]
    return flags


def build_environment(build, environ):
    """``environ`` for Horovod's build: its setup reads every HOROVOD_* variable, so only those
    that ``build`` (and so the cache key) describes may reach it: the flags, and where CUDA and
    NCCL are (``build["locations"]``)."""
    env = {key: value for key, value in environ.items()
           if not key.startswith("HOROVOD_") and key not in LOCATION_VARIABLES}
    env.update(build.get("locations") or {})
    env.update(build_flags(build))
    return env


def prepend_paths(env, key, paths):
    """Put ``paths`` before ``env[key]``'s own, which a new machine may not have set at all."""
    env[key] = os.pathsep.join(paths + ([env[key]] if env.get(key) else []))


def build_wheel(build, cache, destination):
    """Download, patch and compile Horovod; the wheel lands in ``destination``."""
    env = build_environment(build, os.environ)
    if build.get("cuda_toolkit"):
        log(f"CUDA and NCCL for the build: {' '.join(build['cuda_toolkit'])}, assembled once under {cache / 'cuda'}")
        try:
            assembled = cuda_toolkit.assemble(cache, build["cuda_toolkit"])
        except subprocess.CalledProcessError:
            fail("pip could not install the CUDA toolkit's wheels (its message is above): without network, let pip "
                 "find them (PIP_FIND_LINKS), or set HOROVOD_CUDA_HOME and HOROVOD_NCCL_HOME to a toolkit and NCCL")
        except RuntimeError as error:
            fail(str(error))
        # What the user set (a NCCL of their own, say) keys the build, so it wins.
        env.update({**assembled, **build["locations"]})
    prepend_paths(env, "PATH", [str(pathlib.Path(cmake_3()).parent)])
    env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 1}")
    if "tensorflow" in build["frameworks"]:
        # TF's wheel keeps highwayhash and farmhash under include/external/, where Horovod's
        # sources do not look.
        include = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.sysconfig.get_include())"],
                                 capture_output=True, text=True, check=True, env=dict(env, TF_CPP_MIN_LOG_LEVEL="3"))
        include = include.stdout.strip().splitlines()[-1]
        prepend_paths(env, "CPLUS_INCLUDE_PATH",
                      [f"{include}/external/highwayhash", f"{include}/external/farmhash_archive/src"])
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        pip = [sys.executable, "-m", "pip"]
        archive = download_sdist(build["horovod"], json.loads(PATCHES.read_text())["sdist_sha256"], work)
        with tarfile.open(archive) as sdist:
            # Python < 3.11.4 (Debian 12's 3.11.2) has no extraction filters.
            sdist.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        source = work / f"horovod-{build['horovod']}"
        apply_patches(source, gpu=bool(build["gpu_operations"]))
        log(f"compiling with {' '.join(f'{k}={v}' for k, v in sorted(build_flags(build).items()))} "
            f"(10-25 minutes on 2 cores)")
        subprocess.run([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(work / "wheel"), str(source)],
                       check=True, env=env)
        wheel = next((work / "wheel").glob("horovod-*.whl"))
        return publish(wheel, build, destination)


def download_sdist(version, sha256, work):
    """Horovod's sdist in ``work``, its sha256 checked before anything of it runs: pip's
    hash-checking mode verifies the archive as it arrives, before it prepares its metadata
    (which runs the sdist's setup.py)."""
    requirements = work / "requirements.txt"
    requirements.write_text(f"horovod=={version} --hash=sha256:{sha256}\n")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "--require-hashes", "-r", str(requirements), "-d", str(work)], check=True)
    except subprocess.CalledProcessError:
        fail(f"pip could not download horovod {version} with the sha256 the patches were made for ({sha256}): "
             f"see pip's message above")
    return work / f"horovod-{version}.tar.gz"


def publish(wheel, build, destination):
    """Put ``wheel`` and its ``build.json`` in the cache at ``destination`` by renaming a whole
    directory, so that a reader, or another build at the same time, sees an entry whole or not at
    all. An entry already there (``--rebuild``, or one that does not serve) is moved away first;
    one that another build publishes meanwhile is as good, and kept."""
    with published_folder(destination, "build.json", replace=True) as staging:
        shutil.copy2(wheel, staging / wheel.name)
        (staging / "build.json").write_text(json.dumps(build, indent=1, sort_keys=True) + "\n")
    return next(destination.glob("horovod-*.whl"))


def check_build(build):
    """``horovodrun --check-build`` must list every framework and controller of ``build``."""
    horovodrun = pathlib.Path(sys.executable).parent / "horovodrun"
    output = subprocess.run([str(horovodrun), "--check-build"], capture_output=True, text=True).stdout
    print(output, flush=True)
    wanted = [FEATURE_NAMES[name] for name in [*build["frameworks"], *build["controllers"]]]
    missing = [feature for feature in wanted if not re.search(rf"\[X\] {feature}\s*$", output, re.M)]
    if missing:
        fail(f"horovodrun --check-build does not list {', '.join(missing)}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m horovod_accordion.tools.install_horovod", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=pathlib.Path, default=cache_folder())
    parser.add_argument("--gpu-operations", default=os.environ.get("HOROVOD_GPU_OPERATIONS"),
                        help="e.g. NCCL (default: $HOROVOD_GPU_OPERATIONS; none: a CPU build)")
    parser.add_argument("--rebuild", action="store_true", help="compile even when a cached wheel fits")
    args = parser.parse_args(argv)
    args.cache = args.cache.resolve()  # one spelling whatever the working folder: the install marker compares paths

    build = describe_build(args.gpu_operations)
    if build["gpu_operations"] and "torch" in build["frameworks"]:
        give_torch_its_cuda_libraries()
    wheel = None if args.rebuild else find_cached_wheel(args.cache, build)
    marker = pathlib.Path(sys.prefix) / ".horovod-wheel"
    if wheel is None:
        log(f"no cached wheel for {json.dumps(build['frameworks'])} under {args.cache}; building one")
        (args.cache / "wheels").mkdir(parents=True, exist_ok=True)
        destination = args.cache / "wheels" / f"horovod-{build['horovod']}-{cache_key(build)}"
        wheel = build_wheel(build, args.cache, destination)
    elif installed_version(["horovod"]) == build["horovod"] and marker.is_file() and marker.read_text() == str(wheel):
        log(f"Horovod {build['horovod']} from {wheel} is already installed")
        check_build(build)
        return
    log(f"installing {wheel}")
    # --no-deps: a cached wheel installs offline, and leaves the dependencies' versions alone.
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps", str(wheel)],
                   check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    marker.write_text(str(wheel))
    check_build(build)


if __name__ == "__main__":
    main()
