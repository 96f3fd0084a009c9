"""Reference network architectures in plain torch.nn (random weights, no downloads).

The layer shapes follow the published models (torchvision's ResNet-18/50 and
MobileNet-V2, BERT-base's encoder), which is what decides the tensor programs a network
yields; the weights do not matter for tuning, so they are random with a fixed seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# ---------------------------------------------------------------- ResNet (He et al. 2016)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = _downsample(cin, cout, stride)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)  # stride on the 3x3 (v1.5)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = _downsample(cin, cout, stride)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.downsample(x))


def _downsample(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    def __init__(self, block, layers: list[int], num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        stages, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


# ------------------------------------------------------------ MobileNet-V2 (Sandler et al. 2018)


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()
    )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn_relu6(cin, hidden, 1)]
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, stride s) from the paper's Table 2.
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, cin = [_conv_bn_relu6(3, 32, 3, 2)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn_relu6(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


# ------------------------------------------------------------------- BERT encoder (Devlin et al. 2019)


@dataclass(frozen=True)
class BertConfig:
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    layers: int = 12
    seq: int = 128
    max_positions: int = 512


class Dense(nn.Module):
    """y = x @ W + b with W stored [in, out].

    Same math as nn.Linear, whose [out, in] weight exports as a transpose that Relax
    must then constant-fold for every layer (seconds of work for BERT-base).
    """

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cin, cout))
        self.bias = nn.Parameter(torch.empty(cout))
        bound = cin**-0.5  # nn.Linear's default init range
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return torch.addmm(self.bias, x, self.weight)


class BertLayer(nn.Module):
    """Post-LN transformer layer over tokens [batch*seq, hidden], as BERT computes it.

    Keeping tokens 2-D makes every Linear a plain matmul (no reshapes around it), so a
    bias and the GELU fuse into the matmul task as they do in tuned BERT deployments.
    """

    def __init__(self, c: BertConfig):
        super().__init__()
        self.seq, self.heads, self.head_dim = c.seq, c.heads, c.hidden // c.heads
        self.query = Dense(c.hidden, c.hidden)
        self.key = Dense(c.hidden, c.hidden)
        self.value = Dense(c.hidden, c.hidden)
        self.out = Dense(c.hidden, c.hidden)
        self.ln1 = nn.LayerNorm(c.hidden, eps=1e-12)
        self.ffn = nn.Sequential(Dense(c.hidden, c.intermediate), nn.GELU(), Dense(c.intermediate, c.hidden))
        self.ln2 = nn.LayerNorm(c.hidden, eps=1e-12)

    def _split(self, y):
        """[batch*seq, hidden] -> [batch*heads, seq, head_dim]."""
        b = y.shape[0] // self.seq
        return y.reshape(b, self.seq, self.heads, self.head_dim).transpose(1, 2).reshape(-1, self.seq, self.head_dim)

    def forward(self, x):
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.bmm(q, k.transpose(1, 2)) * (self.head_dim**-0.5)
        ctx = torch.bmm(torch.softmax(scores, dim=-1), v)
        ctx = ctx.reshape(-1, self.heads, self.seq, self.head_dim).transpose(1, 2).reshape(x.shape)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ffn(x))


class BertEncoder(nn.Module):
    """Word embeddings [batch, seq, hidden] -> hidden states [batch, seq, hidden].

    The input is the already looked-up word embeddings, not token ids: a gather by
    integer ids would become a task whose index argument, filled with random bits by a
    measurement runner, reads out of bounds. Position and token-type embeddings, the
    embedding LayerNorm and every encoder layer are in the graph. No padding mask.
    """

    def __init__(self, c: BertConfig = BertConfig()):
        super().__init__()
        self.config = c
        self.position = nn.Embedding(c.max_positions, c.hidden)
        self.token_type = nn.Embedding(2, c.hidden)
        self.ln = nn.LayerNorm(c.hidden, eps=1e-12)
        self.layers = nn.Sequential(*[BertLayer(c) for _ in range(c.layers)])

    def forward(self, words):
        b, s, h = words.shape
        x = words + self.position.weight[:s] + self.token_type.weight[0]
        x = self.layers(self.ln(x.reshape(b * s, h)))
        return x.reshape(b, s, h)


# ------------------------------------------------------------------------------ registry


def resnet18() -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3])


def mobilenet_v2() -> nn.Module:
    return MobileNetV2()


def bert_encoder(layers: int = 12, seq: int = 128) -> nn.Module:
    return BertEncoder(BertConfig(layers=layers, seq=seq))


NETWORKS = {"resnet18": resnet18, "resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "bert_encoder": bert_encoder}


def build(name: str, batch: int = 1, seed: int = 0, **options) -> tuple[nn.Module, tuple]:
    """The network in eval mode with seeded random weights, and example inputs of `batch`."""
    if name not in NETWORKS:
        raise ValueError(f"unknown network {name!r}; valid: {', '.join(NETWORKS)}")
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = NETWORKS[name](**options).eval()
    if isinstance(model, BertEncoder):
        c = model.config
        example = (torch.randn(batch, c.seq, c.hidden, generator=gen),)
    else:
        example = (torch.randn(batch, 3, 224, 224, generator=gen),)
    return model, example
