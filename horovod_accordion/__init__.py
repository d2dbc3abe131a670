"""Accordion adaptive gradient compression for Horovod.

Framework adapters live in ``horovod_accordion.torch``, ``horovod_accordion.tensorflow``
and ``horovod_accordion.keras``; this top-level package imports no framework.
"""
from horovod_accordion import moved
from horovod_accordion.core.detector import RegimeDetector

moved.install()

__version__ = "0.2.0"
__all__ = ["RegimeDetector"]
