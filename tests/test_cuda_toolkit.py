"""The CUDA toolkit a GPU build of Horovod compiles against where no system toolkit is set:
which versions it takes from torch, and the folder it assembles from wheels, with real pip on
stand-in wheels (`make image-gpu` uses the real ones)."""
import base64
import hashlib
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from horovod_accordion.tools import cuda_toolkit, install_horovod

# torch 2.13.0's own pins on PyPI (its CUDA 13 build), as importlib.metadata.requires gives them.
TORCH_CU13_PINS = [
    "filelock", "typing-extensions>=4.10.0",
    'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; '
    'platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
    'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
    'optree>=0.13.0; extra == "optree"',
]


def test_the_toolkit_takes_the_compiler_runtime_and_nccl_of_torchs_own_pins(tmp_path, wheel_folder):
    stand_in_wheel(wheel_folder, "stand-in-torch", {"stand_in_torch.py": ""}, requires=TORCH_CU13_PINS)
    path = install(tmp_path / "prefix", "stand-in-torch==1.0")
    assert cuda_toolkit.pins("stand-in-torch", path) == {"cuda-toolkit": "13.0.3", "nvidia-cudnn-cu13": "9.20.0.48",
                                                         "nvidia-nccl-cu13": "2.29.7", "triton": "3.7.1"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", path + sys.path)
        assert cuda_toolkit.requirements_of("stand-in-torch") == ["cuda-toolkit[nvcc,cudart,cccl]==13.0.3",
                                                                  "nvidia-nccl-cu13==2.29.7"]


def test_a_cpu_torch_pins_no_toolkit_and_a_gpu_build_then_names_the_way_out():
    assert cuda_toolkit.requirements_of("torch") is None, "this suite runs on the CPU build of torch"
    no_nvcc = {"PATH": "/nonexistent"}
    with pytest.raises(SystemExit) as refused:
        install_horovod.gpu_toolkit("NCCL", no_nvcc)
    assert "a CPU build" in str(refused.value) and "HOROVOD_CUDA_HOME" in str(refused.value)
    given = {"HOROVOD_CUDA_HOME": "/usr/local/cuda", "HOROVOD_NCCL_HOME": "/opt/nccl"}
    assert install_horovod.gpu_toolkit("NCCL", {**given, **no_nvcc}) == (given, None)
    assert install_horovod.gpu_toolkit(None, given) == ({}, None)


def test_a_toolkit_torch_pins_keys_the_build_by_its_requirements_not_by_where_it_is(monkeypatch):
    monkeypatch.setattr(cuda_toolkit, "requirements_of", lambda name: ["cuda-toolkit[nvcc]==13.0.3", "nccl==2.29.7"])
    for variable in install_horovod.LOCATION_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent" + os.pathsep + os.path.dirname(sys.executable))
    build = install_horovod.describe_build("NCCL")
    assert build["cuda_toolkit"] == ["cuda-toolkit[nvcc]==13.0.3", "nccl==2.29.7"]
    assert build["locations"] == {} and build["cuda"] is None, "no path of the cache in the key: nothing to download"


@pytest.mark.parametrize("release, assembled", [("13.0", False), ("12.8", True)])
def test_an_nvcc_on_the_path_serves_where_it_is_torchs_cuda_major(tmp_path, monkeypatch, release, assembled):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    toolkit = ["cuda-toolkit[nvcc,cudart,cccl]==13.0.3", "nvidia-nccl-cu13==2.29.7"]
    monkeypatch.setattr(cuda_toolkit, "requirements_of", lambda name: toolkit)
    given, requirements = install_horovod.gpu_toolkit("NCCL", {"PATH": str(nvcc.parent)})
    assert given == {} and requirements == (toolkit if assembled else None)


def stand_in_wheel(folder, name, files, requires=()):
    dist = f"{name.replace('-', '_')}-1.0"
    meta = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" +
            "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
            f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                       "Tag: py3-none-any\n"}
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as wheel:
        for path, text in {**files, **meta}.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{dist}.dist-info/RECORD", "".join(f"{path},{record_hash(text)},{len(text)}\n"
                                                           for path, text in {**files, **meta}.items()) +
                       f"{dist}.dist-info/RECORD,,\n")


def record_hash(text):
    """A file's hash as a wheel's RECORD lists it."""
    digest = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@pytest.fixture
def wheel_folder(tmp_path, monkeypatch):
    """A package source of stand-ins laid out as the CUDA 13 and NCCL wheels are, and nothing else."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    stand_in_wheel(folder, "stand-in-cuda", {"nvidia/cu13/bin/nvcc": "", "nvidia/cu13/include/cuda.h": "",
                                              "nvidia/cu13/lib/libcudart.so.13": "runtime",
                                              "nvidia/cu13/lib/libcudart_static.a": ""})
    stand_in_wheel(folder, "stand-in-nccl", {"nvidia/nccl/include/nccl.h": "", "nvidia/nccl/lib/libnccl.so.2": "nccl"})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def test_a_toolkit_is_assembled_once_with_the_names_cmake_and_the_linker_look_for(tmp_path, wheel_folder,
                                                                                  monkeypatch):
    found = cuda_toolkit.assemble(tmp_path / "cache", ["stand-in-cuda==1.0", "stand-in-nccl==1.0"])
    home, nccl = pathlib.Path(found["HOROVOD_CUDA_HOME"]), pathlib.Path(found["HOROVOD_NCCL_HOME"])
    assert found == {"HOROVOD_CUDA_HOME": str(home), "CUDA_HOME": str(home), "HOROVOD_NCCL_HOME": str(nccl),
                     "HOROVOD_NCCL_LINK": "SHARED"}
    assert home.name == "cu13" and (home / "bin" / "nvcc").is_file()
    assert (home / "lib64" / "libcudart.so").read_text() == "runtime"
    assert os.readlink(home / "lib" / "libcudart.so") == "libcudart.so.13", "relative: the cache may move"
    assert (nccl / "lib" / "libnccl.so").read_text() == "nccl" and (nccl / "include" / "nccl.h").is_file()
    assert [p.name for p in (tmp_path / "cache" / "cuda").iterdir()] == [home.parent.parent.name]

    monkeypatch.setattr(cuda_toolkit.subprocess, "run", lambda *a, **k: pytest.fail("pip ran again"))
    assert cuda_toolkit.assemble(tmp_path / "cache", ["stand-in-cuda==1.0", "stand-in-nccl==1.0"]) == found


def test_a_failed_install_leaves_no_toolkit_behind(tmp_path, wheel_folder):
    with pytest.raises(subprocess.CalledProcessError):
        cuda_toolkit.assemble(tmp_path / "cache", ["stand-in-cuda==1.0", "not-in-the-source==1.0"])
    assert list((tmp_path / "cache" / "cuda").iterdir()) == []


def test_torchs_nccl_overwritten_by_another_distribution_is_found_and_a_reinstall_clears_it(tmp_path, wheel_folder):
    """Two stand-ins ship the same nvidia/nccl file, as TF's CUDA 12 and torch's CUDA 13 wheels
    do; the framework pins one of them. Real pip installs them into one prefix, the other last."""
    stand_in_wheel(wheel_folder, "stand-in-torch", {"stand_in_torch.py": ""},
                   requires=['nvidia-stand-in-cu13==1.0; platform_system == "Linux"',
                             'optree>=0.13; extra == "optree"'])
    for name in ("nvidia-stand-in-cu13", "nvidia-stand-in-cu12"):
        stand_in_wheel(wheel_folder, name, {"nvidia/nccl/lib/libnccl.so.2": name, "nvidia/nccl/include/nccl.h": ""})
    prefix = tmp_path / "prefix"
    path = install(prefix, "stand-in-torch==1.0", "nvidia-stand-in-cu13==1.0")
    assert cuda_toolkit.overwritten_pins("stand-in-torch", path) == []
    install(prefix, "nvidia-stand-in-cu12==1.0")
    assert cuda_toolkit.overwritten_pins("stand-in-torch", path) == ["nvidia-stand-in-cu13==1.0"]
    install(prefix, "nvidia-stand-in-cu13==1.0", force=True)
    assert cuda_toolkit.overwritten_pins("stand-in-torch", path) == []


def install(prefix, *requirements, force=False):
    """Real pip, into ``prefix``, from the stand-ins' folder: the ``sys.path`` entry it installed to."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--prefix", str(prefix),
                    *(["--force-reinstall"] if force else []), *requirements], check=True)
    [site] = prefix.glob("lib/python*/site-packages")
    return [str(site)]
