"""Our drop-in modules against Horovod's: every name resolves, and Horovod's behaviours that its
own tests use hold on 2 real ranks (``tests/workers/torch_compat_checks.py``, ``tf_compat_checks.py``)."""
import importlib
import os

import pytest

from tests.conftest import CONTROLLERS, check_names

DROP_INS = {"horovod_accordion.torch": "horovod.torch", "horovod_accordion.tensorflow": "horovod.tensorflow",
            "horovod_accordion.keras": "horovod.tensorflow.keras"}


@pytest.mark.parametrize("ours,theirs", DROP_INS.items())
def test_every_name_of_horovods_module_resolves_on_ours(ours, theirs, monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    theirs, ours = importlib.import_module(theirs), importlib.import_module(ours)
    missing = [name for name in vars(theirs) if not name.startswith("__") and not hasattr(ours, name)]
    assert not missing, missing


@pytest.mark.multiworker
@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("module,check", [(m, c) for m in ("torch_compat_checks", "tf_compat_checks")
                                          for c in check_names(m)])
def test_horovod_behaviours(launches, controller, module, check):
    launches(module, controller, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}).check(check)
