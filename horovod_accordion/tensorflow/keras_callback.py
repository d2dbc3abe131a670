"""``AccordionCallback``'s work, whichever Keras runs ``fit``: each adapter's callback is this
mixin on its Keras's ``Callback``, with that Keras's ``schedule_type``."""

import warnings

import tensorflow as tf

__all__ = ["AccordionCallbackMixin"]


class AccordionCallbackMixin:
    """Feeds the learning rate to the detector before each batch, records each step's
    traffic after it, and closes the detection window at each epoch end.

    Put it after any callback that sets the learning rate (``LearningRateScheduler``,
    Horovod's ``LearningRateWarmupCallback``); it works beside
    ``BroadcastGlobalVariablesCallback`` and ``MetricAverageCallback``. With
    ``tensorboard_dir``, rank 0 writes Accordion's scalars there (bytes per step, each
    layer's level and ratio per check), beside Keras's own ``TensorBoard`` callback.
    """

    def __init__(self, optimizer=None, tensorboard_dir=None):
        super().__init__()
        self._optimizer = optimizer
        self._tensorboard_dir = tensorboard_dir

    @property
    def state(self):
        optimizer = self._optimizer or self.model.optimizer
        return getattr(optimizer, "accordion_state", None)

    def on_train_begin(self, logs=None):
        optimizer = self._optimizer or self.model.optimizer
        optimizer._accordion_callback = self  # windows will close: no warning at the first step
        if getattr(self.model, "jit_compile", False) and hasattr(optimizer, "accordion_state_for"):
            # Keras 3 compiles with XLA by default where there is a GPU ("auto"): the traced step
            # would fail at Accordion's Horovod ops, which XLA does not compile.
            warnings.warn("Accordion's step runs Horovod ops that XLA does not compile: this fit() runs with "
                          "jit_compile=False (compile the model with jit_compile=False to say so)", RuntimeWarning)
            self.model.jit_compile = False
            self.model.make_train_function(force=True)
        if getattr(optimizer, "_accordion_options", {}).get("batch_switch") is None:
            return
        executions = _steps_per_execution(self.model)
        if executions > 1:
            # The batch callbacks, which count the micro-batches and set each one's scales, run once
            # per execution: the micro-batches between them would be scaled as the first.
            raise ValueError(f"batch_switch counts each micro-batch in fit()'s batch callbacks, which run once per "
                             f"{executions} batches with steps_per_execution={executions}: compile the model with "
                             f"steps_per_execution=1")
        # Batch switching counts every micro-batch, the first included: create the state now.
        if not self.model.built:
            raise ValueError("batch_switch needs the model built before fit(): give the first layer an "
                             "input_shape, or call model.build()")
        optimizer.accordion_state_for(self.model.trainable_variables)

    def current_lr(self):
        optimizer = self._optimizer or self.model.optimizer
        schedule_type = self.schedule_type
        # The new optimizers' learning_rate is the rate of the *last* step when it comes from
        # a schedule; the schedule itself gives the rate of the step about to run.
        lr = getattr(optimizer, "_learning_rate", None)
        if not isinstance(lr, schedule_type):
            lr = optimizer.learning_rate
        if isinstance(lr, schedule_type):
            lr = lr(optimizer.iterations)
        return float(tf.convert_to_tensor(lr).numpy())

    def on_train_batch_begin(self, batch, logs=None):
        state = self.state
        if state is None:  # created by the first apply_gradients
            return
        if state.batch_switch is not None:
            state.begin_micro_batch(self.current_lr())
        else:
            state.observe_lr(self.current_lr())

    def on_train_batch_end(self, batch, logs=None):
        state = self.state
        if state is None:
            return
        if self._tensorboard_dir is not None:  # the state exists once the first batch has run
            state.write_tensorboard(self._tensorboard_dir)
            self._tensorboard_dir = None
        if state.batch_switch is not None:
            state.end_micro_batch()
        else:
            state.step_end()

    def on_epoch_end(self, epoch, logs=None):
        state = self.state
        if state is None:
            return
        if state.window_steps is None:
            state.end_epoch()


def _steps_per_execution(model):
    """The model's ``steps_per_execution``: Keras 3's attribute, or tf_keras's variable."""
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)
    return 1 if value is None else int(value.numpy() if hasattr(value, "numpy") else value)
