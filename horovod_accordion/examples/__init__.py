"""The trainer examples, shipped in the wheel so that the docs' commands run without a clone.

Each trains the demo's MLP on the demo's synthetic clusters (no download, no extra package)
through one trainer, with every compression of ``--compression``::

    torchrun --nproc_per_node 2 -m horovod_accordion.examples.lightning     # pip install '...[trainers]'
    accelerate launch --multi_gpu --num_processes 2 -m horovod_accordion.examples.accelerate
    python -m horovod_accordion.examples.ray_train

``python -m horovod_accordion.examples.demo`` is the Horovod one (``--framework tensorflow`` for Keras).
"""
