"""Models the advisor knows by a short name, with their input shape and batch size."""

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["KNOWN", "resnet18_cifar"]


class _BasicBlock(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet18_cifar(classes=10):
    """The CIFAR ResNet-18 (3×3 stem, no max-pool) that ``benchmarks/speed.py`` times: 11.17 M parameters."""
    torch.manual_seed(0)
    layers, width = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()], 64
    for outputs, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_BasicBlock(width, outputs, stride), _BasicBlock(outputs, outputs, 1)]
        width = outputs
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


# name -> (factory, input shape of one sample, batch per rank): the benchmarks' settings.
KNOWN = {"resnet18-cifar": (resnet18_cifar, (3, 32, 32), 16)}
