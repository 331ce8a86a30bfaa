"""torch.nn re-implementations of torchvision's resnet18 and mobilenet_v2.

torchvision does not import beside the installed torch, so its module trees
are written out here with the same attribute names (hence the same
state_dict keys and order). Imports neither torch nor mgtrace at module
level: callers pass ``torch.nn``, and benchmarks/bench_models.py uses these
without loading mgtrace into the torch process.
"""


def _torch_resnet18(nn, num_classes=1000):
    """torchvision.models.resnet18's module tree, written out."""

    class BasicBlock(nn.Module):
        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(64, 2)
            self.layer2 = self._make_layer(128, 2, 2)
            self.layer3 = self._make_layer(256, 2, 2)
            self.layer4 = self._make_layer(512, 2, 2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)

        def _make_layer(self, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes:
                downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                           nn.BatchNorm2d(planes))
            layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes
            layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


def _torch_mobilenet_v2(nn, num_classes=1000):
    """torchvision.models.mobilenet_v2's module tree (width 1.0), written out."""

    def conv_bn_relu6(inp, oup, k=3, stride=1, groups=1):   # Conv2dNormActivation
        return nn.Sequential(nn.Conv2d(inp, oup, k, stride, (k - 1) // 2, groups=groups,
                                       bias=False),
                             nn.BatchNorm2d(oup), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, inp, oup, stride, t):
            super().__init__()
            hidden = int(round(inp * t))
            self.use_res_connect = stride == 1 and inp == oup
            layers = [conv_bn_relu6(inp, hidden, k=1)] if t != 1 else []
            layers += [conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
                       nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            setting = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                       [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]
            inp = 32
            features = [conv_bn_relu6(3, inp, stride=2)]
            for t, c, n, s in setting:
                for i in range(n):
                    features.append(InvertedResidual(inp, c, s if i == 0 else 1, t))
                    inp = c
            features.append(conv_bn_relu6(inp, 1280, k=1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
            return self.classifier(x.flatten(1))

    return MobileNetV2()


TORCH_MODELS = {"resnet18": _torch_resnet18, "mobilenet_v2": _torch_mobilenet_v2}
