"""The DDP communication hook on 2 real processes: ``torchrun`` with Horovod made
unimportable, and one ``horovodrun`` job that compares it with the Horovod optimizer."""
import pytest

from tests.conftest import check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("ddp_checks"))
def test_ddp(launches, check):
    launches("ddp_checks", "torchrun").check(check)


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("ddp_horovod_checks"))
def test_ddp_against_horovod(launches, check):
    launches("ddp_horovod_checks", "gloo").check(check)
