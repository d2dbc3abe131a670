"""Where FSDP2 puts each rank's gradient shards, read from a model that ``fully_shard`` has
wrapped on the shard dimension of a replicas × shards mesh.

FSDP2 has no public record of that layout: it is read from its parameter groups
(``_get_fsdp_state``, ``FSDPParam``) and divide factors, as torch 2.13 (the version pinned)
lays them out in ``_fsdp_collectives.foreach_reduce``; ``tests/test_fsdp.py`` checks it against
native HSDP bitwise.

FSDP2 reduce-scatters each unit's gradients (an ``FSDPModule``'s parameters) over the shard
group into one flat buffer, and hands it to the unit's all-reduce hook before it views the
parameters' gradients out of it: per parameter, in the unit's order, a block of
``ceil(rows / shards)`` rows of dim 0, zero-padded. The layout says which block is which
layer's, and refuses, with the reason, what the cross-replica exchange can't work with.
"""

from typing import List, NamedTuple, Tuple

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors
from torch.distributed.fsdp._fully_shard._fsdp_common import HSDPMeshInfo

__all__ = ["ShardLayout", "Unit"]


class Unit(NamedTuple):
    """One ``FSDPModule``'s reduce-scatter output: ``layers[k]``'s shard is the ``shapes[k]``
    block at ``offsets[k]``, ``numel`` entries in all."""

    module: FSDPModule
    param_group: object  # FSDP's ``FSDPParamGroup``, whose divide factor the hook reads
    layers: List[int]
    offsets: List[int]
    shapes: List[torch.Size]
    numel: int
    trainable: List[Tuple[str, torch.nn.Parameter, bool]]  # every parameter of the unit: name, itself, trainable

    def shards_of(self, flat):
        """The views of ``flat`` that hold each layer's padded shard. FSDP chooses the buffer's
        parameters at each step (the trainable ones), so a parameter frozen or unfrozen since the
        layout was read moves the offsets, or, where one of the same size changed the other way,
        gives one layer's place to another: either is refused here, naming the parameters, before
        anything is read."""
        changed = [f"{name!r} ({'unfrozen' if param.requires_grad else 'frozen'})"
                   for name, param, was in self.trainable if param.requires_grad != was]
        if changed or flat.numel() != self.numel:
            raise RuntimeError(f"a parameter's requires_grad changed after the AccordionState was built: "
                               f"{', '.join(changed) or 'none of this unit'}; FSDP reduce-scattered {flat.numel()} "
                               f"gradient entries for a unit whose trainable parameters' shards hold {self.numel}. "
                               f"Build the state again after freezing or unfreezing")
        return [flat[offset:offset + shape.numel()].view(shape) for offset, shape in zip(self.offsets, self.shapes)]

    def post_divide(self, flat):
        """The factor FSDP divides ``flat`` by after the hook: ``None`` where its reduce-scatter
        already averaged (fp32, bf16), the rest of the mean where it sums (an fp16 reduction,
        ``set_force_sum_reduction_for_comms``)."""
        group = self.param_group
        return _get_gradient_divide_factors(group.mesh_info.shard_process_group, None, flat.dtype, flat.device.type,
                                            group.gradient_divide_factor, group.force_sum_reduction_for_comms)[1]


class ShardLayout:
    """Args:
        model: a module whose trainable parameters are all managed by ``fully_shard`` units
            built on ``mesh``'s shard dimension.
        mesh: a 2-D ``DeviceMesh`` spanning the world, replicas × shards: the dimensions named
            ``"replicate"`` and ``"shard"``, or else the first and the second.

    Raises ``ValueError`` (``TypeError`` for a model without ``fully_shard``) naming what can't
    work: a mesh without a replicate dimension, a unit sharded over the 2-D mesh (native HSDP,
    whose own all-reduce would run uncompressed before any hook), a parameter sharded on another
    dim than 0, a custom gradient divide factor, a trainable parameter outside every unit.
    """

    def __init__(self, model, mesh):
        replicate_dim, shard_dim = _mesh_dims(mesh)
        shard_dim_name = (mesh.mesh_dim_names or (0, 1))[shard_dim]
        self.replicate_group = mesh.get_group(replicate_dim)
        self.shard_group = mesh.get_group(shard_dim)
        self.shards = mesh.size(shard_dim)
        self.replicas = mesh.size(replicate_dim)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names = [name for name, _ in named]
        layer_of = {p: layer for layer, (_, p) in enumerate(named)}
        name_of = {p: name for name, p in model.named_parameters()}
        self.shapes: List[torch.Size] = [None] * len(named)  # each layer's padded shard's
        self.layer_shapes = [tuple(p.shape) for _, p in named]  # the whole layers' (a DTensor's shape is global)
        self.shard_params = [None] * len(named)  # each layer's padded local shard, a view of FSDP's storage
        self.units: List[Unit] = []
        self._all_shards = []  # every parameter's local storage, frozen ones included
        self._buffers = list(model.buffers())
        shard_ranks = dist.get_process_group_ranks(self.shard_group)
        for module in (m for m in model.modules() if isinstance(m, FSDPModule)):
            groups = module._get_fsdp_state()._fsdp_param_groups
            if not groups:
                continue
            if len(groups) > 1:
                raise ValueError(f"{_name_of(model, module)} has parameters on several meshes (shard_placement_fn): "
                                 f"one all-reduce hook per unit can't tell them apart")
            group = groups[0]
            if isinstance(group.mesh_info, HSDPMeshInfo):
                raise ValueError(f"{_name_of(model, module)} is sharded over the 2-D mesh (native HSDP): FSDP then "
                                 f"all-reduces its gradients across replicas itself, uncompressed, before any hook. "
                                 f"Shard every unit on mesh[{shard_dim_name!r}] only: fully_shard(unit, "
                                 f"mesh=mesh[{shard_dim_name!r}])")
            if dist.get_process_group_ranks(group.mesh_info.shard_process_group) != shard_ranks:
                raise ValueError(f"{_name_of(model, module)} is sharded over ranks "
                                 f"{dist.get_process_group_ranks(group.mesh_info.shard_process_group)}, not over "
                                 f"this mesh's shard group {shard_ranks}: fully_shard(unit, mesh=mesh[{shard_dim_name!r}])")
            if group.gradient_divide_factor is not None:
                raise ValueError(f"{_name_of(model, module)} has a custom gradient divide factor "
                                 f"({group.gradient_divide_factor}): Accordion's error feedback and levels work on "
                                 f"the mean gradient; scale the loss instead")
            layers, offsets, shapes, offset = [], [], [], 0
            # FSDP reduce-scatters the trainable parameters only: a frozen one has no place in the buffer.
            for fsdp_param in (f for f in group.fsdp_params if f.sharded_param.requires_grad):
                layer = layer_of[fsdp_param.sharded_param]
                if fsdp_param.offload_to_cpu:
                    raise ValueError(f"{self.names[layer]!r} is offloaded to the CPU (CPUOffloadPolicy): Accordion "
                                     f"keeps its state beside the gradients' buffer, on the device")
                if fsdp_param.fsdp_placement.dim != 0:
                    raise ValueError(f"{self.names[layer]!r} is sharded on dim {fsdp_param.fsdp_placement.dim}: "
                                     f"PowerSGD takes each shard as a block of rows, so every parameter must be "
                                     f"sharded on dim 0 (the default shard_placement_fn)")
                shape = fsdp_param.padded_sharded_param_size
                layers.append(layer)
                offsets.append(offset)
                shapes.append(shape)
                self.shapes[layer] = shape
                self.shard_params[layer] = fsdp_param._sharded_param_data.view(shape)
                offset += shape.numel()
            trainable = [(name_of.get(f.sharded_param, "?"), f.sharded_param, f.sharded_param.requires_grad)
                         for f in group.fsdp_params]
            self.units.append(Unit(module, group, layers, offsets, shapes, offset, trainable))
            self._all_shards += [f._sharded_param_data for f in group.fsdp_params]
        if not self.units:
            raise TypeError("the model has no fully_shard unit: shard it first, fully_shard(block, "
                            f"mesh=mesh[{shard_dim_name!r}]) for each block, then fully_shard(model, mesh=mesh[{shard_dim_name!r}])")
        outside = [name for name, shape in zip(self.names, self.shapes) if shape is None]
        if outside:
            raise ValueError(f"trainable parameters outside every fully_shard unit: {outside}; nothing would average "
                             f"their gradients across replicas")

    def broadcast_from_first_replica(self):
        """Make every replica's shards, frozen ones included, its first replica's, and every
        rank's buffers the first rank's, as DDP does at construction (``fully_shard`` broadcasts
        nothing)."""
        source = dist.get_global_rank(self.replicate_group, 0)
        for shard in self._all_shards:
            dist.broadcast(shard, src=source, group=self.replicate_group)
        for buffer in self._buffers:
            dist.broadcast(buffer, src=0)

    def describe(self):
        """What a checkpoint must match: the mesh and every layer's name and padded shard shape."""
        return {"replicas": self.replicas, "shards": self.shards, "layers": [
            [name, list(shape)] for name, shape in zip(self.names, self.shapes)]}


def _mesh_dims(mesh):
    """The (replicate, shard) dimensions of ``mesh``, or a ``ValueError`` saying why it has none."""
    if getattr(mesh, "ndim", None) != 2:
        raise ValueError(f"the mesh must be 2-D, replicas × shards (init_device_mesh(device, (replicas, shards), "
                         f"mesh_dim_names=('replicate', 'shard'))), got {mesh!r}: without a replicate dimension there "
                         f"is no cross-replica all-reduce to compress (plain data parallelism: horovod_accordion.ddp)")
    names = tuple(mesh.mesh_dim_names or ())
    if mesh.size() != dist.get_world_size():
        raise ValueError(f"the mesh spans {mesh.size()} of the {dist.get_world_size()} ranks: Accordion agrees its "
                         f"levels over the world, so the mesh must span it")
    if {"replicate", "shard"} <= set(names):
        return names.index("replicate"), names.index("shard")
    return 0, 1


def _name_of(model, module):
    return next((f"the unit {name!r}" if name else "the root unit"
                 for name, m in model.named_modules() if m is module), "a unit outside the model")
