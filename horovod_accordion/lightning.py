"""Accordion in Lightning: ``AccordionCallback(state)`` beside the DDP strategy (see ``trainers/lightning.py``)."""
from horovod_accordion.trainers.lightning import AccordionCallback

__all__ = ["AccordionCallback"]
