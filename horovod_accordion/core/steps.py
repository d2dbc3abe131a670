"""What happens around each optimizer step, besides the maths, for every adapter: the
learning rate the schedule sees before the step's first collective, the micro-batches that a
batch switch groups into one step, and the factor on that step's learning rate.

The torch optimizer, the DDP state and the TF state each drive one ``StepDriver``. They read
the learning rate from their own framework and apply the factor to it; the driver decides.
Counting a micro-batch is idempotent until the next one begins, so an explicit
``synchronize()`` followed by ``step()`` counts it once, as ``step()`` alone does.
"""

from horovod_accordion.core.batch import MicroBatchCounter
from horovod_accordion.core.collectives import Traffic

__all__ = ["StepDriver", "watched_lr"]


def watched_lr(optimizer):
    """The learning rate the decay rule watches: a torch optimizer's first parameter group's,
    where LR schedulers set it."""
    return optimizer.param_groups[0]["lr"]


class StepDriver:
    """Args:
        exchange: the ``horovod_accordion.core.exchange.BucketedExchange`` that runs the steps.
        batch_switch: a ``horovod_accordion.core.batch.BatchSwitch``, or ``None``.
        backward_passes_per_step: the micro-batches of every step without a batch switch.
    """

    def __init__(self, exchange, batch_switch=None, backward_passes_per_step=1):
        self.exchange = exchange
        self.backward_passes_per_step = backward_passes_per_step
        self.micro_batches = MicroBatchCounter(batch_switch) if batch_switch is not None else None
        self._counted = None  # whether this micro-batch completes its step, once counted
        self.completed = None  # the step the last counted micro-batch completed: its record and divisor
        self.lr_factor = 1.0  # the factor on the learning rate of the step being applied

    @property
    def switches_batch(self):
        return self.micro_batches is not None

    @property
    def micro_batches_per_step(self):
        """How many micro-batches make one communication now: Accordion's level with a batch switch."""
        return self.exchange.accordion.levels[0] if self.switches_batch else 1

    @property
    def pending_micro_batches(self):
        """The micro-batches of a large batch in progress (0 between large batches)."""
        return self.micro_batches.pending if self.switches_batch else 0

    @property
    def held_micro_batches(self):
        """Of the pending micro-batches, those whose gradients this rank holds; ``None`` without
        a batch switch."""
        return self.micro_batches.held if self.switches_batch else None

    def observe_lr(self, lr):
        """The learning rate of the coming step; a decay event puts every layer at ℓ_low. The
        exchange ignores it once the step's first bucket has started."""
        self.exchange.observe_lr(lr)

    def count_micro_batch(self, lr):
        """Observe ``lr`` and count this micro-batch, once however often it is asked; whether it
        completes a step. Observed first, so that a decay switches to the small batch at once."""
        if self._counted is None:
            self.observe_lr(lr)
            self._counted = self.micro_batches.add(self.micro_batches_per_step)
            if self._counted:
                held = self.micro_batches.held
                record = self.micro_batches.complete_step()
                # A single micro-batch is not divided, which would copy every gradient for nothing.
                self.completed = {"record": record, "divisor": held if held > 1 else None}
                self.lr_factor = record["lr_factor"]
        return self._counted

    def new_micro_batch(self):
        """A new micro-batch begins: the next count is its own."""
        self._counted = None

    @property
    def divisor(self):
        """What the gradients of the step now exchanged are divided by: the micro-batches of its
        large batch that this rank holds, or ``None``."""
        return self.completed["divisor"] if self.completed else None

    def end_steps(self, count=1):
        """Count ``count`` steps run since the last call (a TF graph runs several between two eager
        calls), the last of them the one just completed, and log the bytes that the collectives
        counted with the last one, and its batch."""
        completed, self.completed = self.completed, None
        traffic = self.exchange.collectives.take_traffic()
        for k in range(count):
            last = k == count - 1
            record = completed["record"] if last and completed else None
            micro_batches = record["micro_batches"] if record else self.backward_passes_per_step
            self.exchange.end_step(micro_batches, record, traffic=traffic if last else Traffic())

    def reset(self):
        """After a restore or a failed step: no micro-batch is counted, and no step is in
        progress (``BucketedExchange.abandon_step``)."""
        self._counted, self.completed = None, None
        self.exchange.abandon_step()

    def state_dict(self):
        """A large batch in progress, and where the LR warm-up stands; ``None`` without a batch switch."""
        return self.micro_batches.state_dict() if self.switches_batch else None

    def check_compatible(self, state):
        """Raise a ``ValueError`` if ``state`` (a ``state_dict()``) was saved with a batch switch
        and this driver has none, or the reverse."""
        if (state is None) == self.switches_batch:
            raise ValueError("the checkpoint was saved with batch_switch and this optimizer has none, or the reverse")

    def load_state_dict(self, state, held=None):
        """``held``: how many of the saved pending micro-batches this rank holds the gradients of
        (``None``: all)."""
        self.check_compatible(state)
        if state is not None:
            self.micro_batches.load_state_dict(state, held=held)
        self.reset()
