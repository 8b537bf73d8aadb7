import pytest

from tests.core.graphs import op
from tvm_rtask.core import DEVICE_SPECS, RKernel, ROperator, VDevice
from tvm_rtask.policies import AnalyticalCostModel


def test_roofline_per_rtask():
    cost = AnalyticalCostModel(task_overhead_us=0.0)
    vd = VDevice.cpu(4)  # 4 cores x 50 GFLOP/s, 20 GB/s
    compute = op("a", ["x"], 4, flops=8e6, nbytes=0)
    # 2e6 FLOP per rTask at 50 GFLOP/s per vEU = 40 us
    assert cost.rtask_us(compute, compute.rkernels[0], vd) == pytest.approx(40.0)
    memory = op("b", ["x"], 4, flops=0, nbytes=4e5)
    # 1e5 B per rTask at 20/4 GB/s per vEU = 20 us
    assert cost.rtask_us(memory, memory.rkernels[0], vd) == pytest.approx(20.0)


def test_overhead_and_measured_time():
    cost = AnalyticalCostModel(task_overhead_us=0.25)
    vd = VDevice.cpu(2)
    empty = op("z", ["x"], 2, flops=0, nbytes=0)
    assert cost.rtask_us(empty, empty.rkernels[0], vd) == 0.25
    k = RKernel("m", 3, est_us=7.5)
    measured = ROperator("m", "f", rkernels=[k], flops=1e12)
    assert cost.rtask_us(measured, k, vd) == 7.5
    assert cost.kernel_us(measured, k, vd) == 15.0  # 3 rTasks on 2 vEUs: 2 rounds
    assert cost.work_us(measured, k, vd) == 22.5


def test_fewer_veus_than_sms_do_not_get_more_than_one_sm():
    cost = AnalyticalCostModel(task_overhead_us=0.0)
    spec = DEVICE_SPECS["h100"]
    o = op("a", ["x"], 1, flops=67e6, nbytes=0)
    few = VDevice.cuda(spec, 256, 32, num_veu=8)
    full = VDevice.cuda(spec, 256, 32, num_veu=264)
    # one SM: 67e6 FLOP / (67 TFLOP/s / 132) = 132 us; two blocks per SM: twice that
    assert cost.rtask_us(o, o.rkernels[0], few) == pytest.approx(132.0)
    assert cost.rtask_us(o, o.rkernels[0], full) == pytest.approx(264.0)


def test_fastest_and_most_efficient():
    cost = AnalyticalCostModel(task_overhead_us=1.0)
    vd = VDevice.cpu(4)
    o = op("a", ["x"], [1, 4, 8], flops=4e6, nbytes=0)
    # per rTask: 80+1, 20+1, 10+1 us; alone: 81, 21, 22; work: 81, 84, 88
    assert cost.fastest(o, vd).name == "a@4"
    assert cost.most_efficient(o, vd).name == "a@1"
    assert cost.ordinary_us(o, vd) == pytest.approx(21.0)
    ext = ROperator("e", "", flops=4e6, supported=False)
    assert cost.ordinary_us(ext, vd) == pytest.approx(21.0)  # as if one task per vEU
    assert cost.launch_us(vd) == 5.0 and cost.barrier_us(vd) == 1.0


def test_calibrated_model_takes_measured_barrier_and_launch_costs():
    import json

    from tvm_rtask.errors import PlanError
    from tvm_rtask.policies import CalibratedCostModel

    vd = VDevice.cpu(2)
    plain = CalibratedCostModel()
    assert plain.barrier_us(vd) == 1.0 and plain.launch_us(vd) == 5.0  # the spec's
    model = CalibratedCostModel(
        {"cpu": (0.5, 0.5, 0.2)}, {"a@2": 3.0}, barrier_overhead_us=0.4, launch_overhead_us=2.5
    )
    assert model.barrier_us(vd) == 0.4 and model.launch_us(vd) == 2.5
    again = CalibratedCostModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert (again.barrier_overhead_us, again.launch_overhead_us) == (0.4, 2.5)
    assert again.factors == model.factors and again.measured == model.measured
    # a dict written before these fields loads, with the spec's costs
    old = {"factors": {"cpu": [0.5, 0.5, 0.2]}, "measured": {"a@2": 3.0}}
    loaded = CalibratedCostModel.from_dict(old)
    assert loaded.barrier_us(vd) == 1.0 and loaded.launch_us(vd) == 5.0
    assert "barrier_overhead_us" not in loaded.to_dict()
    with pytest.raises(PlanError, match="barrier"):
        CalibratedCostModel(barrier_overhead_us=float("nan"))


def test_prefer_measured_beats_a_records_estimate():
    from tvm_rtask.policies import CalibratedCostModel

    vd = VDevice.cpu(2)
    k = RKernel("t@2", 2, est_us=9.0)
    o = ROperator("t", "f", rkernels=[k])
    assert CalibratedCostModel(measured={"t@2": 4.0}).rtask_us(o, k, vd) == 9.0
    preferring = CalibratedCostModel(measured={"t@2": 4.0}, prefer_measured=True)
    assert preferring.rtask_us(o, k, vd) == 4.0
    assert CalibratedCostModel.from_dict(preferring.to_dict()).prefer_measured


def test_an_rtask_gets_an_sm_of_its_own_while_fewer_run_than_there_are_sms():
    from tvm_rtask.policies.cost import veu_share

    cost = AnalyticalCostModel(task_overhead_us=0.0)
    full = VDevice.cuda(DEVICE_SPECS["h100"], 256, 32, num_veu=264)
    o = op("a", ["x"], 1, flops=67e6, nbytes=0)
    k = o.rkernels[0]
    assert [veu_share(full, w) for w in (None, 1, 132, 200, 264, 1000)] == [
        264, 132, 132, 200, 264, 264
    ]  # fmt: skip
    # 67e6 FLOP on one SM (1/132 of 67 TFLOP/s): 132 us; two blocks per SM: 264 us
    assert cost.rtask_us_at(o, k, full, 1) == pytest.approx(132.0)
    assert cost.rtask_us_at(o, k, full, 264) == pytest.approx(264.0)
    assert cost.rtask_us_at(o, k, full, None) == cost.rtask_us(o, k, full)
    # a kernel alone on the device runs as wide as it has rTasks
    assert cost.kernel_us(o, k, full) == pytest.approx(132.0)
    # a CPU vEU is one core whatever the width
    cpu = VDevice.cpu(4)
    assert cost.rtask_us_at(o, k, cpu, 1) == cost.rtask_us(o, k, cpu)


def test_a_subclass_rtask_us_is_scaled_by_the_width_not_bypassed():
    class Flat(AnalyticalCostModel):
        def rtask_us(self, op, kernel, vdevice):
            return 10.0

    full = VDevice.cuda(DEVICE_SPECS["h100"], 256, 32, num_veu=264)
    o = op("a", ["x"], 1)
    assert Flat().rtask_us_at(o, o.rkernels[0], full, 1) == pytest.approx(5.0)
    assert Flat().rtask_us_at(o, o.rkernels[0], full, None) == 10.0


def test_measured_times_are_rescaled_from_the_width_they_were_taken_at():
    from tvm_rtask.policies import CalibratedCostModel, calibrate

    full = VDevice.cuda(DEVICE_SPECS["h100"], 256, 32, num_veu=264)
    o = op("a", ["x"], 4, flops=67e6, nbytes=0)
    k = o.rkernels[0]
    # timed stand-alone with 528 blocks side by side (4 per SM)
    model = CalibratedCostModel(measured={k.name: 10.0}, measured_width={k.name: 528})
    assert model.rtask_us(o, k, full) == pytest.approx(10.0 * 264 / 528)
    assert model.rtask_us_at(o, k, full, 1) == pytest.approx(10.0 * 132 / 528)
    again = CalibratedCostModel.from_dict(model.to_dict())
    assert again.measured_width == {k.name: 528}
    assert "measured_width" not in CalibratedCostModel().to_dict()
    # samples that follow the roofline at the width they were taken at fit efficiency 1
    ops = [op(f"o{i}", ["x"], 4, flops=67e6 * (i + 1), nbytes=0) for i in range(3)]
    widths = {p.rkernels[0].name: w for p, w in zip(ops, (4, 132, 528), strict=True)}
    samples = [
        (p, p.rkernels[0], p.flops / 4 / (67e6 / max(132, widths[p.rkernels[0].name]))) for p in ops
    ]
    fitted = calibrate(samples, full, widths=widths)
    assert fitted.factors["h100"][0] == pytest.approx(1.0, rel=1e-6)
    assert fitted.measured_width == widths


def test_veus_are_laid_out_sm_by_sm():
    from tvm_rtask.errors import OptionError

    vd = VDevice.cuda(DEVICE_SPECS["h100"], 256, 32, num_veu=264)
    assert [vd.sm_of(v) for v in (0, 1, 131, 132, 263)] == [0, 1, 131, 0, 131]
    assert VDevice.cpu(4).sm_of(3) == 3
    with pytest.raises(OptionError, match="vEU 264 does not exist"):
        vd.sm_of(264)
