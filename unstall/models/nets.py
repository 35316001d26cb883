"""The models `bench train` trains: torchvision's ResNet-18/50 and MobileNetV2, without torchvision.

Same layers, shapes and parameter counts as ``torchvision.models`` (ResNet: v1.5,
stride on the 3x3 conv; MobileNetV2: width 1.0), same initialisation, so a
training step costs what it costs there. Built by name with `build`.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


def _conv_bn(inp: int, out: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(inp, out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out),
    ]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inp: int, planes: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(inp, planes, 3, stride), nn.ReLU(inplace=True), *_conv_bn(planes, planes, 3)
        )
        self.shortcut = _shortcut(inp, planes * self.expansion, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, and a shortcut (ResNet-50 and up)."""

    expansion = 4

    def __init__(self, inp: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.body = nn.Sequential(
            *_conv_bn(inp, planes, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(planes, planes, 3, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(planes, out, 1),
        )
        self.shortcut = _shortcut(inp, out, stride)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def _shortcut(inp: int, out: int, stride: int) -> nn.Module:
    if stride == 1 and inp == out:
        return nn.Identity()
    return nn.Sequential(*_conv_bn(inp, out, 1, stride))


class ResNet(nn.Module):
    """torchvision's ResNet: 7x7 stem, max pool, four stages of ``block``, pool, classifier."""

    def __init__(
        self, block: type[BasicBlock | Bottleneck], layers: list[int], num_classes: int = 1000
    ):
        super().__init__()
        stages: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True)]
        stages.append(nn.MaxPool2d(3, 2, 1))
        inp = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            for j in range(blocks):
                stages.append(block(inp, planes, 2 if i > 0 and j == 0 else 1))
                inp = planes * block.expansion
        self.features = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inp, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.features(x)).flatten(1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 linear projection, residual if same."""

    def __init__(self, inp: int, out: int, stride: int, expand: int):
        super().__init__()
        hidden = inp * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [*_conv_bn(inp, hidden, 1), nn.ReLU6(inplace=True)]
        layers += [*_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(inplace=True)]
        layers += _conv_bn(hidden, out, 1)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and inp == out

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x) if self.residual else self.body(x)


#: MobileNetV2's stages: expansion t, channels c, repeats n, first stride s.
_MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1))
_MOBILENET_V2 += ((6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 at width 1.0: 32-channel stem, 17 blocks, 1280-wide head."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.ReLU6(inplace=True)]
        inp = 32
        for t, c, n, s in _MOBILENET_V2:
            for i in range(n):
                layers.append(InvertedResidual(inp, c, s if i == 0 else 1, t))
                inp = c
        layers += [*_conv_bn(inp, 1280, 1), nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.pool(self.features(x)).flatten(1))


MODELS: dict[str, Callable[[int], nn.Module]] = {
    "resnet18": lambda n: ResNet(BasicBlock, [2, 2, 2, 2], n),
    "resnet50": lambda n: ResNet(Bottleneck, [3, 4, 6, 3], n),
    "mobilenet_v2": lambda n: MobileNetV2(n),
}


def build(name: str, num_classes: int = 1000) -> nn.Module:
    """A freshly initialised model ``name`` (one of `MODELS`) with ``num_classes`` outputs."""
    if name not in MODELS:
        raise ValueError(f"model={name!r} is not known; choose one of {sorted(MODELS)}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r} must be a positive int")
    return MODELS[name](num_classes)
