"""What the Horovod collectives of torch and TensorFlow share: a Horovod process set's rank and
size, and the cross-rank checks, over the framework's Horovod module (``horovod_module``) and
tensor constructor (``as_tensor``), which each backend names. Imports no framework."""

from horovod_accordion.core.collectives import Collectives

__all__ = ["HorovodProcessSetCollectives"]


class HorovodProcessSetCollectives(Collectives):
    """Args:
        tensors: the framework's tensor maths.
        process_set: the Horovod process set the collectives run in.
        gradient_predivide_factor: Horovod's: the average is split into a pre- and a post-scaling.
        name_prefix: Horovod matches collectives by name: see ``arguments.collective_prefix``.
    """

    horovod_module = None  # horovod.torch or horovod.tensorflow
    as_tensor = None  # torch.tensor or tf.constant

    def __init__(self, tensors, process_set, gradient_predivide_factor=1.0, name_prefix="accordion"):
        super().__init__(tensors)
        self.process_set = process_set
        self.gradient_predivide_factor = gradient_predivide_factor
        self.name_prefix = name_prefix

    def size(self):
        return self.process_set.size()

    def rank(self):
        return self.process_set.rank()

    def included(self):
        """Whether this process is in the set: Horovod lets a process build an optimizer for a set
        it is not in, whose collectives it then skips."""
        return self.process_set.included()

    def is_first_rank(self):
        """Whether this process writes the logs: the set's first rank (a non-member is not)."""
        return self.included() and self.rank() == 0

    # Their names are fixed, not this exchange's prefix: they run where the ranks may disagree on
    # the layer names that the prefix is made of. Eager, blocking.
    def broadcast_object(self, value):
        """The first rank of the process set's ``value``, on every rank."""
        root = self.process_set.ranks[0] if self.process_set.ranks else 0
        return self.horovod_module.broadcast_object(value, root_rank=root, process_set=self.process_set,
                                                    name="accordion.signature")

    def sum_over_ranks(self, count):
        total = self.horovod_module.allreduce(self.as_tensor([count]), op=self.horovod_module.Sum,
                                              name="accordion.signature.check", process_set=self.process_set)
        return int(total.numpy()[0])
