"""The contracts between the core and the backends (``horovod_accordion/core/backends.py``), type-checked
with mypy (pinned in the ``dev`` extra): every backend implements its contract, and the core calls
nothing outside it."""
import pathlib
import subprocess
import sys

from tests.conftest import REPO

CHECKED = ["tests/backends_conformance.py", "horovod_accordion/core/backends.py", "horovod_accordion/core/reducers.py",
           "horovod_accordion/core/exchange.py", "horovod_accordion/core/steps.py"]


def mypy(*paths):
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", *paths], cwd=REPO,
                          capture_output=True, text=True)


def test_every_backend_keeps_its_contract_and_the_core_calls_only_the_contract():
    result = mypy(*CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_backend_that_lacks_a_method_fails_the_check(tmp_path):
    source = (REPO / "horovod_accordion" / "tensorflow" / "tensors.py").read_text()
    assert source.count("    def scatter_mean(") == 1
    drifted = tmp_path / "drifted_tensors.py"
    drifted.write_text(source.replace("    def scatter_mean(", "    def scatter_average(") + '''

def conform(tensors: TensorFlowTensorOps) -> None:
    from horovod_accordion.core.backends import TensorOps
    checked: TensorOps = tensors
''')
    result = mypy("--config-file", str(REPO / "setup.cfg"), str(drifted))
    assert result.returncode == 1 and 'missing following "TensorOps" protocol member' in result.stdout \
        and "scatter_mean" in result.stdout, result.stdout + result.stderr


def test_the_core_calling_outside_the_contract_fails_the_check(tmp_path):
    source = (REPO / "horovod_accordion" / "core" / "exchange.py").read_text()
    core = tmp_path / "exchange_copy.py"
    core.write_text(source.replace("tensors.squared_norms(accumulated)", "tensors.squared_sums(accumulated)"))
    config = tmp_path / "mypy.ini"
    config.write_text((REPO / "setup.cfg").read_text().replace(
        "[mypy-horovod_accordion.core.reducers,horovod_accordion.core.exchange,",
        "[mypy-exchange_copy,horovod_accordion.core.reducers,"))
    result = mypy("--config-file", str(config), str(core))
    assert result.returncode == 1 and '"EagerTensorOps" has no attribute "squared_sums"' in result.stdout, \
        result.stdout + result.stderr
