"""A whole model compiled by tvm-rtask, exported, and run in a process without tvm_rtask."""

import subprocess
import sys
import textwrap

import numpy as np

import tvm_rtask
from tvm_rtask.runtime import export_library
from tvm_rtask.testing.onnx_light import load_light_model, onnxruntime_outputs, random_inputs


def test_exported_squeezenet_runs_in_a_fresh_process(tmp_path):
    model = load_light_model("squeezenet")
    inputs = random_inputs(model)
    expected = onnxruntime_outputs(model, inputs)
    ex = tvm_rtask.compile(model, "llvm", policy="wavefront", barrier="fine", num_veu=2)
    lib = export_library(ex, tmp_path / "squeezenet.so")
    np.savez(tmp_path / "inputs.npz", **{f"a{i}": v for i, v in enumerate(inputs.values())})
    script = textwrap.dedent(
        f"""
        import sys, numpy as np, tvm
        from tvm import relax
        assert "tvm_rtask" not in sys.modules
        tvm.get_global_func("runtime.config_threadpool")(-3, 2, ["0", "0"])
        ex = tvm.runtime.load_module({str(lib)!r})
        vm = relax.VirtualMachine(ex, tvm.cpu())
        data = np.load({str(tmp_path / "inputs.npz")!r})
        out = vm["main"](*(tvm.runtime.tensor(data[k]) for k in sorted(data)))
        np.savez({str(tmp_path / "out.npz")!r}, *[o.numpy() for o in out])
        assert "tvm_rtask" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    out = np.load(tmp_path / "out.npz")
    for i, ref in enumerate(expected):
        got = out[f"arr_{i}"]
        assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))
