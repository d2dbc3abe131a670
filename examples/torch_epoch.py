"""One training epoch of the torch examples, whatever wraps the model or the optimizer."""
import torch


def train_epoch(model, optimizer, x_train, y_train, batch_size, epoch):
    """Shuffled mini-batches (the same order on every rank); returns the losses."""
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
    losses = []
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
