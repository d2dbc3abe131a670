"""The module paths of 0.2.0 that moved, kept importable: a DDP state pickled by 0.2.0 names its
classes by them (``horovod_accordion.ddp.state.AccordionState``, ``horovod_accordion.compression.
PowerSGD``...), and unpickling imports them. Each old path is the new module itself, imported
only when asked for, so the top-level package still imports no framework."""
import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "horovod_accordion.accordion": "horovod_accordion.core.schedule",
    "horovod_accordion.arguments": "horovod_accordion.core.arguments",
    "horovod_accordion.backends": "horovod_accordion.core.backends",
    "horovod_accordion.batch": "horovod_accordion.core.batch",
    "horovod_accordion.buckets": "horovod_accordion.core.buckets",
    "horovod_accordion.collectives": "horovod_accordion.core.collectives",
    "horovod_accordion.compression": "horovod_accordion.core.compression",
    "horovod_accordion.detector": "horovod_accordion.core.detector",
    "horovod_accordion.exchange": "horovod_accordion.core.exchange",
    "horovod_accordion.metrics": "horovod_accordion.core.metrics",
    "horovod_accordion.policies": "horovod_accordion.core.policies",
    "horovod_accordion.process_sets": "horovod_accordion.core.process_sets",
    "horovod_accordion.reducers": "horovod_accordion.core.reducers",
    "horovod_accordion.steps": "horovod_accordion.core.steps",
    "horovod_accordion.torch_compression": "horovod_accordion.torch_common.compression",
    "horovod_accordion.torch_loss_scale": "horovod_accordion.torch_common.loss_scale",
    "horovod_accordion.torch_tensors": "horovod_accordion.torch_common.tensors",
    "horovod_accordion.hook_exchange": "horovod_accordion.hooks.exchange",
    "horovod_accordion.ddp.ops": "horovod_accordion.hooks.ops",
    "horovod_accordion.ddp.state": "horovod_accordion.hooks.ddp_state",
    "horovod_accordion.ddp.trainers": "horovod_accordion.trainers.common",
    "horovod_accordion.fsdp.layout": "horovod_accordion.hooks.fsdp_layout",
    "horovod_accordion.fsdp.state": "horovod_accordion.hooks.fsdp_state",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of ``MOVED`` and loads it as its new module."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        """The new module ran when it was imported."""


def install():
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
