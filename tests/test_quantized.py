"""``Quantized`` on 3 real processes (``torchrun``, Gloo), where the chunks of a bucket split its
layers unevenly; the 2-rank runs are in the Horovod torch (Gloo, MPI) and DDP launches."""
import pytest

from tests.conftest import check_names


@pytest.mark.multiworker
@pytest.mark.parametrize("check", check_names("quantized_checks"))
def test_quantized_on_three_ranks(launches, check):
    launches("quantized_checks", "torchrun", np=3).check(check)
