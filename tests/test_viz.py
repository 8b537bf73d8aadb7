"""Gantt charts: a PNG is written, readable, and of a sensible size."""

import pytest

from tests.core.graphs import inception, op
from tvm_rtask import viz
from tvm_rtask.core import RGraph, VDevice
from tvm_rtask.errors import OptionError
from tvm_rtask.schedule import make_plan

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_png(path):
    from matplotlib import image

    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    return image.imread(str(path))


@pytest.mark.parametrize("policy", ["wavefront", "ios", "sequential"])
def test_plan_gantt_is_a_png(tmp_path, policy):
    plan = make_plan(inception(rtasks=3), VDevice.cpu(6), policy)
    path = tmp_path / f"{policy}.png"
    timing = viz.gantt(plan, path)
    img = read_png(path)
    h, w = img.shape[:2]
    assert 800 <= w <= 3000 and 200 <= h <= 4000
    assert path.stat().st_size > 10_000
    assert img[..., :3].std() > 0.05  # not a blank canvas
    assert timing.total_us == pytest.approx(plan.estimated_us)


def test_program_gantt_with_ordinary_calls_and_many_veus(tmp_path):
    g = RGraph([op("a", ["x"], 64), op("e", ["a"], supported=False), op("b", ["e"], 200)])
    plan = make_plan(g, VDevice.cuda("h100", 256, 64, num_veu=132), "wavefront")
    viz.gantt(plan, tmp_path / "wide.png", title="wide")
    img = read_png(tmp_path / "wide.png")
    assert img.shape[0] <= 4000
    prog = plan.programs()[0]
    viz.gantt(prog, tmp_path / "prog.png", graph=plan.graph, vdevice=plan.vdevice)
    read_png(tmp_path / "prog.png")
    with pytest.raises(OptionError, match="needs graph"):
        viz.gantt(prog, tmp_path / "x.png")


def test_many_operators_without_legend(tmp_path):
    # five layers of eight operators, each reading two of the layer before (no hypothesis
    # search: shrinking a graph to "more than 30 operators" took a minute)
    ops = [op(f"l0_{i}", ["x"]) for i in range(8)]
    for layer in range(1, 5):
        ops += [
            op(f"l{layer}_{i}", [f"l{layer - 1}_{i}", f"l{layer - 1}_{(i + 3) % 8}"])
            for i in range(8)
        ]
    g = RGraph(ops)
    assert len(g) == 40
    viz.gantt(make_plan(g, VDevice.cpu(4), "opara"), tmp_path / "big.png")
    read_png(tmp_path / "big.png")
