"""What ``tests/test_backends.py`` type-checks: every backend against the contract it implements
(``horovod_accordion.core.backends``). Never imported; mypy reads it."""
from horovod_accordion.advise.profile import SimulatedWorld
from horovod_accordion.core.backends import CollectiveOps, EagerTensorOps, Sharding, TensorOps
from horovod_accordion.hooks.ops import DistributedCollectives
from horovod_accordion.hooks.fsdp_state import _Sharding
from horovod_accordion.tensorflow.ops import TensorFlowCollectives
from horovod_accordion.tensorflow.tensors import TensorFlowTensorOps
from horovod_accordion.torch.ops import TorchCollectives
from horovod_accordion.torch_common.tensors import TorchTensorOps


def every_backend_keeps_its_contract(torch_tensors: TorchTensorOps, tf_tensors: TensorFlowTensorOps,
                                     horovod_torch: TorchCollectives, ddp: DistributedCollectives,
                                     horovod_tf: TensorFlowCollectives, advisor: SimulatedWorld,
                                     fsdp: _Sharding) -> None:
    eager: EagerTensorOps = torch_tensors
    traced: TensorOps = tf_tensors
    collectives: list[CollectiveOps] = [horovod_torch, ddp, horovod_tf, advisor]
    sharding: Sharding = fsdp
