"""The torch workers' model and data, without Horovod: the Horovod and the DDP checks share them."""
import torch


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 24), torch.nn.ReLU(), torch.nn.Linear(24, 4))


def batch_of_rank(rank, step, scale=1.0):
    """Different data on every rank, rank r's inputs (1 + 3r) times larger: the gradients
    differ, so averaging matters."""
    generator = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 20, generator=generator) * scale * (1 + 3 * rank)
    y = torch.randint(0, 4, (16,), generator=generator)
    return x, y
