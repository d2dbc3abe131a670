"""Accordion in Hugging Face Accelerate: ``register_accordion`` after ``accelerator.prepare`` (see ``trainers/accelerate.py``)."""
from horovod_accordion.trainers.accelerate import register_accordion

__all__ = ["register_accordion"]
