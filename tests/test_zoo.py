"""dataset=zoo: real networks exported from torch and split into MetaSchedule tasks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from pipeline.core import identity
from pipeline.workloads import networks, zoo
from pipeline.options import workspace_of

CONF = Path(__file__).resolve().parents[1] / "conf"
CUDA = {"kind": "cuda", "arch": "sm_90a", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def _cfg(**dataset):
    """The `dataset` group's config of a zoo dataset."""
    return OmegaConf.create({"name": "zoo", "source": "zoo", "batch": 1, **dataset})


def _llvm():
    import tvm

    return tvm.target.Target({"kind": "llvm", "num-cores": 1})


@pytest.fixture(scope="module")
def resnet18():
    return zoo.load(_cfg(networks=["resnet18"]), _llvm())


def test_resnet18_tasks(resnet18):
    from tvm import tirx

    from pipeline.workloads import args_of

    names = [w.name for w in resnet18]
    assert len(names) == len(set(names)) >= 15
    assert {w.network for w in resnet18} == {"resnet18"} and {w.source for w in resnet18} == {"zoo"}
    assert all(w.weight >= 1 for w in resnet18)
    # ResNet-18 runs 20 convolutions (17 in the blocks and stem, 3 downsampling 1x1s),
    # one max pool, one average pool, one flatten and one dense layer.
    assert sum(w.weight for w in resnet18 if "conv2d" in w.name) == 20
    assert sum(w.weight for w in resnet18) == 24
    # BatchNorm is folded: convolutions fuse with their bias add and ReLU.
    assert any(w.name.startswith("fused_conv2d") and w.name.endswith("relu") for w in resnet18)
    assert not any("batch_norm" in w.name or "divide" in w.name for w in resnet18)
    for w in resnet18:
        assert isinstance(w.mod["main"], tirx.PrimFunc)
        assert args_of(w.mod)  # what stage=tasks stores as args_json
    assert len({identity.task_id(w.mod) for w in resnet18}) == len(resnet18)
    stem = next(w for w in resnet18 if [3, 224, 224] == args_of(w.mod)[0][1][1:])
    assert args_of(stem.mod)[-1] == ["float32", [1, 64, 112, 112]]


def test_a_task_builds_and_runs(resnet18):
    import tvm

    from pipeline.workloads import args_of

    task = next(w for w in resnet18 if w.name.startswith("fused_matmul"))  # the dense layer
    lib = tvm.compile(task.mod, target=_llvm())
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    arrays = [tvm.runtime.tensor(rng.standard_normal(shape).astype(dtype), dev) for dtype, shape in args_of(task.mod)]
    lib["main"](*arrays)
    x, w, b, out = (a.numpy() for a in arrays)
    np.testing.assert_allclose(out, x @ w + b, rtol=1e-4, atol=1e-4)


def test_bert_encoder_tasks_llvm_and_cuda():
    import tvm

    from pipeline.workloads import args_of

    cfg = _cfg(networks=["bert_encoder"], bert_layers=1)
    llvm = zoo.load(cfg, _llvm())
    cuda = zoo.load(cfg, tvm.target.Target(CUDA))
    by_name = {w.name: w for w in llvm}
    # query, key and value projections: one 768x768 dense task called three times.
    qkv = [w for w in llvm if w.weight == 3 and w.name.startswith("fused_matmul")]
    assert len(qkv) == 1
    # The FFN's first dense layer carries its bias and GELU.
    assert any("gelu" in n and "matmul" in n for n in by_name)
    assert any(n.startswith("softmax") for n in by_name)
    # Only float inputs: no gather by integer ids that a runner would fill with garbage.
    for w in llvm:
        assert all(dtype == "float32" for dtype, _ in args_of(w.mod)), w.name
    # The target does not change the tasks, only how they will be tuned.
    assert [identity.task_id(w.mod) for w in llvm] == [identity.task_id(w.mod) for w in cuda]


def test_unknown_network_lists_valid_names():
    with pytest.raises(ValueError) as e:
        zoo.load(_cfg(networks=["resnet18", "vgg16"]), _llvm())
    msg = str(e.value)
    assert "vgg16" in msg and "dataset.networks" in msg
    for name in networks.NETWORKS:
        assert name in msg


def test_networks_run_in_torch():
    """The definitions are the published shapes: logits of 1000 classes, BERT hidden states."""
    import torch

    for name, shape in [("mobilenet_v2", (2, 1000))]:
        model, example = networks.build(name, batch=2)
        with torch.no_grad():
            assert tuple(model(*example).shape) == shape
    model, (words,) = networks.build("bert_encoder", batch=1, layers=1)
    assert tuple(words.shape) == (1, 128, 768)
    with torch.no_grad():
        assert tuple(model(words).shape) == (1, 128, 768)
    n_params = sum(p.numel() for p in networks.resnet50().parameters())
    assert n_params == 25_557_032  # torchvision's resnet50
    # torchvision's squeezenet1_1, mobilenet_v3_small, resnext50_32x4d, convnext_tiny,
    # shufflenet_v2_x1_0 and efficientnet_b0, timm's vit_small_patch16_224 and mixer_s16_224;
    # SmolLM2-135M's 134,515,008 less its (tied) 49,152 x 576 token embedding; wav2vec 2.0
    # base's layers (a plain weight for the weight-normalised position convolution, no
    # training-only mask embedding); openai-whisper's tiny encoder 7,632,384 (its key
    # projection, bias-free there, shares the fused projection's bias here: + 4 x 384);
    # QuartzNet 5x5's 6.7M; t5-small's 60,506,624 less its 32,128 x 512 embedding and decoder;
    # ECAPA-TDNN (C 512) 6.19M and Conv-TasNet 5.1M as their papers count; YOLOv5s (v6.0)
    # as its model summary counts it unfused; X3D-XS as pytorchvideo builds it (its model zoo
    # lists 3.79M); torchvision's swin_t and densenet121; torchvision's inception_v3 27,161,264
    # less its training-only auxiliary classifier (3,326,696); torchvision's regnet_y_400mf;
    # timm's mobilevit_xs; Hugging Face's SegFormer-B0 (nvidia/mit-b0 with the decode head,
    # 150 classes), SpeechT5's HiFi-GAN (microsoft/speecht5_hifigan), PoolFormer-S12
    # (sail/poolformer_s12), SuperPoint (magic-leap-community/superpoint) and LeViT-128
    # (facebook/levit-128 with its distillation head); torchvision's googlenet without its
    # training-only auxiliary classifiers; torchvision's mnasnet0_5, alexnet and regnet_x_400mf;
    # PointNet as pointnet.pytorch builds it (PointNetCls, 40 classes, with the feature transform);
    # torchvision's mobilenet_v3_large and vgg11; sentence-transformers' all-MiniLM-L6-v2
    # 22,713,216 less its 30,522 x 384 word embedding (the input here) and its unused pooler
    published = {"squeezenet": 1_235_496, "mobilenet_v3": 2_542_856, "resnext50": 25_028_904, "vit": 22_050_664,
                 "convnext_tiny": 28_589_128, "shufflenet_v2": 2_278_604, "mlp_mixer": 18_528_264,
                 "efficientnet_b0": 5_288_548, "smollm_decoder": 134_515_008 - 49_152 * 576, "wav2vec2": 94_370_816,
                 "whisper_encoder": 7_632_384 + 4 * 384, "quartznet": 6_713_181, "t5_encoder": 18_881_280,
                 "ecapa_tdnn": 6_191_360, "conv_tasnet": 5_050_545, "yolov5s": 7_235_389, "x3d_xs": 3_794_322,
                 "swin_t": 28_288_354, "densenet121": 7_978_856,
                 "inception_v3": 27_161_264 - 3_326_696, "regnet_y_400mf": 4_344_144, "mobilevit_xs": 2_317_848,
                 "segformer_b0": 3_752_694, "hifigan": 12_656_257, "poolformer_s12": 11_915_176,
                 "superpoint": 1_300_865, "levit_128": 9_213_936, "googlenet": 6_624_904,
                 "mnasnet": 2_218_512, "alexnet": 61_100_840, "regnet_x_400mf": 5_495_976,
                 "pointnet": 3_471_473, "mobilenet_v3_large": 5_483_032, "vgg11": 132_863_336,
                 "minilm_l6": 22_713_216 - 30_522 * 384 - (384 * 384 + 384),
                 # MLPerf DLRM's dense layers: bottom 13-512-256-128, top 479-1024-1024-512-256-1
                 "dlrm": sum(i * o + o for i, o in [(13, 512), (512, 256), (256, 128), (479, 1024),
                                                    (1024, 1024), (1024, 512), (512, 256), (256, 1)]),
                 # the reference GAT for Cora: 1433 -> 8 heads x 8 and 64 -> 7, no biases, an
                 # attention vector of twice the width per head
                 "gat": 1433 * 64 + 8 * 2 * 8 + 64 * 7 + 2 * 7,
                 # the paper's 8.2M: two 9x9 convolutions, a 16x8 weight per primary-digit pair,
                 # the decoder 160-512-1024-784
                 "capsnet": (81 * 256 + 256) + (256 * 81 * 256 + 256) + 1152 * 10 * 16 * 8
                 + sum(i * o + o for i, o in [(160, 512), (512, 1024), (1024, 784)]),
                 # nerf-pytorch's coarse NeRF: 63-256, six 256-256 and a 319-256 (the skip), density
                 # 256-1, feature 256-256, the view layer 283-128 and colour 128-3
                 "nerf": sum(i * o + o for i, o in [(63, 256)] + [(256, 256)] * 6 + [(319, 256), (256, 1), (256, 256),
                                                                                    (283, 128), (128, 3)]),
                 # EDSR's x2 baseline (1.37M): 3x3 convolutions 3-64, 33 of 64-64, 64-256, 64-3
                 "edsr": sum(9 * i * o + o for i, o in [(3, 64)] + [(64, 64)] * 33 + [(64, 256), (64, 3)]),
                 # torchvision's deeplabv3_resnet50 (42,004,074) less its auxiliary FCN head on
                 # layer 3 (3x3 1024-256, BatchNorm, 1x1 256-21 with bias)
                 "deeplabv3": 42_004_074 - (9 * 1024 * 256 + 2 * 256 + 256 * 21 + 21),
                 # PyTorch's word_language_model, medium and tied: two LSTM layers of 650 (four
                 # gates, two biases each) and the 650-10000 decoder, the embedding being its weight
                 "lstm_lm": 2 * (4 * 650 * (650 + 650) + 2 * 4 * 650) + 650 * 10_000 + 10_000,
                 # CycleGAN's resnet_6blocks generator (7.84M): 7x7 3-64, 3x3 64-128 and 128-256,
                 # twelve 3x3 256-256, transposed 3x3 256-128 and 128-64, 7x7 64-3, all with bias
                 "cyclegan": sum(k * k * i * o + o for k, i, o in [(7, 3, 64), (3, 64, 128), (3, 128, 256)]
                                 + [(3, 256, 256)] * 12 + [(3, 256, 128), (3, 128, 64), (7, 64, 3)]),
                 # tensorflow-wavenet's defaults (1.52M): causal kernel-2 256-32, fifty layers of a
                 # dilated kernel-2 32-64, 1x1 32-32 and 32-512, the head 1x1 512-512 and 512-256
                 "wavenet": sum(k * i * o + o for k, i, o in [(2, 256, 32)] + [(2, 32, 64), (1, 32, 32), (1, 32, 512)] * 50
                                + [(1, 512, 512), (1, 512, 256)]),
                 # Zhang, Zhao and LeCun's small character CNN (11.34M): 1-D 70-256 (7), 256-256 (7),
                 # four 256-256 (3), then 256 x 34 frames -> 1024 -> 1024 -> 4 classes
                 "char_cnn": sum(k * i * o + o for k, i, o in [(7, 70, 256), (7, 256, 256)] + [(3, 256, 256)] * 4
                                 + [(1, 256 * 34, 1024), (1, 1024, 1024), (1, 1024, 4)]),
                 # Keras applications' Xception: 22,910,480 parameters, of which 22,855,952 are
                 # trainable (BatchNorm's moving statistics are buffers in torch, not parameters)
                 "xception": 22_855_952,
                 # Hugging Face's gpt2 (124,439,808) less its 1,024 x 768 position table: the step's
                 # input is the new token's embedded state; the output layer is the word table
                 "gpt2_decode": 124_439_808 - 1024 * 768,
                 # T5-small (60,506,624 with its tied word table) less its encoder (t5_encoder's count)
                 # and the cross-attention's key and value projections, applied once to the
                 # encoder's output and cached; the output layer is the word table
                 "t5_decode": 60_506_624 - 18_881_280 - 6 * 2 * 512 * 512,
                 # deepspeech.pytorch's DeepSpeech at its defaults, counted from its layers: the two
                 # convolutions and their BatchNorms, a bidirectional LSTM 1312-1024 (4 gates, two
                 # biases each), four 1024-1024 ones with a BatchNorm before each, BatchNorm, 1024-29
                 "deepspeech2": (41 * 11 * 32 + 32) + (21 * 11 * 32 * 32 + 32) + 2 * 2 * 32
                                + 2 * 4 * (1312 * 1024 + 1024 * 1024 + 2 * 1024)
                                + 4 * (2 * 1024 + 2 * 4 * (2 * 1024 * 1024 + 2 * 1024)) + 2 * 1024 + 1024 * 29}
    for name, count in published.items():
        assert sum(p.numel() for p in networks.NETWORKS[name]().parameters()) == count, name
    for name, shape in [("dcgan", (1, 1)), ("gpt_decoder", (1, 256, 512)), ("vit", (1, 1000)),
                        ("convnext_tiny", (1, 1000)), ("shufflenet_v2", (1, 1000)), ("mlp_mixer", (1, 1000)),
                        ("efficientnet_b0", (1, 1000)), ("smollm_decoder", (1, 256, 576)), ("wav2vec2", (1, 49, 768)),
                        ("whisper_encoder", (1, 1500, 384)), ("quartznet", (1, 29, 500)), ("t5_encoder", (1, 128, 512)),
                        ("ecapa_tdnn", (1, 192)), ("conformer", (1, 249, 144)), ("conv_tasnet", (1, 2, 8000)),
                        ("unet", (1, 2, 128, 128)), ("yolov5s", (1, 3, 85, 2100)), ("x3d_xs", (1, 400)),
                        ("swin_t", (1, 1000)), ("densenet121", (1, 1000)), ("inception_v3", (1, 1000)),
                        ("regnet_y_400mf", (1, 1000)), ("mobilevit_xs", (1, 1000)),
                        ("segformer_b0", (1, 150, 64, 64)), ("hifigan", (1, 8192)),
                        ("poolformer_s12", (1, 1000)), ("levit_128", (1, 1000)), ("googlenet", (1, 1000)),
                        ("mnasnet", (1, 1000)), ("alexnet", (1, 1000)), ("regnet_x_400mf", (1, 1000)),
                        ("pointnet", (1, 40)), ("mobilenet_v3_large", (1, 1000)), ("vgg11", (1, 1000)),
                        ("minilm_l6", (1, 384)), ("dlrm", (1, 128, 1)), ("gat", (1, 512, 7)),
                        ("edsr", (1, 3, 96, 96)), ("deeplabv3", (1, 21, 224, 224)),
                        ("lstm_lm", (1, 10, 35, 10_000)), ("cyclegan", (1, 3, 128, 128)),
                        ("wavenet", (1, 256, 8000)), ("char_cnn", (1, 4)), ("xception", (1, 1000)),
                        ("gpt2_decode", (1, 50257)), ("t5_decode", (1, 32128)),
                        ("deepspeech2", (1, 51, 29))]:
        model, example = networks.build(name)
        with torch.no_grad():
            assert tuple(model(*example).shape) == shape
    # SuperPoint's two outputs: a score map where only local maxima (9x9) stay nonzero, and
    # descriptors of unit length at each of the 30x40 cells
    model, example = networks.build("superpoint")
    with torch.no_grad():
        scores, descriptors = model(*example)
    assert scores.shape == (1, 240, 320) and descriptors.shape == (1, 256, 30, 40)
    pooled = torch.nn.functional.max_pool2d(scores[:, None], 9, stride=1, padding=4)[:, 0]
    kept = scores > 0
    assert 0 < kept.sum() < scores.numel() / 20 and torch.equal(scores[kept], pooled[kept])
    assert torch.allclose(descriptors.norm(dim=1), torch.ones(1, 30, 40), atol=1e-5)


def test_t5_relative_position_buckets():
    """T5's bidirectional buckets (the encoder's): exact up to 7 apart, logarithmic beyond, keys
    after the query in the upper 16; unidirectional (the decoder's): exact up to 15 back,
    logarithmic to 31 at 127 back. The values Hugging Face's `_relative_position_bucket` gives."""
    buckets = networks._t5_buckets(128)
    assert buckets[0, 0] == 0 and buckets[0, 1] == 17 and buckets[1, 0] == 1 and buckets[7, 0] == 7
    assert buckets[9, 0] == 8 and buckets[20, 0] == 10 and buckets[0, 127] == 31 and buckets[127, 0] == 15
    last = networks._t5_buckets(128, bidirectional=False)[-1]  # the last token looking back
    assert last[[-1, -16, -17, -64, 0]].tolist() == [0, 15, 16, 26, 31]


def test_dlrm_dot_interaction():
    """DLRM's interaction keeps each pair of its 27 vectors once (i > j, as the reference's
    `li, lj = tril_indices(offset=-1)`), after the bottom MLP's own output: 128 + 351 values."""
    import torch

    model = networks.DLRM(queries=2).eval()
    features = torch.randn(2, 13 + 26 * 128)
    with torch.no_grad():
        x = model.bottom(features[:, :13])
        vectors = torch.cat([x[:, None], features[:, 13:].reshape(2, 26, 128)], dim=1)
        pairs = [vectors[:, i] @ vectors[:, j].T for i in range(27) for j in range(i)]
        z = torch.cat([x, torch.stack([p.diagonal() for p in pairs], dim=1)], dim=1)
        assert z.shape == (2, 479)
        assert torch.allclose(model(features[None])[0], torch.sigmoid(model.top(z)), atol=1e-6)


def test_gat_attends_over_the_graph_only():
    """GAT's adjacency is symmetric with self loops, each node's attention weights sum to 1 over
    its neighbours and are 0 elsewhere, and a node's output (two layers) moves with a neighbour's
    features and not with those of a node more than two edges away."""
    import torch

    model = networks.GAT(nodes=64, features=20).eval()
    adjacency = model.adjacency
    assert torch.equal(adjacency, adjacency.T) and bool(adjacency.diagonal().all())
    two_hops = (adjacency.float() @ adjacency.float()) > 0
    node = int(adjacency.sum(1).argmax())
    neighbour = int((adjacency[node] & ~torch.eye(64, dtype=torch.bool)[node]).nonzero()[0])
    far = int((~two_hops[node]).nonzero()[0])
    x = torch.randn(1, 64, 20)
    with torch.no_grad():
        out = model(x)
        moved = {}
        for other in (neighbour, far):
            y = x.clone()
            y[0, other] += 10.0
            moved[other] = model(y)[0, node]
        weights, _ = model.hidden_layer.attention(x, adjacency)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 8, 64)) and bool((weights[..., ~adjacency] == 0).all())
    assert not torch.allclose(moved[neighbour], out[0, node]) and torch.allclose(moved[far], out[0, node])
    assert torch.allclose(out.exp().sum(-1), torch.ones(1, 64), atol=1e-5)


def test_capsnet_routes_by_agreement():
    """CapsNet's coupling coefficients are a softmax over the 10 digits for each of the 1,152
    primary capsules (uniform after one round, moved by agreement after three), the digit
    capsules are shorter than 1, and the decoder reconstructs from the longest one alone."""
    import torch

    model, example = networks.build("capsnet")
    with torch.no_grad():
        lengths, reconstruction = model(*example)
        v, coupling = model.route(*example)
        model.iterations = 1
        _, first = model.route(*example)
        masked = torch.zeros_like(v)
        winner = int(lengths.argmax())
        masked[0, winner] = v[0, winner]
        expected = torch.sigmoid(model.decoder(masked.flatten(1)))
    assert lengths.shape == (1, 10) and reconstruction.shape == (1, 784)
    assert coupling.shape == (1, 1152, 10) and torch.allclose(coupling.sum(-1), torch.ones(1, 1152))
    assert torch.allclose(first, torch.full_like(first, 0.1)) and not torch.allclose(coupling, first, atol=1e-4)
    assert bool((lengths < 1).all()) and torch.allclose(lengths, v.norm(dim=-1))
    assert torch.allclose(reconstruction, expected)


def test_nerf_renders_by_quadrature():
    """NeRF's positions carry 63 encoded values and its directions 27; a ray's sample weights
    are its transmittance (the product of 1 - alpha before the sample) times the sample's
    alpha, so they sum to at most 1, and colour and depth are the weighted sums over samples."""
    import torch

    model, (rays,) = networks.build("nerf")
    origins, directions = rays[0, :, :3], rays[0, :, 3:]
    t = model.depths
    points = origins[:, None] + directions[:, None] * t[:, None]
    unit = directions / directions.norm(dim=-1, keepdim=True)
    assert networks._positional_encoding(points, 10).shape[-1] == 63
    assert networks._positional_encoding(unit, 4).shape[-1] == 27
    with torch.no_grad():
        colour, depth = model(rays)
        density, sample_colour = model.field(points, unit[:, None].expand(points.shape))
    gaps = torch.cat([t[1:] - t[:-1], torch.tensor([1e10])]) * directions.norm(dim=-1, keepdim=True)
    alpha = 1 - torch.exp(-torch.relu(density[..., 0]) * gaps)
    transmittance = torch.cumprod(torch.cat([torch.ones(32, 1), 1 - alpha[:, :-1]], -1), -1)
    weights = transmittance * alpha
    assert colour.shape == (1, 32, 3) and depth.shape == (1, 32)
    assert bool((weights.sum(-1) <= 1 + 1e-5).all()) and 0 < float(weights.sum(-1).mean()) <= 1
    assert torch.allclose(colour[0], (weights[..., None] * sample_colour).sum(1), atol=1e-5)
    assert torch.allclose(depth[0], (weights * t).sum(-1), atol=1e-4)


def test_edsr_skips_add_their_input():
    """EDSR's residual blocks and the body's skip add their input: with every block's last
    convolution zeroed, the blocks pass the head's output through, and the body adds it to
    its own last convolution of it."""
    import torch

    model, (x,) = networks.build("edsr")
    with torch.no_grad():
        for block in model.body:
            block[2].weight.zero_()
            block[2].bias.zero_()
        head = model.head(x - model.mean)
        expected = model.tail(model.upsample(model.body_end(head) + head)) + model.mean
        assert torch.allclose(model(x), expected, atol=1e-6)


def test_deeplabv3_backbone_keeps_output_stride_8():
    """DeepLabV3's ResNet-50 trades the last two strides for dilation as torchvision's
    replace_stride_with_dilation does: its stages end at 56, 28, 28 and 28 for a 224 input,
    the 3x3 convolutions of stage 3 dilate 1 then 2, of stage 4 2 then 4; the pooled ASPP
    branch is one value per channel spread over the map."""
    import torch

    model, (x,) = networks.build("deeplabv3")
    sizes, h = [], model.stem(x)
    with torch.no_grad():
        for stage in model.layers:
            h = stage(h)
            sizes.append(h.shape[-1])
        pooled = torch.nn.functional.interpolate(model.pool(h), size=(28, 28), mode="bilinear", align_corners=False)
    assert sizes == [56, 28, 28, 28] and h.shape[1] == 2048
    assert [b.conv2.dilation[0] for b in model.layers[2]] == [1, 2, 2, 2, 2, 2]
    assert [b.conv2.dilation[0] for b in model.layers[3]] == [2, 4, 4]
    assert torch.allclose(pooled, pooled[..., :1, :1].expand_as(pooled))


def test_lstm_lm_layers_compute_one_two_layer_lstm():
    """The language model's two one-layer LSTMs compute what torch's two-layer LSTM computes
    with the same weights, each stream on its own."""
    import torch

    model, (x,) = networks.build("lstm_lm")
    reference = torch.nn.LSTM(650, 650, num_layers=2, batch_first=True).eval()
    with torch.no_grad():
        for k, layer in enumerate(model.layers):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(reference, f"{name}_l{k}").copy_(getattr(layer, f"{name}_l0"))
        expected = model.decoder(reference(x[0])[0])
        assert torch.allclose(model(x)[0], expected, atol=1e-5)
        assert torch.allclose(model(x[:, 3:4])[0, 0], expected[3], atol=1e-5)


def test_cyclegan_normalizes_each_image_alone():
    """CycleGAN's InstanceNorm normalizes each image's channels on their own (an image's
    translation does not depend on the batch), the residual trunk runs at 256 channels and a
    quarter of the size, and tanh bounds the output."""
    import torch

    model, (x,) = networks.build("cyclegan", batch=2)
    with torch.no_grad():
        out = model(x)
        assert torch.allclose(model(x[1:]), out[1:], atol=1e-5) and out.abs().max() <= 1
        trunk_input = model.net[:9](x)  # the second downsampling convolution and its InstanceNorm
    assert trunk_input.shape == (2, 256, 32, 32)
    assert torch.allclose(trunk_input.mean((2, 3)), torch.zeros(2, 256), atol=1e-4)
    assert torch.allclose(trunk_input.var((2, 3), unbiased=False), torch.ones(2, 256), atol=1e-2)

def test_wavenet_sees_the_past_within_its_receptive_field():
    """WaveNet's output at a sample depends on the 5,117 samples up to it (1 + five stacks of
    dilations summing to 1,023) and on none after it: the gradient of one output sample's
    logits over the input is nonzero exactly there."""
    import torch

    model, _ = networks.build("wavenet", samples=6000)
    model.double()  # the farthest samples' gradients (~1e-48) vanish in float32
    x = torch.nn.functional.one_hot(torch.randint(0, 256, (1, 6000)), 256).double().transpose(1, 2)
    x.requires_grad_(True)
    t = 5500
    model(x)[0, :, t].sum().backward()
    reached = x.grad.abs().sum(1)[0].nonzero().flatten()
    assert reached.min().item() == t - 5116 and reached.max().item() == t
    assert len(reached) == 5117


def test_char_cnn_frames_and_eval_mode():
    """The character CNN's six convolutions and three pools leave (l0 - 96) / 27 = 34 frames of
    1,014 characters (the paper's figure), and in eval mode its dropout is off: a text's logits
    are the same alone, again, and within a batch."""
    import torch

    model, (x,) = networks.build("char_cnn", batch=2)
    with torch.no_grad():
        assert model.features(x).shape == (2, 256, (1014 - 96) // 27) == (2, 256, 34)
        out = model(x)
        assert torch.equal(model(x), out) and torch.allclose(model(x[1:]), out[1:], atol=1e-5)


def test_xception_flows_and_residuals():
    """Xception's entry flow halves 147x147 three times (to 74, 37, 19), the middle flow keeps
    728 x 19 x 19 through eight blocks, the exit flow ends at 10x10; and a middle block adds its
    input: with its last BatchNorm zeroed, the block is the identity."""
    import torch

    model, (x,) = networks.build("xception")
    blocks = [m for m in model.features if isinstance(m, networks._XceptionBlock)]
    sizes = []
    with torch.no_grad():
        h = model.features[:6](x)
        for block in blocks:
            h = block(h)
            sizes.append(tuple(h.shape[1:]))
        assert sizes == [(128, 74, 74), (256, 37, 37)] + [(728, 19, 19)] * 9 + [(1024, 10, 10)]
        middle, h = blocks[3], torch.randn(1, 728, 19, 19)
        middle.body[-1].weight.zero_()
        middle.body[-1].bias.zero_()
        assert torch.equal(middle(h), h)


def test_gpt2_decode_step_is_the_last_position_of_a_causal_pass():
    """Decoding with a cache is the full causal pass read at its last position: with the cache
    holding the keys and values the layer computes for 255 tokens, its output for the 256th is
    what causal attention over all 256 (torch's scaled_dot_product_attention) gives there."""
    import torch
    import torch.nn.functional as F

    model, _ = networks.build("gpt2_decode")
    layer = model.layers[0]
    x = torch.randn(256, 768, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        q, k, v = layer.qkv(layer.ln1(x)).reshape(256, 3, 12, 64).permute(1, 2, 0, 3)  # each [12, 256, 64]
        layer.past_keys.copy_(k[None, :, :255])
        layer.past_values.copy_(v[None, :, :255])
        full = x + layer.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(256, 768))
        full = full + layer.mlp(layer.ln2(full))
        assert torch.allclose(layer(x[255:]), full[255:], atol=1e-4)
        assert not torch.allclose(layer(x[254:255]), full[254:255], atol=1e-4)  # a token the cache already holds


def test_t5_decode_step_is_the_last_position_of_a_causal_pass():
    """A step with the cache holding the keys and values the layer computes for 63 tokens
    gives, for the 64th, what causal attention over all 64 with each query's own
    unidirectional position bias gives there."""
    import torch

    model, _ = networks.build("t5_decode")
    layer, table = model.layers[0], model.relative_bias.weight
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h = layer.norm1(x)
        q, k, v = (y.reshape(64, 8, 64).transpose(0, 1) for y in (layer.q(h), layer.k(h), layer.v(h)))  # [8, 64, 64]
        layer.past_keys.copy_(k[None, :, :63])
        layer.past_values.copy_(v[None, :, :63])
        causal = torch.ones(64, 64, dtype=torch.bool).tril()  # query i sees keys 0..i
        bias = table[networks._t5_buckets(64, bidirectional=False)].permute(2, 0, 1).masked_fill(~causal, float("-inf"))
        full = x + layer.o(((q @ k.transpose(1, 2) + bias).softmax(-1) @ v).transpose(0, 1).reshape(64, 512))
        cq = layer.cross_q(layer.norm2(full)).reshape(64, 8, 64).transpose(0, 1)
        cross = (cq @ layer.source_keys[0].transpose(1, 2)).softmax(-1) @ layer.source_values[0]
        full = full + layer.cross_o(cross.transpose(0, 1).reshape(64, 512))
        full = full + layer.mlp(layer.norm3(full))
        assert torch.allclose(layer(x[63:], model.bias), full[63:], atol=1e-4)
        assert not torch.allclose(layer(x[62:63], model.bias), full[62:63], atol=1e-4)  # a token the cache already holds


def test_deepspeech2_convolutions_and_summed_directions():
    """The convolutions leave 32 channels x 41 frequencies at 51 steps of 161 x 101; a recurrent
    layer's output is its forward LSTM's plus its backward LSTM's (run over the steps reversed,
    then reversed back), after the BatchNorm over each step's features."""
    import torch
    from torch import nn

    model, example = networks.build("deepspeech2")
    layer = model.rnns[1]
    x = torch.randn(51, 1, 1024, generator=torch.Generator().manual_seed(1))
    forward, backward = nn.LSTM(1024, 1024), nn.LSTM(1024, 1024)
    with torch.no_grad():
        assert model.conv(example[0]).shape == (1, 32, 41, 51)
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(forward, name).copy_(getattr(layer.rnn, name))
            getattr(backward, name).copy_(getattr(layer.rnn, name + "_reverse"))
        h = layer.norm(x.reshape(51, 1024)).reshape(51, 1, 1024)
        assert torch.allclose(layer(x), forward(h)[0] + backward(h.flip(0))[0].flip(0), atol=1e-5)

def test_rnnsearch_step_attends_and_gates_as_the_paper_writes():
    """With the alignment scores saturated on one source word, the step is the step whose 50
    annotations are all that word's (the context is that annotation); with the update gate
    shut (its bias at -1e4) the new state is the previous one."""
    import torch

    model, (x,) = networks.build("rnnsearch_decode", batch=2)
    with torch.no_grad():
        logits, state = model(x)
        assert logits.shape == (2, 30000) and state.shape == (2, 1000)
        model.score.weight.mul_(1e3)
        model.keys.copy_(-50 * model.score.weight.sign().expand(50, -1))
        model.keys[7] *= -1  # tanh at +-1 where v_a is +-: word 7 scores the most by 2e3 |v_a|
        attended = model(x)
        model.annotations.copy_(model.annotations[7].expand(50, -1).clone())
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(attended, model(x)))
        model.word.bias[:1000] = -1e4
        assert torch.allclose(model(x)[1], x[:, 620:], atol=1e-6)


def test_tiny_yolov3_pool_of_stride_one_and_its_two_scales():
    """The stride-1 max pool keeps 13x13 and takes the max over the window's cells inside the
    map (a -inf border, not zeros: leaky ReLU leaves negative values); the heads see 13x13 and
    26x26 maps and give 3 x 85 values at each of their 169 + 676 positions."""
    import torch
    import torch.nn.functional as F

    model, (x,) = networks.build("tiny_yolov3")
    h = -torch.rand(2, 4, 13, 13, generator=torch.Generator().manual_seed(1))  # all negative
    pooled = networks._SamePool()(h)
    assert torch.equal(pooled, F.max_pool2d(F.pad(h, (0, 1, 0, 1), value=float("-inf")), 2, 1))
    assert not torch.equal(pooled, F.max_pool2d(F.pad(h, (0, 1, 0, 1)), 2, 1))
    with torch.no_grad():
        c26 = model.to26(x)
        assert c26.shape == (1, 256, 26, 26) and model.to13(c26).shape == (1, 256, 13, 13)
        assert model(x).shape == (1, 3, 85, 169 + 676)


def test_wide_resnet_doubles_the_inner_width_with_dense_3x3s():
    """Wide ResNet-50-2: each bottleneck's 1x1 and 3x3 convolutions twice as wide as
    ResNet-50's, the 3x3 dense (ResNeXt-50 has the same widths in 32 groups), the blocks'
    outputs and the classifier as ResNet-50's; torchvision's wide_resnet50_2 has 68,883,240
    parameters."""
    import torch

    wide, plain = networks.wide_resnet50_2(), networks.resnet50()
    assert sum(p.numel() for p in wide.parameters()) == 68_883_240
    convs = [(m.in_channels, m.out_channels, m.groups) for m in wide.layers[2][1].modules()
             if isinstance(m, torch.nn.Conv2d)]
    assert convs == [(1024, 512, 1), (512, 512, 1), (512, 1024, 1)]
    ref = [m.out_channels for m in plain.layers[2][1].modules() if isinstance(m, torch.nn.Conv2d)]
    assert ref == [256, 256, 1024]
    model, (x,) = networks.build("wide_resnet50_2")
    with torch.no_grad():
        assert model.layers(model.stem(x)).shape == (1, 2048, 7, 7) and model(x).shape == (1, 1000)


def test_vit_base_is_vit_small_twice_as_wide():
    """ViT-B/16: ViT-S/16's 12 layers over the same 197 tokens with hidden 768, 12 heads of 64
    and a 3,072-wide MLP; timm's vit_base_patch16_224 has 86,567,656 parameters."""
    import torch

    base, small = networks.vit_b16(), networks.ViT()
    assert sum(p.numel() for p in base.parameters()) == 86_567_656
    assert (base.seq, base.hidden, len(base.layers)) == (small.seq, 768, len(small.layers)) == (197, 768, 12)
    layer = base.layers[0]
    assert (layer.heads, layer.head_dim) == (12, 64) and tuple(layer.mlp[0].weight.shape) == (768, 3072)
    model, (x,) = networks.build("vit_b16")
    with torch.no_grad():
        assert model(x).shape == (1, 1000)


def test_swin_shifted_window_mask():
    """After the cyclic shift by 3 of a 14x14 map, the top-left 7x7 window holds one region
    (no mask) and the bottom-right four (4x4, 4x3, 3x4, 3x3 tokens): a token attends only to
    the tokens of its own region, as in Swin's reference mask."""
    import torch

    mask = networks._window_mask(14, 7, 3)
    assert mask.shape == (4, 49, 49) and torch.equal(mask, mask.transpose(1, 2))
    assert (mask[0] == 0).all()
    assert sorted(set((mask[3] == 0).sum(dim=1).tolist())) == [9, 12, 16]
    assert set(mask.unique().tolist()) == {-100.0, 0.0}


RELEASES = Path(__file__).resolve().parents[1] / "data" / "releases"


def _released_networks() -> list[tuple[str, str]]:
    """(release, network) for every network a committed dataset release was made from, as
    its manifest's selection names them."""
    pairs = []
    for path in sorted(RELEASES.glob("*/manifest.json")):
        manifest = json.loads(path.read_text())
        if manifest.get("kind") == "dataset":
            pairs += [(path.parent.name, network) for network in manifest["selection"].get("dataset.networks") or []]
    return pairs


@pytest.mark.parametrize("release,network", _released_networks())
def test_networks_still_yield_their_released_tasks(release, network):
    """A change to a network's definition that changes its tasks would orphan the released
    labels: the definition must give the tasks (ids and weights) its release holds."""
    import pandas as pd

    held = pd.read_parquet(RELEASES / release / "tables" / "network_tasks.parquet").query("network == @network")
    tasks = zoo.load(_cfg(networks=[network]), _llvm())
    assert {identity.task_id(t.mod): t.weight for t in tasks} == dict(zip(held["task_id"], held["weight"]))


def test_constants_folded_in_numpy_give_foldconstants_tasks_and_outputs():
    """A BatchNorm with no convolution before it to fold into (DenseNet's pre-activation)
    leaves arithmetic on constant statistics, and a gather from a constant table leaves a
    take: folded in NumPy before legalization, they give the tasks FoldConstant gives, and
    the network computes what torch does."""
    import torch
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.conv = torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 3, padding=1)
            self.table = torch.nn.Parameter(torch.randn(5, 4))
            self.register_buffer("index", torch.tensor([4, 0, 2, 2]))

        def forward(self, x):
            return self.conv(torch.relu(self.norm(x))) + self.table[self.index].sum(0).reshape(1, 4, 1, 1)

    torch.manual_seed(0)
    model = Net().eval()
    model.norm.running_mean.uniform_(-1, 1), model.norm.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 8, 10, 10)
    mod = zoo.from_torch(model, (x,))
    expected = model(x).detach().numpy()
    found = []
    for fold_in_numpy in (True, False):
        fused = zoo.fuse(mod, fold_in_numpy=fold_in_numpy)
        tasks = ms.relax_integration.extract_tasks(fused, _llvm())
        found.append({identity.task_id(zoo.as_main(t.dispatched[0])): t.weight for t in tasks})
        vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x.numpy())).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert found[0] == found[1] and found[0]
    # the folded module has no call left whose inputs are all constants
    folded = zoo.fold_constants_in_numpy()(relax.transform.DecomposeOpsForInference()(mod))
    assert "R.sqrt" not in folded.script() and "R.take" not in folded.script()


def test_stage_tasks_on_zoo(tmp_path):
    from hydra import compose, initialize_config_dir

    from pipeline.stages import tasks
    from pipeline.core.workspace import read_table

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["dataset=zoo", "dataset.networks=[resnet18]", "budget=smoke",
                                           f"paths.data={tmp_path}"])
    assert tasks.run(cfg) == {"tasks": 3, "records": 0}
    df = read_table(workspace_of(cfg).tasks)
    assert set(df["network"]) == {"resnet18"} and set(df["source"]) == {"zoo"}
    # budget=smoke keeps the heaviest tasks (weight x FLOPs): convolutions.
    assert all("conv2d" in n for n in df["name"])
    assert all(json.loads(a) for a in df["args_json"])
