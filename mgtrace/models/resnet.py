"""ResNet-18 (He et al. 2015) with torchvision's module names.

``resnet18().state_dict()`` has exactly the keys, shapes, dtypes and order of
``torchvision.models.resnet18().state_dict()`` (``conv1.weight``,
``bn1.running_mean``, ``layer1.0.conv1.weight``, ..., ``fc.bias``), so a
torchvision checkpoint loads with no renaming::

    import torch, mgtrace.models as models
    net = models.resnet18()
    net.load_state_dict({k: v.numpy() for k, v in torch_net.state_dict().items()})

Only the computation of mgtrace's builtin modules is used, so a tracer sees
Conv2d, BatchNorm2d, ReLU, MaxPool2d and Linear leaves plus ``add``,
``adaptive_avg_pool2d`` and ``flatten``.

>>> import mgtrace as mt, numpy as np, mgtrace.models as models
>>> net = models.resnet18(num_classes=10).eval()
>>> list(net.state_dict())[:3]
['conv1.weight', 'bn1.weight', 'bn1.bias']
>>> net(mt.tensor(np.zeros((1, 3, 32, 32), np.float32))).shape
(1, 10)
"""
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.module import init

__all__ = ["BasicBlock", "ResNet", "resnet18"]


def _conv3x3(in_planes, out_planes, stride=1):
    return M.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes, out_planes, stride=1):
    return M.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(M.Module):
    """Two 3x3 conv + batch-norm layers and a shortcut (torchvision's BasicBlock).

    Args:
        inplanes: input channels C_in.
        planes: output channels C_out.
        stride: stride of the first conv (2 halves H and W).
        downsample: None, or the shortcut module (1x1 conv + BatchNorm2d,
            named ``downsample.0`` / ``downsample.1``) used when the shape changes.

    Shapes: x float32 [N, C_in, H, W] -> [N, C_out, H / stride, W / stride].
    """
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = M.BatchNorm2d(planes)
        self.relu = M.ReLU()
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = M.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(M.Module):
    """A ResNet of BasicBlocks (torchvision's ResNet, without Bottleneck).

    Args:
        layers: blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        num_classes: size of the last axis of the output.

    Shapes: x float32 [N, 3, H, W] (H, W >= 32 or so) -> logits [N, num_classes].

    Initialisation as torchvision: convs kaiming_normal_(fan_out, relu),
    batch norms weight 1 / bias 0, fc PyTorch's Linear default.
    """

    def __init__(self, layers=(2, 2, 2, 2), num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = M.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = M.BatchNorm2d(64)
        self.relu = M.ReLU()
        self.maxpool = M.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = M.AdaptiveAvgPool2d((1, 1))
        self.fc = M.Linear(512 * BasicBlock.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, M.Conv2d):
                init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
            downsample = M.Sequential(_conv1x1(self.inplanes, planes * BasicBlock.expansion,
                                               stride),
                                      M.BatchNorm2d(planes * BasicBlock.expansion))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * BasicBlock.expansion
        layers += [BasicBlock(self.inplanes, planes) for _ in range(1, blocks)]
        return M.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(num_classes=1000):
    """ResNet-18 with torchvision's structure and state_dict names, randomly
    initialised (load weights with ``load_state_dict``).

    Args:
        num_classes: output size of ``fc``.

    Returns:
        ResNet in training mode (call ``.eval()`` for inference).
    """
    return ResNet((2, 2, 2, 2), num_classes)
