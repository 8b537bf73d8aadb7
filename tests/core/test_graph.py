import pytest

from tests.core.graphs import chain, diamond, inception, op
from tvm_rtask.core import RGraph, RKernel, ROperator
from tvm_rtask.errors import OptionError, PlanError


def test_diamond_waves_and_edges():
    g = diamond()
    assert g.waves() == [["a"], ["b", "c"], ["d"]]
    assert g.preds("d") == ["b", "c"]
    assert g.succs("a") == ["b", "c"]
    assert g.producer("a") == "a" and g.producer("x") is None


def test_inception_waves():
    assert inception().waves() == [["stem"], ["b1", "b2a", "b3a", "b4"], ["b2b", "b3b"], ["concat"]]


def test_level_is_one_plus_max_pred_level():
    # d reads a (level 0) and c (level 2): level 3, not 1
    g = RGraph([op("a", ["x"]), op("b", ["a"]), op("c", ["b"]), op("d", ["a", "c"])])
    assert g.levels() == {"a": 0, "b": 1, "c": 2, "d": 3}


def test_given_topological_order_is_kept():
    ops = [op("b", ["x"]), op("a", ["x"]), op("c", ["a", "b"])]
    assert RGraph(ops).names == ["b", "a", "c"]


def test_non_topological_order_is_sorted_stably():
    ops = [op("d", ["b", "c"]), op("c", ["a"]), op("a", ["x"]), op("b", ["a"]), op("e", ["x"])]
    g = RGraph(ops)
    assert g.names == ["a", "c", "b", "d", "e"]
    assert g.waves() == [["a", "e"], ["c", "b"], ["d"]]


def test_cycle_names_its_ops():
    ops = [op("a", ["c"]), op("b", ["a"]), op("c", ["b"]), op("z", ["x"])]
    with pytest.raises(PlanError, match="cycle") as e:
        RGraph(ops)
    assert "a -> b -> c -> a" in str(e.value)
    assert "z" not in str(e.value)


def test_self_read_is_a_cycle():
    with pytest.raises(PlanError, match="cycle.*'a'"):
        RGraph([op("a", ["a"])])


def test_double_writer_names_both():
    a = op("a", ["x"])
    b = ROperator("b", "f_b", inputs=["x"], outputs=["a"], rkernels=[RKernel("k", 1)])
    with pytest.raises(PlanError, match="tensor 'a' is written by both 'a' and 'b'"):
        RGraph([a, b])


def test_duplicate_names_and_bad_operators():
    with pytest.raises(PlanError, match="two operators are called 'a'"):
        RGraph([op("a", ["x"]), op("a", ["y"])])
    with pytest.raises(OptionError, match="no rKernel"):
        ROperator("a", "f")
    with pytest.raises(OptionError, match="pattern"):
        ROperator("a", "f", pattern="conv", rkernels=[RKernel("k", 1)])
    with pytest.raises(OptionError, match="num_rtasks"):
        RKernel("k", 0)
    ROperator("ext", "", supported=False, reason="extern")  # no kernel needed


def test_kernel_lookup():
    o = op("a", ["x"], [2, 4])
    assert o.kernel("a@4").num_rtasks == 4
    with pytest.raises(PlanError, match="'a@3'.*a@2"):
        o.kernel("a@3")
    with pytest.raises(PlanError, match="not in the graph"):
        diamond().op("zz")


def test_critical_path():
    g = diamond()
    w = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0}
    assert g.critical_path(w.__getitem__) == 7.0


def test_dict_round_trip():
    g = inception()
    assert RGraph.from_dict(g.to_dict()) == g
    assert RGraph.from_dict(g.to_dict()).waves() == g.waves()


def test_10000_op_chain_and_wide_graph():
    g = chain(10_000)
    assert len(g.waves()) == 10_000
    assert g.critical_path(lambda _: 1.0) == 10_000
    wide = RGraph(
        [op("src", ["x"])]
        + [op(f"w{i}", ["src"]) for i in range(9_998)]
        + [op("sink", [f"w{i}" for i in range(9_998)])]
    )
    assert [len(w) for w in wide.waves()] == [1, 9_998, 1]
    # reversed: forces the topological sort
    rev = RGraph(list(reversed(chain(10_000).ops)))
    assert rev.names[0] == "op0"
