"""Random DAG networks compiled under every policy on the CPU vDevice, against numpy.

Each network is a small random DAG (2-9 operators among matmul, add, relu, multiply,
concat; tensors of 8-64 elements) drawn from a seeded RNG. To amortise compile time,
``NETS_PER_MODULE`` independent networks share one Relax module (each with its own inputs
and weights; the module returns every network's unused outputs), which also gives the
planner wide graphs to pack. Every module is compiled with ``tvm_rtask.compile(mod, target,
policy=p, num_veu=2)`` for each policy p, alternating fine and global barriers between
modules, and every output is compared with a numpy evaluation of the same description
(computed here, independently of tvm-rtask and TVM).

The target is ``"llvm"`` for every fifth module and ``{"kind": "llvm", "opt-level": 0}``
for the others: the same code generator without LLVM's optimisations, which compiles about
three times faster and keeps the file within a few minutes on two cores (the persistent
kernels, barriers and plans are the same; the light-model tests cover the optimised build).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_rtask

POLICIES = ["sequential", "wavefront", "ios", "opara"]
NUM_MODULES = 20
NETS_PER_MODULE = 10
SEED = 20240521
ROWS = (2, 4)
WIDTHS = (4, 8, 16)
MAX_ELEMENTS = 64
KINDS = ("matmul", "add", "relu", "multiply", "concat")


@dataclass
class Net:
    """A network description: named inputs/weights with shapes, then operators in order."""

    params: dict[str, tuple[int, int]] = field(default_factory=dict)
    ops: list[tuple[str, list[str], str]] = field(default_factory=list)  # kind, inputs, out
    shapes: dict[str, tuple[int, int]] = field(default_factory=dict)

    def outputs(self) -> list[str]:
        used = {t for _, ins, _ in self.ops for t in ins}
        return [out for _, _, out in self.ops if out not in used]


def random_net(rng: np.random.Generator, prefix: str) -> Net:
    net = Net()
    rows = int(rng.choice(ROWS))
    widths = [w for w in WIDTHS if rows * w <= MAX_ELEMENTS]
    for i in range(int(rng.integers(1, 3))):
        name = f"{prefix}_x{i}"
        net.params[name] = net.shapes[name] = (rows, int(rng.choice(widths)))
    for i in range(int(rng.integers(2, 10))):
        out = f"{prefix}_t{i}"
        tensors = list(net.shapes)
        kind = str(rng.choice(KINDS))
        a = tensors[int(rng.integers(len(tensors)))]
        width = net.shapes[a][1]
        same = [t for t in tensors if net.shapes[t] == net.shapes[a]]
        joinable = [t for t in tensors if net.shapes[t][1] + width <= MAX_ELEMENTS // rows]
        if kind in ("add", "multiply"):
            ins = [a, same[int(rng.integers(len(same)))]]
        elif kind == "concat" and joinable:
            ins = [a, joinable[int(rng.integers(len(joinable)))]]
        elif kind == "matmul" or kind == "concat":
            kind = "matmul"
            w = f"{prefix}_w{i}"
            net.params[w] = (width, int(rng.choice(widths)))
            ins = [a, w]
        else:
            ins = [a]
        net.ops.append((kind, ins, out))
        if kind == "matmul":
            net.shapes[out] = (rows, net.params[ins[1]][1])
        elif kind == "concat":
            net.shapes[out] = (rows, width + net.shapes[ins[1]][1])
        else:
            net.shapes[out] = net.shapes[a]
    return net


def random_values(net: Net, rng: np.random.Generator) -> dict[str, np.ndarray]:
    vals = {}
    for name, shape in net.params.items():
        scale = 1.0 / np.sqrt(shape[0]) if "_w" in name else 1.0
        vals[name] = (scale * rng.standard_normal(shape)).astype("float32")
    return vals


def numpy_reference(net: Net, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = {k: v.astype(np.float64) for k, v in values.items()}
    for kind, ins, out in net.ops:
        xs = [env[t] for t in ins]
        if kind == "matmul":
            env[out] = xs[0] @ xs[1]
        elif kind == "add":
            env[out] = xs[0] + xs[1]
        elif kind == "multiply":
            env[out] = xs[0] * xs[1]
        elif kind == "relu":
            env[out] = np.maximum(xs[0], 0.0)
        elif kind == "concat":
            env[out] = np.concatenate(xs, axis=1)
    return {t: env[t] for t in net.outputs()}


def relax_module(nets: list[Net]) -> tuple[tvm.IRModule, list[str], list[str]]:
    """One module with every network side by side; returns it, its params and outputs."""
    bb = relax.BlockBuilder()
    params = {
        name: relax.Var(name, relax.TensorType(shape, "float32"))
        for net in nets
        for name, shape in net.params.items()
    }
    outputs = [t for net in nets for t in net.outputs()]
    with bb.function("main", list(params.values())):
        with bb.dataflow():
            env: dict[str, relax.Expr] = dict(params)
            for net in nets:
                for kind, ins, out in net.ops:
                    xs = [env[t] for t in ins]
                    if kind == "matmul":
                        expr = relax.op.matmul(xs[0], xs[1])
                    elif kind == "add":
                        expr = relax.op.add(xs[0], xs[1])
                    elif kind == "multiply":
                        expr = relax.op.multiply(xs[0], xs[1])
                    elif kind == "relu":
                        expr = relax.op.nn.relu(xs[0])
                    else:
                        expr = relax.op.concat(xs, axis=1)
                    env[out] = bb.emit(expr, name_hint=out)
            result = bb.emit_output(relax.Tuple([env[t] for t in outputs]))
        bb.emit_func_output(result)
    return bb.get(), list(params), outputs


@dataclass
class Case:
    mod: tvm.IRModule
    inputs: list[np.ndarray]
    outputs: list[str]
    expected: dict[str, np.ndarray]
    networks: int


def make_case(index: int) -> Case:
    rng = np.random.default_rng([SEED, index])
    nets = [random_net(rng, f"n{k}") for k in range(NETS_PER_MODULE)]
    values, expected = {}, {}
    for net in nets:
        v = random_values(net, rng)
        values.update(v)
        expected.update(numpy_reference(net, v))
    mod, params, outputs = relax_module(nets)
    return Case(mod, [values[p] for p in params], outputs, expected, len(nets))


@pytest.fixture(scope="module")
def cases():
    return {}


def get_case(cases, index: int) -> Case:
    if index not in cases:
        cases[index] = make_case(index)
    return cases[index]


def test_enough_networks_and_a_fair_mix():
    rng = np.random.default_rng([SEED, 0])
    nets = [random_net(rng, f"n{k}") for k in range(NETS_PER_MODULE)]
    assert NUM_MODULES * NETS_PER_MODULE >= 200
    kinds = {kind for net in nets for kind, _, _ in net.ops}
    assert kinds == set(KINDS)
    assert all(2 <= len(net.ops) <= 9 for net in nets)
    for net in nets:
        for name, shape in net.shapes.items():
            if not name.split("_")[1].startswith("w"):
                assert 8 <= shape[0] * shape[1] <= MAX_ELEMENTS


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("index", range(NUM_MODULES))
def test_random_dags_match_numpy(cases, index, policy):
    case = get_case(cases, index)
    barrier = "fine" if index % 2 == 0 else "global"
    target = "llvm" if index % 5 == 0 else {"kind": "llvm", "opt-level": 0}
    ex = tvm_rtask.compile(case.mod, target, policy=policy, barrier=barrier, num_veu=2)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    result = vm["main"](*(tvm.runtime.tensor(x) for x in case.inputs))
    assert len(result) == len(case.outputs)
    for name, got in zip(case.outputs, result, strict=True):
        want = case.expected[name]
        got = got.numpy()
        assert got.shape == want.shape, name
        scale = max(float(np.abs(want).max()), 1.0)
        err = float(np.abs(got - want).max()) / scale
        assert err < 1e-5, (index, policy, barrier, name, err)


def test_plan_accepts_every_policy_and_reports_the_simulation(cases):
    from tvm_rtask.policies import simulate

    case = get_case(cases, 0)
    for policy in POLICIES:
        plan = tvm_rtask.plan(case.mod, "llvm", policy=policy, num_veu=2)
        assert plan.policy == policy
        plan.validate()
        assert plan.report()["estimated_us"] == pytest.approx(simulate(plan).total_us)
