"""``AccordionState`` for FSDP2: Accordion on the cross-replica all-reduce of hybrid sharding.

::

    mesh = init_device_mesh("cuda", (replicas, shards), mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    state = AccordionState(mesh, compression=PowerSGD(4, 1), model=model, optimizer=optimizer, window_steps=20)
    for step in ...:
        loss(model(x)).backward()   # each unit's shard is averaged across replicas here
        optimizer.step()

FSDP2 reduce-scatters each unit's gradients inside a replica (the fast link, uncompressed),
then calls the unit's all-reduce hook with this rank's flat shard buffer. The hook averages each
layer's shard across the replicas (the slow link) with the exchange every backend runs
(``horovod_accordion.core.exchange``): PowerSGD sees each shard as its block of rows, and the error
feedback, Q and Δ are shard-sized, so sharding keeps its memory saving. The detector sums a
layer's shards' squared norms over the world, so every rank decides alike.

FSDP views the parameters' gradients out of the buffer when the hook returns, so each unit's
phases run inside its hook: on a CPU its collectives are done when it returns; on a GPU they are
queued on the stream FSDP runs the hook in.
"""

import functools
import io
import json
from typing import NamedTuple

import torch
from torch.autograd import Variable

from horovod_accordion.core.schedule import warn_at_exit_if_no_window_closed
from horovod_accordion.core.backends import CollectiveOps
from horovod_accordion.core.compression import PowerSGD
from horovod_accordion.hooks.ops import DistributedCollectives
from horovod_accordion.hooks.fsdp_layout import ShardLayout
from horovod_accordion.hooks.exchange import HookStateViews, build_exchange, hook_loss_scale, schedule_options
from horovod_accordion.torch_common.compression import check_hook_compression
from horovod_accordion.torch_common.loss_scale import grad_scaler_property
from horovod_accordion.torch_common.tensors import TorchTensorOps

__all__ = ["AccordionState"]


class _Sharding(NamedTuple):
    shards: int
    world: CollectiveOps


class AccordionState(HookStateViews):
    """Args:
        mesh: the 2-D ``DeviceMesh`` of replicas × shards that the model is sharded on (its
            ``"shard"`` dimension; see ``horovod_accordion.hooks.fsdp_layout.ShardLayout``).
        compression: as ``horovod_accordion.ddp.AccordionState``'s: ``Compression.none``,
            ``Compression.fp16``, ``PowerSGD(low_rank, high_rank)``, ``TopK(low_fraction,
            high_fraction)`` or ``Quantized(low_bits, high_bits)``, applied to each rank's shard of
            each layer.
        model: the module ``fully_shard`` has wrapped, every unit on ``mesh["shard"]``. The
            state registers its hook on every unit (``set_all_reduce_hook``), has unused
            parameters reduce-scattered as zeros (so each unit's buffer keeps its layout), and
            broadcasts the first replica's parameters to the others, as DDP does.
        optimizer: the optimizer whose first parameter group's ``lr`` the first hook of each
            step reads, for the learning-rate decay rule; ``None``: call ``observe_lr(lr)``.

    ``eta``, ``interval``, ``window_steps``, ``per_layer``, ``lr_decay_factor``,
    ``delta_windows``, ``check_norm``, ``verify_levels``, ``log_path``, ``tensorboard_dir``,
    ``policy``, ``grad_scaler`` and ``bf16_wire`` are as in ``horovod_accordion.ddp.AccordionState``.
    A step is one backward whose gradients FSDP reduces (``set_requires_gradient_sync(False)``
    accumulates micro-batches without one). Construction is a collective over the world.

    ``state_dict()`` / ``load_state_dict()`` make the state a ``torch.distributed.checkpoint``
    ``Stateful``: each rank saves its own shards' state, and a checkpoint made on another layout
    (mesh, layers, shard shapes) is refused with a ``ValueError`` on every rank.
    """

    def __init__(self, mesh, compression=PowerSGD(2, 1), *, model, optimizer=None, eta=0.5, interval=10,
                 window_steps=None, per_layer=True, lr_decay_factor=2.0, delta_windows=1, check_norm="local",
                 verify_levels=None, log_path=None, tensorboard_dir=None, policy="accordion", grad_scaler=None,
                 bf16_wire=False):
        check_hook_compression(compression)
        layout = ShardLayout(model, mesh)
        hooked = [unit for unit in layout.units if unit.param_group._all_reduce_hook is not None]
        if hooked:
            raise ValueError("this model's units already have an all-reduce hook (another AccordionState?): build "
                             "one state per model")
        tensors = TorchTensorOps(layout.shard_params[0].device, bf16_wire)
        options = schedule_options(compression, policy, eta=eta, interval=interval, window_steps=window_steps,
                                   per_layer=per_layer, lr_decay_factor=lr_decay_factor, delta_windows=delta_windows,
                                   check_norm=check_norm, verify_levels=verify_levels)
        self._loss_scale = hook_loss_scale(grad_scaler)
        self._exchange, self._steps = build_exchange(
            layout.names, layout.shard_params, compression, options,
            DistributedCollectives(tensors, layout.replicate_group),
            sharding=_Sharding(layout.shards, DistributedCollectives(tensors)), loss_scale=self._loss_scale,
            log_path=log_path, tensorboard_dir=tensorboard_dir, layer_shapes=layout.layer_shapes)
        accordion = self._exchange.accordion
        self._layout, self._optimizer = layout, optimizer
        self.iter = 0  # the steps averaged
        self._in_step = False
        layout.broadcast_from_first_replica()
        for index, unit in enumerate(layout.units):
            unit.module.set_reduce_scatter_unused_params(True, recurse=False)
            unit.module.set_all_reduce_hook(functools.partial(self._on_unit, index))
        model.register_forward_pre_hook(self._before_forward)
        warn_at_exit_if_no_window_closed(self, accordion, "state.end_epoch()")

    grad_scaler = grad_scaler_property()

    def _bound(self):
        return self._exchange

    def state_dict(self):
        """For ``torch.distributed.checkpoint``: the layout, and this rank's state as bytes under
        its own key (the memories and Δ are its shards')."""
        buffer = io.BytesIO()
        torch.save(dict(self._exchange.state_dict(), iter=self.iter), buffer)
        return {"layout": json.dumps(self._layout.describe()), self._own_key(): buffer.getvalue()}

    def load_state_dict(self, state_dict):
        """Restore a ``state_dict()`` of the same layout; another layout raises a ``ValueError``
        on every rank before anything is loaded."""
        if self._in_step:
            raise RuntimeError("load_state_dict() during backward")
        ours, theirs = self._layout.describe(), json.loads(state_dict["layout"])
        if theirs != ours:
            differs = sorted(key for key in ours if ours[key] != theirs.get(key))
            raise ValueError(f"this checkpoint was saved on another layout ({', '.join(differs)} differ): "
                             f"{theirs['replicas']} replicas × {theirs['shards']} shards against this run's "
                             f"{ours['replicas']} × {ours['shards']}, and each rank's error feedback is its own "
                             f"shard's, so it can't resume here")
        saved = torch.load(io.BytesIO(state_dict[self._own_key()]), weights_only=True)
        self._exchange.load_state_dict(saved, own=True)
        self.iter = saved["iter"]

    def _own_key(self):
        return f"rank{self._exchange.world.rank()}"

    def _on_unit(self, index, flat):
        """FSDP's all-reduce hook of unit ``index``: overwrite ``flat``, this rank's reduce-scatter
        output, with each layer's shard averaged across replicas."""
        unit = self._layout.units[index]
        if not self._in_step:
            # After FSDP's own end-of-backward callback, queued before any unit's hook runs.
            Variable._execution_engine.queue_callback(self._end_step)
            self._in_step = True
            self._observe_optimizer_lr()
        if flat.is_cuda:
            # FSDP runs this hook on its all-reduce stream and keeps the reduce-scatter output
            # alive past it only for native HSDP: with a reduce_dtype other than the parameters'
            # or with accumulation, the next unit's reduce-scatter could take its memory while the
            # kernels and cross-replica collectives queued here still read it. Recorded on this
            # stream, the caching allocator holds it until they have run.
            flat.record_stream(torch.cuda.current_stream(flat.device))
        try:
            shards = unit.shards_of(flat)
            post_divide = unit.post_divide(flat)
            grads = [shard / post_divide for shard in shards] if post_divide else shards
            self._exchange.start(index, unit.layers, grads)
            outputs = self._exchange.finish()
        except BaseException:
            self._abandon_step()
            raise
        for layer, shard in zip(unit.layers, shards):
            average = outputs[layer] * post_divide if post_divide else outputs[layer]
            if average.data_ptr() != shard.data_ptr():  # Compression.none averages the buffer in place
                shard.copy_(average)

    def _end_step(self):
        self._in_step = False
        self.iter += 1
        self._steps.end_steps()

    def _before_forward(self, module, inputs):
        """A backward that raised (in a hook, or out of memory in a later layer) never ran its
        end-of-step callback: the next forward starts clean, the failed step uncounted."""
        if self._in_step:
            self._abandon_step()

    def _abandon_step(self):
        self._in_step = False
        self._exchange.abandon_step()
