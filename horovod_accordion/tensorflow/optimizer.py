"""``DistributedOptimizer`` for tf_keras optimizers: ``fit`` and custom loops alike.

With a plain compressor it is ``horovod.tensorflow.keras.DistributedOptimizer``. With
PowerSGD or TopK it subclasses the user's optimizer class (as Horovod does) and
averages the gradients in ``apply_gradients`` through an ``AccordionState``, created
on the first call, eagerly, once the variables are known.
"""

import warnings

import tensorflow as tf
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras

from horovod_accordion.arguments import under_elastic
from horovod_accordion.compression import PowerSGD, TopK
from horovod_accordion.tensorflow.state import AccordionState

__all__ = ["DistributedOptimizer", "load_model", "tensorflow_distributed_optimizer"]


class _AccordionOptimizer:
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads, variables = zip(*list(grads_and_vars))
        state = self.accordion_state_for(variables)
        if state.backward_passes_per_step > 1:
            # As Horovod: sum locally, and exchange and apply on every n-th call only.
            _build_weights(self, variables)
            state.add_micro_batch(grads)

            def apply_aggregated():
                averaged = state.reduce_pending()
                super(self.__class__, self).apply_gradients(zip(averaged, variables), *args, **kwargs)
                return tf.constant(True)

            return tf.cond(state.count_backward_pass(), apply_aggregated, lambda: tf.constant(False))
        if state.batch_switch is None:
            grads = state.reduce(list(grads))
            return super(self.__class__, self).apply_gradients(zip(grads, variables), *args, **kwargs)
        # Batch switching: accumulate every micro-batch; communicate and apply only when
        # begin_micro_batch decided this one completes the step (identically on every rank).
        if not state.micro_batches_driven:
            raise RuntimeError(
                "batch_switch decides before each micro-batch whether it completes a step, and nothing did: "
                "add horovod_accordion.keras.AccordionCallback() to fit()'s callbacks. In a custom loop, "
                "create the state with optimizer.accordion_state_for(variables) and call its "
                "begin_micro_batch(lr) before, and end_micro_batch() after, every micro-batch.")
        _build_weights(self, variables)
        learning_rate = _learning_rate_variable(self)
        state.add_micro_batch(grads)

        def apply_large_batch():
            averaged = state.reduce_pending()
            base = tf.identity(learning_rate)
            learning_rate.assign(base * state.lr_factor)  # for this step only
            super(self.__class__, self).apply_gradients(zip(averaged, variables), *args, **kwargs)
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
                    self._accordion_state.load_snapshot(self._accordion_restore)
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
        """The native ``.keras`` format: the optimizer's variables, and Accordion's beside them."""
        super(self.__class__, self).save_own_variables(store)
        if self._accordion_state is not None:
            for k, value in enumerate(self._accordion_state.snapshot()):
                store[f"accordion_{k}"] = value

    def load_own_variables(self, store):
        ours = sorted((key for key in store.keys() if key.startswith("accordion_")), key=lambda k: int(k[10:]))
        super(self.__class__, self).load_own_variables(
            {key: store[key] for key in store.keys() if not key.startswith("accordion_")})
        # Applied when the state is created, at the first step.
        self._accordion_restore = [_stored_value(store[key]) for key in ours] or None

    @property
    def accordion_state(self):
        """The ``AccordionState``, or ``None`` before the first step."""
        return self._accordion_state


def _warn_if_no_window_can_close(state):
    """At the first step, rather than after the run: with no ``AccordionCallback`` in ``fit``
    and no ``window_steps``, nothing closes a window unless the loop calls ``end_epoch()``."""
    if state.adaptive and state.window_steps is None:
        warnings.warn(
            "this optimizer's first step runs without horovod_accordion.keras.AccordionCallback, and "
            "window_steps is None: unless your loop calls optimizer.accordion_state.end_epoch() every epoch, "
            "no detection window closes and every layer stays at ℓ_low. Add AccordionCallback() to fit()'s "
            "callbacks, or pass window_steps=N", RuntimeWarning)


def _stored_value(entry):
    """A value read back from a ``.keras`` file (an h5py dataset) while the file is open."""
    return entry[()] if hasattr(entry, "shape") else entry


def _build_weights(optimizer, variables):
    """Create the slots and hyper-parameters outside the tf.cond that applies the step."""
    if hasattr(optimizer, "_create_all_weights"):  # tf_keras legacy optimizers
        optimizer._create_all_weights(variables)
    else:
        optimizer.build(variables)


def _learning_rate_variable(optimizer):
    learning_rate = optimizer.learning_rate
    if not isinstance(learning_rate, tf.Variable):
        raise ValueError(
            "batch_switch scales the learning rate of each step in the graph, so it needs the learning "
            "rate as a variable: pass a float learning rate (change it with LearningRateScheduler), "
            "not a LearningRateSchedule")
    return learning_rate


def _require_keras2(optimizer):
    import tf_keras
    bases = (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, bases):
        raise ValueError(
            f"{type(optimizer).__module__}.{type(optimizer).__name__} is not a tf_keras (Keras 2) optimizer. "
            f"Horovod's Keras integration, and Accordion's, need Keras 2: Keras 3 breaks it (horovod#4290). "
            f"Set TF_USE_LEGACY_KERAS=1 before importing TensorFlow, pip install tf-keras, and build the "
            f"model and optimizer with tf.keras (or tf_keras).")


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=hvd.Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=hvd.Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=hvd.global_process_set, scale_local_gradients=True, *,
                         eta=0.5, interval=10, window_steps=None, per_layer=True, lr_decay_factor=2.0,
                         delta_windows=1, check_norm="local", verify_levels=None, log_path=None,
                         tensorboard_dir=None, batch_switch=None):
    """Wrap a tf_keras ``optimizer`` so that ``apply_gradients`` averages over ranks.

    The arguments up to ``scale_local_gradients`` are Horovod's, with its defaults.
    Accordion's (``eta`` … ``log_path``) are those of ``AccordionState``; add
    ``horovod_accordion.keras.AccordionCallback`` to ``fit`` so that epochs close the
    detection windows and learning-rate decays reach the detector. With ``batch_switch``
    (a ``BatchSwitch``), Accordion switches between 1 and m micro-batches (``fit`` batches)
    per communication instead of the compression level; ``compression`` stays fixed.
    With ``Compression.none`` or ``fp16`` and neither ``log_path`` nor ``tensorboard_dir``,
    this is Horovod's own optimizer; with either, Accordion's, which records the traffic.
    Accordion's has no ``device_dense``, ``device_sparse``, ``num_groups``, ``groups`` or
    ``scale_local_gradients``: set away from Horovod's defaults, they raise a ``ValueError``;
    sparse gradients need ``sparse_as_dense=True``.
    """
    _require_keras2(optimizer)
    # Plain none or fp16 is Horovod's own optimizer, unless a traffic record is asked for: then
    # it runs through Accordion's exchange, so that a baseline logs as the compressed runs do.
    records = log_path is not None or tensorboard_dir is not None
    if batch_switch is None and not isinstance(compression, (PowerSGD, TopK)) and not records:
        return hvd_keras.DistributedOptimizer(
            optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    horovod_only = [f"{name}={value!r}" for name, value, default in (
        ("device_dense", device_dense, ''), ("device_sparse", device_sparse, ''), ("num_groups", num_groups, 0),
        ("groups", groups, None), ("scale_local_gradients", scale_local_gradients, True)) if value != default]
    if horovod_only:
        instead = "" if isinstance(compression, (PowerSGD, TopK)) or batch_switch is not None else \
            ", or drop log_path and tensorboard_dir to get Horovod's own optimizer"
        raise ValueError(f"Accordion's Keras optimizer does not take {', '.join(horovod_only)}: leave them at "
                         f"Horovod's defaults{instead}")
    options = dict(compression=compression, op=op, gradient_predivide_factor=gradient_predivide_factor,
                   sparse_as_dense=sparse_as_dense, process_set=process_set, eta=eta, interval=interval,
                   window_steps=window_steps, per_layer=per_layer, lr_decay_factor=lr_decay_factor,
                   delta_windows=delta_windows, check_norm=check_norm, verify_levels=verify_levels,
                   tensorboard_dir=tensorboard_dir,
                   log_path=log_path, batch_switch=batch_switch, backward_passes_per_step=backward_passes_per_step,
                   average_aggregated_gradients=average_aggregated_gradients)
    methods = {k: v for k, v in _AccordionOptimizer.__dict__.items() if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._accordion_options = options
    wrapped._accordion_state = None
    return wrapped


def tensorflow_distributed_optimizer(optimizer, name=None, use_locking=False, device_dense='', device_sparse='',
                                     compression=hvd.Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                                     op=hvd.Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                                     num_groups=0, groups=None, process_set=hvd.global_process_set,
                                     scale_local_gradients=True, **accordion_options):
    """``horovod.tensorflow.DistributedOptimizer``, with its arguments and defaults, exported as
    ``horovod_accordion.tensorflow.DistributedOptimizer``: a tf_keras optimizer gets
    :func:`DistributedOptimizer` (Accordion's keyword arguments included), and a
    ``tf.compat.v1.train.Optimizer`` gets Horovod's own, whose compressors are the plain ones:
    PowerSGD and TopK keep state across steps, which Accordion keeps in the tape
    (``DistributedGradientTape(accordion=...)``) or in a tf_keras optimizer.
    ``use_locking`` is passed to Horovod's v1 optimizer; Keras optimizers have no such option."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if isinstance(compression, (PowerSGD, TopK)) or accordion_options:
            raise ValueError(
                f"a tf.compat.v1 optimizer takes Horovod's plain compressions only (none, fp16), without "
                f"Accordion's options{' ' + str(sorted(accordion_options)) if accordion_options else ''}: for "
                f"PowerSGD, TopK or Accordion, use a tf_keras optimizer or DistributedGradientTape(accordion=...)")
        return hvd.DistributedOptimizer(
            optimizer, name=name, use_locking=use_locking, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            backward_passes_per_step=backward_passes_per_step, op=op,
            gradient_predivide_factor=gradient_predivide_factor,
            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    return DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse, compression=compression,
        sparse_as_dense=sparse_as_dense, gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step, average_aggregated_gradients=average_aggregated_gradients,
        num_groups=num_groups, groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
        **accordion_options)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=hvd.Compression.none,
               legacy_opts=False, **accordion_options):
    """``horovod.tensorflow.keras.load_model`` with Accordion's optimizer: load a tf_keras model
    saved with its optimizer, and wrap that optimizer in :func:`DistributedOptimizer` with
    ``compression`` and Accordion's keyword arguments (``eta``, ``interval``, ...).

    The model's weights and the optimizer's slots come back. So does Accordion's state from a
    native ``.keras`` file, where the optimizer saves it beside its own variables: training
    continues exactly. An ``.h5`` file has no room for it, so there the levels restart at
    ℓ_low until the first check.
    """
    import tf_keras
    base = tf_keras.optimizers.legacy.Optimizer if legacy_opts else tf_keras.optimizers.Optimizer

    def wrap(cls):
        """What Keras deserializes the optimizer with: anything with a ``from_config``."""
        def from_config(config, custom_objects=None):
            return DistributedOptimizer(cls.from_config(config), compression=compression, **accordion_options)
        return type(cls.__name__, (), {"from_config": staticmethod(from_config)})

    # h5 files name a built-in optimizer in lower case, .keras files by its class name.
    objects = {name: wrap(cls) for cls in base.__subclasses__() for name in (cls.__name__, cls.__name__.lower())}
    objects.update({cls.__name__: wrap(cls) for cls in custom_optimizers or ()})
    objects.update(custom_objects or {})
    return tf_keras.models.load_model(filepath, custom_objects=objects)
