"""The GPU window kit without a GPU: `make gpu-window` dry run, the pack's size checks, and the
README GPU table generated from a (synthetic) results file (bench.gpu_window, bench.gpu_pack)."""

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import gpu_pack, gpu_window
from bench.records import results_document

ROOT = Path(__file__).resolve().parents[1]

MIB = 2**20


def test_dry_run_without_a_gpu(tmp_path):
    """`make gpu-window ARGS="--out DIR"` without a GPU: every step runs on tiny models, says
    GPU ABSENT, and leaves no more files than a device call brings back (8)."""
    out = tmp_path / "out"
    env = dict(os.environ, TVM_RTASK_CUDA_CACHE=str(tmp_path / "nvcc"))
    env.pop("OUT", None)
    args = f"--out {out} --work {tmp_path / 'work'} --no-gpu"
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "gpu-window", f"GPU_PY={sys.executable}", f"ARGS={args}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "GPU ABSENT" in proc.stdout
    summary = (out / "summary.md").read_text()
    assert "GPU ABSENT" in summary
    for header in ("## 1. Numerics", "## 2. Latency", "## 3. Where", "## 4. Device profile"):
        assert header in summary
    numerics = [json.loads(line) for line in (out / "numerics.jsonl").read_text().splitlines()]
    llvm = [r for r in numerics if r["target"] == "llvm"]
    assert llvm and all(r["ok"] for r in llvm), [(r["model"], r.get("error")) for r in llvm]
    assert all(r["rel_err"] < gpu_window.TOLERANCE for r in llvm)
    codegen = [r for r in numerics if r["target"].startswith("cuda")]
    if gpu_pack.shutil.which("nvcc"):
        assert codegen and codegen[0]["ok"], codegen
        assert codegen[0]["nvcc_cache"]["misses"] >= 1
        # a second process (the device, after the pack) is answered by the cache alone
        again = tmp_path / "again.jsonl"
        subprocess.run(
            [sys.executable, "-m", "bench.gpu_window", "--codegen-worker",
             gpu_window.SMOKE_CUDA_CODEGEN, "--worker-out", str(again)],
            env=env, cwd=ROOT, capture_output=True, timeout=300, check=True,
        )  # fmt: skip
        cache = json.loads(again.read_text())["nvcc_cache"]
        assert cache["misses"] == 0 and cache["hits"] >= 1, cache
    bench = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines()]
    timed = {r["config"] for r in bench if "median_ms" in r}
    assert {"tvm_default", "sequential"} <= timed, bench
    files = [p for p in out.iterdir() if p.is_file()]
    assert len(files) <= 8, files
    with tarfile.open(out / gpu_window.DETAILS) as tar:
        names = tar.getnames()
    assert "window.log" in names and any(n.startswith("kernels/") for n in names)
    doc = json.loads((out / "summary.json").read_text())
    assert doc["gpu_present"] is False and "extras" in doc["steps"]


def test_batch_size_checks(tmp_path):
    assert gpu_pack.check_batches({"a": 58 * MIB, "b": 50 * MIB}, tree=5 * MIB) == []
    problems = gpu_pack.check_batches({"a": 61 * MIB, "b": 60 * MIB}, tree=5 * MIB)
    assert any("batch a: 61.0 MiB > 60 MiB" in p for p in problems)
    assert any("batch b + working tree: 65.0 MiB > 64 MiB" in p for p in problems)
    # batch a takes what fits both limits
    assert gpu_pack.first_part_bytes(tree=2 * MIB) == 60 * MIB
    assert gpu_pack.first_part_bytes(tree=5 * MIB) == 58 * MIB
    folder = tmp_path / "b"
    (folder / "sub").mkdir(parents=True)
    with open(folder / "big", "wb") as f:  # sparse: costs no disk
        f.truncate(61 * MIB)
    (folder / "sub" / "small").write_bytes(b"x" * 10)
    size = gpu_pack.batch_bytes(folder)
    assert size == 61 * MIB + 10
    assert gpu_pack.check_batches({"b": size}, tree=0)


def _synthetic_window(folder: Path) -> None:
    folder.mkdir()
    env = {"type": "env", "device": "NVIDIA H100 80GB HBM3", "target": "cuda"}
    rows = {
        "tvm_default": 0.60,
        "tvm_cuda_graph": 0.48,
        "sequential": 2.50,
        "wavefront_counter": 0.90,
        "wavefront_cuda_graph": 0.40,
    }
    lines = [env]
    for name, ms in rows.items():
        lines.append(
            {
                "type": "result",
                "model": "squeezenet",
                "batch": 1,
                "config": name,
                "kind": "tvm" if name.startswith("tvm") else "rtask",
                "median_ms": ms,
                "min_ms": ms,
                "max_ms": ms,
                "repeat": 100,
            }  # fmt: skip
        )
    lines.append(
        {
            "type": "result",
            "model": "resnext29",
            "batch": 1,
            "config": "tvm_cuda_graph",
            "kind": "tvm",
            "median_ms": 1.0,
            "min_ms": 1.0,
            "max_ms": 1.0,
            "repeat": 100,
        }  # fmt: skip
    )
    lines.append(
        {
            "type": "result",
            "model": "resnext29",
            "batch": 1,
            "config": "sequential",
            "kind": "rtask",
            "error": "worker died (status -11)",
        }  # fmt: skip
    )
    (folder / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "numerics.jsonl").write_text(json.dumps({"model": "light:squeezenet", "ok": True}))
    summary = {"date": "2027-01-05T10:00:00", "gpu": {"device_name": "NVIDIA H100 80GB HBM3"}}
    (folder / "summary.json").write_text(json.dumps({**summary, "not_reached": ["extras"]}))


def test_slower_lines_and_worst_model(tmp_path):
    _synthetic_window(tmp_path / "w")
    records = [json.loads(x) for x in (tmp_path / "w" / "bench.jsonl").read_text().splitlines()]
    doc = results_document(records)
    slower = gpu_window.slower_than_baseline(doc)
    assert len(slower) == 3  # tvm_default, sequential, wavefront_counter; not the graph one
    assert any(
        s.startswith("squeezenet sequential: 2.500 ms, 5.21x tvm_cuda_graph") for s in slower
    )
    assert gpu_window.worst_ratio_model(doc) == ("squeezenet", round(0.40 / 0.48, 3))


def test_results_published_and_readme_table_generated(tmp_path):
    _synthetic_window(tmp_path / "w")
    results = tmp_path / "results"
    results.mkdir()
    path = gpu_window.publish(tmp_path / "w", results)
    assert path.name == "2027-01-05-h100.json"
    doc = json.loads(path.read_text())
    assert doc["window"]["numerics"][0]["ok"] is True
    assert len(doc["window"]["slower_than_tvm_cuda_graph"]) == 3
    assert path.with_suffix(".md").read_text().count("squeezenet") == 1
    readme = tmp_path / "README.md"
    before = (
        "# x\n\nintro\n\nGPU: no GPU table yet; no GPU run has produced one\n(docs).\n\n## Use\n"
    )
    readme.write_text(before)
    gpu_window.update_readme(path, readme)
    text = readme.read_text()
    assert "no GPU table yet" not in text and text.endswith("\n\n## Use\n")
    block = gpu_window.readme_block(path, tmp_path)
    assert block in text and "2027-01-05-h100.json" in block
    assert "| squeezenet" in block and "0.400 (0.83x)" in block
    gpu_window.update_readme(path, readme)  # again: the marked block is replaced in place
    assert readme.read_text() == text
    old = "<!-- gpu numbers: generated by `python bench/gpu_window.py --update-readme x.json` -->"
    readme.write_text(f"# x\n\n{old}\nold table\n<!-- /gpu numbers -->\n\n## Use\n")
    gpu_window.update_readme(path, readme)  # a block the old script wrote is replaced too
    assert readme.read_text() == f"# x\n\n{block}\n\n## Use\n"
    readme.write_text("# nothing to replace\n")
    with pytest.raises(SystemExit):
        gpu_window.update_readme(path, readme)


def test_background_compiles_on_a_gpu(tmp_path, monkeypatch):
    """With a GPU, step 2's builds that step 1 does not make compile during step 1 (and the
    twins' torch.compile warms Inductor's caches); all are stopped before step 2 times."""
    args = gpu_window.parse_args(["--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")])
    args.numerics = gpu_window.NUMERICS_MODELS
    window = gpu_window.Window(args)
    window.gpu = {"exist": True}
    spawned = {}

    class Done:
        returncode = 0

        def poll(self):
            return 0

    monkeypatch.setattr(
        window, "_spawn", lambda cmd, name: spawned.setdefault(name, cmd) and Done()
    )
    window.start_background()
    assert set(spawned) == {"precompile-shared", "precompile-alone", "torch-warm"}
    shared = spawned["precompile-shared"]
    models = shared[shared.index("--models") + 1 : shared.index("--configs")]
    assert "squeezenet" not in models and "nasnet_cifar" in models
    assert "--compile-only" in shared and "--compile-only" not in spawned["torch-warm"]
    alone = spawned["precompile-alone"]
    assert alone[alone.index("--models") + 1] == "squeezenet"
    window.stop_background(0)
    assert window.background == []
    assert (tmp_path / "o" / "window.jsonl").read_text().count('"background"') == 3


def test_a_model_still_building_at_step_1s_end_goes_on_until_step_2(tmp_path):
    """On a GPU a numerics worker running at step 1's end is kept (not cut), waited for
    before step 2 times, and its record, written late, reaches the summary."""
    args = gpu_window.parse_args(["--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")])
    window = gpu_window.Window(args)
    out = window.out / "numerics.jsonl"
    record = json.dumps({"model": "zoo:late", "ok": True})
    slow = [
        sys.executable,
        "-c",
        f"import time; time.sleep(1.5); open({str(out)!r}, 'a').write({record!r} + '\\n')",
    ]
    window.start_margin = 0
    late: list = []
    cut = window.run_many([("numerics-late", slow)], 2, time.time() + 0.5, keep=late)
    assert cut == [] and [n for n, _ in late] == ["numerics-late"]
    window.background = late
    window.steps["numerics"] = {"records": []}
    window.stop_background(time.time() + 30)
    assert window.steps["numerics"]["records"] == [{"model": "zoo:late", "ok": True}]
    assert '"late": true' in (window.out / "window.jsonl").read_text()
    assert not window.not_reached


def test_pack_carries_only_the_entries_its_builds_used(tmp_path):
    prep = tmp_path / "prep"
    (prep / "nvcc").mkdir(parents=True)
    for key in ("used", "old"):
        (prep / "nvcc" / f"{key}.cubin").write_bytes(b"cubin")
        (prep / "nvcc" / f"{key}.ptxas").write_text("report")
    (prep / "nvcc" / "registers").mkdir()
    for key in ("kept", "stale"):
        (prep / "nvcc" / "registers" / f"{key}.json").write_text('{"registers": 40}')
    manifest = {"nvcc_entries": ["used"], "register_entries": ["kept"]}
    (prep / "manifest.json").write_text(json.dumps(manifest))
    gpu_pack.compress_prep(prep, tmp_path / "prep.tar.xz")
    with tarfile.open(tmp_path / "prep.tar.xz") as tar:
        names = sorted(tar.getnames())
    assert names == [
        "manifest.json",
        "nvcc/registers/kept.json",
        "nvcc/used.cubin",
        "nvcc/used.ptxas",
    ]
