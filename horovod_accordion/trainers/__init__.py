"""The trainer adapters, on the DDP state: Lightning, Accelerate, Ray Train, and the glue they
share (``common.py``). Users import them as ``horovod_accordion.lightning``, ``.accelerate`` and
``.ray_train``.
"""
