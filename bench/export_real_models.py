"""Export torchvision's classifiers to architecture-only ONNX files: tvm_rtask/models/real.

Usage (in a separate environment with torchvision; never a dependency of tvm-rtask):

    python3 -m venv /tmp/tvexport
    /tmp/tvexport/bin/pip install torch torchvision onnx onnxscript
    /tmp/tvexport/bin/python bench/export_real_models.py [--models resnet18 ...] [--out DIR]

Each model is built by torchvision twice, in eval mode and batch 1: at full size (torchvision's
constructor with ``weights=None``, 224x224, Inception v3 299x299) and reduced (the same
operator kinds, a small input and, where the constructors allow, fewer and narrower layers;
see ``REDUCED``). Each is exported once with ``torch.onnx.export`` (the ``torch.export``
exporter, opset 18, static shapes, its optimiser on: BatchNorm folded into the convolutions),
then every floating-point weight is replaced by a ``ConstantOfShape`` node of its shape
(``tvm_rtask.testing.onnx_light.strip_weights``), so a file is KBs. The loader
(``tvm_rtask.models.real.load_real_model``) makes seeded random weights of those nodes.

Writes ``<out>/full/<name>.onnx``, ``<out>/reduced/<name>.onnx`` and ``<out>/models.json``
(names, inputs, outputs, configurations, operator counts, parameters, versions).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import importlib.util
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(ROOT, "tvm_rtask", "models", "real")
OPSET = 18

try:
    import onnx
    import torch
    import torchvision
    from torchvision import models as tvm_models
except ImportError as exc:  # pragma: no cover - the exporter's own environment
    sys.exit(
        f"bench/export_real_models.py needs torch, torchvision, onnx and onnxscript ({exc}); "
        "it runs in its own environment, e.g. python3 -m venv /tmp/tvexport && "
        "/tmp/tvexport/bin/pip install torch torchvision onnx onnxscript"
    )


def _onnx_light():
    """tvm_rtask/testing/onnx_light.py by path: it needs numpy and onnx only, while importing
    the tvm_rtask package would need TVM in this environment."""
    path = os.path.join(ROOT, "tvm_rtask", "testing", "onnx_light.py")
    spec = importlib.util.spec_from_file_location("onnx_light", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------
# The reduced configurations: the same operator kinds, much cheaper.


def _narrow_conv(cls, factor):
    """A BasicConv2d class (GoogLeNet, Inception v3) with every channel count divided by
    ``factor`` (the 3 input channels stay): the blocks' concatenations stay consistent."""

    class Narrow(cls):
        def __init__(self, in_channels, out_channels, **kwargs):
            in_channels = in_channels if in_channels == 3 else in_channels // factor
            super().__init__(in_channels, out_channels // factor, **kwargs)

    return Narrow


def _reduced_googlenet():
    g = importlib.import_module("torchvision.models.googlenet")

    narrow = _narrow_conv(g.BasicConv2d, 8)
    # the Inception blocks build their convolutions with their own conv_block argument
    blocks = [narrow, functools.partial(g.Inception, conv_block=narrow), g.InceptionAux]
    model = g.GoogLeNet(num_classes=10, aux_logits=False, init_weights=False, blocks=blocks)
    model.fc = torch.nn.Linear(1024 // 8, 10)
    return model


def _reduced_inception_v3():
    i = importlib.import_module("torchvision.models.inception")

    narrow = _narrow_conv(i.BasicConv2d, 8)
    blocks = [narrow] + [
        functools.partial(block, conv_block=narrow)
        for block in (i.InceptionA, i.InceptionB, i.InceptionC, i.InceptionD, i.InceptionE)
    ]
    blocks.append(i.InceptionAux)
    model = i.Inception3(
        num_classes=10, aux_logits=False, init_weights=False, inception_blocks=blocks
    )
    model.fc = torch.nn.Linear(2048 // 8, 10)
    return model


def _reduced_mobilenet_v3_small():
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf

    setting, last_channel = _mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.5)
    # blocks 0 (SE, ReLU, stride 2), 1-2 (ReLU), 3-4 (SE, hard-swish, 5x5): every kind once
    setting = setting[:5]
    return MobileNetV3(setting, last_channel // 4, num_classes=10)


def _reduced_efficientnet_b0():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    # B0's last channel count is 4x its last stage's output (last_channel is None)
    setting, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.1)
    return EfficientNet(setting, dropout=0.2, last_channel=last_channel, num_classes=10)


def _reduced_regnet_y_400mf():
    from torchvision.models.regnet import BlockParams, RegNet

    params = BlockParams.from_init_params(
        depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25
    )
    return RegNet(params, num_classes=10, stem_width=16)


def _reduced_convnext_tiny():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    setting = [
        CNBlockConfig(16, 32, 1),
        CNBlockConfig(32, 64, 1),
        CNBlockConfig(64, 128, 1),
        CNBlockConfig(128, None, 1),
    ]
    return ConvNeXt(setting, num_classes=10)


def _reduced_mnasnet0_5():
    return tvm_models.MNASNet(alpha=0.25, num_classes=10)


def _reduced_vit_b_16():
    return tvm_models.VisionTransformer(
        image_size=32,
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        mlp_dim=128,
        num_classes=10,
    )


def _models():
    """name -> (summary, full builder, full size, reduced builder, reduced size, reduced
    configuration in words)."""
    from torchvision.models import densenet, mobilenetv2, resnet, shufflenetv2, squeezenet

    m = tvm_models
    return {
        "resnet18": (
            "ResNet-18 (He et al., CVPR 2016)",
            lambda: m.resnet18(),
            224,
            lambda: resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10),
            32,
            "ResNet(BasicBlock, [1, 1, 1, 1]): one block per stage",
        ),
        "resnet50": (
            "ResNet-50 (He et al., CVPR 2016)",
            lambda: m.resnet50(),
            224,
            lambda: resnet.ResNet(
                resnet.Bottleneck, [1, 1, 1, 1], width_per_group=16, num_classes=10
            ),
            32,
            "ResNet(Bottleneck, [1, 1, 1, 1], width_per_group=16)",
        ),
        "resnext50_32x4d": (
            "ResNeXt-50 32x4d (Xie et al., CVPR 2017)",
            lambda: m.resnext50_32x4d(),
            224,
            lambda: resnet.ResNet(
                resnet.Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=4, num_classes=10
            ),
            32,
            "ResNet(Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=4)",
        ),
        "mobilenet_v2": (
            "MobileNet v2 (Sandler et al., CVPR 2018)",
            lambda: m.mobilenet_v2(),
            224,
            lambda: mobilenetv2.MobileNetV2(
                num_classes=10,
                width_mult=0.25,
                inverted_residual_setting=[
                    [1, 16, 1, 1],
                    [6, 24, 2, 2],
                    [6, 32, 1, 2],
                    [6, 64, 1, 2],
                    [6, 96, 1, 1],
                    [6, 160, 1, 2],
                    [6, 320, 1, 1],
                ],
            ),
            32,
            "MobileNetV2(width_mult=0.25), one block per stage (two in the second: a residual)",
        ),
        "mobilenet_v3_small": (
            "MobileNet v3 small (Howard et al., ICCV 2019)",
            lambda: m.mobilenet_v3_small(),
            224,
            _reduced_mobilenet_v3_small,
            32,
            "MobileNetV3 small, width_mult=0.5, its first 5 blocks (SE, ReLU, hard-swish, 5x5)",
        ),
        "efficientnet_b0": (
            "EfficientNet-B0 (Tan and Le, ICML 2019)",
            lambda: m.efficientnet_b0(),
            224,
            _reduced_efficientnet_b0,
            32,
            "EfficientNet width_mult=0.25, depth_mult=0.1 (one MBConv per stage)",
        ),
        "regnet_y_400mf": (
            "RegNetY-400MF (Radosavovic et al., CVPR 2020)",
            lambda: m.regnet_y_400mf(),
            224,
            _reduced_regnet_y_400mf,
            32,
            "RegNet(depth=4, w_0=16, w_a=8, w_m=2, group_width=8, se_ratio=0.25, stem 16)",
        ),
        "shufflenet_v2_x1_0": (
            "ShuffleNet v2 1.0x (Ma et al., ECCV 2018)",
            lambda: m.shufflenet_v2_x1_0(),
            224,
            lambda: shufflenetv2.ShuffleNetV2([1, 1, 1], [16, 32, 64, 128, 256], num_classes=10),
            32,
            "ShuffleNetV2(stages_repeats=[1, 1, 1], stages_out_channels=[16, 32, 64, 128, 256])",
        ),
        "squeezenet1_1": (
            "SqueezeNet 1.1 (Iandola et al., 2016)",
            lambda: m.squeezenet1_1(),
            224,
            lambda: squeezenet.SqueezeNet("1_1", num_classes=10),
            32,
            "SqueezeNet 1.1 unchanged but for 10 classes (no width setting)",
        ),
        "densenet121": (
            "DenseNet-121 (Huang et al., CVPR 2017)",
            lambda: m.densenet121(),
            224,
            lambda: densenet.DenseNet(
                growth_rate=8,
                block_config=(2, 2, 2, 2),
                num_init_features=16,
                bn_size=2,
                num_classes=10,
            ),
            32,
            "DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2)",
        ),
        "googlenet": (
            "GoogLeNet / Inception v1 (Szegedy et al., CVPR 2015), no auxiliary heads",
            lambda: m.googlenet(aux_logits=False, init_weights=False),
            224,
            _reduced_googlenet,
            64,
            "GoogLeNet with every channel count divided by 8",
        ),
        "inception_v3": (
            "Inception v3 (Szegedy et al., CVPR 2016), no auxiliary head",
            lambda: m.inception_v3(aux_logits=False, init_weights=False),
            299,
            _reduced_inception_v3,
            75,
            "Inception3 with every channel count divided by 8; 75x75, its smallest input",
        ),
        "mnasnet0_5": (
            "MNASNet 0.5 (Tan et al., CVPR 2019)",
            lambda: m.mnasnet0_5(),
            224,
            _reduced_mnasnet0_5,
            32,
            "MNASNet(alpha=0.25): the same 16 blocks, narrower (no depth setting)",
        ),
        "convnext_tiny": (
            "ConvNeXt-T (Liu et al., CVPR 2022)",
            lambda: m.convnext_tiny(),
            224,
            _reduced_convnext_tiny,
            32,
            "ConvNeXt, one block per stage, widths 16/32/64/128",
        ),
        "vit_b_16": (
            "ViT-B/16 (Dosovitskiy et al., ICLR 2021)",
            lambda: m.vit_b_16(),
            224,
            _reduced_vit_b_16,
            32,
            "VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, "
            "hidden_dim=64, mlp_dim=128)",
        ),
    }


# ---------------------------------------------------------------------------------------------


def _clean(model) -> None:
    """Drop what the exporter records per node (stack traces, names of the PyTorch modules):
    most of a weightless file otherwise."""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    del model.metadata_props[:]
    for value in list(model.graph.value_info) + list(model.graph.initializer):
        del value.metadata_props[:]
    model.graph.doc_string = ""
    model.doc_string = ""


def _randomize(module) -> None:
    """Every parameter and buffer non-zero (uniform in [0.5, 1.5]) before the export: the
    exporter's optimiser drops an exactly zero bias (a BatchNorm with its initial statistics
    folds into a convolution without bias; EfficientNet's linear biases start at zero), which
    a trained model keeps. The values themselves are removed afterwards."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                tensor.uniform_(0.5, 1.5)


def export(builder, size: int, path: str, light) -> dict:
    torch.manual_seed(0)
    module = builder().eval()
    _randomize(module)
    params = sum(p.numel() for p in module.parameters())
    x = torch.randn(1, 3, size, size)
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "model.onnx")
        torch.onnx.export(
            module,
            (x,),
            raw,
            dynamo=True,
            opset_version=OPSET,
            input_names=["input"],
            output_names=["logits"],
            external_data=False,
            optimize=True,
        )
        model = onnx.load(raw)
    _clean(model)
    stripped = light.strip_weights(model)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    out = model.graph.output[0].type.tensor_type.shape
    ops = collections.Counter(n.op_type for n in model.graph.node if n.op_type != "ConstantOfShape")
    return {
        "input": [1, 3, size, size],
        "output": [d.dim_value for d in out.dim],
        "parameters": params,
        "weights": len(stripped),
        "bytes": os.path.getsize(path),
        "operators": dict(sorted(ops.items())),
    }


def main() -> None:
    table = _models()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(table), choices=list(table))
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--sizes", nargs="+", default=["full", "reduced"])
    args = parser.parse_args()
    light = _onnx_light()
    index_path = os.path.join(args.out, "models.json")
    index = {"models": {}}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    index.update(
        {
            "source": f"torchvision {torchvision.__version__}, torch {torch.__version__}",
            "exporter": f"torch.onnx.export(dynamo=True, opset_version={OPSET}), onnx "
            f"{onnx.__version__}; weights replaced by ConstantOfShape nodes",
            "opset": OPSET,
            "exported": datetime.date.today().isoformat(),
        }
    )
    for name in args.models:
        summary, full, full_size, reduced, reduced_size, config = table[name]
        entry = index["models"].setdefault(name, {})
        entry["summary"] = summary
        entry["torchvision"] = f"torchvision.models.{name}"
        entry["reduced_config"] = config
        for size in args.sizes:
            builder, pixels = (full, full_size) if size == "full" else (reduced, reduced_size)
            os.makedirs(os.path.join(args.out, size), exist_ok=True)
            path = os.path.join(args.out, size, f"{name}.onnx")
            entry[size] = export(builder, pixels, path, light)
            print(f"{name} {size}: {entry[size]['bytes']} B, {entry[size]['operators']}")
    index["models"] = {k: index["models"][k] for k in table if k in index["models"]}
    with open(index_path, "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
