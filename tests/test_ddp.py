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


def run_state_script(body):
    """``body`` after ``state = AccordionState(...)``, in a new process (the warning comes at exit)."""
    script = ("from horovod_accordion.ddp import AccordionState, PowerSGD\n"
              "state = AccordionState(compression=PowerSGD(2, 1))\n" + body)
    env = worker_env({"PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "no_horovod"), str(REPO)])})
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)


def test_the_never_ran_warning_names_every_entry_point_and_stays_out_of_a_crash():
    clean = run_state_script("")
    assert clean.returncode == 0 and "hook never ran" in clean.stderr, clean.stderr
    for entry_point in ("register_comm_hook(state, accordion_hook)", "AccordionCallback(state)", "register_accordion",
                        "prepare_accordion"):
        assert entry_point in clean.stderr, (entry_point, clean.stderr)
    crashed = run_state_script("raise ValueError('the real error')")
    assert crashed.returncode == 1 and "ValueError: the real error" in crashed.stderr, crashed.stderr
    assert "never ran" not in crashed.stderr, crashed.stderr
    registered = run_state_script("state._hook_watch.registered = True  # as the trainer integrations do\n")
    assert "registered on the DDP model, but no training step went through it" in registered.stderr, registered.stderr
    assert "AccordionCallback" not in registered.stderr, registered.stderr


def test_reading_an_unbound_state_says_its_hook_has_not_run():
    said = run_state_script("try:\n    state.accordion_stats()\nexcept RuntimeError as error:\n    print(error)\n")
    assert "its hook has not run: register it on the DDP model" in said.stdout, said.stdout + said.stderr
