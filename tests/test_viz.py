"""Gantt charts: PNG and SVG are written and readable; legends name the largest operators in
colours that do not repeat; waits are drawn; zooms and the vEU cap limit what is drawn."""

import xml.etree.ElementTree as ET

import pytest

from tests.core.graphs import inception, op
from tvm_rtask import viz
from tvm_rtask.core import RGraph, RKernel, ROperator, VDevice
from tvm_rtask.errors import OptionError
from tvm_rtask.policies import make_plan, simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SVG = "{http://www.w3.org/2000/svg}"


def read_png(path):
    from matplotlib import image

    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    return image.imread(str(path))


FUNCS = [
    "fused_conv2d_add_relu",
    "fused_matmul_add",
    "max_pool2d",
    "fused_add_relu",
    "mean",
    "concatenate",
    "reshape",
    "dense",
]


def layered(layers: int = 5, width: int = 8) -> RGraph:
    """``layers`` x ``width`` operators, each reading two of the layer before; every operator
    has its own FLOP count (so the largest are well defined) and a function name of some kind.
    """
    ops = []
    for layer in range(layers):
        for i in range(width):
            k = layer * width + i
            name = f"l{layer}_{i}"
            reads = (
                ["x"] if layer == 0 else [f"l{layer - 1}_{i}", f"l{layer - 1}_{(i + 3) % width}"]
            )
            ops.append(
                ROperator(
                    name,
                    func=FUNCS[k % len(FUNCS)] + str(k),
                    inputs=reads,
                    outputs=[name],
                    flops=1e6 * (1 + (k * 17) % 40),  # a permutation of 1..40 MFLOP
                    bytes=1e3,
                    rkernels=[RKernel(f"{name}@2", 2)],
                )
            )
    return RGraph(ops)


def op_times(plan) -> dict[str, float]:
    """rTask time per operator from the simulator, independently of viz."""
    out: dict[str, float] = {}
    for st in simulate(plan).steps:
        if st.program is not None:
            for (o, _), (_, a, b) in st.program.spans.items():
                out[o] = out.get(o, 0.0) + b - a
    return out


@pytest.fixture(scope="module")
def big_plan():
    g = layered()
    assert len(g) == 40
    return make_plan(g, VDevice.cpu(4), "wavefront")


def legend_texts(fig) -> list[str]:
    return [t.get_text() for lg in fig.legends for t in lg.get_texts()]


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


@pytest.mark.parametrize(
    "func,pattern,kind",
    [
        ("fused_conv2d_add_relu", "opaque", "conv"),
        ("fused_conv2d17_add9_relu9", "opaque", "conv"),
        ("conv2d_transpose", "out_ewise_fusable", "conv"),
        ("fused_matmul_add_relu", "out_ewise_fusable", "matmul"),
        ("dense3", "opaque", "matmul"),
        ("batch_matmul", "opaque", "matmul"),
        ("max_pool2d1", "out_ewise_fusable", "pool"),
        ("adaptive_avg_pool2d", "opaque", "pool"),
        ("concatenate_join", "opaque", "concat"),
        ("mean", "out_ewise_fusable", "reduction"),
        ("softmax", "opaque", "reduction"),
        ("fused_layer_norm", "opaque", "reduction"),
        ("fused_add_relu", "opaque", "elementwise"),
        ("f_x", "broadcast", "elementwise"),
        ("f_y", "reduce", "reduction"),
        ("reshape8", "injective", "other"),
        ("transpose", "opaque", "other"),
    ],
)
def test_operator_kind(func, pattern, kind):
    o = ROperator("o", func, pattern=pattern, supported=False)
    assert viz.operator_kind(o) == kind
    assert viz.operator_kind(func, pattern) == kind
    assert kind in viz.KINDS


def test_legend_names_the_largest_operators_of_a_40_operator_plan(big_plan):
    times = op_times(big_plan)
    largest = sorted(times, key=lambda o: -times[o])
    fig, lay = viz.gantt_figure(big_plan, labels=10)
    assert lay.labelled == largest[:10]
    texts = legend_texts(fig)
    for rank, o in enumerate(largest[:10], 1):
        assert any(t.startswith(f"#{rank} {o} ") for t in texts), (o, texts)
    named = " ".join(texts)
    assert all(f" {o} " not in named for o in largest[10:])
    # the other 30 are counted by kind, and waits and releases are explained
    assert sum(int(t.split()[0]) for t in texts if " more " in t or "other kinds" in t) == 30
    assert "barrier wait (hatched)" in texts and "barrier release" in texts
    # the bars of named operators carry their rank
    ax = fig.axes[0]
    ranks = {t.get_text() for t in ax.texts}
    assert "#1" in ranks


@pytest.mark.parametrize("color_by", ["operator", "kind"])
@pytest.mark.parametrize("labels", [12, 40])
def test_colours_of_named_operators_do_not_repeat(big_plan, color_by, labels):
    lay = viz.gantt_layout(big_plan, color_by=color_by, labels=labels)
    assert len(lay.labelled) == labels
    colours = [lay.colours[o] for o in lay.labelled]
    assert len(set(colours)) == len(colours)
    # unnamed operators never take a named one's colour
    others = {lay.colours[o] for o in lay.op_time_us if o not in lay.labelled}
    assert not others & set(colours)
    # every drawn bar has its operator's colour
    assert all(b.colour == lay.colours[b.op] for b in lay.bars)
    entries = {e.op: e.colour for e in lay.legend if e.what == "operator"}
    assert entries == {o: lay.colours[o] for o in lay.labelled}


def test_kind_colours_and_legend(big_plan):
    fig, lay = viz.gantt_figure(big_plan, color_by="kind", labels=5)
    texts = legend_texts(fig)
    present = {viz.operator_kind(big_plan.graph.op(o)) for o in lay.op_time_us}
    assert present == {"conv", "matmul", "pool", "elementwise", "reduction", "concat", "other"}
    for k in present:
        assert any(t.startswith(f"{k}: ") for t in texts), (k, texts)
    # unnamed operators take their kind's pale tone: one colour per kind
    unnamed = [o for o in lay.op_time_us if o not in lay.labelled]
    by_kind: dict[str, set[str]] = {}
    for o in unnamed:
        by_kind.setdefault(lay.kinds[o], set()).add(lay.colours[o])
    assert all(len(c) == 1 for c in by_kind.values())


def test_wave_colours(big_plan):
    lay = viz.gantt_layout(big_plan, color_by="wave")
    waves = {b.wave for b in lay.bars}
    assert len(waves) > 1
    by_wave: dict[int, set[str]] = {}
    for b in lay.bars:
        by_wave.setdefault(b.wave, set()).add(b.colour)
    assert all(len(c) == 1 for c in by_wave.values())
    assert len({next(iter(c)) for c in by_wave.values()}) == min(len(waves), 12)
    assert [e.label for e in lay.legend if e.what == "wave"][0].startswith("wave ")


def test_waits_are_drawn_on_the_waiting_veu_and_rows_are_shaded(tmp_path):
    # uneven branches: the vEUs of the short ones wait at the barrier before the concat
    g = RGraph(
        [
            op("stem", ["x"], 2),
            op("short", ["stem"], 2, flops=1e5),
            op("long", ["stem"], 2, flops=5e7),
            op("concat", ["short", "long"], 4),
        ]
    )
    plan = make_plan(g, VDevice.cpu(4), "wavefront")
    fig, lay = viz.gantt_figure(plan)
    assert lay.timing.num_barriers > 0
    assert lay.waits and any(w.wait_us > 0 for w in lay.waits)
    ax = fig.axes[0]
    waits = [p for p in ax.patches if p.get_gid() == "wait"]
    assert len(waits) == len(lay.waits) > 0
    assert all(p.get_hatch() for p in waits)
    # each wait sits on the row of the vEU that waits
    rows = lay.rows
    assert sorted(round(p.get_y() + p.get_height() / 2) for p in waits) == sorted(
        rows[w.veu] for w in lay.waits
    )
    # every other row is shaded
    shades = [p for p in ax.patches if p.get_gid() == "row-shade"]
    assert len(shades) == len(lay.veus) // 2
    # at this scale a wait stays visible: at least two pixels wide once drawn
    fig.canvas.draw()
    for p in waits:
        x0 = ax.transData.transform((p.get_x(), 0))[0]
        x1 = ax.transData.transform((p.get_x() + p.get_width(), 0))[0]
        assert x1 - x0 >= 1.9
    viz.gantt(plan, tmp_path / "waits.png")
    read_png(tmp_path / "waits.png")


def test_short_waits_on_a_long_plan_are_widened(big_plan):
    fig, lay = viz.gantt_figure(big_plan)
    ax = fig.axes[0]
    fig.canvas.draw()
    waits = [p for p in ax.patches if p.get_gid() == "wait"]
    assert waits
    px = [
        ax.transData.transform((p.get_x() + p.get_width(), 0))[0]
        - ax.transData.transform((p.get_x(), 0))[0]
        for p in waits
    ]
    assert min(px) >= 1.9


def two_program_plan():
    g = RGraph(
        [
            op("a", ["x"], 4),
            op("b", ["a"], 4),
            op("e", ["b"], supported=False),
            op("c", ["e"], 4),
            op("d", ["c"], 4),
        ]
    )
    plan = make_plan(g, VDevice.cpu(4), "wavefront")
    assert len(plan.programs()) == 2
    return plan


def test_window_and_program_zoom_limit_the_axis(big_plan, tmp_path):
    total = simulate(big_plan).total_us
    window = (0.25 * total, 0.5 * total)
    fig, lay = viz.gantt_figure(big_plan, window=window)
    for ax in fig.axes:
        assert ax.get_xlim() == pytest.approx(window)
    assert lay.window == pytest.approx(window)
    assert lay.bars and all(b.end_us > window[0] and b.start_us < window[1] for b in lay.bars)
    full = viz.gantt_layout(big_plan)
    assert len(lay.bars) < len(full.bars)
    assert "window" in lay.subtitle

    plan = two_program_plan()
    timing = simulate(plan)
    progs = [s for s in timing.steps if s.program is not None]
    fig, lay = viz.gantt_figure(plan, program=1)
    assert fig.axes[0].get_xlim() == pytest.approx((progs[1].start_us, progs[1].end_us))
    assert {b.op for b in lay.bars} == {"c", "d"}
    assert not lay.calls  # the ordinary call before it is out of view
    assert "rProgram 1" in lay.subtitle
    # a window inside a program: the intersection
    mid = (progs[1].start_us + progs[1].end_us) / 2
    lay = viz.gantt_layout(plan, program=1, window=(0, mid))
    assert lay.window == pytest.approx((progs[1].start_us, mid))
    viz.gantt(plan, tmp_path / "p0.png", program=0)
    read_png(tmp_path / "p0.png")

    with pytest.raises(OptionError, match="2 rPrograms"):
        viz.gantt_layout(plan, program=2)
    with pytest.raises(OptionError, match="t0_us < t1_us"):
        viz.gantt_layout(plan, window=(5, 5))
    with pytest.raises(OptionError, match="color_by"):
        viz.gantt_layout(plan, color_by="rainbow")
    with pytest.raises(OptionError, match="max_veus"):
        viz.gantt_layout(plan, max_veus=0)


def test_max_veus_caps_the_rows_and_says_how_many_are_hidden(tmp_path):
    plan = make_plan(inception(rtasks=8), VDevice.cpu(16), "wavefront")
    fig, lay = viz.gantt_figure(plan, max_veus=5)
    assert lay.veus == [0, 1, 2, 3, 4] and lay.hidden_veus == 11
    assert all(b.veu < 5 for b in lay.bars) and all(w.veu < 5 for w in lay.waits)
    ax = fig.axes[0]
    assert ax.get_ylim() == pytest.approx((4.5, -0.5))
    shown = [t.get_text() for t in ax.texts] + [ax.get_title(loc="left")]
    assert any("11 vEUs" in t for t in shown), shown
    viz.gantt_svg(plan, tmp_path / "cap.svg", max_veus=5)
    assert "+11 vEUs not drawn" in (tmp_path / "cap.svg").read_text()


def svg_rtasks(path):
    root = ET.parse(path).getroot()  # well-formed XML or this raises
    assert root.tag == SVG + "svg"
    return root, [r for r in root.iter(SVG + "rect") if r.get("class") == "rtask"]


def test_svg_has_one_title_per_drawn_rtask(big_plan, tmp_path):
    path = tmp_path / "g.svg"
    timing = viz.gantt_svg(big_plan, path)
    assert timing.total_us == pytest.approx(big_plan.estimated_us)
    lay = viz.gantt_layout(big_plan)
    root, rects = svg_rtasks(path)
    assert len(rects) == len(lay.bars) == big_plan.report()["rtasks"]
    titles = [r.findall(SVG + "title") for r in rects]
    assert all(len(t) == 1 for t in titles)
    seen = set()
    for r, (t,), b in zip(rects, titles, lay.bars, strict=True):
        text = t.text
        assert text.startswith(f"{b.op} rTask {b.rtask_id} ")
        assert f"start {b.start_us:.2f} us, end {b.end_us:.2f} us" in text
        assert r.get("data-op") == b.op
        seen.add((b.op, b.rtask_id))
    assert len(seen) == len(rects)
    # the other tooltips are on waits and ordinary calls only
    all_titles = list(root.iter(SVG + "title"))
    waits = [r for r in root.iter(SVG + "rect") if r.get("class") == "wait"]
    assert len(waits) == len(lay.waits) > 0
    assert len(all_titles) == len(rects) + len(waits)
    assert "<script" not in path.read_text()  # self-contained, no code


def test_svg_zoom_and_gantt_dispatch(tmp_path):
    plan = two_program_plan()
    viz.gantt_svg(plan, tmp_path / "p1.svg", program=1, color_by="kind")
    _, rects = svg_rtasks(tmp_path / "p1.svg")
    assert {r.get("data-op") for r in rects} == {"c", "d"}
    assert len(rects) == len(viz.gantt_layout(plan, program=1).bars)
    # gantt writes the SVG view when the path ends in .svg
    viz.gantt(plan, tmp_path / "all.svg", color_by="wave")
    root, rects = svg_rtasks(tmp_path / "all.svg")
    assert len(rects) == plan.report()["rtasks"]
    calls = [r for r in root.iter(SVG + "rect") if r.get("class") == "call"]
    assert len(calls) == 1 and "e (ordinary call" in calls[0].find(SVG + "title").text


def test_names_that_need_escaping(tmp_path):
    g = RGraph([op("a<&>\"'", ["x"], 2), op("b", ["a<&>\"'"], 2)])
    plan = make_plan(g, VDevice.cpu(2), "wavefront")
    viz.gantt_svg(plan, tmp_path / "esc.svg")
    _, rects = svg_rtasks(tmp_path / "esc.svg")
    assert {r.get("data-op") for r in rects} == {"a<&>\"'", "b"}
    viz.gantt(plan, tmp_path / "esc.png")
    read_png(tmp_path / "esc.png")


def test_many_operators(tmp_path, big_plan):
    viz.gantt(big_plan, tmp_path / "big.png")
    read_png(tmp_path / "big.png")
    viz.gantt(make_plan(layered(), VDevice.cpu(4), "opara"), tmp_path / "opara.png", dpi=60)
    read_png(tmp_path / "opara.png")
