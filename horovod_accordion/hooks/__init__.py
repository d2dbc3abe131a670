"""The torch.distributed backends, without Horovod: the DDP comm hook (``ddp_state.py``),
FSDP2's all-reduce hook (``fsdp_state.py``, ``fsdp_layout.py``), what both build their exchange
from (``exchange.py``) and their collectives (``ops.py``). Users import them as
``horovod_accordion.ddp`` and ``horovod_accordion.fsdp``.
"""
