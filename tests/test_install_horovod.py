"""The packaged Horovod installer's decisions: which cached wheel fits, what joins the key, and
patches that must match exactly once. The build itself runs in `make setup` (scripts/setup.sh),
and the whole install path a user takes in tests/test_release.py."""
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

from horovod_accordion.tools import install_horovod
from tests.conftest import worker_env

BUILD = {"horovod": "0.28.1", "patches": "p", "python": "3.11.7", "machine": "x86_64",
         "controllers": ["gloo", "mpi"], "gpu_operations": None,
         "frameworks": {"torch": "2.13.0+cpu"}}


def cache_entry(cache, build, name=None):
    entry = cache / "wheels" / f"horovod-0.28.1-{name or install_horovod.cache_key(build)}"
    entry.mkdir(parents=True)
    (entry / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    (entry / "build.json").write_text(json.dumps(build))
    return entry


def test_a_wheel_built_for_more_frameworks_at_the_same_versions_serves_a_torch_only_environment(tmp_path):
    both = dict(BUILD, frameworks={"torch": "2.13.0+cpu", "tensorflow": "2.21.0"})
    entry = cache_entry(tmp_path, both)
    assert install_horovod.find_cached_wheel(tmp_path, BUILD).parent == entry


@pytest.mark.parametrize("change", [
    {"frameworks": {"torch": "2.12.0"}},
    {"gpu_operations": "NCCL"},
    {"controllers": ["gloo"]},
    {"python": "3.11.2"},
    {"patches": "other"},
])
def test_a_wheel_built_otherwise_is_not_reused(tmp_path, change):
    cache_entry(tmp_path, dict(BUILD, **change))
    assert install_horovod.find_cached_wheel(tmp_path, BUILD) is None


def test_the_environment_s_own_key_comes_first(tmp_path):
    cache_entry(tmp_path, dict(BUILD, frameworks={"torch": "2.13.0+cpu", "tensorflow": "2.21.0"}), name="0" * 16)
    own = cache_entry(tmp_path, BUILD)
    assert install_horovod.find_cached_wheel(tmp_path, BUILD).parent == own


def test_the_gpu_operations_join_the_build_flags_and_the_key():
    nccl = dict(BUILD, gpu_operations="NCCL")
    assert install_horovod.build_flags(nccl)["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert "HOROVOD_GPU_OPERATIONS" not in install_horovod.build_flags(BUILD)
    assert install_horovod.cache_key(nccl) != install_horovod.cache_key(BUILD)
    flags = install_horovod.build_flags(BUILD)
    assert flags["HOROVOD_WITH_PYTORCH"] == flags["HOROVOD_WITHOUT_TENSORFLOW"] == flags["HOROVOD_WITH_MPI"] == "1"


def test_only_the_horovod_variables_the_key_describes_reach_the_build():
    environ = {"PATH": "/usr/bin", "HOROVOD_GPU_ALLREDUCE": "NCCL", "HOROVOD_GPU_OPERATIONS": "NCCL",
               "HOROVOD_WITHOUT_GLOO": "1"}
    env = install_horovod.build_environment(BUILD, environ)
    assert env["PATH"] == "/usr/bin"
    assert {k: v for k, v in env.items() if k.startswith("HOROVOD_")} == install_horovod.build_flags(BUILD)


@pytest.mark.parametrize("gpu", [False, True])
def test_each_patch_must_match_exactly_once(tmp_path, gpu):
    edits = json.loads(install_horovod.PATCHES.read_text())["edits"]
    gpu_edits = json.loads(install_horovod.GPU_PATCHES.read_text())["edits"]
    for edit in edits + gpu_edits:
        path = tmp_path / edit["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(path.read_text() + edit["old"] + "\n" if path.exists() else edit["old"] + "\n")
    install_horovod.apply_patches(tmp_path, gpu=gpu)
    for edit in edits:
        assert edit["new"] in (tmp_path / edit["file"]).read_text()
    for edit in gpu_edits:
        assert (edit["new"] in (tmp_path / edit["file"]).read_text()) == gpu, "GPU edits only in GPU builds"
    with pytest.raises(SystemExit, match="expected one"):
        install_horovod.apply_patches(tmp_path, gpu=gpu)  # patched already: the old text is gone


def test_the_gpu_fields_key_gpu_builds_only(monkeypatch):
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    # The fields of a CPU build's key as its cached wheels were made with: no new one may join them.
    assert set(install_horovod.describe_build(None)) == {
        "horovod", "patches", "python", "machine", "libc", "controllers", "mpi", "gpu_operations", "cuda",
        "compiler", "locations", "frameworks"}
    gpu = install_horovod.describe_build("NCCL")
    assert gpu["gpu_patches"] and gpu["cuda_toolkit"] is None and gpu["locations"]["CUDA_HOME"] == "/usr/local/cuda"


def test_the_patches_ship_in_the_package():
    patches = json.loads(install_horovod.PATCHES.read_text())
    assert patches["horovod"] == "0.28.1" and all(edit["why"] for edit in patches["edits"])
    assert all(edit["why"] for edit in json.loads(install_horovod.GPU_PATCHES.read_text())["edits"])


@pytest.mark.parametrize("before, after", [({}, "/a:/b"), ({"CPLUS_INCLUDE_PATH": ""}, "/a:/b"),
                                           ({"CPLUS_INCLUDE_PATH": "/c"}, "/a:/b:/c")])
def test_include_paths_go_first_whether_or_not_the_machine_set_any(before, after):
    env = dict(before)
    install_horovod.prepend_paths(env, "CPLUS_INCLUDE_PATH", ["/a", "/b"])
    assert env["CPLUS_INCLUDE_PATH"] == after


def test_the_sdist_is_hashed_before_anything_of_it_runs(tmp_path, monkeypatch):
    """pip prepares a downloaded sdist's metadata (its setup.py runs) before we could hash the file:
    the download goes through pip's hash-checking mode, which refuses it first."""
    ran = []
    monkeypatch.setattr(install_horovod.subprocess, "run", lambda command, **kw: ran.append(command))
    archive = install_horovod.download_sdist("0.28.1", "ab" * 32, tmp_path)
    (command,) = ran
    assert "--require-hashes" in command and command[command.index("-r") + 1] == str(tmp_path / "requirements.txt")
    assert (tmp_path / "requirements.txt").read_text() == f"horovod==0.28.1 --hash=sha256:{'ab' * 32}\n"
    assert archive == tmp_path / "horovod-0.28.1.tar.gz"


def test_pip_refuses_an_sdist_of_another_hash_before_preparing_it(tmp_path):
    """The real pip, on a local sdist whose setup.py leaves a mark when pip prepares it (it does
    without hashes, in this environment with --no-build-isolation): the wrong hash stops it first."""
    source = tmp_path / "marker-1.0"
    source.mkdir()
    mark = tmp_path / "setup_ran"
    (source / "setup.py").write_text(f"open({str(mark)!r}, 'w').close()\nfrom setuptools import setup\n"
                                     f"setup(name='marker', version='1.0')\n")
    with tarfile.open(tmp_path / "marker-1.0.tar.gz", "w:gz") as sdist:
        sdist.add(source, arcname="marker-1.0")
    (tmp_path / "req.txt").write_text(f"marker==1.0 --hash=sha256:{'0' * 64}\n")
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-build-isolation", "--no-index",
                             "--find-links", str(tmp_path),
                             "--no-deps", "--no-binary", ":all:", "--require-hashes", "-r", str(tmp_path / "req.txt"),
                             "-d", str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode != 0 and "hash" in result.stderr.lower(), result.stderr
    assert not mark.exists(), "the sdist's setup.py ran before its hash was checked"


def test_cuda_and_nccl_locations_reach_the_build_and_join_the_key(monkeypatch):
    monkeypatch.setenv("HOROVOD_NCCL_HOME", "/opt/nccl")
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda-12")
    monkeypatch.delenv("NCCL_HOME", raising=False)
    build = install_horovod.describe_build("NCCL")
    assert build["locations"]["HOROVOD_NCCL_HOME"] == "/opt/nccl" and build["locations"]["CUDA_HOME"] == \
        "/usr/local/cuda-12"
    env = install_horovod.build_environment(build, {"PATH": "/usr/bin", "HOROVOD_NCCL_HOME": "/elsewhere",
                                                    "NCCL_HOME": "/not/in/the/key"})
    assert env["HOROVOD_NCCL_HOME"] == "/opt/nccl" and env["CUDA_HOME"] == "/usr/local/cuda-12"
    assert "NCCL_HOME" not in env
    other = dict(build, locations=dict(build["locations"], HOROVOD_NCCL_HOME="/opt/nccl-2"))
    assert install_horovod.cache_key(other) != install_horovod.cache_key(build)


def test_the_compiler_joins_the_key_and_a_silent_tool_is_no_crash(monkeypatch):
    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], 60)

    assert "compiler" in install_horovod.describe_build(None)
    monkeypatch.setattr(install_horovod.subprocess, "run", hangs)
    assert install_horovod.first_line(["nvcc", "--version"]) is None


def test_a_cache_entry_appears_whole_and_a_concurrent_one_is_kept(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = tmp_path / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"built")
    destination = wheels / "horovod-0.28.1-key"
    published = install_horovod.publish(wheel, BUILD, destination)
    assert published.read_bytes() == b"built" and json.loads((destination / "build.json").read_text()) == BUILD
    assert [p.name for p in wheels.iterdir()] == [destination.name], "no staging directory is left"
    wheel.write_bytes(b"rebuilt")
    assert install_horovod.publish(wheel, BUILD, destination).read_bytes() == b"rebuilt"  # --rebuild replaces
    assert [p.name for p in wheels.iterdir()] == [destination.name]


def test_the_packaged_demo_without_horovod_says_how_to_install_it_or_where_the_ddp_route_is():
    """In a torch-only environment it ended in a bare ``ModuleNotFoundError: No module named 'horovod'``."""
    import os
    import pathlib

    repo = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo / "tests" / "no_horovod"), str(repo)]))
    result = subprocess.run([sys.executable, "-m", "horovod_accordion.examples.demo", "--epochs", "1"], env=env,
                            cwd=repo, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    for words in ("trains with Horovod", "python -m horovod_accordion.tools.install_horovod",
                  "docs/getting-started/ddp.md"):
        assert words in result.stderr, (words, result.stderr)


@pytest.mark.multiworker
def test_horovodrun_asks_torch_whether_gloo_and_mpi_were_built(tmp_path):
    """Before every job horovodrun imports a framework's extension to ask whether its controller
    was built. Unpatched, it asked TensorFlow's first, 4 s of CPU per launch: a stand-in
    ``tensorflow`` in front of the real one records whether anything imported it. (Unpatched, a
    Horovod built without TensorFlow would pass too; tests/test_stack.py checks that it has it.)"""
    env = worker_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\nraise ImportError('stand-in')\n")
    horovodrun = str(pathlib.Path(sys.executable).parent / "horovodrun")
    for controller in ("gloo", "mpi"):
        job = subprocess.run([horovodrun, "-np", "1", f"--{controller}", sys.executable, "-c", "pass"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert not (tmp_path / "imported").exists(), f"horovodrun --{controller} imported TensorFlow"
