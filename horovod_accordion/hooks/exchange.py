"""What a torch.distributed hook's state builds over its parameters: DDP's communication hook
(``horovod_accordion.ddp``) and FSDP2's all-reduce hook (``horovod_accordion.fsdp``) run the same
exchange, schedule and step driver; only the parameters they hand over and the collectives differ.
"""


from horovod_accordion.core.schedule import Accordion
from horovod_accordion.core.arguments import check_real_floating, check_same_exchange_on_all_ranks
from horovod_accordion.core.exchange import BucketedExchange, check_epoch_windows, warn_end_epoch_before_any_step
from horovod_accordion.core.metrics import CommunicationLog
from horovod_accordion.core.reducers import make_reducer
from horovod_accordion.core.policies import policy_for
from horovod_accordion.core.steps import StepDriver, watched_lr
from horovod_accordion.torch_common.compression import PlainCompressor, compression_levels
from horovod_accordion.torch_common.loss_scale import LossScale
from horovod_accordion.torch_common.tensors import summary_writer

__all__ = ["HookStateViews", "build_exchange", "hook_loss_scale", "schedule_options"]


def schedule_options(compression, policy, **options):
    """``Accordion``'s keywords from a hook state's arguments: ``options`` as given, the policy
    built for ``compression``'s levels."""
    return dict(options, policy=policy_for(policy, compression_levels(compression)))


def hook_loss_scale(grad_scaler=None):
    """The loss scale a hook state reads ``grad_scaler``'s scale from, and how to give it one."""
    return LossScale(grad_scaler, "grad_scaler=scaler to AccordionState, or set state.grad_scaler")


def build_exchange(names, params, compression, schedule_options, collectives, *, sharding=None, loss_scale=None,
                   log=None, log_path=None, tensorboard_dir=None, layer_shapes=None):
    """The ``(BucketedExchange, StepDriver)`` that averages ``params`` (named ``names``) over
    ``collectives`` with ``compression``, on the schedule of ``schedule_options`` (``Accordion``'s
    keywords, the policy built). ``sharding``: the ``backends.Sharding`` where ``params`` are
    shards; ``log``: a ``CommunicationLog`` to keep (a state bound again), else a new one on this
    rank. A collective over every rank (the sharding's world, or ``collectives``): each checks that
    the others exchange the same tensors with the same compression and policy; its errors name the
    layers by ``layer_shapes`` (the whole layers', where ``params`` are shards), as users know them."""
    world = sharding.world if sharding is not None else collectives
    dtypes = [p.dtype for p in params]
    check_real_floating(names, dtypes, [p.is_floating_point() for p in params])
    check_same_exchange_on_all_ranks(world, names, layer_shapes or [p.shape for p in params], dtypes, compression,
                                     schedule_options["policy"])
    reducer, levels = make_reducer(compression, [p.shape for p in params], collectives.tensors, collectives,
                                   PlainCompressor)
    log = log or CommunicationLog.on_rank(world.rank(), log_path, tensorboard_dir, summary_writer)
    accordion = Accordion(names, levels, log=log, compressed_layers=reducer.compressed, **schedule_options)
    exchange = BucketedExchange(accordion, reducer, params, loss_scale, sharding=sharding)
    return exchange, StepDriver(exchange)


class HookStateViews:
    """What a hook's state says of its exchange, in the same words on DDP and FSDP. The state
    has ``_exchange`` (``None`` until a DDP state is bound), ``_steps`` (its step driver),
    ``_optimizer`` (or ``None``) and ``_bound()``, which returns the exchange or raises, saying
    why there is none."""

    @property
    def levels(self):
        """Each compressed layer's level now, by name; ``{}`` before the state is bound. A tensor
        (or shard) the compression leaves whole (1-D, or too small to gain) has no level."""
        return self._exchange.accordion.named_levels if self._exchange is not None else {}

    @property
    def bytes_sent_last_step(self):
        """The bytes this rank handed to the collectives in the last step (FSDP: across replicas); 0
        before the first."""
        sent = self._exchange.accordion.log.bytes_per_step if self._exchange is not None else []
        return sent[-1] if sent else 0

    @property
    def wire_bytes_sent_last_step(self):
        """The bytes that crossed this rank's link in the last step (``docs/concepts.md``, traffic
        accounting; FSDP: across replicas); 0 before the first."""
        sent = self._exchange.accordion.log.wire_bytes_per_step if self._exchange is not None else []
        return sent[-1] if sent else 0

    @property
    def kept_bytes(self):
        """The bytes of the state this rank keeps between steps: error-feedback memory, Q and Δ, of
        whole layers (DDP) or of this rank's shards (FSDP); 0 before the state is bound."""
        return self._exchange.kept_bytes() if self._exchange is not None else 0

    def observe_lr(self, lr):
        """Tell the detector the learning rate of the coming step (if no ``optimizer`` was given).
        It rides on the step's collectives and is agreed over ranks (``BucketedExchange.observe_lr``):
        call it on every rank, before each step."""
        if self._exchange is not None:
            self._steps.observe_lr(lr)
        else:
            self._lr_before_binding = lr

    def _observe_optimizer_lr(self):
        """At the step's first hook: the ``optimizer``'s rate, where the state was given one."""
        if self._optimizer is not None:
            self._steps.observe_lr(watched_lr(self._optimizer))

    def end_epoch(self):
        """Close an epoch-long detection window. Call it once per epoch, on every rank, after the
        epoch's steps (``BucketedExchange.end_epoch``: before the first, it warns and does nothing)."""
        if self._exchange is None:  # DDP's state before its first step binds it
            check_epoch_windows(self.window_steps)
            if not (getattr(self, "_saved", None) or {}).get("iter", 0):
                warn_end_epoch_before_any_step()
                return
        self._bound().end_epoch()

    def accordion_stats(self):
        """Bytes sent per step, every check's levels, ratios and norms, and the levels now."""
        return dict(self._bound().accordion.log.as_dict(), levels=self.levels)
