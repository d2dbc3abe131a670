"""TensorBoard scalars through ``tf.summary``, with the ``add_scalar``/``flush`` interface of
torch's ``SummaryWriter`` that ``CommunicationLog`` writes to."""

import tensorflow as tf

__all__ = ["SummaryScalars"]


class SummaryScalars:
    def __init__(self, logdir):
        self.writer = tf.summary.create_file_writer(logdir)

    def add_scalar(self, tag, value, step):
        with self.writer.as_default():
            tf.summary.scalar(tag, value, step=step)

    def flush(self):
        self.writer.flush()
