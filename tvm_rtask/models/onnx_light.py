"""The real architectures the ``onnx`` package ships, with seeded random weights.

``onnx/backend/test/data/light`` holds AlexNet, DenseNet-121, Inception v1/v2, ResNet-50,
ShuffleNet, SqueezeNet, VGG-19 and ZFNet-512 with every weight produced by a
``ConstantOfShape`` node (one repeated value), which tests little. :func:`load_light_model`
replaces each such node by a seeded random initializer: He-scaled weights, BatchNorm
variances positive, BatchNorm scales near one. ONNX Runtime then gives the reference.

The same two steps serve the committed torchvision architectures (``tvm_rtask.models.real``):
:func:`strip_weights` writes a model's weights as ``ConstantOfShape`` nodes (the one-time exporter,
removed from ``bench/``), :func:`materialize_weights` makes seeded weights of them.
"""

from __future__ import annotations

import os

import numpy as np

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model_path(name: str) -> str:
    """Path of ``light_<name>.onnx`` inside the installed onnx package."""
    import onnx

    if name not in LIGHT_MODELS:
        raise ValueError(f"unknown light model {name!r}; known: {', '.join(LIGHT_MODELS)}")
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return os.path.join(root, f"light_{name}.onnx")


# (op type, input index) -> role of a weight there; BatchNorm's come first (a BatchNorm scale
# that is also an input of another node keeps its BatchNorm role).
_NORM_ROLES = {
    "BatchNormalization": {1: "scale", 2: "bias", 3: "mean", 4: "var"},
    "LayerNormalization": {1: "scale", 2: "bias"},
    "InstanceNormalization": {1: "scale", 2: "bias"},
}


def _weight_roles(graph) -> dict[str, str]:
    """The role of each weight by the input it feeds: a normalisation's scale, bias, mean or
    variance; ``rows`` for a weight whose fan-in is its first dimension (``MatMul``'s second
    input, ``Gemm`` without ``transB``); ``scale`` / ``bias`` for a constant multiplied or added
    elementwise (layer scales, position embeddings). Anything else: the default role (He-scaled
    with the fan-in over every dimension but the first, e.g. ``Conv`` and ``Gemm`` with
    ``transB``; small values for 1-D tensors)."""
    roles: dict[str, str] = {}
    for node in graph.node:
        for index, role in _NORM_ROLES.get(node.op_type, {}).items():
            if index < len(node.input):
                roles[node.input[index]] = role
    for node in graph.node:
        inputs = list(node.input)
        if node.op_type == "MatMul" and len(inputs) > 1:
            roles.setdefault(inputs[1], "rows")
        elif node.op_type == "Gemm" and len(inputs) > 1:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            if not trans_b:
                roles.setdefault(inputs[1], "rows")
        elif node.op_type in ("Mul", "Add"):
            for name in inputs:
                roles.setdefault(name, "scale" if node.op_type == "Mul" else "bias")
    return roles


def _random_tensor(shape: tuple[int, ...], role: str, rng: np.random.Generator) -> np.ndarray:
    if role == "var":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if role == "scale":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if role in ("bias", "mean") or len(shape) <= 1:
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if role == "rows":
        fan_in = int(shape[-2])
    else:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return (np.sqrt(2.0 / max(fan_in, 1)) * rng.standard_normal(shape)).astype(np.float32)


def materialize_weights(model, seed: int = 0) -> None:
    """Replace, in place, every weight written as a ``ConstantOfShape`` node (whose shape is an
    initializer: the form of the onnx package's light models and of
    :func:`strip_weights`) by a seeded random initializer of that shape, by the role the
    weight plays (:func:`_weight_roles`): He-scaled weights, BatchNorm and LayerNorm scales
    and variances near one, small biases and means. The same ``seed`` gives the same tensors.
    """
    from onnx import numpy_helper

    graph = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in graph.initializer}
    roles = _weight_roles(graph)
    keep_nodes, weights = [], {}
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            out = node.output[0]
            weights[out] = _random_tensor(shape, roles.get(out, "weight"), rng)
        else:
            keep_nodes.append(node)
    used = {i for n in keep_nodes for i in n.input}
    new_inits = [t for t in graph.initializer if t.name in used and t.name not in weights]
    new_inits += [numpy_helper.from_array(a, name=n) for n, a in weights.items()]
    # IR version 4 lets initializers stay out of the graph inputs, so they become constants.
    model.ir_version = max(model.ir_version, 4)
    inputs = [i for i in graph.input if i.name not in weights and i.name not in inits]
    del graph.node[:]
    graph.node.extend(keep_nodes)
    del graph.initializer[:]
    graph.initializer.extend(new_inits)
    del graph.input[:]
    graph.input.extend(inputs)


def strip_weights(model, min_elements: int = 2) -> list[str]:
    """Replace, in place, every floating-point initializer of at least ``min_elements``
    elements by a ``ConstantOfShape`` node of its shape (value 0): the architecture without
    its weights, a few KB, which :func:`materialize_weights` turns back into a model. Integer
    initializers (shapes, axes, indices) and float scalars stay. Returns the names replaced.

    Refuses a graph that already has a ``ConstantOfShape`` of an initializer shape, which
    :func:`materialize_weights` would take for a weight.
    """
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name for t in graph.initializer}
    clash = [
        n.output[0] for n in graph.node if n.op_type == "ConstantOfShape" and n.input[0] in inits
    ]
    if clash:
        raise ValueError(f"the graph already has ConstantOfShape nodes of initializers: {clash}")
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    keep, nodes, stripped = [], [], []
    for tensor in graph.initializer:
        count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
        if tensor.data_type not in floats or count < min_elements:
            keep.append(tensor)
            continue
        shape_name = f"{tensor.name}__shape"
        keep.append(numpy_helper.from_array(np.array(tensor.dims, dtype=np.int64), shape_name))
        value = helper.make_tensor("value", tensor.data_type, [1], [0.0])
        nodes.append(helper.make_node("ConstantOfShape", [shape_name], [tensor.name], value=value))
        stripped.append(tensor.name)
    del graph.initializer[:]
    graph.initializer.extend(keep)
    names = set(stripped)
    inputs = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(inputs)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    return stripped


def load_light_model(name: str, seed: int = 0, expose_logits: bool = True):
    """The light model ``name`` with its ConstantOfShape weights replaced by random tensors.

    With random weights the final softmax of a deep residual net saturates to one-hot, which
    would hide numeric errors; ``expose_logits`` adds the softmax's input as a second output.
    """
    import onnx

    model = onnx.load(light_model_path(name))
    materialize_weights(model, seed)
    if expose_logits:
        _expose_softmax_input(model)
    onnx.checker.check_model(model)
    return model


def _expose_softmax_input(model) -> None:
    import onnx

    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Softmax" and node.output[0] in outputs:
            info = inferred.get(node.input[0])
            if info is None:
                info = onnx.helper.make_tensor_value_info(
                    node.input[0], onnx.TensorProto.FLOAT, None
                )
            model.graph.output.append(info)


def random_inputs(model, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded standard-normal values for every graph input (static shapes required)."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    out = {}
    for inp in model.graph.input:
        shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        out[inp.name] = rng.standard_normal(shape).astype(dtype)
    return out
