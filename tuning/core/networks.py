"""Whole networks in plain torch, for end-to-end tuning (no TVM, no torchvision).

The image networks reproduce torchvision's architectures layer for layer (same
parameter counts, same initialisation rules), so results compare with papers
that tune torchvision's models; `bert_encoder_layer` is one BERT-base encoder
layer, the batched-GEMM case. Weights are random, drawn from the run's seed:

    model, example = build_network("resnet18", seed=0)   # eval mode, (1, 3, 224, 224)
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

IMAGE_SHAPE = (1, 3, 224, 224)
NUM_CLASSES = 1000


# ---- ResNet-18 (torchvision.models.resnet18) ---------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(64, 64), BasicBlock(64, 64))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---- AlexNet (torchvision.models.alexnet) --------------------------------------------
class AlexNet(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ---- VGG-16 (torchvision.models.vgg16, configuration "D", no batch norm) -------------
VGG16_LAYERS = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG16(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for v in VGG16_LAYERS:
            if isinstance(v, int):
                layers += [nn.Conv2d(in_channels, v, 3, padding=1), nn.ReLU(inplace=True)]
                in_channels = v
            else:  # "M"
                layers.append(nn.MaxPool2d(2, 2))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ---- SqueezeNet 1.0 (torchvision.models.squeezenet1_0) -------------------------------
class Fire(nn.Module):
    def __init__(self, in_channels: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(in_channels, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet10(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(96, 16, 64, 64), Fire(128, 16, 64, 64), Fire(128, 32, 128, 128),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 32, 128, 128), Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(512, 64, 256, 256),
        )
        final_conv = nn.Conv2d(512, num_classes, 1)
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), final_conv, nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                if m is final_conv:
                    nn.init.normal_(m.weight, 0, 0.01)
                else:
                    nn.init.kaiming_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


# ---- MobileNetV2 (torchvision.models.mobilenet_v2, width 1.0) ------------------------
def conv_bn_relu6(in_channels: int, out_channels: int, kernel: int = 3, stride: int = 1,
                  groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(in_channels * expand_ratio))
        self.use_res_connect = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(conv_bn_relu6(in_channels, hidden, kernel=1))
        layers += [
            conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, out_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # (expand ratio t, output channels c, repeats n, first stride s)
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        in_channels, last_channels = 32, 1280
        layers: list[nn.Module] = [conv_bn_relu6(3, in_channels, stride=2)]
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(in_channels, c, s if i == 0 else 1, t))
                in_channels = c
        layers.append(conv_bn_relu6(in_channels, last_channels, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last_channels, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ---- BERT-base encoder layer (HuggingFace BertLayer, eval mode) ----------------------
class BertEncoderLayer(nn.Module):
    """Self-attention (written out as batched matmuls, so Relax sees the GEMMs) + FFN."""

    def __init__(self, hidden: int = 768, heads: int = 12, intermediate: int = 3072, eps: float = 1e-12) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=eps)
        for m in self.modules():  # BERT's initializer_range
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.02)
                nn.init.zeros_(m.bias)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.reshape(batch, seq, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.permute(0, 2, 1, 3).reshape(batch, seq, hidden)
        x = self.attention_norm(self.attention_output(context) + x)
        return self.output_norm(self.output(nn.functional.gelu(self.intermediate(x))) + x)


# ---- a tiny CNN for tests and quick checks ---------------------------------------------
class TinyCNN(nn.Module):
    """conv-bn-relu, a strided residual block, global pooling, classifier: ResNet-18's kinds of
    kernels at 1x3x16x16, so the whole-model path runs in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.block = BasicBlock(8, 16, stride=2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# ---- registry -------------------------------------------------------------------------
# name -> (constructor, example input shape)
NETWORKS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "resnet18": (ResNet18, IMAGE_SHAPE),
    "alexnet": (AlexNet, IMAGE_SHAPE),
    "vgg16": (VGG16, IMAGE_SHAPE),
    "squeezenet1_0": (SqueezeNet10, IMAGE_SHAPE),
    "mobilenet_v2": (MobileNetV2, IMAGE_SHAPE),
    "bert_encoder_layer": (BertEncoderLayer, (1, 128, 768)),
    "tiny_cnn": (TinyCNN, (1, 3, 16, 16)),
}


def randomize_batch_norm(model: nn.Module, generator: torch.Generator) -> None:
    """Non-trivial running statistics and affine terms, so folding batch norm into the
    convolutions is really exercised (fresh ones are the identity in eval mode)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
            m.running_var.copy_(torch.empty(n).uniform_(0.5, 1.5, generator=generator))
            m.weight.data.copy_(torch.empty(n).uniform_(0.5, 1.5, generator=generator))
            m.bias.data.copy_(0.1 * torch.randn(n, generator=generator))


@torch.no_grad()
def build_network(name: str, seed: int) -> tuple[nn.Module, torch.Tensor]:
    """(model in eval mode with random weights from `seed`, example input).

    torch's initialisers draw from the global RNG; it is forked, so the caller's
    global RNG state is left as it was."""
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; known: {sorted(NETWORKS)}")
    constructor, input_shape = NETWORKS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = constructor()
    generator = torch.Generator().manual_seed(seed)
    randomize_batch_norm(model, generator)
    example = torch.randn(input_shape, generator=generator)
    return model.eval(), example
