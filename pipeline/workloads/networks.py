"""Reference network architectures in plain torch.nn (random weights, no downloads).

The layer shapes follow the published models (torchvision's ResNet-18/50, ResNeXt-50 32x4d,
MobileNet-V2, MobileNet-V3 small, SqueezeNet 1.1, ConvNeXt-T, ShuffleNet-V2 1.0x and
EfficientNet-B0, BERT-base's encoder, ViT-S/16 and ViT-B/16, MLP-Mixer S/16, a GPT-style decoder,
SmolLM2-135M's decoder, wav2vec 2.0 base, Whisper tiny's encoder, QuartzNet 5x5, T5-small's
encoder, ECAPA-TDNN (C 512), Conformer-S's encoder, Conv-TasNet, U-Net, YOLOv5s, X3D-XS,
Swin-T, DenseNet-121, Inception-v3, RegNetY-400MF, timm's MobileViT-XS, TenSet's DCGAN), which
is what decides the tensor programs a network yields; the weights do not matter for tuning,
so they are random with a fixed seed.
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

    def __init__(self, cin: int, width: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        # stride on the 3x3 (v1.5); a dilated 3x3 keeps the map's size (DeepLabV3's backbone)
        self.conv2 = nn.Conv2d(width, width, 3, stride, dilation, dilation=dilation, bias=False)
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


class ResNeXtBottleneck(Bottleneck):
    """ResNeXt-50 32x4d (Xie et al. 2017): a bottleneck twice as wide whose 3x3 convolution
    has 32 groups."""

    groups = 32

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__(cin, width, stride)
        inner = width * 2
        self.conv1 = nn.Conv2d(cin, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride, 1, groups=self.groups, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, width * self.expansion, 1, bias=False)


class WideBottleneck(ResNeXtBottleneck):
    """Wide ResNet-50-2 (Zagoruyko and Komodakis 2016, the ImageNet bottleneck network as
    torchvision's wide_resnet50_2 builds it): ResNeXt's widths with the 3x3 convolution dense."""

    groups = 1


def _downsample(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """`dilate[i]`: stage i + 2 trades its stride for dilation, its first block keeping the
    previous dilation (torchvision's replace_stride_with_dilation; Bottleneck blocks only).
    `num_classes` None: the backbone alone, without the pool and the classifier."""

    def __init__(self, block, layers: list[int], num_classes: int | None = 1000, dilate: tuple[bool, ...] = ()):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        stages, cin, dilation = [], 64, 1
        for i, n in enumerate(layers):
            width, stride, first = 64 * 2**i, 2 if i > 0 else 1, dilation
            if i > 0 and i <= len(dilate) and dilate[i - 1]:
                stride, dilation = 1, dilation * 2
            blocks = []
            for j in range(n):
                d = first if j == 0 else dilation
                blocks.append(block(cin, width, stride if j == 0 else 1, **({"dilation": d} if d > 1 else {})))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.Sequential(*stages)
        if num_classes is not None:
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


# ------------------------------------------------------------ MobileNet-V2 (Sandler et al. 2018)


def _conv_bn_act(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                 act: type[nn.Module] = nn.ReLU6) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), act()
    )


class InvertedResidual(nn.Module):
    """1x1 expansion, k x k depthwise carrying the stride (3x3 but in MNASNet), 1x1
    projection; the shortcut only where the shape is kept. ReLU6 in MobileNet-V2, SiLU in
    MobileViT, ReLU in MNASNet."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, act: type[nn.Module] = nn.ReLU6,
                 kernel: int = 3):
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn_act(cin, hidden, 1, act=act)]
        layers += [
            _conv_bn_act(hidden, hidden, kernel, stride, groups=hidden, act=act),
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
        layers, cin = [_conv_bn_act(3, 32, 3, 2)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn_act(cin, 1280, 1))
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
    ln_eps: float = 1e-12


class Dense(nn.Module):
    """y = x @ W + b with W stored [in, out].

    Same math as nn.Linear, whose [out, in] weight exports as a transpose that Relax
    must then constant-fold for every layer (seconds of work for BERT-base).
    """

    def __init__(self, cin: int, cout: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cin, cout))
        self.bias = nn.Parameter(torch.empty(cout)) if bias else None
        bound = cin**-0.5  # nn.Linear's default init range
        nn.init.uniform_(self.weight, -bound, bound)
        if bias:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return torch.mm(x, self.weight) if self.bias is None else torch.addmm(self.bias, x, self.weight)


def _split_heads(y, seq: int, heads: int):
    """[batch*seq, hidden] -> [batch*heads, seq, head_dim]."""
    return y.reshape(-1, seq, heads, y.shape[1] // heads).transpose(1, 2).reshape(-1, seq, y.shape[1] // heads)


def _attend(q, k, v, heads: int, mask=None):
    """Scaled dot-product attention: queries [batch*heads, seq, head_dim] over keys and values
    [batch*heads, kv_seq, head_dim] (plus an additive mask), back to tokens
    [batch*seq, heads*head_dim], the inverse of `_split_heads`."""
    seq, head_dim = q.shape[1], q.shape[2]
    scores = torch.bmm(q, k.transpose(1, 2)) * (head_dim**-0.5)
    if mask is not None:
        scores = scores + mask
    ctx = torch.bmm(torch.softmax(scores, dim=-1), v)
    return ctx.reshape(-1, heads, seq, head_dim).transpose(1, 2).reshape(-1, heads * head_dim)


class BertLayer(nn.Module):
    """Post-LN transformer layer over tokens [batch*seq, hidden], as BERT computes it.

    Keeping tokens 2-D makes every Linear a plain matmul (no reshapes around it), so a
    bias and the GELU fuse into the matmul task as they do in tuned BERT deployments.
    """

    def __init__(self, c: BertConfig):
        super().__init__()
        self.seq, self.heads = c.seq, c.heads
        self.query = Dense(c.hidden, c.hidden)
        self.key = Dense(c.hidden, c.hidden)
        self.value = Dense(c.hidden, c.hidden)
        self.out = Dense(c.hidden, c.hidden)
        self.ln1 = nn.LayerNorm(c.hidden, eps=c.ln_eps)
        self.ffn = nn.Sequential(Dense(c.hidden, c.intermediate), nn.GELU(), Dense(c.intermediate, c.hidden))
        self.ln2 = nn.LayerNorm(c.hidden, eps=c.ln_eps)

    def forward(self, x):
        q, k, v = (_split_heads(y, self.seq, self.heads) for y in (self.query(x), self.key(x), self.value(x)))
        x = self.ln1(x + self.out(_attend(q, k, v, self.heads)))
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


# ------------------------------------------------------- SqueezeNet 1.1 (Iandola et al. 2016)


class Fire(nn.Module):
    """Squeeze 1x1, then 1x1 and 3x3 expands side by side, concatenated."""

    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x):
        x = self.squeeze(x)
        return torch.cat([self.expand1(x), self.expand3(x)], 1)


class SqueezeNet(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(), pool(), Fire(64, 16, 64), Fire(128, 16, 64), pool(),
            Fire(128, 32, 128), Fire(256, 32, 128), pool(), Fire(256, 48, 192), Fire(384, 48, 192),
            Fire(384, 64, 256), Fire(512, 64, 256),
        )
        self.classifier = nn.Sequential(nn.Conv2d(512, num_classes, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


# ----------------------------------------------------- MobileNet-V3 small (Howard et al. 2019)


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int, act: type[nn.Module] = nn.ReLU, gate: type[nn.Module] = nn.Hardsigmoid):
        super().__init__()
        self.fc = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, squeeze, 1), act(), nn.Conv2d(squeeze, c, 1),
                                gate())

    def forward(self, x):
        return x * self.fc(x)


def _make_divisible(v: int, divisor: int = 8) -> int:
    """The nearest multiple of `divisor` (at least `divisor`), raised by one step where rounding
    down would lose more than a tenth: how the MobileNets size their squeeze layers."""
    out = max(divisor, (v + divisor // 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


class InvertedResidualV3(nn.Module):
    def __init__(self, cin: int, k: int, hidden: int, cout: int, se: bool, hswish: bool, stride: int,
                 eps: float = 1e-5):
        super().__init__()
        act = nn.Hardswish if hswish else nn.ReLU
        layers = [] if hidden == cin else [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden, eps), act()]
        layers += [nn.Conv2d(hidden, hidden, k, stride, (k - 1) // 2, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden, eps), act()]
        if se:
            layers.append(SqueezeExcite(hidden, _make_divisible(hidden // 4)))
        layers += [nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout, eps)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV3Small(nn.Module):
    # (kernel, expanded channels, out channels, squeeze-excite, hard-swish, stride): the paper's Table 2.
    SETTINGS = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
                (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
                (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
                (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1)]

    LAST, HEAD = 576, 1024  # the last 1x1 convolution's channels, the classifier's hidden width
    EPS = 1e-5  # batch norm's epsilon

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        eps = self.EPS
        layers, cin = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16, eps), nn.Hardswish()], 16
        for k, hidden, cout, se, hs, s in self.SETTINGS:
            layers.append(InvertedResidualV3(cin, k, hidden, cout, se, hs, s, eps))
            cin = cout
        layers += [nn.Conv2d(cin, self.LAST, 1, bias=False), nn.BatchNorm2d(self.LAST, eps), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(self.LAST, self.HEAD), nn.Hardswish(),
                                        nn.Linear(self.HEAD, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class MobileNetV3Large(MobileNetV3Small):
    """MobileNet-V3 large at 224x224: fifteen inverted residual blocks (3x3 and 5x5 depthwise,
    expansions 64-960, squeeze-excite on eight, hard-swish from the seventh), the last 1x1
    convolution to 960 channels, classifier 960-1280-1000; 5,483,032 parameters."""

    SETTINGS = [(3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2), (3, 72, 24, False, False, 1),
                (5, 72, 40, True, False, 2), (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
                (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1), (3, 184, 80, False, True, 1),
                (3, 184, 80, False, True, 1), (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
                (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1), (5, 960, 160, True, True, 1)]
    LAST, HEAD = 960, 1280
    EPS = 1e-3  # as torchvision trains it (the small network above keeps PyTorch's default)


# ------------------------------------------------------------------ DCGAN (Radford et al. 2016)


class DCGAN(nn.Module):
    """The generator (noise [batch, 100] -> image [batch, 3, 64, 64], transposed 4x4
    convolutions of stride 2) followed by the discriminator (4x4 convolutions of stride 2,
    LeakyReLU) that scores its image, as TenSet's `dcgan` network does."""

    example_shape = (100,)

    def __init__(self, ngf: int = 128, ndf: int = 64):
        super().__init__()
        self.ngf = ngf
        self.project = nn.Linear(100, 4 * 4 * ngf * 8)
        g, c = [], ngf * 8
        for _ in range(3):
            g += [nn.ConvTranspose2d(c, c // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(c // 2), nn.ReLU()]
            c //= 2
        g += [nn.ConvTranspose2d(c, 3, 4, 2, 1, bias=False), nn.Tanh()]
        self.generator = nn.Sequential(*g)
        d, c = [nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2)], ndf
        for _ in range(3):
            d += [nn.Conv2d(c, c * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(c * 2), nn.LeakyReLU(0.2)]
            c *= 2
        d += [nn.Conv2d(c, 1, 4, 1, 0, bias=False), nn.Sigmoid()]
        self.discriminator = nn.Sequential(*d)

    def forward(self, z):
        x = torch.relu(self.project(z)).reshape(z.shape[0], self.ngf * 8, 4, 4)
        return torch.flatten(self.discriminator(self.generator(x)), 1)


# ------------------------------------------------- transformers: ViT (Dosovitskiy et al. 2021), GPT


class PreLNLayer(nn.Module):
    """Pre-LN transformer layer over tokens [batch*seq, hidden] (ViT, GPT-2, MobileViT),
    optionally causal: each token attends to itself and the tokens before it."""

    def __init__(self, hidden: int, heads: int, intermediate: int, seq: int, causal: bool = False,
                 act: type[nn.Module] = nn.GELU):
        super().__init__()
        self.seq, self.heads, self.head_dim = seq, heads, hidden // heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = Dense(hidden, 3 * hidden)
        self.out = Dense(hidden, hidden)
        self.mlp = nn.Sequential(Dense(hidden, intermediate), act(), Dense(intermediate, hidden))
        mask = torch.full((seq, seq), float("-inf")).triu(1) if causal else torch.zeros(seq, seq)
        self.register_buffer("mask", mask)

    def forward(self, x):
        b = x.shape[0] // self.seq
        qkv = self.qkv(self.ln1(x)).reshape(b, self.seq, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = (t.reshape(b * self.heads, self.seq, self.head_dim) for t in qkv)
        x = x + self.out(_attend(q, k, v, self.heads, self.mask))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """ViT-S/16 at 224x224: 16x16 patches (196 tokens and a class token), hidden 384, 6 heads."""

    def __init__(self, hidden: int = 384, heads: int = 6, layers: int = 12, patch: int = 16, num_classes: int = 1000):
        super().__init__()
        self.hidden, self.seq = hidden, (224 // patch) ** 2 + 1
        self.patch = nn.Conv2d(3, hidden, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.position = nn.Parameter(torch.randn(1, self.seq, hidden) * 0.02)
        self.layers = nn.Sequential(*[PreLNLayer(hidden, heads, 4 * hidden, self.seq) for _ in range(layers)])
        self.ln = nn.LayerNorm(hidden)
        self.head = Dense(hidden, num_classes)

    def forward(self, x):
        b = x.shape[0]
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(b, -1, -1), tokens], 1) + self.position
        x = self.ln(self.layers(x.reshape(b * self.seq, self.hidden))).reshape(b, self.seq, self.hidden)
        return self.head(x[:, 0])


class GPTDecoder(nn.Module):
    """GPT-style decoder stack over token embeddings [batch, seq, hidden] (seq 256, hidden
    512, 8 heads, causal attention, pre-LN); the input is already embedded, as BERT's is."""

    def __init__(self, hidden: int = 512, heads: int = 8, layers: int = 6, seq: int = 256):
        super().__init__()
        self.hidden, self.seq = hidden, seq
        self.example_shape = (seq, hidden)
        self.position = nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.layers = nn.Sequential(*[PreLNLayer(hidden, heads, 4 * hidden, seq, causal=True) for _ in range(layers)])
        self.ln = nn.LayerNorm(hidden)

    def forward(self, words):
        b = words.shape[0]
        x = (words + self.position).reshape(b * self.seq, self.hidden)
        return self.ln(self.layers(x)).reshape(b, self.seq, self.hidden)


# ---------------------------------------------------------- ConvNeXt-T (Liu et al. 2022)


class ChannelsLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's LayerNorm2d)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise convolution, LayerNorm, an inverted MLP (4x, GELU) over channels-last
    tokens, a per-channel layer scale, the residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(Dense(dim, 4 * dim), nn.GELU(), Dense(4 * dim, dim))
        self.scale = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1)).reshape(b * h * w, c)
        y = (self.mlp(y) * self.scale).reshape(b, h, w, c).permute(0, 3, 1, 2)
        return x + y


class ConvNeXt(nn.Module):
    def __init__(self, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), num_classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, dims[0], 4, 4), ChannelsLayerNorm(dims[0], eps=1e-6)]
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            if i:
                layers += [ChannelsLayerNorm(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = Dense(dims[-1], num_classes)

    def forward(self, x):
        return self.head(self.norm(torch.flatten(self.pool(self.features(x)), 1)))


# ------------------------------------------------------- ShuffleNet-V2 1.0x (Ma et al. 2018)


def _channel_shuffle(x, groups: int = 2):
    b, c, h, w = x.shape
    return x.reshape(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


class ShuffleUnit(nn.Module):
    """Stride 1: half the channels pass, the other half go 1x1 -> 3x3 depthwise -> 1x1;
    stride 2: both halves are convolved and the width doubles. Then a channel shuffle."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.stride = stride
        half = cout // 2
        inner = cin if stride > 1 else half
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                nn.Conv2d(cin, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU())
        self.branch2 = nn.Sequential(
            nn.Conv2d(inner, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(),
            nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU())

    def forward(self, x):
        if self.stride > 1:
            out = torch.cat([self.branch1(x), self.branch2(x)], 1)
        else:
            a, b = x.chunk(2, dim=1)
            out = torch.cat([a, self.branch2(b)], 1)
        return _channel_shuffle(out)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats=(4, 8, 4), widths=(24, 116, 232, 464, 1024), num_classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                  nn.MaxPool2d(3, 2, 1)]
        cin = widths[0]
        for n, cout in zip(repeats, widths[1:4]):
            layers += [ShuffleUnit(cin, cout, 2)] + [ShuffleUnit(cout, cout, 1) for _ in range(n - 1)]
            cin = cout
        layers += [nn.Conv2d(cin, widths[4], 1, bias=False), nn.BatchNorm2d(widths[4]), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(widths[4], num_classes)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


# ----------------------------------------------------- MLP-Mixer S/16 (Tolstikhin et al. 2021)


class MixerLayer(nn.Module):
    """Token mixing (an MLP across the 196 patches, per channel), then channel mixing (an MLP
    across channels, per patch), each pre-LN with a residual."""

    def __init__(self, tokens: int, hidden: int, token_mlp: int, channel_mlp: int):
        super().__init__()
        self.tokens, self.hidden = tokens, hidden
        self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-6), nn.LayerNorm(hidden, eps=1e-6)
        self.token_mlp = nn.Sequential(Dense(tokens, token_mlp), nn.GELU(), Dense(token_mlp, tokens))
        self.channel_mlp = nn.Sequential(Dense(hidden, channel_mlp), nn.GELU(), Dense(channel_mlp, hidden))

    def forward(self, x):
        b = x.shape[0] // self.tokens
        y = self.ln1(x).reshape(b, self.tokens, self.hidden).transpose(1, 2).reshape(b * self.hidden, self.tokens)
        y = self.token_mlp(y).reshape(b, self.hidden, self.tokens).transpose(1, 2).reshape(x.shape)
        x = x + y
        return x + self.channel_mlp(self.ln2(x))


class MLPMixer(nn.Module):
    def __init__(self, hidden: int = 512, layers: int = 8, patch: int = 16, token_mlp: int = 256,
                 channel_mlp: int = 2048, num_classes: int = 1000):
        super().__init__()
        self.hidden, self.tokens = hidden, (224 // patch) ** 2
        self.patch = nn.Conv2d(3, hidden, patch, patch)
        self.layers = nn.Sequential(*[MixerLayer(self.tokens, hidden, token_mlp, channel_mlp) for _ in range(layers)])
        self.ln = nn.LayerNorm(hidden, eps=1e-6)
        self.head = Dense(hidden, num_classes)

    def forward(self, x):
        b = x.shape[0]
        tokens = self.patch(x).flatten(2).transpose(1, 2).reshape(b * self.tokens, self.hidden)
        x = self.ln(self.layers(tokens)).reshape(b, self.tokens, self.hidden)
        return self.head(x.mean(1))


# ------------------------------------------------------ EfficientNet-B0 (Tan and Le 2019)


class MBConv(nn.Module):
    """1x1 expansion, k x k depthwise convolution, squeeze-and-excitation (SiLU, sigmoid, a
    quarter of the block's input channels), 1x1 projection; SiLU throughout."""

    def __init__(self, cin: int, expand: int, k: int, stride: int, cout: int):
        super().__init__()
        hidden = cin * expand
        bn = lambda c: nn.BatchNorm2d(c, eps=1e-3)  # noqa: E731
        layers = [] if expand == 1 else [nn.Conv2d(cin, hidden, 1, bias=False), bn(hidden), nn.SiLU()]
        layers += [nn.Conv2d(hidden, hidden, k, stride, k // 2, groups=hidden, bias=False), bn(hidden), nn.SiLU(),
                   SqueezeExcite(hidden, max(1, cin // 4), nn.SiLU, nn.Sigmoid),
                   nn.Conv2d(hidden, cout, 1, bias=False), bn(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class EfficientNetB0(nn.Module):
    # (expansion, kernel, stride, out channels, repeats): the paper's Table 1.
    STAGES = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
              (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, cin = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32, eps=1e-3), nn.SiLU()], 32
        for expand, k, stride, cout, repeats in self.STAGES:
            for i in range(repeats):
                layers.append(MBConv(cin, expand, k, stride if i == 0 else 1, cout))
                cin = cout
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280, eps=1e-3), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


# ------------------------------------------- SmolLM2-135M's decoder (a Llama-style model)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaLayer(nn.Module):
    """Pre-RMSNorm causal attention with grouped key/value heads and rotary position
    embeddings, then a SwiGLU MLP; no biases. Tokens are [batch*seq, hidden]."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int, seq: int, theta: float):
        super().__init__()
        self.seq, self.heads, self.kv_heads, self.head_dim = seq, heads, kv_heads, hidden // heads
        kv = kv_heads * self.head_dim
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q, self.k, self.v = Dense(hidden, hidden, False), Dense(hidden, kv, False), Dense(hidden, kv, False)
        self.o = Dense(hidden, hidden, False)
        self.gate, self.up = Dense(hidden, intermediate, False), Dense(hidden, intermediate, False)
        self.down = Dense(intermediate, hidden, False)
        inv = theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv).repeat(1, 2)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1))

    def _heads(self, y, n: int):
        """[batch*seq, n*head_dim] -> [batch, n, seq, head_dim], rotated."""
        y = y.reshape(-1, self.seq, n, self.head_dim).transpose(1, 2)
        half = self.head_dim // 2
        return y * self.cos + torch.cat([-y[..., half:], y[..., :half]], -1) * self.sin

    def forward(self, x):
        b, groups = x.shape[0] // self.seq, self.heads // self.kv_heads
        h = self.norm1(x)
        q = self._heads(self.q(h), self.heads).reshape(b * self.heads, self.seq, self.head_dim)
        k = self._heads(self.k(h), self.kv_heads)
        v = self.v(h).reshape(b, self.seq, self.kv_heads, self.head_dim).transpose(1, 2)
        k, v = (t[:, :, None].expand(b, self.kv_heads, groups, self.seq, self.head_dim)
                .reshape(b * self.heads, self.seq, self.head_dim) for t in (k, v))
        x = x + self.o(_attend(q, k, v, self.heads, self.mask))
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class LlamaDecoder(nn.Module):
    """SmolLM2-135M's decoder stack (hidden 576, 9 query and 3 key/value heads, SwiGLU 1536,
    30 layers, RoPE base 10000) over token embeddings [batch, seq, hidden], seq 256; the input
    is already embedded, as BERT's is."""

    def __init__(self, hidden: int = 576, heads: int = 9, kv_heads: int = 3, intermediate: int = 1536,
                 layers: int = 30, seq: int = 256, theta: float = 10000.0):
        super().__init__()
        self.hidden, self.seq = hidden, seq
        self.example_shape = (seq, hidden)
        self.layers = nn.Sequential(*[LlamaLayer(hidden, heads, kv_heads, intermediate, seq, theta)
                                      for _ in range(layers)])
        self.norm = RMSNorm(hidden)

    def forward(self, words):
        b = words.shape[0]
        return self.norm(self.layers(words.reshape(b * self.seq, self.hidden))).reshape(b, self.seq, self.hidden)


# ---------------------------------------------- wav2vec 2.0 base (Baevski et al. 2020)


class Wav2Vec2(nn.Module):
    """Raw audio [batch, samples] -> hidden states [batch, frames, 768]: seven 1-D
    convolutions (512 channels, strides 5,2,2,2,2,2,2; GroupNorm after the first, GELU),
    a projection to 768, a grouped convolutional position embedding (kernel 128, 16 groups;
    its weight normalisation is a plain weight at inference) and twelve post-LN transformer
    layers. One second at 16 kHz is 49 frames."""

    def __init__(self, samples: int = 16000, hidden: int = 768, layers: int = 12):
        super().__init__()
        self.example_shape = (samples,)
        convs, cin, frames = [], 1, samples
        for i, (k, s) in enumerate([(10, 5)] + [(3, 2)] * 4 + [(2, 2)] * 2):
            convs += [nn.Conv1d(cin, 512, k, s, bias=False)] + ([nn.GroupNorm(512, 512)] if i == 0 else [])
            convs.append(nn.GELU())
            cin, frames = 512, (frames - k) // s + 1
        self.features = nn.Sequential(*convs)
        self.frames, self.hidden = frames, hidden
        self.project = nn.Sequential(nn.LayerNorm(512), nn.Linear(512, hidden))
        self.position = nn.Conv1d(hidden, hidden, 128, padding=64, groups=16)
        self.ln = nn.LayerNorm(hidden)
        c = BertConfig(hidden=hidden, heads=12, intermediate=4 * hidden, layers=layers, seq=frames, ln_eps=1e-5)
        self.layers = nn.Sequential(*[BertLayer(c) for _ in range(layers)])

    def forward(self, audio):
        b = audio.shape[0]
        x = self.project(self.features(audio[:, None]).transpose(1, 2))
        pos = nn.functional.gelu(self.position(x.transpose(1, 2))[:, :, :-1]).transpose(1, 2)
        x = self.ln(x + pos).reshape(b * self.frames, self.hidden)
        return self.layers(x).reshape(b, self.frames, self.hidden)


# -------------------------------------- Whisper tiny's audio encoder (Radford et al. 2022)


class WhisperEncoder(nn.Module):
    """Log-mel spectrogram [batch, 80, 3000] (30 s) -> hidden states [batch, 1500, 384]: two
    1-D convolutions (kernel 3, the second of stride 2, GELU), fixed sinusoidal positions and
    four pre-LN layers (6 heads, MLP 1536): 1,500-token attention."""

    def __init__(self, mels: int = 80, frames: int = 3000, hidden: int = 384, heads: int = 6, layers: int = 4):
        super().__init__()
        self.example_shape = (mels, frames)
        self.hidden, self.seq = hidden, frames // 2
        self.conv1 = nn.Conv1d(mels, hidden, 3, padding=1)
        self.conv2 = nn.Conv1d(hidden, hidden, 3, stride=2, padding=1)
        inv = torch.exp(-torch.log(torch.tensor(10000.0)) / (hidden // 2 - 1) * torch.arange(hidden // 2))
        angles = torch.arange(self.seq)[:, None] * inv[None]
        self.register_buffer("position", torch.cat([angles.sin(), angles.cos()], 1))
        self.layers = nn.Sequential(*[PreLNLayer(hidden, heads, 4 * hidden, self.seq) for _ in range(layers)])
        self.ln = nn.LayerNorm(hidden)

    def forward(self, mel):
        b = mel.shape[0]
        x = nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(mel)))).transpose(1, 2) + self.position
        return self.ln(self.layers(x.reshape(b * self.seq, self.hidden))).reshape(b, self.seq, self.hidden)


# ------------------------------------------------ QuartzNet 5x5 (Kriman et al. 2020)


def _separable(cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1) -> list[nn.Module]:
    """A time-channel separable 1-D convolution: k-wide depthwise, then pointwise, then BN."""
    return [nn.Conv1d(cin, cin, k, stride, padding=k // 2 * dilation, dilation=dilation, groups=cin, bias=False),
            nn.Conv1d(cin, cout, 1, bias=False), nn.BatchNorm1d(cout)]


class QuartzBlock(nn.Module):
    """R separable convolutions (ReLU between), the block's input through a pointwise
    convolution and BN added before the last ReLU."""

    def __init__(self, cin: int, cout: int, k: int, repeat: int = 5):
        super().__init__()
        body = []
        for i in range(repeat):
            body += _separable(cin if i == 0 else cout, cout, k) + ([nn.ReLU()] if i < repeat - 1 else [])
        self.body = nn.Sequential(*body)
        self.residual = nn.Sequential(nn.Conv1d(cin, cout, 1, bias=False), nn.BatchNorm1d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.residual(x))


class QuartzNet(nn.Module):
    """QuartzNet 5x5 speech recognition over 64 mel features [batch, 64, frames] (10 s: 1,000
    frames) -> character logits [batch, 29, frames / 2]: depthwise 1-D kernels 33 to 87 wide."""

    def __init__(self, features: int = 64, frames: int = 1000, classes: int = 29):
        super().__init__()
        self.example_shape = (features, frames)
        blocks = [QuartzBlock(256, 256, 33), QuartzBlock(256, 256, 39), QuartzBlock(256, 512, 51),
                  QuartzBlock(512, 512, 63), QuartzBlock(512, 512, 75)]
        self.net = nn.Sequential(*_separable(features, 256, 33, stride=2), nn.ReLU(), *blocks,
                                 *_separable(512, 512, 87, dilation=2), nn.ReLU(),
                                 nn.Conv1d(512, 1024, 1, bias=False), nn.BatchNorm1d(1024), nn.ReLU(),
                                 nn.Conv1d(1024, classes, 1))

    def forward(self, x):
        return self.net(x)


# --------------------------------------------------- T5-small's encoder (Raffel et al. 2020)


class T5Layer(nn.Module):
    """Pre-RMSNorm attention without score scaling, a relative position bias added to the
    scores, then a ReLU MLP; no biases. Tokens are [batch*seq, hidden]."""

    def __init__(self, hidden: int, heads: int, intermediate: int, seq: int):
        super().__init__()
        self.seq, self.heads, self.head_dim = seq, heads, hidden // heads
        self.norm1, self.norm2 = RMSNorm(hidden, 1e-6), RMSNorm(hidden, 1e-6)
        self.q, self.k, self.v, self.o = (Dense(hidden, hidden, False) for _ in range(4))
        self.mlp = nn.Sequential(Dense(hidden, intermediate, False), nn.ReLU(), Dense(intermediate, hidden, False))

    def forward(self, x, bias):
        b = x.shape[0] // self.seq
        h = self.norm1(x)
        q, k, v = (_split_heads(y, self.seq, self.heads) for y in (self.q(h), self.k(h), self.v(h)))
        scores = torch.bmm(q, k.transpose(1, 2))
        attn = torch.softmax(scores.reshape(b, self.heads, self.seq, self.seq) + bias, dim=-1)
        ctx = torch.bmm(attn.reshape(-1, self.seq, self.seq), v)
        x = x + self.o(ctx.reshape(b, self.heads, self.seq, self.head_dim).transpose(1, 2).reshape(x.shape))
        return x + self.mlp(self.norm2(x))


def _t5_buckets(seq: int, buckets: int = 32, max_distance: int = 128, bidirectional: bool = True) -> torch.Tensor:
    """T5's relative position buckets [query, key] over `seq` tokens: exact for small
    distances, logarithmic up to max_distance. Bidirectional (the encoder's): keys after the
    query in the upper half of the buckets; unidirectional (the decoder's): keys after the
    query share bucket 0 with the query itself, which causal attention masks anyway."""
    rel = torch.arange(seq)[None] - torch.arange(seq)[:, None]
    if bidirectional:
        half = buckets // 2
        out = (rel > 0).long() * half
        rel = rel.abs()
    else:
        half, out, rel = buckets, 0, (-rel).clamp(min=0)
    exact = half // 2
    log = exact + (torch.log(rel.float().clamp(min=1) / exact) / torch.log(torch.tensor(max_distance / exact))
                   * (half - exact)).long()
    return out + torch.where(rel < exact, rel, log.clamp(max=half - 1))


class T5Encoder(nn.Module):
    """T5-small's encoder (hidden 512, 8 heads of 64, ReLU MLP 2048, 6 layers) over token
    embeddings [batch, seq, hidden], seq 128. The relative position bias (32 buckets per head,
    shared by the layers) is looked up once here: the sequence length is fixed, and a lookup
    by integer index in the graph would be a task whose index argument a runner fills with
    random bits."""

    def __init__(self, hidden: int = 512, heads: int = 8, intermediate: int = 2048, layers: int = 6, seq: int = 128):
        super().__init__()
        self.hidden, self.seq = hidden, seq
        self.example_shape = (seq, hidden)
        self.relative_bias = nn.Embedding(32, heads)
        self.register_buffer("bias", self.relative_bias.weight.detach()[_t5_buckets(seq)].permute(2, 0, 1)[None])
        self.layers = nn.ModuleList([T5Layer(hidden, heads, intermediate, seq) for _ in range(layers)])
        self.norm = RMSNorm(hidden, 1e-6)

    def forward(self, words):
        b = words.shape[0]
        x = words.reshape(b * self.seq, self.hidden)
        for layer in self.layers:
            x = layer(x, self.bias)
        return self.norm(x).reshape(b, self.seq, self.hidden)


# ------------------------------------------ ECAPA-TDNN (Desplanques et al. 2020), C = 512


class SERes2Block(nn.Module):
    """Pointwise convolution, a Res2Net 1-D convolution (kernel 3, dilated; the channels in 8
    groups, each after the first added to the previous group's output), pointwise again,
    squeeze-excitation over time and the residual; ReLU then BN after each convolution."""

    def __init__(self, c: int, dilation: int, scale: int = 8, se: int = 128):
        super().__init__()
        self.scale, width = scale, c // scale
        self.pre = nn.Sequential(nn.Conv1d(c, c, 1), nn.ReLU(), nn.BatchNorm1d(c))
        self.res2 = nn.ModuleList([nn.Sequential(nn.Conv1d(width, width, 3, padding=dilation, dilation=dilation),
                                                 nn.ReLU(), nn.BatchNorm1d(width)) for _ in range(scale - 1)])
        self.post = nn.Sequential(nn.Conv1d(c, c, 1), nn.ReLU(), nn.BatchNorm1d(c))
        self.se = nn.Sequential(nn.Conv1d(c, se, 1), nn.ReLU(), nn.Conv1d(se, c, 1), nn.Sigmoid())

    def forward(self, x):
        parts = torch.chunk(self.pre(x), self.scale, dim=1)
        out, y = [parts[0]], None
        for i, conv in enumerate(self.res2):
            y = conv(parts[i + 1] if y is None else parts[i + 1] + y)
            out.append(y)
        h = self.post(torch.cat(out, 1))
        return x + h * self.se(h.mean(dim=2, keepdim=True))


class ECAPATDNN(nn.Module):
    """ECAPA-TDNN speaker embedding over 80 filterbanks [batch, 80, frames] (3 s: 300 frames)
    -> [batch, 192]: a kernel-5 convolution, three SE-Res2 blocks (dilations 2, 3, 4), their
    outputs joined by a pointwise convolution to 1,536 channels, attentive statistics pooling
    with the utterance's mean and deviation as context, and a 192-wide embedding."""

    def __init__(self, features: int = 80, frames: int = 300, c: int = 512, joined: int = 1536, embedding: int = 192):
        super().__init__()
        self.example_shape = (features, frames)
        self.front = nn.Sequential(nn.Conv1d(features, c, 5, padding=2), nn.ReLU(), nn.BatchNorm1d(c))
        self.blocks = nn.ModuleList([SERes2Block(c, d) for d in (2, 3, 4)])
        self.join = nn.Sequential(nn.Conv1d(3 * c, joined, 1), nn.ReLU())
        self.attention = nn.Sequential(nn.Conv1d(3 * joined, 128, 1), nn.ReLU(), nn.BatchNorm1d(128), nn.Tanh(),
                                       nn.Conv1d(128, joined, 1))
        self.head = nn.Sequential(nn.BatchNorm1d(2 * joined), nn.Linear(2 * joined, embedding), nn.BatchNorm1d(embedding))

    @staticmethod
    def _stats(x, w):
        mean = (x * w).sum(dim=2, keepdim=True)
        return mean, torch.sqrt(((x - mean) ** 2 * w).sum(dim=2, keepdim=True).clamp(min=1e-12))

    def forward(self, x):
        x = self.front(x)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.join(torch.cat(outs, 1))
        frames = x.shape[2]
        mean, std = self._stats(x, torch.full_like(x[:, :1], 1.0 / frames))
        context = torch.cat([x, mean.expand_as(x), std.expand_as(x)], 1)
        w = torch.softmax(self.attention(context), dim=2)
        mean, std = self._stats(x, w)
        return self.head(torch.cat([mean, std], 1)[:, :, 0])


# ----------------------------------------------- Conformer-S encoder (Gulati et al. 2020)


class ConformerLayer(nn.Module):
    """Half-step feed-forward (SiLU), pre-LN self-attention (plain scaled dot product: the
    paper's relative-position terms are left out, as torchaudio's Conformer does), the
    convolution module (pointwise to 2d, GLU, depthwise kernel 31, BN, SiLU, pointwise), a
    second half-step feed-forward and a final LayerNorm. Tokens are [batch*seq, hidden]."""

    def __init__(self, hidden: int, heads: int, ffn: int, seq: int, kernel: int = 31):
        super().__init__()
        self.seq, self.heads = seq, heads
        self.ffn1, self.ffn2 = (nn.Sequential(nn.LayerNorm(hidden), Dense(hidden, ffn), nn.SiLU(), Dense(ffn, hidden))
                                for _ in range(2))
        self.norm_attn = nn.LayerNorm(hidden)
        self.qkv, self.o = Dense(hidden, 3 * hidden), Dense(hidden, hidden)
        self.norm_conv = nn.LayerNorm(hidden)
        self.conv = nn.Sequential(nn.Conv1d(hidden, 2 * hidden, 1), nn.GLU(dim=1),
                                  nn.Conv1d(hidden, hidden, kernel, padding=kernel // 2, groups=hidden),
                                  nn.BatchNorm1d(hidden), nn.SiLU(), nn.Conv1d(hidden, hidden, 1))
        self.norm_out = nn.LayerNorm(hidden)

    def forward(self, x):
        b, d = x.shape[0] // self.seq, x.shape[1]
        x = x + 0.5 * self.ffn1(x)
        qkv = self.qkv(self.norm_attn(x))
        q, k, v = (_split_heads(qkv[:, i * d:(i + 1) * d], self.seq, self.heads) for i in range(3))
        x = x + self.o(_attend(q, k, v, self.heads))
        h = self.norm_conv(x).reshape(b, self.seq, d).transpose(1, 2)
        x = x + self.conv(h).transpose(1, 2).reshape(x.shape)
        return self.norm_out(x + 0.5 * self.ffn2(x))


class ConformerEncoder(nn.Module):
    """Conformer-S (hidden 144, 4 heads, feed-forward 576, 16 layers, depthwise kernel 31)
    over 80 filterbanks [batch, frames, 80] (10 s: 1,000 frames): two 3x3 stride-2
    convolutions (ReLU) subsample time by 4 to 249 frames, a linear projection, the layers.
    8.35M parameters: the paper's 10.3M also counts its decoder."""

    def __init__(self, features: int = 80, frames: int = 1000, hidden: int = 144, heads: int = 4, ffn: int = 576,
                 layers: int = 16):
        super().__init__()
        self.example_shape = (frames, features)
        self.subsample = nn.Sequential(nn.Conv2d(1, hidden, 3, 2), nn.ReLU(), nn.Conv2d(hidden, hidden, 3, 2), nn.ReLU())
        t, f = (frames - 3) // 2 + 1, (features - 3) // 2 + 1
        self.seq, self.hidden, self.width = (t - 3) // 2 + 1, hidden, (f - 3) // 2 + 1
        self.project = Dense(hidden * self.width, hidden)
        self.layers = nn.Sequential(*[ConformerLayer(hidden, heads, ffn, self.seq) for _ in range(layers)])

    def forward(self, x):
        b = x.shape[0]
        x = self.subsample(x[:, None]).permute(0, 2, 1, 3).reshape(b * self.seq, self.hidden * self.width)
        return self.layers(self.project(x)).reshape(b, self.seq, self.hidden)


# ------------------------------------------- Conv-TasNet (Luo and Mesgarani 2019)


class GlobalLayerNorm(nn.Module):
    """Conv-TasNet's gLN: normalized over channels and time together, a gain and bias per
    channel. The same function as nn.GroupNorm(1, c); written out as the reference
    implementation has it, which is the graph (and the task ids) the seventh release holds."""

    def __init__(self, c: int, eps: float = 1e-8):
        super().__init__()
        self.gamma, self.beta, self.eps = nn.Parameter(torch.ones(1, c, 1)), nn.Parameter(torch.zeros(1, c, 1)), eps

    def forward(self, x):
        mean = x.mean(dim=(1, 2), keepdim=True)
        var = ((x - mean) ** 2).mean(dim=(1, 2), keepdim=True)
        return self.gamma * (x - mean) / torch.sqrt(var + self.eps) + self.beta


class TasBlock(nn.Module):
    """Pointwise B -> H, PReLU, gLN, dilated depthwise (kernel 3), PReLU, gLN, then pointwise
    to the residual path and to the skip path."""

    def __init__(self, b: int, h: int, skip: int, dilation: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(b, h, 1), nn.PReLU(), GlobalLayerNorm(h),
                                  nn.Conv1d(h, h, 3, padding=dilation, dilation=dilation, groups=h), nn.PReLU(),
                                  GlobalLayerNorm(h))
        self.residual, self.skip = nn.Conv1d(h, b, 1), nn.Conv1d(h, skip, 1)

    def forward(self, x):
        y = self.body(x)
        return x + self.residual(y), self.skip(y)


class ConvTasNet(nn.Module):
    """Conv-TasNet speech separation of 1 s at 8 kHz [batch, 8000] -> 2 sources [batch, 2,
    8000], the paper's best (N 512, L 16, B 128, H 512, Sc 128, P 3, X 8, R 3; 5.1M
    parameters): a 16-sample stride-8 encoder to 512 bases, gLN and a bottleneck to 128
    channels, 3 repeats of 8 blocks (dilations 1 to 128) summing their skip outputs, sigmoid
    masks and a transposed-convolution decoder."""

    def __init__(self, samples: int = 8000, n: int = 512, length: int = 16, b: int = 128, h: int = 512,
                 skip: int = 128, x: int = 8, r: int = 3, sources: int = 2):
        super().__init__()
        self.example_shape = (samples,)
        self.n, self.sources = n, sources
        self.encoder = nn.Conv1d(1, n, length, stride=length // 2, bias=False)
        self.bottleneck = nn.Sequential(GlobalLayerNorm(n), nn.Conv1d(n, b, 1))
        self.blocks = nn.ModuleList([TasBlock(b, h, skip, 2**i) for _ in range(r) for i in range(x)])
        self.mask = nn.Sequential(nn.PReLU(), nn.Conv1d(skip, sources * n, 1), nn.Sigmoid())
        self.decoder = nn.ConvTranspose1d(n, 1, length, stride=length // 2, bias=False)

    def forward(self, audio):
        batch = audio.shape[0]
        w = torch.relu(self.encoder(audio[:, None]))
        x, skips = self.bottleneck(w), 0
        for block in self.blocks:
            x, s = block(x)
            skips = skips + s
        masked = self.mask(skips).reshape(batch, self.sources, self.n, -1) * w[:, None]
        out = self.decoder(masked.reshape(batch * self.sources, self.n, -1))
        return out.reshape(batch, self.sources, -1)


# ------------------------------------------------------- U-Net (Ronneberger et al. 2015)


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """U-Net segmentation [batch, 3, 128, 128] -> [batch, 2, 128, 128] at the common
    PyTorch layout (two padded 3x3 convolutions with BatchNorm per level, 64 to 1024
    channels over five levels, 2x2 max pools down, 2x2 stride-2 transposed convolutions up,
    each concatenated with the skip of its level; 31.0M parameters)."""

    def __init__(self, size: int = 128, channels: int = 3, classes: int = 2):
        super().__init__()
        self.example_shape = (channels, size, size)
        widths = [64, 128, 256, 512, 1024]
        self.down = nn.ModuleList([_double_conv(channels, 64)] +
                                  [_double_conv(a, b) for a, b in zip(widths, widths[1:])])
        self.up = nn.ModuleList([nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in zip(widths[::-1][1:], widths[::-1])])
        self.merge = nn.ModuleList([_double_conv(b, a) for a, b in zip(widths[::-1][1:], widths[::-1])])
        self.pool, self.head = nn.MaxPool2d(2), nn.Conv2d(64, classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, skips[-2::-1]):
            x = merge(torch.cat([skip, up(x)], dim=1))
        return self.head(x)


# ------------------------------------------------------------- YOLOv5s (Ultralytics v6.0)


class _ConvBNSiLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, padding: int | None = None):
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2 if padding is None else padding, bias=False),
                         nn.BatchNorm2d(cout), nn.SiLU())


class _C3(nn.Module):
    """CSP bottleneck with three convolutions: n bottlenecks (1x1, 3x3, optional residual) on
    half the channels, concatenated with a 1x1 of the input, then a 1x1."""

    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = True):
        super().__init__()
        c = cout // 2
        self.cv1, self.cv2, self.cv3 = _ConvBNSiLU(cin, c), _ConvBNSiLU(cin, c), _ConvBNSiLU(2 * c, cout)
        self.m = nn.ModuleList([nn.Sequential(_ConvBNSiLU(c, c), _ConvBNSiLU(c, c, 3)) for _ in range(n)])
        self.shortcut = shortcut

    def forward(self, x):
        y = self.cv1(x)
        for block in self.m:
            y = y + block(y) if self.shortcut else block(y)
        return self.cv3(torch.cat([y, self.cv2(x)], dim=1))


class _SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three 5x5 max pools in a row, concatenated."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.cv1, self.cv2 = _ConvBNSiLU(cin, cin // 2), _ConvBNSiLU(cin * 2, cout)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], dim=1))


class YOLOv5s(nn.Module):
    """YOLOv5s (v6.0 layout, 80 classes) over a 320x320 image: CSP backbone (6x6 stride-2
    stem, C3 blocks of 1/2/3/1 bottlenecks, SPPF), PANet neck (nearest 2x upsampling and
    concatenation up, stride-2 3x3 down), three 1x1 detection heads of 3 anchors x 85,
    sigmoid; the outputs of the three scales concatenated [batch, 3, 85, 2100]; 7,235,389
    parameters, as the model summary counts them before BatchNorm is fused."""

    def __init__(self, size: int = 320, classes: int = 80):
        super().__init__()
        self.example_shape = (3, size, size)
        self.backbone = nn.ModuleList([
            _ConvBNSiLU(3, 32, 6, 2, 2), _ConvBNSiLU(32, 64, 3, 2), _C3(64, 64, 1),
            _ConvBNSiLU(64, 128, 3, 2), _C3(128, 128, 2), _ConvBNSiLU(128, 256, 3, 2), _C3(256, 256, 3),
            _ConvBNSiLU(256, 512, 3, 2), _C3(512, 512, 1), _SPPF(512, 512)])
        self.lateral5, self.top4 = _ConvBNSiLU(512, 256), _C3(512, 256, 1, False)
        self.lateral4, self.out3 = _ConvBNSiLU(256, 128), _C3(256, 128, 1, False)
        self.down3, self.out4 = _ConvBNSiLU(128, 128, 3, 2), _C3(256, 256, 1, False)
        self.down4, self.out5 = _ConvBNSiLU(256, 256, 3, 2), _C3(512, 512, 1, False)
        self.heads = nn.ModuleList([nn.Conv2d(c, 3 * (classes + 5), 1) for c in (128, 256, 512)])
        self.outputs = classes + 5

    def forward(self, x):
        features = []
        for i, layer in enumerate(self.backbone):
            x = layer(x)
            if i in (4, 6):
                features.append(x)
        p3, p4 = features
        l5 = self.lateral5(x)
        up = nn.functional.interpolate(l5, scale_factor=2.0, mode="nearest")
        l4 = self.lateral4(self.top4(torch.cat([up, p4], dim=1)))
        up = nn.functional.interpolate(l4, scale_factor=2.0, mode="nearest")
        o3 = self.out3(torch.cat([up, p3], dim=1))
        o4 = self.out4(torch.cat([self.down3(o3), l4], dim=1))
        o5 = self.out5(torch.cat([self.down4(o4), l5], dim=1))
        batch = x.shape[0]
        maps = [head(o).reshape(batch, 3, self.outputs, -1) for head, o in zip(self.heads, (o3, o4, o5))]
        return torch.sigmoid(torch.cat(maps, dim=3))


# --------------------------------------------------------- X3D-XS (Feichtenhofer 2020)


class _X3DBlock(nn.Module):
    """1x1x1 expansion (2.25x), 3x3x3 depthwise with squeeze-excite on every other block
    and swish, 1x1x1 projection; the residual through a strided 1x1x1 where the shape
    changes; ReLU after the sum."""

    def __init__(self, cin: int, cout: int, stride: int, se: bool):
        super().__init__()
        inner = int(2.25 * cout)
        self.a = nn.Sequential(nn.Conv3d(cin, inner, 1, bias=False), nn.BatchNorm3d(inner), nn.ReLU())
        self.b = nn.Sequential(nn.Conv3d(inner, inner, 3, (1, stride, stride), 1, groups=inner, bias=False),
                               nn.BatchNorm3d(inner))
        reduced = _se_width(inner)
        self.se = nn.Sequential(nn.Conv3d(inner, reduced, 1), nn.ReLU(), nn.Conv3d(reduced, inner, 1),
                                nn.Sigmoid()) if se else None
        self.c = nn.Sequential(nn.Conv3d(inner, cout, 1, bias=False), nn.BatchNorm3d(cout))
        self.shortcut = (nn.Sequential(nn.Conv3d(cin, cout, 1, (1, stride, stride), bias=False), nn.BatchNorm3d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = self.b(self.a(x))
        if self.se is not None:
            y = y * self.se(y.mean(dim=(2, 3, 4), keepdim=True))
        y = self.c(y * torch.sigmoid(y))
        return torch.relu(y + self.shortcut(x))


def _se_width(channels: int, ratio: float = 0.0625, divisor: int = 8) -> int:
    """X3D's squeeze width: channels x ratio rounded to a multiple of 8 (at least 8, and
    not 10% below the exact width)."""
    width = channels * ratio
    out = max(divisor, int(width + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * width else out


class X3D(nn.Module):
    """X3D-XS action recognition over 4 frames of 160x160 [batch, 3, 4, 160, 160] -> 400
    Kinetics classes: a 1x3x3 stride-2 stem and a 5x1x1 depthwise temporal convolution,
    four stages of 3/5/11/7 blocks of widths 24/48/96/192 (3-D depthwise convolutions
    throughout), a 1x1x1 to 432, global pooling, 2048 and the classifier; 3.8M parameters."""

    def __init__(self, frames: int = 4, size: int = 160, classes: int = 400):
        super().__init__()
        self.example_shape = (3, frames, size, size)
        self.stem = nn.Sequential(nn.Conv3d(3, 24, (1, 3, 3), (1, 2, 2), (0, 1, 1), bias=False),
                                  nn.Conv3d(24, 24, (5, 1, 1), padding=(2, 0, 0), groups=24, bias=False),
                                  nn.BatchNorm3d(24), nn.ReLU())
        blocks, cin = [], 24
        for cout, depth in zip((24, 48, 96, 192), (3, 5, 11, 7)):
            for i in range(depth):
                blocks.append(_X3DBlock(cin, cout, 2 if i == 0 else 1, se=i % 2 == 0))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Conv3d(192, 432, 1, bias=False), nn.BatchNorm3d(432), nn.ReLU())
        self.post = nn.Linear(432, 2048, bias=False)
        self.classifier = nn.Linear(2048, classes)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.classifier(torch.relu(self.post(x.mean(dim=(2, 3, 4)))))


# ------------------------------------------------------------ Swin-T (Liu et al. 2021)


def _window_mask(size: int, window: int, shift: int) -> torch.Tensor:
    """Swin's shifted-window mask [windows, w*w, w*w]: -100 between tokens that the cyclic
    shift brought into one window from different regions of the map, 0 elsewhere."""
    region = torch.zeros(size, size)
    cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, (hs, ws) in enumerate((h, w) for h in cuts for w in cuts):
        region[hs, ws] = i
    n = size // window
    ids = region.view(n, window, n, window).permute(0, 2, 1, 3).reshape(n * n, window * window)
    diff = ids.unsqueeze(1) - ids.unsqueeze(2)
    return torch.zeros_like(diff).masked_fill(diff != 0, -100.0)


class _SwinBlock(nn.Module):
    """Pre-LN (shifted) window attention with a learned relative position bias per head,
    then an MLP (4x, GELU), over a channels-last map [batch, size, size, dim]."""

    def __init__(self, dim: int, heads: int, size: int, shift: bool, window: int = 7):
        super().__init__()
        self.heads, self.window = heads, window
        self.shift = window // 2 if shift and size > window else 0
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("relative_position_index", (rel[..., 0] * (2 * window - 1) + rel[..., 1]).flatten(),
                             persistent=False)
        if self.shift:
            self.register_buffer("mask", _window_mask(size, window, self.shift), persistent=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def _attention(self, x):
        b, size, _, dim = x.shape
        w, n, heads = self.window, size // self.window, self.heads
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        x = x.view(b, n, w, n, w, dim).permute(0, 1, 3, 2, 4, 5).reshape(b * n * n, w * w, dim)
        q, k, v = self.qkv(x).reshape(b * n * n, w * w, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        attn = (q * (dim // heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index].view(w * w, w * w, heads)
        attn = attn + bias.permute(2, 0, 1).unsqueeze(0)
        if self.shift:
            attn = (attn.view(b, n * n, heads, w * w, w * w) + self.mask.unsqueeze(1).unsqueeze(0)).view(-1, heads, w * w, w * w)
        x = (attn.softmax(-1) @ v).transpose(1, 2).reshape(b * n * n, w * w, dim)
        x = self.proj(x).view(b, n, n, w, w, dim).permute(0, 1, 3, 2, 4, 5).reshape(b, size, size, dim)
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        return x

    def forward(self, x):
        x = x + self._attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _PatchMerging(nn.Module):
    """2x2 neighbours concatenated (4 x dim), LayerNorm, a bias-free projection to 2 x dim."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.reduction = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(x))


class SwinT(nn.Module):
    """Swin-T at 224x224 (torchvision's swin_t layout): 4x4 patches to 96 channels, stages of
    2, 2, 6 and 2 blocks (3, 6, 12, 24 heads) over 7x7 windows, every other block's windows
    shifted by 3 (not at the last stage, whose map is one window), patch merging between
    stages, 1000 classes; 28,288,354 parameters."""

    def __init__(self, size: int = 224, classes: int = 1000):
        super().__init__()
        self.example_shape = (3, size, size)
        self.patch = nn.Conv2d(3, 96, 4, 4)
        self.patch_norm = nn.LayerNorm(96)
        layers, dim, side = [], 96, size // 4
        for stage, (depth, heads) in enumerate(zip((2, 2, 6, 2), (3, 6, 12, 24))):
            layers += [_SwinBlock(dim, heads, side, shift=i % 2 == 1) for i in range(depth)]
            if stage < 3:
                layers.append(_PatchMerging(dim))
                dim, side = dim * 2, side // 2
        self.layers = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.layers(self.patch_norm(self.patch(x).permute(0, 2, 3, 1)))
        return self.head(self.norm(x).mean(dim=(1, 2)))


# ------------------------------------------------------------ DenseNet-121 (Huang et al. 2017)


class _DenseLayer(nn.Module):
    """BN, ReLU, a 1x1 convolution to 4 x growth, BN, ReLU, a 3x3 convolution to growth, over
    the concatenation of every earlier map of its block (pre-activation, as torchvision)."""

    def __init__(self, cin: int, growth: int = 32):
        super().__init__()
        self.layers = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                    nn.BatchNorm2d(4 * growth), nn.ReLU(),
                                    nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, features: list):
        return self.layers(torch.cat(features, dim=1))


class DenseNet121(nn.Module):
    """DenseNet-121 at 224x224 (torchvision's densenet121 layout): a 7x7 stride-2 stem and a
    3x3 max pool, four dense blocks of 6/12/24/16 layers (growth 32: each layer reads the
    concatenation of every earlier map of its block), transitions (BN, ReLU, a 1x1 convolution
    halving the channels, 2x2 average pooling) between them, 1000 classes; 7,978,856
    parameters."""

    def __init__(self, size: int = 224, classes: int = 1000, growth: int = 32):
        super().__init__()
        self.example_shape = (3, size, size)
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.blocks, self.transitions, c = nn.ModuleList(), nn.ModuleList(), 64
        for i, depth in enumerate((6, 12, 24, 16)):
            self.blocks.append(nn.ModuleList(_DenseLayer(c + j * growth, growth) for j in range(depth)))
            c += depth * growth
            if i < 3:
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                                                      nn.AvgPool2d(2, 2)))
                c //= 2
        self.norm, self.classifier = nn.BatchNorm2d(c), nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, dim=1)
            if i < len(self.transitions):
                x = self.transitions[i](x)
        return self.classifier(torch.relu(self.norm(x)).mean(dim=(2, 3)))


# ------------------------------------------------------------ Inception-v3 (Szegedy et al. 2016)


def _conv_bn_relu(cin: int, cout: int, kernel, stride: int = 1, padding=0) -> nn.Sequential:
    """Inception's basic convolution: bias-free, BatchNorm (eps 0.001), ReLU."""
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding, bias=False), nn.BatchNorm2d(cout, eps=0.001),
                         nn.ReLU())


def _conv_1x7(cin: int, cout: int) -> nn.Sequential:
    return _conv_bn_relu(cin, cout, (1, 7), padding=(0, 3))


def _conv_7x1(cin: int, cout: int) -> nn.Sequential:
    return _conv_bn_relu(cin, cout, (7, 1), padding=(3, 0))


class _InceptionBlock(nn.Module):
    """Branches side by side over one input, concatenated over channels."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([branch(x) for branch in self.branches], dim=1)


def _expanded_bank(c: int) -> _InceptionBlock:
    """Inception-v3's expanded filter bank: a 1x3 and a 3x1 convolution side by side on one map."""
    return _InceptionBlock(_conv_bn_relu(c, c, (1, 3), padding=(0, 1)),
                           _conv_bn_relu(c, c, (3, 1), padding=(1, 0)))


def _avg_pool_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, 1, 1), _conv_bn_relu(cin, cout, 1))


def _inception_a(cin: int, pool: int) -> _InceptionBlock:
    return _InceptionBlock(_conv_bn_relu(cin, 64, 1),
                           nn.Sequential(_conv_bn_relu(cin, 48, 1), _conv_bn_relu(48, 64, 5, padding=2)),
                           nn.Sequential(_conv_bn_relu(cin, 64, 1), _conv_bn_relu(64, 96, 3, padding=1),
                                         _conv_bn_relu(96, 96, 3, padding=1)),
                           _avg_pool_conv(cin, pool))


def _inception_c(c7: int) -> _InceptionBlock:
    """The 17x17 module: 7x7 convolutions factorized into 1x7 and 7x1 (once and twice)."""
    return _InceptionBlock(_conv_bn_relu(768, 192, 1),
                           nn.Sequential(_conv_bn_relu(768, c7, 1), _conv_1x7(c7, c7), _conv_7x1(c7, 192)),
                           nn.Sequential(_conv_bn_relu(768, c7, 1), _conv_7x1(c7, c7), _conv_1x7(c7, c7),
                                         _conv_7x1(c7, c7), _conv_1x7(c7, 192)),
                           _avg_pool_conv(768, 192))


def _inception_e(cin: int) -> _InceptionBlock:
    """The 8x8 module: 3x3 convolutions expanded into 1x3 and 3x1 side by side."""
    return _InceptionBlock(_conv_bn_relu(cin, 320, 1),
                           nn.Sequential(_conv_bn_relu(cin, 384, 1), _expanded_bank(384)),
                           nn.Sequential(_conv_bn_relu(cin, 448, 1), _conv_bn_relu(448, 384, 3, padding=1),
                                         _expanded_bank(384)),
                           _avg_pool_conv(cin, 192))


class InceptionV3(nn.Module):
    """Inception-v3 at 299x299 (torchvision's inception_v3 layout, without the training-only
    auxiliary classifier): a five-convolution stem with two 3x3 max pools, three 35x35
    modules, a grid reduction, four 17x17 modules of factorized 7x7 convolutions (1x7, 7x1),
    a second reduction, two 8x8 modules of expanded 1x3/3x1 filter banks, 1000 classes;
    23,834,568 parameters."""

    def __init__(self, size: int = 299, classes: int = 1000):
        super().__init__()
        self.example_shape = (3, size, size)
        self.stem = nn.Sequential(_conv_bn_relu(3, 32, 3, 2), _conv_bn_relu(32, 32, 3),
                                  _conv_bn_relu(32, 64, 3, padding=1), nn.MaxPool2d(3, 2), _conv_bn_relu(64, 80, 1),
                                  _conv_bn_relu(80, 192, 3), nn.MaxPool2d(3, 2))
        reduce_b = _InceptionBlock(_conv_bn_relu(288, 384, 3, 2),
                                   nn.Sequential(_conv_bn_relu(288, 64, 1), _conv_bn_relu(64, 96, 3, padding=1),
                                                 _conv_bn_relu(96, 96, 3, 2)),
                                   nn.MaxPool2d(3, 2))
        reduce_d = _InceptionBlock(nn.Sequential(_conv_bn_relu(768, 192, 1), _conv_bn_relu(192, 320, 3, 2)),
                                   nn.Sequential(_conv_bn_relu(768, 192, 1), _conv_1x7(192, 192), _conv_7x1(192, 192),
                                                 _conv_bn_relu(192, 192, 3, 2)),
                                   nn.MaxPool2d(3, 2))
        self.blocks = nn.Sequential(_inception_a(192, 32), _inception_a(256, 64), _inception_a(288, 64), reduce_b,
                                    _inception_c(128), _inception_c(160), _inception_c(160), _inception_c(192),
                                    reduce_d, _inception_e(1280), _inception_e(2048))
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


# ------------------------------------------------------------ GoogLeNet (Szegedy et al. 2015)


def _inception_v1(cin: int, c1: int, c3_reduce: int, c3: int, c5_reduce: int, c5: int, pool: int) -> _InceptionBlock:
    """GoogLeNet's module: 1x1; 1x1 then 3x3; 1x1 then 3x3 (torchvision's layout, where the
    paper has 5x5); a 3x3 stride-1 max pool then 1x1."""
    return _InceptionBlock(_conv_bn_relu(cin, c1, 1),
                           nn.Sequential(_conv_bn_relu(cin, c3_reduce, 1), _conv_bn_relu(c3_reduce, c3, 3, padding=1)),
                           nn.Sequential(_conv_bn_relu(cin, c5_reduce, 1), _conv_bn_relu(c5_reduce, c5, 3, padding=1)),
                           nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), _conv_bn_relu(cin, pool, 1)))


class GoogLeNet(nn.Module):
    """GoogLeNet at 224x224 (torchvision's googlenet layout, without the training-only
    auxiliary classifiers): a 7x7 stride-2 stem, 1x1 and 3x3 convolutions, nine inception
    modules of four branches over 28x28, 14x14 and 7x7 maps with ceil-mode max pools
    between, 1000 classes; 6,624,904 parameters."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        pool = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.stem = nn.Sequential(_conv_bn_relu(3, 64, 7, 2, 3), pool, _conv_bn_relu(64, 64, 1),
                                  _conv_bn_relu(64, 192, 3, padding=1), pool)
        self.blocks = nn.Sequential(
            _inception_v1(192, 64, 96, 128, 16, 32, 32), _inception_v1(256, 128, 128, 192, 32, 96, 64), pool,
            _inception_v1(480, 192, 96, 208, 16, 48, 64), _inception_v1(512, 160, 112, 224, 24, 64, 64),
            _inception_v1(512, 128, 128, 256, 24, 64, 64), _inception_v1(512, 112, 144, 288, 32, 64, 64),
            _inception_v1(528, 256, 160, 320, 32, 128, 128), nn.MaxPool2d(2, 2, ceil_mode=True),
            _inception_v1(832, 256, 160, 320, 32, 128, 128), _inception_v1(832, 384, 192, 384, 48, 128, 128))
        self.fc = nn.Linear(1024, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


# ------------------------------------------------------------ RegNet-X/Y-400MF (Radosavovic et al. 2020)


class _RegNetBlock(nn.Module):
    """RegNet's X and Y blocks: 1x1, a 3x3 group convolution (groups of `group_width`
    channels) carrying the stride, in Y squeeze-and-excitation (ReLU, sigmoid, a quarter of
    the block's input channels), 1x1 without activation, then the (projected) shortcut and
    ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, group_width: int = 8, se: bool = True):
        super().__init__()
        layers = [nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                  nn.Conv2d(cout, cout, 3, stride, 1, groups=cout // group_width, bias=False),
                  nn.BatchNorm2d(cout), nn.ReLU()]
        if se:
            layers.append(SqueezeExcite(cout, round(cin / 4), nn.ReLU, nn.Sigmoid))
        self.f = nn.Sequential(*layers, nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = _downsample(cin, cout, stride)

    def forward(self, x):
        return torch.relu(self.shortcut(x) + self.f(x))


class _RegNet(nn.Module):
    """A RegNet at 224x224 in torchvision's layout: a 3x3 stride-2 stem to 32 channels, four
    stages of blocks (each stage's first halves the map), a global mean, 1000 classes."""

    # (width, blocks) of the four stages; channels per group; squeeze-and-excitation or not
    STAGES: list[tuple[int, int]]
    GROUP_WIDTH: int
    SE: bool

    def __init__(self, size: int = 224, classes: int = 1000):
        super().__init__()
        self.example_shape = (3, size, size)
        layers, cin = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()], 32
        for width, depth in self.STAGES:
            for i in range(depth):
                layers.append(_RegNetBlock(cin, width, 2 if i == 0 else 1, self.GROUP_WIDTH, self.SE))
                cin = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


class RegNetY400MF(_RegNet):
    """RegNetY-400MF (torchvision's regnet_y_400mf): stages of 1/3/6/6 Y blocks (groups of 8
    channels) at widths 48/104/208/440; 4,344,144 parameters."""

    STAGES, GROUP_WIDTH, SE = [(48, 1), (104, 3), (208, 6), (440, 6)], 8, True


class RegNetX400MF(_RegNet):
    """RegNetX-400MF (torchvision's regnet_x_400mf): stages of 1/2/7/12 X blocks (no
    squeeze-and-excitation; groups of 16 channels) at widths 32/64/160/400; 5,495,976
    parameters."""

    STAGES, GROUP_WIDTH, SE = [(32, 1), (64, 2), (160, 7), (400, 12)], 16, False


# ------------------------------------------------------ MobileViT-XS (Mehta and Rastegari 2022)


class _MobileViTBlock(nn.Module):
    """Local 3x3 and 1x1 convolutions; the map cut into 2x2 patches and unfolded into four
    sequences (one per position inside a patch) that pre-LN transformer layers (4 heads, SiLU
    MLP of twice the width) mix across the whole map; folded back, projected 1x1 and fused
    with the block's input by a 3x3 convolution."""

    def __init__(self, channels: int, dim: int, depth: int, tokens: int, patch: int = 2):
        super().__init__()
        self.dim, self.patch = dim, patch
        self.local = nn.Sequential(_ConvBNSiLU(channels, channels, 3), nn.Conv2d(channels, dim, 1, bias=False))
        self.transformer = nn.Sequential(*[PreLNLayer(dim, 4, 2 * dim, tokens, act=nn.SiLU) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.project = _ConvBNSiLU(dim, channels)
        self.fuse = _ConvBNSiLU(2 * channels, channels, 3)

    def forward(self, x):
        b, _, h, w = x.shape
        p = self.patch
        y = self.local(x).reshape(b, self.dim, h // p, p, w // p, p).permute(0, 3, 5, 2, 4, 1)
        y = self.norm(self.transformer(y.reshape(-1, self.dim)))
        y = y.reshape(b, p, p, h // p, w // p, self.dim).permute(0, 5, 3, 1, 4, 2).reshape(b, self.dim, h, w)
        return self.fuse(torch.cat([x, self.project(y)], 1))


class MobileViTXS(nn.Module):
    """MobileViT-XS at 256x256 (timm's mobilevit_xs layout): a 3x3 stride-2 stem to 16
    channels, inverted residuals to 32 and 3 x 48, then three stages that each halve the map
    with an inverted residual and mix it globally with a MobileViT block (64/80/96 channels,
    transformer widths 96/120/144, depths 2/4/3, over 32x32, 16x16 and 8x8 maps), a 1x1
    convolution to 384, 1000 classes; 2,317,848 parameters."""

    STAGES = [(64, 96, 2), (80, 120, 4), (96, 144, 3)]

    def __init__(self, size: int = 256, classes: int = 1000):
        super().__init__()
        self.example_shape = (3, size, size)
        block = lambda cin, cout, stride: InvertedResidual(cin, cout, stride, 4, act=nn.SiLU)  # noqa: E731
        layers = [_ConvBNSiLU(3, 16, 3, 2), block(16, 32, 1)]
        layers += [block(32 if i == 0 else 48, 48, 2 if i == 0 else 1) for i in range(3)]
        cin, side = 48, size // 4
        for channels, dim, depth in self.STAGES:
            side //= 2
            layers += [block(cin, channels, 2), _MobileViTBlock(channels, dim, depth, (side // 2) ** 2)]
            cin = channels
        layers.append(_ConvBNSiLU(cin, 384))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(384, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


class _EfficientAttention(nn.Module):
    """SegFormer's self-attention: queries from every token, keys and values from the map
    shrunk by a stride-`reduction` convolution (and a LayerNorm), so attention over N tokens
    costs N x N / reduction^2."""

    def __init__(self, dim: int, heads: int, reduction: int):
        super().__init__()
        self.heads, self.reduction = heads, reduction
        self.query, self.key, self.value, self.out = (Dense(dim, dim) for _ in range(4))
        if reduction > 1:
            self.sr = nn.Conv2d(dim, dim, reduction, reduction)
            self.norm = nn.LayerNorm(dim)

    def forward(self, x, b: int, h: int, w: int):
        q = _split_heads(self.query(x), h * w, self.heads)
        kv, seq = x, h * w
        if self.reduction > 1:
            m = self.sr(x.reshape(b, h, w, -1).permute(0, 3, 1, 2))
            seq = m.shape[2] * m.shape[3]
            kv = self.norm(m.flatten(2).transpose(1, 2).reshape(b * seq, -1))
        k, v = _split_heads(self.key(kv), seq, self.heads), _split_heads(self.value(kv), seq, self.heads)
        return self.out(_attend(q, k, v, self.heads))


class _MixTransformerLayer(nn.Module):
    """A SegFormer encoder layer on [batch*h*w, dim] tokens: pre-LN efficient attention, then
    the Mix-FFN (dense up 4x, a depthwise 3x3 convolution over the map, GELU, dense down),
    which stands in for position embeddings."""

    def __init__(self, dim: int, heads: int, reduction: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = _EfficientAttention(dim, heads, reduction)
        self.up, self.down = Dense(dim, 4 * dim), Dense(4 * dim, dim)
        self.dw = nn.Conv2d(4 * dim, 4 * dim, 3, 1, 1, groups=4 * dim)

    def forward(self, x, b: int, h: int, w: int):
        x = x + self.attention(self.norm1(x), b, h, w)
        y = self.up(self.norm2(x)).reshape(b, h, w, -1).permute(0, 3, 1, 2)
        y = nn.functional.gelu(self.dw(y)).permute(0, 2, 3, 1).reshape(b * h * w, -1)
        return x + self.down(y)


class SegFormerB0(nn.Module):
    """SegFormer-B0 at 256x256 (Hugging Face's nvidia/mit-b0 layout with the all-MLP decode
    head, 150 ADE20K classes): four stages of overlapping patch embeddings (7x7 stride 4, then
    3x3 stride 2) to 32/64/160/256 channels, two Mix-Transformer layers each (1/2/5/8 heads,
    keys and values from the map shrunk 8/4/2/1 times), each stage's map projected to 256,
    upsampled bilinearly to 64x64, concatenated, fused by a 1x1 convolution; 3,752,694
    parameters."""

    STAGES = [(32, 7, 4, 1, 8), (64, 3, 2, 2, 4), (160, 3, 2, 5, 2), (256, 3, 2, 8, 1)]  # dim, patch, stride, heads, reduction

    def __init__(self, size: int = 256, classes: int = 150, depth: int = 2, decoder: int = 256):
        super().__init__()
        self.example_shape = (3, size, size)
        self.embed, self.embed_norm, self.stages, self.norms, self.project = (nn.ModuleList() for _ in range(5))
        cin = 3
        for dim, patch, stride, heads, reduction in self.STAGES:
            self.embed.append(nn.Conv2d(cin, dim, patch, stride, patch // 2))
            self.embed_norm.append(nn.LayerNorm(dim))
            self.stages.append(nn.ModuleList(_MixTransformerLayer(dim, heads, reduction) for _ in range(depth)))
            self.norms.append(nn.LayerNorm(dim))
            self.project.append(Dense(dim, decoder))
            cin = dim
        self.fuse = nn.Sequential(nn.Conv2d(4 * decoder, decoder, 1, bias=False), nn.BatchNorm2d(decoder), nn.ReLU())
        self.classifier = nn.Conv2d(decoder, classes, 1)

    def forward(self, x):
        b, maps, size = x.shape[0], [], None
        for embed, embed_norm, layers, norm, project in zip(self.embed, self.embed_norm, self.stages, self.norms,
                                                            self.project):
            x = embed(x)
            h, w = x.shape[2], x.shape[3]
            t = embed_norm(x.flatten(2).transpose(1, 2).reshape(b * h * w, -1))
            for layer in layers:
                t = layer(t, b, h, w)
            t = norm(t)
            x = t.reshape(b, h, w, -1).permute(0, 3, 1, 2)
            size = size or (h, w)
            m = project(t).reshape(b, h, w, -1).permute(0, 3, 1, 2)
            maps.append(nn.functional.interpolate(m, size=size, mode="bilinear", align_corners=False))
        return self.classifier(self.fuse(torch.cat(maps[::-1], 1)))


# ------------------------------------------------- HiFi-GAN vocoder (Kong et al. 2020)


class _HiFiGANResBlock(nn.Module):
    """Three residual pairs of 1-D convolutions (kernel k; the first dilated 1/3/5, the second
    not), each convolution after a leaky ReLU (slope 0.1)."""

    def __init__(self, channels: int, kernel: int, dilations=(1, 3, 5)):
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, dilation=d, padding=(kernel - 1) * d // 2)
                                    for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2)
                                    for _ in dilations)

    def forward(self, x):
        for conv1, conv2 in zip(self.convs1, self.convs2):
            x = x + conv2(nn.functional.leaky_relu(conv1(nn.functional.leaky_relu(x, 0.1)), 0.1))
        return x


class HiFiGAN(nn.Module):
    """The HiFi-GAN vocoder of SpeechT5 (Hugging Face's microsoft/speecht5_hifigan, weight
    norm folded as at inference): a log-mel spectrogram [batch, frames, 80] (32 frames, 0.5 s
    at 16 kHz) normalized per bin, a 7-wide convolution to 512 channels, four transposed
    convolutions (kernel 8, stride 4) halving the channels to 32, each followed by the mean of
    three residual blocks (kernels 3, 7, 11), then a 7-wide convolution and tanh to a
    waveform [batch, 256 x frames]; 12,656,257 parameters."""

    def __init__(self, frames: int = 32, mels: int = 80, channels: int = 512, rates=(4, 4, 4, 4),
                 kernels=(3, 7, 11)):
        super().__init__()
        self.example_shape = (frames, mels)
        self.register_buffer("mean", torch.zeros(mels))
        self.register_buffer("scale", torch.ones(mels))
        self.conv_pre = nn.Conv1d(mels, channels, 7, padding=3)
        self.upsampler, self.resblocks = nn.ModuleList(), nn.ModuleList()
        for i, rate in enumerate(rates):
            cout = channels // 2 ** (i + 1)
            self.upsampler.append(nn.ConvTranspose1d(cout * 2, cout, 2 * rate, stride=rate, padding=rate // 2))
            self.resblocks.append(nn.ModuleList(_HiFiGANResBlock(cout, k) for k in kernels))
        self.conv_post = nn.Conv1d(cout, 1, 7, padding=3)

    def forward(self, spectrogram):
        x = self.conv_pre(((spectrogram - self.mean) / self.scale).transpose(1, 2))
        for upsample, blocks in zip(self.upsampler, self.resblocks):
            x = upsample(nn.functional.leaky_relu(x, 0.1))
            y = blocks[0](x)
            for block in blocks[1:]:
                y = y + block(x)
            x = y / len(blocks)
        return torch.tanh(self.conv_post(nn.functional.leaky_relu(x))).flatten(1)


# ------------------------------------------------------------ PoolFormer (Yu et al. 2022)


class _PoolFormerBlock(nn.Module):
    """MetaFormer block with pooling as the token mixer: GroupNorm over (C, H, W), a 3x3 average
    pool (padding not counted) minus its input, then GroupNorm, a 1x1 convolution MLP (4x, GELU);
    both branches scaled per channel and added back."""

    def __init__(self, dim: int, mlp_ratio: int = 4, pool: int = 3):
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(1, dim), nn.GroupNorm(1, dim)
        self.pool = nn.AvgPool2d(pool, stride=1, padding=pool // 2, count_include_pad=False)
        self.fc1, self.fc2 = nn.Conv2d(dim, dim * mlp_ratio, 1), nn.Conv2d(dim * mlp_ratio, dim, 1)
        self.scale1 = nn.Parameter(1e-5 * torch.ones(dim, 1, 1))
        self.scale2 = nn.Parameter(1e-5 * torch.ones(dim, 1, 1))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.scale1 * (self.pool(y) - y)
        return x + self.scale2 * self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class PoolFormerS12(nn.Module):
    """PoolFormer-S12 at 224x224 (Hugging Face's sail/poolformer_s12 layout): a 7x7 stride-4
    patch embedding to 64 channels, stages of 2, 2, 6, 2 pooling blocks at 64, 128, 320, 512
    channels joined by 3x3 stride-2 embeddings, GroupNorm, global mean, 1000 classes;
    11,915,176 parameters."""

    def __init__(self, depths=(2, 2, 6, 2), dims=(64, 128, 320, 512), classes: int = 1000):
        super().__init__()
        self.embed = nn.ModuleList(nn.Conv2d(3 if i == 0 else dims[i - 1], dim, 7 if i == 0 else 3,
                                             stride=4 if i == 0 else 2, padding=2 if i == 0 else 1)
                                   for i, dim in enumerate(dims))
        self.stages = nn.ModuleList(nn.Sequential(*(_PoolFormerBlock(dim) for _ in range(depth)))
                                    for depth, dim in zip(depths, dims))
        self.norm = nn.GroupNorm(1, dims[-1])
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        for embed, stage in zip(self.embed, self.stages):
            x = stage(embed(x))
        return self.head(self.norm(x).mean((-2, -1)))


# ------------------------------------------------------ SuperPoint (DeTone et al. 2018)


class SuperPoint(nn.Module):
    """SuperPoint keypoints and descriptors (Hugging Face's magic-leap-community/superpoint
    layout) over a grayscale 240x320 image [batch, 1, 240, 320]: a VGG-style encoder (3x3
    convolutions with ReLU, 64/64/128/128 channels, three 2x2 max pools), a score head (3x3 to
    256, 1x1 to 65 cells, softmax, the 64 cells unfolded into the full-resolution map, non-maximum
    suppression by 9x9 max pools twice) and a descriptor head (3x3 to 256, 1x1 to 256, L2
    normalized) -> (scores [batch, 240, 320], descriptors [batch, 256, 30, 40]); the dense part
    of the model, before keypoints are thresholded and sampled; 1,300,865 parameters."""

    def __init__(self, height: int = 240, width: int = 320, widths=(64, 64, 128, 128), hidden: int = 256,
                 descriptor: int = 256, nms_radius: int = 4):
        super().__init__()
        self.example_shape = (1, height, width)
        self.nms_radius = nms_radius
        layers, cin = [], 1
        for i, cout in enumerate(widths):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU()]
            layers += [nn.MaxPool2d(2)] if i < len(widths) - 1 else []
            cin = cout
        self.encoder = nn.Sequential(*layers)
        self.score = nn.Sequential(nn.Conv2d(cin, hidden, 3, padding=1), nn.ReLU(), nn.Conv2d(hidden, 65, 1))
        self.descriptor = nn.Sequential(nn.Conv2d(cin, hidden, 3, padding=1), nn.ReLU(),
                                        nn.Conv2d(hidden, descriptor, 1))

    def _max_pool(self, x):
        return nn.functional.max_pool2d(x, 2 * self.nms_radius + 1, stride=1, padding=self.nms_radius)

    def forward(self, image):
        x = self.encoder(image)
        scores = nn.functional.pixel_shuffle(self.score(x).softmax(1)[:, :-1], 8)  # [batch, 1, H, W]
        zeros = torch.zeros_like(scores)
        keep = scores == self._max_pool(scores)
        for _ in range(2):
            suppressed = self._max_pool(keep.float()) > 0
            rest = torch.where(suppressed, zeros, scores)
            keep = keep | ((rest == self._max_pool(rest)) & ~suppressed)
        descriptors = nn.functional.normalize(self.descriptor(x), p=2, dim=1)
        return torch.where(keep, scores, zeros).squeeze(1), descriptors


# ------------------------------------------------------------ LeViT (Graham et al. 2021)


class _LinearBN(nn.Module):
    """LeViT's projection: a linear map without bias, then a batch norm over all tokens."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.linear, self.norm = nn.Linear(cin, cout, bias=False), nn.BatchNorm1d(cout)

    def forward(self, x):
        y = self.linear(x)
        return self.norm(y.flatten(0, 1)).reshape_as(y)


def _offset_index(size_in: int, stride: int) -> tuple[torch.Tensor, int]:
    """For every (query, key) pair of a size_in x size_in map whose queries sit on every
    stride-th row and column: the index of its |dy|, |dx| among the distinct offsets, numbered
    in the order they are first met; and how many there are (LeViT's attention-bias table)."""
    size_out = (size_in - 1) // stride + 1
    offsets, index = {}, []
    for qy in range(size_out):
        for qx in range(size_out):
            for ky in range(size_in):
                for kx in range(size_in):
                    index.append(offsets.setdefault((abs(qy * stride - ky), abs(qx * stride - kx)), len(offsets)))
    return torch.tensor(index).view(size_out ** 2, size_in ** 2), len(offsets)


class _LeViTAttention(nn.Module):
    """Multi-head attention over a size x size map's tokens with a learned bias per head and
    relative offset, Hardswish before the output projection. With stride 2 the queries come from
    every other row and column (the map shrinks) and their heads are wider."""

    def __init__(self, dim: int, out: int, heads: int, size: int, key_dim: int = 16, ratio: int = 2,
                 stride: int = 1):
        super().__init__()
        index, offsets = _offset_index(size, stride)
        self.attention_biases = nn.Parameter(torch.zeros(heads, offsets))
        self.register_buffer("index", index, persistent=False)
        self.heads, self.key_dim, self.value_dim, self.size, self.stride = heads, key_dim, ratio * key_dim, size, stride
        queries = heads * key_dim if stride == 1 else 0
        self.qkv = _LinearBN(dim, queries + heads * (key_dim + self.value_dim))
        self.queries = _LinearBN(dim, heads * key_dim) if stride > 1 else None
        self.projection = _LinearBN(heads * self.value_dim, out)

    def forward(self, x):
        b, n, dim = x.shape
        h, k = self.heads, self.key_dim
        if self.queries is None:
            q, key, v = self.qkv(x).view(b, n, h, -1).split([k, k, self.value_dim], 3)
        else:
            key, v = self.qkv(x).view(b, n, h, -1).split([k, self.value_dim], 3)
            shrunk = x.view(b, self.size, self.size, dim)[:, ::self.stride, ::self.stride].reshape(b, -1, dim)
            q = self.queries(shrunk).view(b, shrunk.shape[1], h, k)
        q, key, v = q.transpose(1, 2), key.transpose(1, 2), v.transpose(1, 2)
        attn = q @ key.transpose(-2, -1) * k ** -0.5 + self.attention_biases[:, self.index]
        y = (attn.softmax(-1) @ v).transpose(1, 2).flatten(2)
        return self.projection(nn.functional.hardswish(y))


class _LeViTResidual(nn.Module):
    """x + f(x), where f is a LeViT attention or MLP (two batch-normalized maps, Hardswish)."""

    def __init__(self, f: nn.Module):
        super().__init__()
        self.f = f

    def forward(self, x):
        return x + self.f(x)


def _levit_mlp(dim: int, ratio: int = 2) -> _LeViTResidual:
    return _LeViTResidual(nn.Sequential(_LinearBN(dim, ratio * dim), nn.Hardswish(), _LinearBN(ratio * dim, dim)))


class LeViT(nn.Module):
    """LeViT-128 at 224x224 (Hugging Face's facebook/levit-128 layout, distillation head kept):
    four 3x3 stride-2 convolutions with batch norm (Hardswish between) to 128 channels at 14x14,
    then stages of 4 attention and MLP (2x) residual blocks at 128, 256, 384 channels with 4, 8,
    12 heads (keys 16, values 32 wide), joined by attention whose queries shrink the map (14 -> 7
    -> 4; 8 and 16 heads, values 64 wide) and an MLP; every linear map bias-free and
    batch-normalized; mean over tokens, the two batch-norm + linear classifiers averaged;
    9,213,936 parameters."""

    def __init__(self, dims=(128, 256, 384), heads=(4, 8, 12), depths=(4, 4, 4), key_dim: int = 16,
                 size: int = 14, classes: int = 1000):
        super().__init__()
        widths = (3, dims[0] // 8, dims[0] // 4, dims[0] // 2, dims[0])
        self.stem = nn.Sequential(*(_conv_bn_act(cin, cout, 3, 2, act=nn.Hardswish if cout != dims[0] else nn.Identity)
                                    for cin, cout in zip(widths, widths[1:])))
        blocks = []
        for i, (dim, h, depth) in enumerate(zip(dims, heads, depths)):
            for _ in range(depth):
                blocks += [_LeViTResidual(_LeViTAttention(dim, dim, h, size, key_dim)), _levit_mlp(dim)]
            if i + 1 < len(dims):
                blocks.append(_LeViTAttention(dim, dims[i + 1], dim // key_dim, size, key_dim, ratio=4, stride=2))
                blocks.append(_levit_mlp(dims[i + 1]))
                size = (size - 1) // 2 + 1
        self.blocks = nn.Sequential(*blocks)
        self.classifiers = nn.ModuleList(nn.Sequential(nn.BatchNorm1d(dims[-1]), nn.Linear(dims[-1], classes))
                                         for _ in range(2))

    def forward(self, x):
        x = self.blocks(self.stem(x).flatten(2).transpose(1, 2)).mean(1)
        return (self.classifiers[0](x) + self.classifiers[1](x)) / 2


# ------------------------------------------------------------------- MNASNet (Tan et al. 2019)


class MNASNet(nn.Module):
    """MNASNet-B1 at width 0.5 and 224x224 (torchvision's mnasnet0_5 layout): a 3x3 stride-2
    stem to 16 channels and a depthwise separable convolution to 8, then six stacks of
    inverted residuals (ReLU, expansion 3 or 6, 3x3 or 5x5 depthwise) to 16/24/40/48/96/160
    channels, a 1x1 convolution to 1280, 1000 classes; 2,218,512 parameters."""

    # (channels, depthwise kernel, first stride, expansion, repeats) of the six stacks
    STACKS = [(16, 3, 2, 3, 3), (24, 5, 2, 3, 3), (40, 5, 2, 6, 3), (48, 3, 1, 6, 2), (96, 5, 2, 6, 4),
              (160, 3, 1, 6, 1)]

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, cin = [_conv_bn_act(3, 16, 3, 2, act=nn.ReLU), InvertedResidual(16, 8, 1, 1, act=nn.ReLU)], 8
        for cout, kernel, stride, expand, repeats in self.STACKS:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand, act=nn.ReLU, kernel=kernel))
                cin = cout
        layers.append(_conv_bn_act(cin, 1280, 1, act=nn.ReLU))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(2, 3)))


class AlexNet(nn.Module):
    """AlexNet at 224x224 (torchvision's one-tower layout): five convolutions (11x11 stride 4,
    5x5, three 3x3; 64/192/384/256/256 channels) with ReLU and three 3x3 stride-2 max pools,
    then three fully connected layers (9216 to 4096 to 4096 to 1000); 61,100,840 parameters,
    nine in ten of them in the first two fully connected layers."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
            nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class VGG11(nn.Module):
    """VGG-11 at 224x224 (configuration A, without batch norm, torchvision's layout): eight 3x3
    convolutions (64, 128, 256, 256, 512, 512, 512, 512 channels) with ReLU and five 2x2 max
    pools, a 7x7 adaptive average pool, then three fully connected layers (25088 to 4096 to
    4096 to 1000); 132,863,336 parameters, nine in ten of them in the first fully connected one."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, cin = [], 3
        for width in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
            if width == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, width, 3, padding=1), nn.ReLU()]
                cin = width
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(0.5), nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


class SentenceMiniLM(nn.Module):
    """A sentence-embedding encoder, all-MiniLM-L6-v2's shape: BERT's post-LN layers at hidden 384,
    12 heads of 32, intermediate 1536, 6 layers, 128 tokens (the embedding LayerNorm and every
    layer as `BertEncoder` computes them), then the sentence-transformers head: the mean over
    tokens (no padding mask) and division by the L2 norm. Input: already looked-up word
    embeddings [batch, seq, 384]; output: unit-length sentence embeddings [batch, 384]."""

    def __init__(self, layers: int = 6, seq: int = 128):
        super().__init__()
        self.encoder = BertEncoder(BertConfig(hidden=384, heads=12, intermediate=1536, layers=layers, seq=seq))
        self.example_shape = (seq, 384)

    def forward(self, words):
        return nn.functional.normalize(self.encoder(words).mean(dim=1), dim=-1)


# ------------------------------------------------------------------ DLRM (Naumov et al. 2019)


def _mlp(*widths: int, last_relu: bool = True, layer=lambda cin, cout: [nn.Linear(cin, cout)]) -> nn.Sequential:
    """`layer` between each pair of `widths`, a ReLU after each (after the last only with
    `last_relu`)."""
    layers = []
    for i, (cin, cout) in enumerate(zip(widths, widths[1:])):
        layers += layer(cin, cout)
        layers += [nn.ReLU()] if last_relu or i < len(widths) - 2 else []
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """A recommendation model, MLPerf's DLRM shape (Criteo Terabyte): 13 dense features through
    the bottom MLP 13-512-256-128, 26 sparse features as already looked-up 128-wide embeddings,
    the dot interaction (every pair's inner product among the 27 vectors, the strict lower
    triangle kept, the bottom output appended: 351 + 128 = 479), then the top MLP
    479-1024-1024-512-256-1 and a sigmoid. A batch of `queries` samples is scored at once, as
    a server does. Input: [batch, queries, 13 + 26 x 128]; output: click probabilities
    [batch, queries, 1]."""

    def __init__(self, dense: int = 13, sparse: int = 26, width: int = 128, queries: int = 128):
        super().__init__()
        self.dense, self.sparse, self.width = dense, sparse, width
        self.bottom = _mlp(dense, 512, 256, width)
        vectors = sparse + 1
        rows, cols = torch.tril_indices(vectors, vectors, offset=-1)
        self.register_buffer("pairs", rows * vectors + cols, persistent=False)
        self.top = _mlp(len(rows) + width, 1024, 1024, 512, 256, 1, last_relu=False)
        self.example_shape = (queries, dense + sparse * width)

    def forward(self, features):
        *lead, _ = features.shape
        dense, sparse = features.split([self.dense, self.sparse * self.width], dim=-1)
        x = self.bottom(dense.reshape(-1, self.dense))
        vectors = torch.cat([x[:, None], sparse.reshape(-1, self.sparse, self.width)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)
        z = torch.cat([x, dots.index_select(1, self.pairs)], dim=1)
        return torch.sigmoid(self.top(z)).reshape(*lead, 1)


# ------------------------------------------------------------------ PointNet (Qi et al. 2017)


def _shared_mlp(*widths: int, last_relu: bool = True) -> nn.Sequential:
    """The same small MLP on every point: 1x1 Conv1d + BatchNorm (+ ReLU) over the point axis."""
    return _mlp(*widths, last_relu=last_relu, layer=lambda cin, cout: [nn.Conv1d(cin, cout, 1), nn.BatchNorm1d(cout)])


def _point_head(outputs: int) -> nn.Sequential:
    """Fully connected 1024-512-256 (BatchNorm, ReLU; dropout before the second norm, as
    trained), then `outputs`."""
    return nn.Sequential(nn.Linear(1024, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 256),
                         nn.Dropout(0.3), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, outputs))


class _TNet(nn.Module):
    """A k x k transform predicted from the points themselves (shared MLP k-64-128-1024, max over
    the points, the fully connected head), added to the identity."""

    def __init__(self, k: int):
        super().__init__()
        self.k, self.points, self.head = k, _shared_mlp(k, 64, 128, 1024), _point_head(k * k)
        self.register_buffer("identity", torch.eye(k).flatten(), persistent=False)

    def forward(self, x):
        return (self.head(self.points(x).max(dim=2).values) + self.identity).view(-1, self.k, self.k)


class PointNet(nn.Module):
    """PointNet classification (ModelNet40: 40 classes) on 1,024 points of (x, y, z), with the
    input (3x3) and feature (64x64) transforms: per-point MLPs 3-64 and 64-128-1024 between
    them, a max over the points, the fully connected head; 3,471,473 parameters."""

    def __init__(self, classes: int = 40, points: int = 1024):
        super().__init__()
        self.example_shape = (3, points)
        self.input_transform, self.mlp1 = _TNet(3), _shared_mlp(3, 64)
        self.feature_transform, self.mlp2 = _TNet(64), _shared_mlp(64, 128, 1024, last_relu=False)
        self.head = _point_head(classes)

    @staticmethod
    def _transformed(x, transform):
        return torch.bmm(x.transpose(2, 1), transform).transpose(2, 1)

    def forward(self, x):
        x = self.mlp1(self._transformed(x, self.input_transform(x)))
        x = self._transformed(x, self.feature_transform(x))
        return self.head(self.mlp2(x).max(dim=2).values)


# ------------------------------------------------------------------------------ registry


def resnet18() -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3])


def wide_resnet50_2() -> nn.Module:
    return ResNet(WideBottleneck, [3, 4, 6, 3])


def vit_b16() -> nn.Module:
    """ViT-B/16 at 224x224 (timm's vit_base_patch16_224): ViT-S/16 with hidden 768 and 12 heads."""
    return ViT(hidden=768, heads=12)


def bert_encoder(layers: int = 12, seq: int = 128) -> nn.Module:
    return BertEncoder(BertConfig(layers=layers, seq=seq))


def resnext50() -> nn.Module:
    return ResNet(ResNeXtBottleneck, [3, 4, 6, 3])


# ------------------------------------------------------------------ GAT (Velickovic et al. 2018)


class _GraphAttention(nn.Module):
    """One graph attention layer: every node's features projected per head, a score per edge
    (LeakyReLU 0.2 of the source's and the target's halves of the attention vector), a softmax
    over each node's neighbours (non-edges at -9e15, as the reference code writes it), and the
    neighbours' projections summed with those weights. Out: [batch, heads, nodes, width]."""

    def __init__(self, features: int, width: int, heads: int):
        super().__init__()
        self.heads, self.width = heads, width
        self.project = nn.Linear(features, heads * width, bias=False)
        self.source = nn.Parameter(torch.randn(heads, width) / width ** 0.5)
        self.target = nn.Parameter(torch.randn(heads, width) / width ** 0.5)

    def attention(self, x, adjacency):
        """(each head's weights over every node's neighbours [batch, heads, nodes, nodes], the
        projections [batch, heads, nodes, width])."""
        b, n, _ = x.shape
        h = self.project(x).reshape(b, n, self.heads, self.width).transpose(1, 2)
        scores = (h * self.source[:, None]).sum(-1)[..., :, None] + (h * self.target[:, None]).sum(-1)[..., None, :]
        scores = torch.where(adjacency, nn.functional.leaky_relu(scores, 0.2), torch.full_like(scores, -9e15))
        return torch.softmax(scores, dim=-1), h

    def forward(self, x, adjacency):
        weights, h = self.attention(x, adjacency)
        return weights @ h


class GAT(nn.Module):
    """A graph attention network, the Cora model's shape (Velickovic et al. 2018): 1,433 bag-of-
    words features per node, 8 heads of 8 concatenated through an ELU, then one head over the 7
    classes and a log-softmax. Full-graph inference runs on a sampled subgraph of `nodes` (a
    serving batch), its edges fixed by `seed`: about `degree` neighbours a node, symmetric, self
    loops added (Cora's mean degree is 3.9). Input: [batch, nodes, 1433]; output: class
    log-probabilities [batch, nodes, 7]."""

    def __init__(self, nodes: int = 512, features: int = 1433, hidden: int = 8, heads: int = 8,
                 classes: int = 7, degree: float = 4.0, seed: int = 0):
        super().__init__()
        edges = torch.rand(nodes, nodes, generator=torch.Generator().manual_seed(seed)) < degree / (2 * nodes)
        self.register_buffer("adjacency", edges | edges.T | torch.eye(nodes, dtype=torch.bool), persistent=False)
        self.hidden_layer = _GraphAttention(features, hidden, heads)
        self.output_layer = _GraphAttention(heads * hidden, classes, 1)
        self.example_shape = (nodes, features)

    def forward(self, x):
        h = self.hidden_layer(x, self.adjacency)
        h = nn.functional.elu(h.transpose(1, 2).flatten(2))
        return torch.log_softmax(self.output_layer(h, self.adjacency).mean(dim=1), dim=-1)

# ------------------------------------------------------------ CapsNet (Sabour et al. 2017)


def _squash(s, dim: int = -1):
    """Capsule non-linearity: the vector's direction kept, its length |s|^2 / (1 + |s|^2)."""
    squared = (s * s).sum(dim, keepdim=True)
    return squared / (1 + squared) * s / torch.sqrt(squared + 1e-8)


class CapsNet(nn.Module):
    """The capsule network for MNIST (Sabour et al. 2017): a 9x9 convolution of 256, primary
    capsules from a 9x9 stride-2 convolution (32 maps of 8-vectors at 6x6, squashed), a 16x8
    weight for every pair of the 1,152 primary and 10 digit capsules, `iterations` rounds of
    routing by agreement (a softmax over the 10 digits per primary capsule, weighted sums
    squashed, logits raised by agreement), and the reconstruction decoder (160-512-1024-784)
    fed only the longest digit capsule. The pair weights are drawn at 1/sqrt(8), so that the
    routing moves the coupling. Input: [batch, 1, 28, 28]; output: the digit capsules'
    lengths [batch, 10] and the reconstruction [batch, 784]."""

    def __init__(self, classes: int = 10, iterations: int = 3):
        super().__init__()
        self.iterations = iterations
        self.conv = nn.Conv2d(1, 256, 9)
        self.primary = nn.Conv2d(256, 32 * 8, 9, stride=2)
        self.weight = nn.Parameter(torch.randn(32 * 6 * 6, classes, 16, 8) / 8 ** 0.5)
        self.decoder = _mlp(16 * classes, 512, 1024, 784, last_relu=False)
        self.example_shape = (1, 28, 28)

    def route(self, x):
        """(the digit capsules [batch, 10, 16], the last round's coupling coefficients
        [batch, 1152, 10])."""
        u = self.primary(torch.relu(self.conv(x)))
        b = u.shape[0]
        u = _squash(u.reshape(b, 32, 8, 36).permute(0, 1, 3, 2).reshape(b, 32 * 36, 8))
        predictions = (self.weight @ u[:, :, None, :, None]).squeeze(-1)  # [b, 1152, 10, 16]
        logits = torch.zeros_like(predictions[..., 0])
        for i in range(self.iterations):
            coupling = torch.softmax(logits, dim=-1)
            v = _squash((coupling[..., None] * predictions).sum(1))
            if i + 1 < self.iterations:
                logits = logits + (predictions * v[:, None]).sum(-1)
        return v, coupling

    def forward(self, x):
        v, _ = self.route(x)
        lengths = torch.sqrt((v * v).sum(-1))
        mask = (lengths == lengths.max(-1, keepdim=True).values).to(v.dtype)
        return lengths, torch.sigmoid(self.decoder((v * mask[..., None]).flatten(1)))


# ------------------------------------------------------------ NeRF (Mildenhall et al. 2020)


def _positional_encoding(x, frequencies: int):
    """x and sin(2^k x), cos(2^k x) for k < `frequencies` (NeRF's gamma, input kept): 3 -> 3 + 6k."""
    scaled = [x * 2.0 ** k for k in range(frequencies)]
    return torch.cat([x] + [f(s) for s in scaled for f in (torch.sin, torch.cos)], dim=-1)


class NeRF(nn.Module):
    """A neural radiance field rendering a batch of rays (nerf-pytorch's coarse model for the
    Blender scenes): `samples` points a ray between `near` and `far`, positions encoded with 10
    frequencies and view directions with 4, an 8-layer MLP of 256 (the encoded position joined
    again after the fifth layer), density from its output, colour from a 128-wide layer that
    also sees the direction, and volume rendering by the paper's quadrature (transmittance
    exp(-cumsum) of density times the gaps between samples before each, the last gap 1e10). The fine
    model's importance resampling (a search over the weights' CDF) is left out. Input: rays
    [batch, rays, 6] (origin, direction); output: colour [batch, rays, 3] and depth [batch, rays]."""

    def __init__(self, rays: int = 32, samples: int = 64, width: int = 256, near: float = 2.0, far: float = 6.0):
        super().__init__()
        self.register_buffer("depths", torch.linspace(near, far, samples), persistent=False)
        position, direction = 3 + 6 * 10, 3 + 6 * 4
        self.trunk = nn.ModuleList([nn.Linear(position, width)] + [
            nn.Linear(width + (position if i == 5 else 0), width) for i in range(1, 8)])
        self.density = nn.Linear(width, 1)
        self.feature = nn.Linear(width, width)
        self.view = nn.Linear(width + direction, width // 2)
        self.colour = nn.Linear(width // 2, 3)
        self.example_shape = (rays, 6)

    def field(self, points, directions):
        """(density [..., 1] before its ReLU, colour [..., 3]) at points seen from directions."""
        encoded = _positional_encoding(points, 10)
        h = encoded
        for i, layer in enumerate(self.trunk):
            h = torch.relu(layer(torch.cat([encoded, h], -1) if i == 5 else h))
        view = torch.relu(self.view(torch.cat([self.feature(h), _positional_encoding(directions, 4)], -1)))
        return self.density(h), torch.sigmoid(self.colour(view))

    def forward(self, rays):
        origins, directions = rays[..., :3], rays[..., 3:]
        t = self.depths
        points = origins[..., None, :] + directions[..., None, :] * t[:, None]  # [b, rays, samples, 3]
        unit = directions / torch.sqrt((directions * directions).sum(-1, keepdim=True))
        density, colour = self.field(points, unit[..., None, :].expand(points.shape))
        gaps = torch.cat([t[1:] - t[:-1], torch.full((1,), 1e10)])
        optical = torch.relu(density[..., 0]) * gaps * torch.sqrt((directions * directions).sum(-1, keepdim=True))
        # transmittance: the optical depth of the samples before (the last gap's 1e10 would swamp
        # a difference of inclusive sums), times the sample's own opacity
        before = torch.cumsum(torch.cat([torch.zeros_like(optical[..., :1]), optical[..., :-1]], -1), -1)
        weights = torch.exp(-before) * (1 - torch.exp(-optical))
        return (weights[..., None] * colour).sum(-2), (weights * t).sum(-1)


# ------------------------------------------------------------ EDSR (Lim et al. 2017)


class EDSR(nn.Module):
    """EDSR's baseline for x2 super-resolution: the dataset's mean colour subtracted, a 3x3
    convolution to 64 channels, 16 residual blocks (3x3, ReLU, 3x3, no BatchNorm, the block's
    input added), a 3x3 convolution with the head's output added, a 3x3 convolution to 4 x 64
    channels and a pixel shuffle to twice the size, a 3x3 convolution to RGB, the mean added
    back. Input: a low-resolution patch [batch, 3, 48, 48] (the paper's training patch);
    output: [batch, 3, 96, 96]."""

    def __init__(self, blocks: int = 16, features: int = 64, scale: int = 2, size: int = 48):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.4488, 0.4371, 0.4040]).view(1, 3, 1, 1), persistent=False)
        self.head = nn.Conv2d(3, features, 3, padding=1)
        self.body = nn.ModuleList([nn.Sequential(nn.Conv2d(features, features, 3, padding=1), nn.ReLU(),
                                                 nn.Conv2d(features, features, 3, padding=1)) for _ in range(blocks)])
        self.body_end = nn.Conv2d(features, features, 3, padding=1)
        self.upsample = nn.Sequential(nn.Conv2d(features, features * scale * scale, 3, padding=1), nn.PixelShuffle(scale))
        self.tail = nn.Conv2d(features, 3, 3, padding=1)
        self.example_shape = (3, size, size)

    def forward(self, x):
        x = self.head(x - self.mean)
        h = x
        for block in self.body:
            h = h + block(h)
        return self.tail(self.upsample(self.body_end(h) + x)) + self.mean


class DeepLabV3(nn.Module):
    """DeepLabV3 for semantic segmentation (torchvision's deeplabv3_resnet50 layout, without
    the training-only auxiliary head): ResNet-50 at output stride 8, its last two stages
    without stride and with 3x3 convolutions dilated 2 and 4 (each stage's first block keeps
    the previous dilation); atrous spatial pyramid pooling over the 2048-channel map: a 1x1
    convolution, three 3x3 convolutions dilated 12, 24 and 36, and the map's mean through a 1x1
    convolution spread back bilinearly, each to 256 channels with BatchNorm and ReLU,
    concatenated and projected 1x1 to 256; a 3x3 convolution, a 1x1 to the 21 VOC classes and
    a bilinear upsampling to the input's size. Input: [batch, 3, 224, 224]."""

    def __init__(self, classes: int = 21, rates: tuple[int, ...] = (12, 24, 36), size: int = 224):
        super().__init__()
        backbone = ResNet(Bottleneck, [3, 4, 6, 3], num_classes=None, dilate=(False, True, True))
        self.stem, self.layers, cin = backbone.stem, backbone.layers, 2048
        branch = lambda k, d: nn.Sequential(nn.Conv2d(cin, 256, k, padding=d if k == 3 else 0, dilation=d,
                                                      bias=False), nn.BatchNorm2d(256), nn.ReLU())
        self.aspp = nn.ModuleList([branch(1, 1)] + [branch(3, r) for r in rates])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, 256, 1, bias=False), nn.BatchNorm2d(256),
                                  nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(256 * (len(rates) + 2), 256, 1, bias=False), nn.BatchNorm2d(256),
                                     nn.ReLU())
        self.head = nn.Sequential(nn.Conv2d(256, 256, 3, padding=1, bias=False), nn.BatchNorm2d(256), nn.ReLU(),
                                  nn.Conv2d(256, classes, 1))
        self.example_shape = (3, size, size)

    def forward(self, x):
        f = self.layers(self.stem(x))
        pooled = nn.functional.interpolate(self.pool(f), size=f.shape[-2:], mode="bilinear", align_corners=False)
        f = self.project(torch.cat([b(f) for b in self.aspp] + [pooled], dim=1))
        return nn.functional.interpolate(self.head(f), size=x.shape[-2:], mode="bilinear", align_corners=False)


# ------------------------------------- LSTM language model (Zaremba et al. 2014; PyTorch's example)


class LSTMLanguageModel(nn.Module):
    """The medium word-level LSTM language model of PyTorch's word_language_model example
    (Penn Treebank: 10,000 words, 650-wide embeddings and two LSTM layers of 650, tied decoder
    weights): `streams` text streams of `steps` tokens scored at once, as the example
    evaluates (10 x 35). The layers are two one-layer `nn.LSTM`s, the same computation as one
    two-layer LSTM in eval mode, because the Relax importer unrolls one layer at a time.
    Input: the tokens' embeddings [batch, streams, steps, 650] (the lookup is a gather, like
    BERT's); output: next-word logits [batch, streams, steps, 10000]."""

    def __init__(self, words: int = 10_000, hidden: int = 650, layers: int = 2, steps: int = 35, streams: int = 10):
        super().__init__()
        self.layers = nn.ModuleList([nn.LSTM(hidden, hidden, batch_first=True) for _ in range(layers)])
        self.decoder = nn.Linear(hidden, words)
        self.example_shape = (streams, steps, hidden)

    def forward(self, x):
        *lead, steps, hidden = x.shape
        h = x.reshape(-1, steps, hidden)
        for layer in self.layers:
            h = layer(h)[0]
        return self.decoder(h).reshape(*lead, steps, -1)


# ------------------------------------- CycleGAN's generator (Zhu et al. 2017)


class _ReflectResidual(nn.Module):
    """x + (reflection pad 1, 3x3, InstanceNorm, ReLU, reflection pad 1, 3x3, InstanceNorm)."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels),
                                  nn.ReLU(), nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3),
                                  nn.InstanceNorm2d(channels))

    def forward(self, x):
        return x + self.body(x)


class CycleGANGenerator(nn.Module):
    """CycleGAN's ResNet generator (Zhu et al. 2017; the authors' resnet_6blocks for 128x128
    images): reflection pad 3 and a 7x7 convolution to 64 channels, two 3x3 stride-2
    convolutions to 128 and 256, six residual blocks at 256 channels and a quarter of the
    size, two 3x3 stride-2 transposed convolutions back to 64, reflection pad 3, a 7x7
    convolution to RGB and tanh; InstanceNorm without affine parameters and ReLU after every
    convolution but the last. Input: an image [batch, 3, 128, 128]; output: the translated
    image, the same shape."""

    def __init__(self, blocks: int = 6, features: int = 64, size: int = 128):
        super().__init__()
        f = features
        stem = [nn.ReflectionPad2d(3), nn.Conv2d(3, f, 7), nn.InstanceNorm2d(f), nn.ReLU()]
        down = [m for c in (f, 2 * f) for m in (nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.InstanceNorm2d(2 * c),
                                                 nn.ReLU())]
        up = [m for c in (4 * f, 2 * f) for m in (nn.ConvTranspose2d(c, c // 2, 3, stride=2, padding=1,
                                                                      output_padding=1),
                                                   nn.InstanceNorm2d(c // 2), nn.ReLU())]
        self.net = nn.Sequential(*stem, *down, *[_ReflectResidual(4 * f) for _ in range(blocks)], *up,
                                 nn.ReflectionPad2d(3), nn.Conv2d(f, 3, 7), nn.Tanh())
        self.example_shape = (3, size, size)

    def forward(self, x):
        return self.net(x)


# ------------------------------------- WaveNet (van den Oord et al. 2016)


class _WaveNetLayer(nn.Module):
    """A dilated causal convolution (kernel 2) to twice the residual width, tanh of one half
    times the sigmoid of the other, then a 1x1 to the residual (added to the input) and a
    1x1 to the skip connections."""

    def __init__(self, residual: int, skip: int, dilation: int):
        super().__init__()
        self.dilated = nn.Conv1d(residual, 2 * residual, 2, dilation=dilation, padding=dilation)
        self.residual = nn.Conv1d(residual, residual, 1)
        self.skip = nn.Conv1d(residual, skip, 1)

    def forward(self, x):
        filter_, gate = self.dilated(x)[..., :x.shape[-1]].chunk(2, dim=1)  # the first samples: causal
        z = torch.tanh(filter_) * torch.sigmoid(gate)
        return x + self.residual(z), self.skip(z)


class WaveNet(nn.Module):
    """WaveNet over mu-law audio (tensorflow-wavenet's defaults: 256 levels one-hot, a causal
    kernel-2 convolution to 32 channels, five stacks of ten layers dilated 1, 2, ..., 512, skip
    connections of 512 summed, ReLU, 1x1 to 512, ReLU, 1x1 to 256 logits), scoring half a
    second at 16 kHz (8,000 samples) at once, as in training and teacher-forced scoring.
    Receptive field 5,117 samples. Input: one-hot samples [batch, 256, 8000]; output: the next
    sample's logits [batch, 256, 8000]."""

    def __init__(self, levels: int = 256, residual: int = 32, skip: int = 512, stacks: int = 5, depth: int = 10,
                 samples: int = 8000):
        super().__init__()
        self.causal = nn.Conv1d(levels, residual, 2, padding=1)
        self.layers = nn.ModuleList([_WaveNetLayer(residual, skip, 2 ** k) for _ in range(stacks)
                                     for k in range(depth)])
        self.head = nn.Sequential(nn.ReLU(), nn.Conv1d(skip, skip, 1), nn.ReLU(), nn.Conv1d(skip, levels, 1))
        self.example_shape = (levels, samples)

    def forward(self, x):
        h = self.causal(x)[..., :x.shape[-1]]
        skips = 0
        for layer in self.layers:
            h, s = layer(h)
            skips = skips + s
        return self.head(skips)


# ------------------------------------- Character-level CNN (Zhang, Zhao and LeCun 2015)


class CharCNN(nn.Module):
    """The small character-level convolutional network for text classification (Zhang, Zhao
    and LeCun 2015): 1,014 characters of a 70-letter alphabet, one-hot; six 1-D convolutions
    of 256 features (kernels 7, 7, 3, 3, 3, 3; max pools of 3 after the first, second and
    sixth; ReLU), two fully connected layers of 1,024 (ReLU; dropout, inactive in eval), and a
    linear layer to the classes (4: AG's News). Input: one-hot characters [batch, 70, 1014];
    output: class logits [batch, 4]."""

    def __init__(self, alphabet: int = 70, length: int = 1014, features: int = 256, hidden: int = 1024,
                 classes: int = 4):
        super().__init__()
        layers, cin = [], alphabet
        for kernel, pool in ((7, True), (7, True), (3, False), (3, False), (3, False), (3, True)):
            layers += [nn.Conv1d(cin, features, kernel), nn.ReLU()] + ([nn.MaxPool1d(3)] if pool else [])
            cin = features
        self.features = nn.Sequential(*layers)
        frames = (((length - 6) // 3 - 6) // 3 - 8) // 3  # 34 for 1,014 characters
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(features * frames, hidden), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(), nn.Linear(hidden, classes))
        self.example_shape = (alphabet, length)

    def forward(self, x):
        return self.classifier(self.features(x))


class _SeparableConv(nn.Sequential):
    """Xception's separable convolution: a 3x3 depthwise convolution, then a 1x1 pointwise
    one, neither with a bias nor a nonlinearity between (its BatchNorm follows outside)."""

    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False), nn.Conv2d(cin, cout, 1, bias=False))


class _XceptionBlock(nn.Module):
    """For each width: ReLU, separable convolution, BatchNorm (the first ReLU left out where the
    stem's own comes just before). A strided block ends in a 3x3 stride-2 max pool and adds a
    1x1 stride-2 projection of its input (with BatchNorm); a middle-flow block adds its input."""

    def __init__(self, cin: int, widths: tuple[int, ...], strided: bool, first_relu: bool = True):
        super().__init__()
        layers, c = [], cin
        for i, cout in enumerate(widths):
            layers += ([nn.ReLU()] if i or first_relu else []) + [_SeparableConv(c, cout), nn.BatchNorm2d(cout)]
            c = cout
        if strided:
            layers.append(nn.MaxPool2d(3, 2, padding=1))
        self.body = nn.Sequential(*layers)
        self.skip = nn.Sequential(nn.Conv2d(cin, c, 1, stride=2, bias=False), nn.BatchNorm2d(c)) if strided \
            else nn.Identity()

    def forward(self, x):
        return self.body(x) + self.skip(x)


class Xception(nn.Module):
    """Xception at 299x299 (Chollet 2017; the Keras applications layout): an entry flow of two
    unpadded 3x3 convolutions (32 stride 2, 64) and three strided blocks to 128, 256 and 728
    channels (147 -> 74 -> 37 -> 19), a middle flow of eight residual blocks of three 728-728
    separable convolutions at 19x19, an exit flow of a strided block (728, 1024; to 10x10) and
    separable convolutions to 1536 and 2048 (BatchNorm, ReLU), global average pooling and a
    linear layer to 1,000 classes. Input: images [batch, 3, 299, 299]; output: logits
    [batch, 1000]."""

    def __init__(self, classes: int = 1000, middle: int = 8):
        super().__init__()
        stem = [nn.Conv2d(3, 32, 3, stride=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                nn.Conv2d(32, 64, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
        blocks = [_XceptionBlock(64, (128, 128), True, first_relu=False), _XceptionBlock(128, (256, 256), True),
                  _XceptionBlock(256, (728, 728), True)]
        blocks += [_XceptionBlock(728, (728, 728, 728), False) for _ in range(middle)]
        blocks.append(_XceptionBlock(728, (728, 1024), True))
        exit_convs = [_SeparableConv(1024, 1536), nn.BatchNorm2d(1536), nn.ReLU(),
                      _SeparableConv(1536, 2048), nn.BatchNorm2d(2048), nn.ReLU()]
        self.features = nn.Sequential(*stem, *blocks, *exit_convs)
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, classes))
        self.example_shape = (3, 299, 299)

    def forward(self, x):
        return self.classifier(self.features(x))


class _GPT2DecodeLayer(nn.Module):
    """A GPT-2 layer for one new token: pre-LN attention whose keys and values are the cached
    ones of the `past` earlier tokens (buffers here: a decoding step reads them as it reads
    its weights) and the token's own, then the pre-LN MLP (4x, tanh GELU); both residual."""

    def __init__(self, hidden: int, heads: int, past: int):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(approximate="tanh"), nn.Linear(4 * hidden, hidden))
        self.register_buffer("past_keys", torch.randn(1, heads, past, self.dim))
        self.register_buffer("past_values", torch.randn(1, heads, past, self.dim))

    def forward(self, x):
        b = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).reshape(b, 3, self.heads, self.dim).unbind(1)  # each [b, heads, dim]
        keys = torch.cat([self.past_keys.expand(b, -1, -1, -1), k[:, :, None]], dim=2)  # [b, heads, past + 1, dim]
        values = torch.cat([self.past_values.expand(b, -1, -1, -1), v[:, :, None]], dim=2)
        scores = q[:, :, None] @ keys.transpose(-1, -2) * self.dim ** -0.5  # [b, heads, 1, past + 1]
        x = x + self.proj((scores.softmax(-1) @ values).reshape(b, -1))
        return x + self.mlp(self.ln2(x))


class GPT2Decode(nn.Module):
    """GPT-2 small (Radford et al. 2019; Hugging Face's gpt2 layout) generating one token: the
    new token's embedded state (its word and position embeddings summed before, a gather and
    an add) through twelve layers (hidden 768, 12 heads of 64) whose attention reads the cached
    keys and values of the 255 tokens before it, the final LayerNorm and the output layer to
    50,257 word logits (tied to the word embeddings in GPT-2; its weight here). Every product
    is a matrix-vector product that reads its weight once for the one token. Input: embedded
    tokens [batch, 768]; output: next-word logits [batch, 50257]."""

    def __init__(self, hidden: int = 768, heads: int = 12, layers: int = 12, past: int = 255, words: int = 50257):
        super().__init__()
        self.layers = nn.Sequential(*[_GPT2DecodeLayer(hidden, heads, past) for _ in range(layers)])
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, words, bias=False)
        self.example_shape = (hidden,)

    def forward(self, x):
        return self.head(self.ln(self.layers(x)))



class _T5DecodeLayer(nn.Module):
    """A T5 decoder layer for one new token: pre-RMSNorm self-attention (no score scaling, the
    relative position bias added) over the cached keys and values of the `past` earlier tokens
    and its own, pre-RMSNorm attention over the encoder's cached keys and values of `source`
    tokens (projected once per input, so those projections are not part of a step), then the
    ReLU MLP; no biases, each residual."""

    def __init__(self, hidden: int, heads: int, intermediate: int, past: int, source: int):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.norm1, self.norm2, self.norm3 = (RMSNorm(hidden, 1e-6) for _ in range(3))
        self.q, self.k, self.v, self.o = (Dense(hidden, hidden, False) for _ in range(4))
        self.cross_q, self.cross_o = Dense(hidden, hidden, False), Dense(hidden, hidden, False)
        self.mlp = nn.Sequential(Dense(hidden, intermediate, False), nn.ReLU(), Dense(intermediate, hidden, False))
        for name, n in (("past_keys", past), ("past_values", past), ("source_keys", source), ("source_values", source)):
            self.register_buffer(name, torch.randn(1, heads, n, self.dim))

    def forward(self, x, bias):
        b = x.shape[0]
        h = self.norm1(x)
        q, k, v = (y.reshape(b, self.heads, 1, self.dim) for y in (self.q(h), self.k(h), self.v(h)))
        keys = torch.cat([self.past_keys.expand(b, -1, -1, -1), k], dim=2)  # [b, heads, past + 1, dim]
        values = torch.cat([self.past_values.expand(b, -1, -1, -1), v], dim=2)
        x = x + self.o(((q @ keys.transpose(-1, -2) + bias).softmax(-1) @ values).reshape(b, -1))
        q = self.cross_q(self.norm2(x)).reshape(b, self.heads, 1, self.dim)
        x = x + self.cross_o(((q @ self.source_keys.transpose(-1, -2)).softmax(-1) @ self.source_values).reshape(b, -1))
        return x + self.mlp(self.norm3(x))


class T5Decode(nn.Module):
    """T5-small's decoder (Raffel et al. 2020; hidden 512, 8 heads of 64, ReLU MLP 2048, 6
    layers) generating one token: the new token's embedding through six layers that attend
    to the cached keys and values of the 63 tokens before it (with the unidirectional relative
    position bias, looked up once here as the encoder's is) and to the encoder's 128 cached
    ones, the final RMSNorm, and the output layer to 32,128 words, its input scaled by
    hidden^-0.5 as T5 does for its tied word table (its weight here). Every product is a
    matrix-vector product. Input: the embedded token [batch, 512]; output: next-word logits
    [batch, 32128]."""

    def __init__(self, hidden: int = 512, heads: int = 8, intermediate: int = 2048, layers: int = 6, past: int = 63,
                 source: int = 128, words: int = 32128):
        super().__init__()
        self.hidden = hidden
        self.relative_bias = nn.Embedding(32, heads)
        self.register_buffer("bias", self.relative_bias.weight.detach()[_t5_buckets(past + 1, bidirectional=False)[-1]].T[None, :, None])
        self.layers = nn.ModuleList([_T5DecodeLayer(hidden, heads, intermediate, past, source) for _ in range(layers)])
        self.norm = RMSNorm(hidden, 1e-6)
        self.head = Dense(hidden, words, False)
        self.example_shape = (hidden,)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, self.bias)
        return self.head(self.norm(x) * self.hidden**-0.5)


class _BidirectionalLSTM(nn.Module):
    """deepspeech.pytorch's BatchRNN: an optional BatchNorm over the features of every time
    step, a bidirectional LSTM, and the two directions' outputs summed. Time-major [T, N, C]."""

    def __init__(self, cin: int, hidden: int, batch_norm: bool):
        super().__init__()
        self.norm = nn.BatchNorm1d(cin) if batch_norm else None
        self.rnn = nn.LSTM(cin, hidden, bidirectional=True)

    def forward(self, x):
        if self.norm is not None:
            t, n, c = x.shape
            x = self.norm(x.reshape(t * n, c)).reshape(t, n, c)
        x = self.rnn(x)[0]
        return x.reshape(x.shape[0], x.shape[1], 2, -1).sum(2)


class DeepSpeech2(nn.Module):
    """Deep Speech 2 (Amodei et al. 2016) in deepspeech.pytorch's layout: a spectrogram of
    161 frequencies (20 ms windows, 10 ms hops at 16 kHz) over 1 s (101 frames) through two
    2-D convolutions (41x11 stride 2x2 and 21x11 stride 2x1, 32 channels, BatchNorm,
    Hardtanh 0-20) to 32 x 41 features at 51 steps, five bidirectional LSTM layers of 1,024
    (the directions summed; BatchNorm before all but the first), BatchNorm and a bias-free
    layer to 29 characters, softmax over them as its inference does. The importer unrolls
    each LSTM step by step, as the LSTM language model's. Input: [batch, 1, 161, 101];
    output: [batch, 51, 29]."""

    def __init__(self, labels: int = 29, hidden: int = 1024, layers: int = 5, freq: int = 161, frames: int = 101):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 32, (41, 11), (2, 2), (20, 5)), nn.BatchNorm2d(32), nn.Hardtanh(0, 20),
                                  nn.Conv2d(32, 32, (21, 11), (2, 1), (10, 5)), nn.BatchNorm2d(32), nn.Hardtanh(0, 20))
        f = ((freq - 1) // 2 + 1 - 1) // 2 + 1  # frequencies left after the two strided convolutions
        self.rnns = nn.ModuleList([_BidirectionalLSTM(32 * f, hidden, False)]
                                  + [_BidirectionalLSTM(hidden, hidden, True) for _ in range(layers - 1)])
        self.fc = nn.Sequential(nn.BatchNorm1d(hidden), nn.Linear(hidden, labels, bias=False))
        self.example_shape = (1, freq, frames)

    def forward(self, x):
        x = self.conv(x)
        n, c, f, t = x.shape
        x = x.reshape(n, c * f, t).permute(2, 0, 1)  # time-major [T, N, C*F]
        for rnn in self.rnns:
            x = rnn(x)
        t, n, h = x.shape
        return self.fc(x.reshape(t * n, h)).reshape(t, n, -1).transpose(0, 1).softmax(-1)


class RNNsearchDecode(nn.Module):
    """RNNsearch-50's decoder (Bahdanau et al. 2015, its appendix A; English to French, 30,000
    words, embeddings of 620, a GRU of 1,000 units, alignment of 1,000, maxout of 500)
    generating one word of a 50-word sentence: the additive attention scores the encoder's
    50 annotations (2,000 wide: both directions) against the previous state, their softmax
    weights give the context, the GRU (update and reset gates, the proposal reading the
    reset state) takes the previous word, the context and the previous state, and the output
    layer maxes over pairs of 1,000 units (the previous state, word and context) before the
    word logits. The annotations and their alignment projection (U_a h_j) are computed once
    per sentence, so they are cached buffers here. Every product but the attention's is a
    matrix-vector product. Input: the previous word's embedding and the previous state,
    concatenated [batch, 1620]; output: next-word logits [batch, 30000] and the new state
    [batch, 1000]."""

    def __init__(self, words: int = 30_000, embed: int = 620, hidden: int = 1000, align: int = 1000,
                 maxout: int = 500, source: int = 50):
        super().__init__()
        self.embed, self.hidden, self.maxout = embed, hidden, maxout
        self.register_buffer("annotations", torch.randn(source, 2 * hidden))  # h_j
        self.register_buffer("keys", torch.randn(source, align))  # U_a h_j
        self.query, self.score = nn.Linear(hidden, align, bias=False), nn.Linear(align, 1, bias=False)  # W_a, v_a
        self.word = nn.Linear(embed, 3 * hidden)  # W_z, W_r, W: E y, with the gates' biases
        self.state_gates = nn.Linear(hidden, 2 * hidden, bias=False)  # U_z, U_r
        self.context_in = nn.Linear(2 * hidden, 3 * hidden, bias=False)  # C_z, C_r, C
        self.state_proposal = nn.Linear(hidden, hidden, bias=False)  # U
        self.out_state, self.out_word = nn.Linear(hidden, 2 * maxout), nn.Linear(embed, 2 * maxout, bias=False)  # U_o, V_o
        self.out_context = nn.Linear(2 * hidden, 2 * maxout, bias=False)  # C_o
        self.logits = nn.Linear(maxout, words, bias=False)  # W_o
        self.example_shape = (embed + hidden,)

    def forward(self, x):
        y, s = x[:, :self.embed], x[:, self.embed:]
        alpha = self.score(torch.tanh(self.query(s)[:, None] + self.keys)).squeeze(-1).softmax(-1)  # [batch, source]
        c = alpha @ self.annotations  # [batch, 2 * hidden]
        wy, cc = self.word(y), self.context_in(c)
        z, r = torch.sigmoid(wy[:, :2 * self.hidden] + self.state_gates(s) + cc[:, :2 * self.hidden]).chunk(2, -1)
        proposal = torch.tanh(wy[:, 2 * self.hidden:] + self.state_proposal(r * s) + cc[:, 2 * self.hidden:])
        t = self.out_state(s) + self.out_word(y) + self.out_context(c)  # [batch, 2 * maxout]
        t = t.reshape(-1, self.maxout, 2).amax(-1)
        return self.logits(t), (1 - z) * s + z * proposal


def _conv_bn_leaky(cin: int, cout: int, k: int) -> nn.Sequential:
    """Darknet's convolutional layer: bias-free, BatchNorm, leaky ReLU of slope 0.1."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, 1, k // 2, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.1))


class _SamePool(nn.Module):
    """Darknet's 2x2 max pool of stride 1 that keeps the size: the edge repeated on the right
    and bottom, which gives the max over the window's cells inside the map."""

    def forward(self, x):
        return nn.functional.max_pool2d(nn.functional.pad(x, (0, 1, 0, 1), mode="replicate"), 2, 1)


class TinyYOLOv3(nn.Module):
    """Tiny YOLOv3 (Redmon and Farhadi 2018; darknet's yolov3-tiny.cfg, 80 classes) over a
    416x416 image: seven 3x3 convolutions from 16 to 1,024 channels with 2x2 max pools (five
    of stride 2 to 13x13, one of stride 1), a 1x1 to 256, then two heads: 3x3 to 512 and a 1x1
    to 3 anchors x 85 at 13x13; and a 1x1 to 128, nearest 2x upsampling, concatenation with
    the 26x26 map of 256 channels, 3x3 to 256 and a 1x1 to 255 at 26x26. BatchNorm and leaky
    ReLU after every convolution but the heads' last (biased, linear). Output: the two heads'
    raw maps [batch, 3, 85, 169 + 676] (the boxes are decoded after the network)."""

    def __init__(self, size: int = 416, classes: int = 80):
        super().__init__()
        self.example_shape = (3, size, size)
        pool = nn.MaxPool2d(2, 2)
        self.to26 = nn.Sequential(_conv_bn_leaky(3, 16, 3), pool, _conv_bn_leaky(16, 32, 3), pool,
                                  _conv_bn_leaky(32, 64, 3), pool, _conv_bn_leaky(64, 128, 3), pool,
                                  _conv_bn_leaky(128, 256, 3))
        self.to13 = nn.Sequential(pool, _conv_bn_leaky(256, 512, 3), _SamePool(), _conv_bn_leaky(512, 1024, 3),
                                  _conv_bn_leaky(1024, 256, 1))
        self.outputs = classes + 5
        self.head13 = nn.Sequential(_conv_bn_leaky(256, 512, 3), nn.Conv2d(512, 3 * self.outputs, 1))
        self.lateral = _conv_bn_leaky(256, 128, 1)
        self.head26 = nn.Sequential(_conv_bn_leaky(384, 256, 3), nn.Conv2d(256, 3 * self.outputs, 1))

    def forward(self, x):
        c26 = self.to26(x)
        c13 = self.to13(c26)
        up = nn.functional.interpolate(self.lateral(c13), scale_factor=2.0, mode="nearest")
        maps = [self.head13(c13), self.head26(torch.cat([up, c26], dim=1))]
        return torch.cat([m.reshape(x.shape[0], 3, self.outputs, -1) for m in maps], dim=3)


# name -> constructor (a model class or a function of the options `build` passes on)
NETWORKS = {"resnet18": resnet18, "resnet50": resnet50, "mobilenet_v2": MobileNetV2, "bert_encoder": bert_encoder,
            "resnext50": resnext50, "squeezenet": SqueezeNet, "mobilenet_v3": MobileNetV3Small, "dcgan": DCGAN,
            "vit": ViT, "gpt_decoder": GPTDecoder, "convnext_tiny": ConvNeXt, "shufflenet_v2": ShuffleNetV2,
            "mlp_mixer": MLPMixer, "efficientnet_b0": EfficientNetB0, "smollm_decoder": LlamaDecoder,
            "wav2vec2": Wav2Vec2, "whisper_encoder": WhisperEncoder, "quartznet": QuartzNet, "t5_encoder": T5Encoder,
            "ecapa_tdnn": ECAPATDNN, "conformer": ConformerEncoder, "conv_tasnet": ConvTasNet, "unet": UNet,
            "yolov5s": YOLOv5s, "x3d_xs": X3D, "swin_t": SwinT,
            "densenet121": DenseNet121, "inception_v3": InceptionV3, "regnet_y_400mf": RegNetY400MF,
            "mobilevit_xs": MobileViTXS, "segformer_b0": SegFormerB0, "hifigan": HiFiGAN,
            "poolformer_s12": PoolFormerS12, "superpoint": SuperPoint, "levit_128": LeViT,
            "googlenet": GoogLeNet, "mnasnet": MNASNet, "alexnet": AlexNet,
            "regnet_x_400mf": RegNetX400MF, "pointnet": PointNet, "mobilenet_v3_large": MobileNetV3Large,
            "vgg11": VGG11, "minilm_l6": SentenceMiniLM, "dlrm": DLRM, "gat": GAT,
            "capsnet": CapsNet, "nerf": NeRF, "edsr": EDSR, "deeplabv3": DeepLabV3,
            "lstm_lm": LSTMLanguageModel, "cyclegan": CycleGANGenerator, "wavenet": WaveNet,
            "char_cnn": CharCNN, "xception": Xception,
            "gpt2_decode": GPT2Decode, "t5_decode": T5Decode,
            "deepspeech2": DeepSpeech2, "rnnsearch_decode": RNNsearchDecode,
            "tiny_yolov3": TinyYOLOv3, "wide_resnet50_2": wide_resnet50_2, "vit_b16": vit_b16}


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
        shape = (c.seq, c.hidden)
    else:
        shape = getattr(model, "example_shape", (3, 224, 224))
    example = (torch.randn(batch, *shape, generator=gen),)
    return model, example
