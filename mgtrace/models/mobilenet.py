"""MobileNetV2 (Sandler et al. 2018) with torchvision's module names.

``mobilenet_v2().state_dict()`` has exactly the keys, shapes and order of
``torchvision.models.mobilenet_v2().state_dict()``: ``features.0.0.weight``
(stem conv), ``features.1.conv.0.0.weight`` (first depthwise conv), ...,
``features.18.1.running_var`` (last 1x1 conv's batch norm),
``classifier.1.weight``. Blocks use ReLU6 and depthwise 3x3 convs
(``groups`` = channels).

>>> import mgtrace as mt, numpy as np, mgtrace.models as models
>>> net = models.mobilenet_v2(num_classes=10).eval()
>>> list(net.state_dict())[:2], list(net.state_dict())[-1]
(['features.0.0.weight', 'features.0.1.weight'], 'classifier.1.bias')
>>> net(mt.tensor(np.zeros((1, 3, 32, 32), np.float32))).shape
(1, 10)
"""
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.module import init

__all__ = ["ConvBNReLU6", "InvertedResidual", "MobileNetV2", "mobilenet_v2"]

# (expand ratio t, output channels c, repeats n, first stride s): the paper's Table 2
INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _make_divisible(v, divisor=8, min_value=None):
    """torchvision's rounding of channel counts: nearest multiple of divisor,
    never more than 10% below v."""
    min_value = divisor if min_value is None else min_value
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU6(M.Sequential):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> ReLU6, children
    ``0``, ``1``, ``2`` (torchvision's Conv2dNormActivation with ReLU6)."""

    def __init__(self, in_planes, out_planes, kernel_size=3, stride=1, groups=1):
        padding = (kernel_size - 1) // 2
        super().__init__(M.Conv2d(in_planes, out_planes, kernel_size, stride, padding,
                                  groups=groups, bias=False),
                         M.BatchNorm2d(out_planes), M.ReLU6())


class InvertedResidual(M.Module):
    """1x1 expansion (skipped when expand_ratio is 1) -> 3x3 depthwise ->
    1x1 linear projection, plus the input when stride is 1 and C_in = C_out.

    Children live in ``conv`` (a Sequential), as in torchvision.
    """

    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"InvertedResidual: stride must be 1 or 2, got {stride}")
        hidden = int(round(inp * expand_ratio))
        self.stride = stride
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden, kernel_size=1))
        layers += [ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
                   M.Conv2d(hidden, oup, 1, 1, 0, bias=False),
                   M.BatchNorm2d(oup)]
        self.conv = M.Sequential(*layers)
        self.out_channels = oup

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(M.Module):
    """MobileNetV2 (torchvision's layout: ``features``, ``classifier``).

    Args:
        num_classes: size of the last axis of the output.
        width_mult: channel multiplier (1.0 is the standard network).
        round_nearest: channel counts are rounded to a multiple of this.
        dropout: drop probability before the classifier's Linear (training only).

    Shapes: x float32 [N, 3, H, W] -> logits [N, num_classes].

    Initialisation as torchvision: convs kaiming_normal_(fan_out), batch
    norms weight 1 / bias 0, Linear N(0, 0.01) with zero bias.
    """

    def __init__(self, num_classes=1000, width_mult=1.0, round_nearest=8, dropout=0.2):
        super().__init__()
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel,
                                                 s if i == 0 else 1, t))
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, self.last_channel, kernel_size=1))
        self.features = M.Sequential(*features)
        self.classifier = M.Sequential(M.Dropout(dropout),
                                       M.Linear(self.last_channel, num_classes))
        for m in self.modules():
            if isinstance(m, M.Conv2d):
                init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    init.zeros_(m.bias)
            elif isinstance(m, M.Linear):
                init.normal_(m.weight, 0.0, 0.01)
                init.zeros_(m.bias)

    def forward(self, x):
        x = self.features(x)
        x = F.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.classifier(x)


def mobilenet_v2(num_classes=1000, width_mult=1.0, dropout=0.2):
    """MobileNetV2 with torchvision's structure and state_dict names, randomly
    initialised (load weights with ``load_state_dict``).

    Args:
        num_classes: output size of ``classifier.1``.
        width_mult: channel multiplier; 1.0 gives the standard network.
        dropout: probability of the Dropout at ``classifier.0``.

    Returns:
        MobileNetV2 in training mode (call ``.eval()`` for inference).
    """
    return MobileNetV2(num_classes=num_classes, width_mult=width_mult, dropout=dropout)
