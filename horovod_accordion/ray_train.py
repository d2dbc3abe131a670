"""Accordion in Ray Train: ``prepare_accordion`` and ``report`` in ``train_loop_per_worker`` (see ``trainers/ray_train.py``)."""
from horovod_accordion.trainers.ray_train import prepare_accordion, report

__all__ = ["prepare_accordion", "report"]
