"""A rank that ends its script while Gloo's worker still holds a collective's tensor: rank 1
joins the collective after rank 0's script has ended, so rank 0's worker finishes it, and frees
a tensor Python made, while rank 0 exits. Run with ``torchrun --nproc_per_node 2``, with ``hook``
(Accordion's DDP hook) or ``plain`` (DDP's own allreduce: only the import of horovod_accordion.ddp)."""
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from horovod_accordion.ddp import AccordionState, PowerSGD, accordion_hook

dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(4, 4))
if sys.argv[1] == "hook":
    model.register_comm_hook(AccordionState(compression=PowerSGD(1), model=model), accordion_hook)
dist.barrier()
if dist.get_rank() == 1:
    time.sleep(0.02)
dist.all_reduce(torch.ones(1000), async_op=True)
