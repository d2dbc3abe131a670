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


class Float64State:
    """Mixed into torch tensor ops: the reducer's maths and state in fp64, so that a comparison
    with numpy or with the TF reducer holds far above rounding on any CPU."""

    def state(self, array, name):
        return torch.from_numpy(array).to(torch.float64)

    def as_matrix(self, grad, shape):
        return grad.reshape(shape).to(torch.float64)
