"""Accordion's optimizer wrapper, whichever Keras the optimizer comes from: tf_keras
(``horovod_accordion.keras``) or Keras 3 (``horovod_accordion.keras3``).

As Horovod does, the wrapper subclasses the user's optimizer class. Each adapter adds the one
method its Keras hands the gradients to (tf_keras's ``apply_gradients``, Keras 3's ``apply``),
which calls ``accordion_apply``; the ``AccordionState`` is created on the first call, eagerly,
once the variables are known.
"""

import json
import warnings

import numpy as np
import tensorflow as tf

from horovod_accordion.core.arguments import under_elastic
from horovod_accordion.core.policies import policy_for
from horovod_accordion.tensorflow.compression import check_traceable
from horovod_accordion.tensorflow.state import AccordionState

__all__ = ["AccordionOptimizer", "accordion_keras_optimizer", "build_weights", "deserializers"]


class AccordionOptimizer:
    def accordion_apply(self, grads, variables, apply):
        """Average ``grads`` over the ranks and give them to ``apply``, the user optimizer's own
        method, on the calls that complete a step."""
        state = self.accordion_state_for(variables)
        if state.backward_passes_per_step > 1:
            # As Horovod: sum locally, and exchange and apply on every n-th call only.
            build_weights(self, variables)
            state.add_micro_batch(grads)

            def apply_aggregated():
                apply(state.reduce_pending())
                return tf.constant(True)

            return tf.cond(state.count_backward_pass(), apply_aggregated, lambda: tf.constant(False))
        if state.batch_switch is None:
            return apply(state.reduce(list(grads)))
        # Batch switching: accumulate every micro-batch; communicate and apply only when
        # begin_micro_batch decided this one completes the step (identically on every rank).
        if not state.micro_batches_driven:
            raise RuntimeError(
                "batch_switch decides before each micro-batch whether it completes a step, and nothing did: "
                "add AccordionCallback() to fit()'s callbacks. In a custom loop, create the state with "
                "optimizer.accordion_state_for(variables) and call its begin_micro_batch(lr) before, and "
                "end_micro_batch() after, every micro-batch.")
        build_weights(self, variables)
        learning_rate = _learning_rate_variable(self)
        state.add_micro_batch(grads)

        def apply_large_batch():
            averaged = state.reduce_pending()
            base = tf.identity(learning_rate)
            learning_rate.assign(base * state.lr_factor)  # for this step only
            apply(averaged)
            learning_rate.assign(base)
            return tf.constant(True)

        return tf.cond(state.apply_now, apply_large_batch, lambda: tf.constant(False))

    def accordion_state_for(self, variables):
        """The ``AccordionState`` of ``variables``, created on first use, eagerly."""
        if self._accordion_state is None:
            with tf.init_scope():
                self._accordion_state = AccordionState(variables, **self._accordion_options)
            if getattr(self, "_accordion_callback", None) is None:
                _warn_if_no_window_can_close(self._accordion_state)
            # A checkpoint of the optimizer (or of the model with it) then carries the state,
            # and a restore made before this first step is applied now (deferred restoration).
            self._track_trackable(self._accordion_state, name="accordion_state")
            if getattr(self, "_accordion_restore", None) is not None:
                with tf.init_scope():
                    self._accordion_state.load_snapshot(*self._accordion_restore)
                self._accordion_restore = None
            # If only the root rank restored a checkpoint, the ranks would start this first step
            # with different levels: share them now, as BroadcastGlobalVariablesCallback does
            # for the weights (after this step).
            # Under hvd.elastic, KerasState.sync does it, on every rank at once.
            process_set = self._accordion_options["process_set"]
            if not under_elastic():
                with tf.init_scope():
                    self._accordion_state.broadcast_shared_state(process_set.ranks[0] if process_set.ranks else 0)
        self._accordion_state.check_variables(variables)
        return self._accordion_state

    def save_own_variables(self, store):
        """The native ``.keras`` format: the optimizer's variables, and Accordion's beside them.
        Keras 3 stores numbers only: the detector's JSON goes as its UTF-8 bytes."""
        super().save_own_variables(store)
        # Loaded but not yet applied (no step since): saved as it was loaded, not dropped.
        if self._accordion_state is not None:
            values, names = self._accordion_state.snapshot(), self._accordion_state.snapshot_names()
        else:
            values, names = self._accordion_restore or (None, None)
        if values is not None:
            if names is not None:  # so that a load checks them: the values are by position
                store["accordion_names_utf8"] = np.frombuffer(json.dumps(names).encode(), np.uint8)
            for k, value in enumerate(values):
                if isinstance(value, bytes):
                    store[f"accordion_{k}_utf8"] = np.frombuffer(value, np.uint8)
                else:
                    store[f"accordion_{k}"] = value

    def load_own_variables(self, store):
        ours = sorted((key for key in store.keys() if key.startswith("accordion_") and key.split("_")[1].isdigit()),
                      key=lambda key: int(key.split("_")[1]))
        super().load_own_variables({key: store[key] for key in store.keys() if not key.startswith("accordion_")})
        values = [_stored_value(store[key], key.endswith("_utf8")) for key in ours] or None
        names = json.loads(_stored_value(store["accordion_names_utf8"], True)) \
            if "accordion_names_utf8" in store.keys() else None  # files saved before names were kept
        if self._accordion_state is not None and values is not None:
            self._accordion_state.load_snapshot(values, names)
        else:  # applied when the state is created, at the first step
            self._accordion_restore = None if values is None else (values, names)

    @property
    def accordion_state(self):
        """The ``AccordionState``, or ``None`` before the first step."""
        return self._accordion_state


def accordion_keras_optimizer(adapter, optimizer, name, device_dense, device_sparse, num_groups, groups,
                              scale_local_gradients, instead="", **options):
    """A copy of ``optimizer`` whose class is its own under ``adapter`` (a subclass of
    ``AccordionOptimizer``), with ``options`` for its ``AccordionState``: the arguments of a
    ``DistributedOptimizer`` with Horovod's signature. Horovod's arguments that Accordion's
    exchange has no use for must keep Horovod's defaults, rather than be dropped."""
    horovod_only = [f"{key}={value!r}" for key, value, default in (
        ("device_dense", device_dense, ''), ("device_sparse", device_sparse, ''), ("num_groups", num_groups, 0),
        ("groups", groups, None), ("scale_local_gradients", scale_local_gradients, True)) if value != default]
    if horovod_only:
        raise ValueError(f"Accordion's Keras optimizer does not take {', '.join(horovod_only)}: leave them at "
                         f"Horovod's defaults{instead}")
    if isinstance(optimizer, AccordionOptimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer: wrap the plain one once")
    # Here, not at the first step where the state is built: a bad policy is the caller's mistake.
    check_traceable(options["compression"])
    policy_for(options["policy"], getattr(options["compression"], "levels", (None,)),
               batch_switch=options["batch_switch"] is not None)
    cls = type(optimizer.__class__.__name__, (adapter, optimizer.__class__), {"__module__": adapter.__module__})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._accordion_options = options
    wrapped._accordion_state = None
    return wrapped


def deserializers(optimizer_classes, distributed_optimizer, compression, accordion_options):
    """``custom_objects`` for a Keras ``load_model``: each optimizer class, by its name (and, as
    tf_keras's ``.h5`` files write built-in ones, in lower case), deserialized wrapped."""
    def wrap(cls):
        def from_config(config, custom_objects=None):
            return distributed_optimizer(cls.from_config(config), compression=compression, **accordion_options)
        return type(cls.__name__, (), {"from_config": staticmethod(from_config)})

    return {name: wrap(cls) for cls in optimizer_classes for name in (cls.__name__, cls.__name__.lower())}


def _warn_if_no_window_can_close(state):
    """At the first step, rather than after the run: with no ``AccordionCallback`` in ``fit``
    and no ``window_steps``, nothing closes a window unless the loop calls ``end_epoch()``."""
    if state.adaptive and state.window_steps is None:
        warnings.warn(
            "this optimizer's first step runs without AccordionCallback, and window_steps is None: unless your "
            "loop calls optimizer.accordion_state.end_epoch() every epoch, no detection window closes and every "
            "layer stays at ℓ_low. Add AccordionCallback() to fit()'s callbacks, or pass window_steps=N",
            RuntimeWarning)


def _stored_value(entry, utf8):
    """A value read back from a ``.keras`` file (an h5py dataset) while the file is open."""
    value = entry[()] if hasattr(entry, "shape") else entry
    return np.asarray(value, np.uint8).tobytes() if utf8 else value


def build_weights(optimizer, variables):
    """Create the slots and hyper-parameters outside the tf.cond that applies the step."""
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras legacy optimizers
        optimizer._create_all_weights(variables)
    elif not getattr(optimizer, "built", False):  # Keras 3 builds once; tf_keras checks for itself
        optimizer.build(variables)


def _learning_rate_variable(optimizer):
    learning_rate = optimizer.learning_rate
    if not hasattr(learning_rate, "assign"):
        raise ValueError(
            "batch_switch scales the learning rate of each step in the graph, so it needs the learning "
            "rate as a variable: pass a float learning rate (change it with LearningRateScheduler), "
            "not a LearningRateSchedule")
    return learning_rate
