"""The DDP communication hook on 2 real processes: ``torchrun`` with Horovod made
unimportable, and one ``horovodrun`` job that compares it with the Horovod optimizer."""
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, WORKERS, check_names, free_port, worker_env


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("ddp_checks"))
def test_ddp(launches, check):
    launches("ddp_checks", "torchrun").check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("ddp_horovod_checks"))
def test_ddp_against_horovod(launches, check):
    launches("ddp_horovod_checks", "gloo").check(check)


@pytest.mark.multiworker
def test_a_collective_that_gloo_frees_after_the_script_ends_does_not_abort_the_exit():
    """The 1-in-50 abort at the end of a run ("terminate called without an active exception"), with
    Accordion's hook or plain DDP: without the DDP backend's exit grace, 5 of 8 such launches aborted."""
    for mode in ("hook", "plain", "hook", "plain"):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                   "127.0.0.1", "--master_port", str(free_port()), str(WORKERS / "exit_race_job.py"), mode]
        env = worker_env({"PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "no_horovod"), str(REPO)])})
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (mode, result.stderr[-3000:])
