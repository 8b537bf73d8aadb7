import pytest

from tvm_rtask.core import DEVICE_SPECS, VDevice, blocks_per_sm, cpu_spec, get_spec
from tvm_rtask.errors import CapacityError, OptionError

H100 = DEVICE_SPECS["h100"]


@pytest.mark.parametrize(
    "spec, threads, regs, smem, expected",
    [
        ("h100", 256, 32, 0, 8),  # threads and registers both allow 8
        ("h100", 1024, 64, 0, 1),
        ("h100", 128, 0, 0, 16),  # threads: 2048 / 128
        ("h100", 32, 0, 0, 32),  # the 32 blocks per SM limit
        ("h100", 256, 0, 48 * 1024, 4),  # (48 KB + 1 KB reserved) x 4 <= 228 KB
        ("h100", 64, 0, 100 * 1024, 2),
        ("a100", 64, 0, 80 * 1024, 2),  # 2 x (80 + 1) KB <= 164 KB
        ("v100", 64, 0, 48 * 1024, 2),  # no reserved shared memory before sm_80
        ("v100", 256, 128, 0, 2),  # 128 regs x 256 threads = 32K registers
        ("h100", 64, 40, 0, 24),  # 40 regs -> 1280 per warp -> 12 warps per sub-partition
        ("h100", 96, 0, 0, 21),  # 3 warps: 2048 // 96
    ],
)
def test_known_occupancies(spec, threads, regs, smem, expected):
    assert blocks_per_sm(get_spec(spec), threads, regs, smem) == expected


def test_blocks_that_cannot_run():
    with pytest.raises(CapacityError, match="2048 threads exceeds the 1024"):
        blocks_per_sm(H100, 2048, 32, 0)
    with pytest.raises(CapacityError, match="registers per thread"):
        blocks_per_sm(H100, 128, 256, 0)
    with pytest.raises(CapacityError, match="shared memory"):
        blocks_per_sm(H100, 128, 0, 228 * 1024)
    with pytest.raises(CapacityError, match="not enough registers"):
        blocks_per_sm(H100, 1024, 72, 0)  # 1024 x 72 registers > 65536


def test_vdevice_cuda_capacity():
    vd = VDevice.cuda("h100", threads=256, registers=32)
    assert vd.capacity == 132 * 8 and vd.num_veu == vd.capacity
    assert VDevice.cuda(H100, 256, 32, num_veu=132).num_veu == 132
    with pytest.raises(CapacityError, match=r"1057 vEUs.*1056"):
        VDevice.cuda(H100, 256, 32, num_veu=1057)
    assert VDevice.from_dict(vd.to_dict()) == vd


def test_cpu():
    vd = VDevice.cpu(4)
    assert vd.capacity == 4 and vd.spec.kind == "cpu" and vd.spec.num_sms == 4
    assert cpu_spec(8).peak_gflops == 400.0
    with pytest.raises(OptionError):
        VDevice.cpu(0)
    with pytest.raises(CapacityError):
        VDevice(cpu_spec(2), num_veu=3, capacity=2)


def test_get_spec():
    assert get_spec("H100") is DEVICE_SPECS["h100"]
    assert get_spec("NVIDIA H200").name == "h200"
    assert get_spec("Tesla V100-SXM2-16GB").arch == "sm_70"
    assert get_spec("llvm").kind == "cpu"
    with pytest.raises(OptionError, match="a100, h100, h200, v100"):
        get_spec("tpu")
    assert DEVICE_SPECS["h200"].bandwidth_gbs == 4800 and DEVICE_SPECS["a100"].num_sms == 108
