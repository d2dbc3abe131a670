"""``horovod_accordion.fsdp`` on 4 real processes: ``torchrun``, Gloo, 2 replicas × 2 shards;
a second launch resumes the first's checkpoint, a third trains under Lightning's
``ModelParallelStrategy``."""
import pytest

from tests.conftest import check_names, run_workers


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    shared = tmp_path_factory.mktemp("fsdp-shared")
    env = {"ACCORDION_SHARED_DIR": str(shared)}
    first = run_workers("fsdp_checks", tmp_path_factory.mktemp("fsdp"), np=4, controller="torchrun", env=env,
                        timeout=600)
    resumed = run_workers("fsdp_resume_checks", tmp_path_factory.mktemp("fsdp-resume"), np=4, controller="torchrun",
                          env=env, timeout=300)
    lightning = run_workers("lightning_fsdp_checks", tmp_path_factory.mktemp("fsdp-lightning"), np=4,
                            controller="torchrun", timeout=300)
    return {"fsdp_checks": first, "fsdp_resume_checks": resumed, "lightning_fsdp_checks": lightning}


@pytest.mark.multiworker
@pytest.mark.parametrize("module,check", [(module, check)
                                          for module in ("fsdp_checks", "fsdp_resume_checks", "lightning_fsdp_checks")
                                          for check in check_names(module)])
def test_fsdp(launches, module, check):
    launches[module].check(check)
