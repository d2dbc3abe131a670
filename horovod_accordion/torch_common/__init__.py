"""The torch pieces that every torch backend shares, Horovod's (``torch/``) and
torch.distributed's (``hooks/``): the reducers' tensor maths and state, the ``Compression``
kinds, the loss-scale hand-off. Imports torch and the core, never Horovod.
"""
