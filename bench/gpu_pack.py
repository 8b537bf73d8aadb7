"""``make gpu-pack``: everything a GPU window needs, in two batches that fit one device call each.

Run on an ordinary machine (no GPU) from the project root (docs/gpu.md)::

    python -m bench gpu-pack            # = make gpu-pack
    python -m bench gpu-pack --smoke    # the dry run's one tiny build instead of the window's

Makes ``.gpu/`` (ignored by git): ``.gpu/a/`` (command 1's batch: the first part of the TVM
wheel, apache-tvm 0.27.0.post1 cp312 manylinux x86_64 from ``pip download``, cut so that the
batch is <= 60 MiB and fits one call (64 MiB) with the working tree); ``.gpu/b/`` (command
2's: the rest of the wheel, apache-tvm-ffi 0.1.14.post1 and the pure-Python wheels the GPU
image lacks, ``setup.sh`` (``bench/gpu_setup.sh``) and ``prep.tar.xz``: the nvcc cache of
every tvm-rtask CUDA build the window makes (``gpu-window --prepare``), the kernels' register
counts and ``manifest.json``); ``.gpu/pack.json`` (sizes, seconds, what was prepared).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench import HERE, ROOT

MIB = 2**20
BATCH_LIMIT = 60 * MIB  # the limit per batch
CALL_LIMIT = 64 * MIB  # what one device call carries: the working tree + the carried batch
TVM = "apache-tvm==0.27.0.post1"
TVM_FFI = "apache-tvm-ffi==0.1.14.post1"
PURE_WHEELS = ["networkx", "tqdm", "pytest-timeout", "pytest-xdist", "execnet", "onnx2torch"]
# MetaSchedule's cost model for the window's CUDA tuning (ship-records window): the CPU build
# of xgboost, a binary wheel of a few MiB
TUNING_WHEELS = ["xgboost-cpu"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"]  # fmt: skip


def download(dest: Path, python: str = sys.executable) -> list[Path]:
    """The cp312 wheels (``pip download``), kept in ``dest`` between packs."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd + [TVM, TVM_FFI, *PURE_WHEELS, *TUNING_WHEELS], check=True)
    return sorted(dest.glob("*.whl"))


def working_tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what travels with every call: tracked files and untracked ones git does
    not ignore."""
    cmd = ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(cmd, capture_output=True, check=True).stdout
    total = 0
    for name in out.decode().split("\0"):
        path = root / name
        if name and path.is_file():
            total += path.stat().st_size
    return total


def batch_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def check_batches(sizes: dict[str, int], tree: int) -> list[str]:
    """What is wrong with batch sizes ``{name: bytes}`` given the working tree's bytes:
    a batch over 60 MiB, or a batch and the tree together over one call's 64 MiB."""
    problems = []
    for name, size in sizes.items():
        if size > BATCH_LIMIT:
            problems.append(f"batch {name}: {size / MIB:.1f} MiB > {BATCH_LIMIT / MIB:.0f} MiB")
        if size + tree > CALL_LIMIT:
            problems.append(f"batch {name} + working tree: {(size + tree) / MIB:.1f} MiB > "
                            f"{CALL_LIMIT / MIB:.0f} MiB per call")  # fmt: skip
    return problems


def first_part_bytes(tree: int, margin: int = MIB) -> int:
    """How much of the TVM wheel batch a takes: as much as fits both limits."""
    return min(BATCH_LIMIT, CALL_LIMIT - tree - margin)


def compress_prep(prep: Path, dest: Path) -> None:
    """``prep/manifest.json`` and the entries of ``prep/nvcc/`` it lists (those this pack's
    builds used, compiled sources and kernels' register counts; the cache keeps older ones for
    later packs) as ``dest`` (tar, xz preset 6)."""
    from tvm_rtask.backend.cuda.compile_cache import REGISTERS_DIR

    manifest = json.loads((prep / "manifest.json").read_text())
    with lzma.open(dest, "wb", preset=6) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(prep / "manifest.json", arcname="manifest.json")
        for entry in manifest.get("nvcc_entries", []):
            for suffix in (".cubin", ".ptxas"):
                tar.add(prep / "nvcc" / f"{entry}{suffix}", arcname=f"nvcc/{entry}{suffix}")
        for entry in manifest.get("register_entries", []):
            name = f"nvcc/{REGISTERS_DIR}/{entry}.json"
            tar.add(prep / name, arcname=name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--out", default=str(ROOT / ".gpu"))
    add("--jobs", type=int, default=2, help="builds side by side (default 2)")
    add("--smoke", action="store_true", help="prepare the dry run's tiny build only")
    add("--no-prepare", action="store_true", help="the wheels and setup.sh only")
    args = p.parse_args(argv)
    started = time.time()
    out = Path(args.out)
    times: dict[str, float] = {}

    t = time.time()
    wheels = download(out / "dl")
    times["download_s"] = round(time.time() - t, 1)
    tvm_wheel = next(w for w in wheels if w.name.startswith("apache_tvm-"))

    prep = out / "prep"
    manifest: dict = {}
    if not args.no_prepare:
        t = time.time()
        cmd = [sys.executable, "-m", "bench.gpu_window", "--prepare", str(prep)]
        cmd += ["--jobs", str(args.jobs)] + (["--smoke"] if args.smoke else [])
        status = subprocess.run(cmd, cwd=str(ROOT)).returncode
        times["prepare_s"] = round(time.time() - t, 1)
        manifest = json.loads((prep / "manifest.json").read_text())
        if status:
            print(f"warning: some builds failed to prepare (see {prep / 'prepare.log'})")

    t = time.time()
    for name in ("a", "b"):
        shutil.rmtree(out / name, ignore_errors=True)
        (out / name).mkdir(parents=True)
    tree = working_tree_bytes()
    cut = first_part_bytes(tree)
    with open(tvm_wheel, "rb") as f:
        (out / "a" / "tvm.part.aa").write_bytes(f.read(cut))
        (out / "b" / "tvm.part.ab").write_bytes(f.read())
    (out / "b" / "tvm_wheel_name").write_text(tvm_wheel.name + "\n")
    for wheel in wheels:
        if wheel != tvm_wheel:
            shutil.copy(wheel, out / "b" / wheel.name)
    shutil.copy(HERE / "gpu_setup.sh", out / "b" / "setup.sh")
    if manifest:
        compress_prep(prep, out / "b" / "prep.tar.xz")
    times["batches_s"] = round(time.time() - t, 1)

    sizes = {name: batch_bytes(out / name) for name in ("a", "b")}
    problems = check_batches(sizes, tree)
    tar = out / "b" / "prep.tar.xz"
    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cores": os.cpu_count()}
    doc.update(seconds=round(time.time() - started, 1), **times, batch_bytes=sizes)
    doc.update(batch_mib={k: round(v / MIB, 1) for k, v in sizes.items()})
    doc.update(working_tree_mib=round(tree / MIB, 1))
    doc.update(prep_tar_mib=round(tar.stat().st_size / MIB if tar.exists() else 0, 1))
    doc.update(nvcc=manifest.get("nvcc"), nvcc_entries=len(manifest.get("nvcc_entries", [])))
    doc.update(nvcc_mib=round(manifest.get("nvcc_bytes", 0) / MIB, 1))
    doc.update(prepared_builds=manifest.get("builds", []), problems=problems)
    (out / "pack.json").write_text(json.dumps(doc, indent=1))
    print(f"gpu-pack: batch a {doc['batch_mib']['a']} MiB, batch b {doc['batch_mib']['b']} MiB "
          f"(working tree {doc['working_tree_mib']} MiB travels with each), "
          f"{doc['nvcc_entries']} nvcc builds prepared ({doc['nvcc_mib']} MiB, "
          f"{doc['prep_tar_mib']} MiB compressed), {doc['seconds']} s")  # fmt: skip
    for problem in problems:
        print(f"TOO LARGE: {problem}")
    print(
        "The two device calls, back to back (docs/gpu.md):\n"
        '  1. carry [".gpu/a"]:  mkdir -p /tmp/gpua && cp .gpu/a/* /tmp/gpua/\n'
        '  2. carry [".gpu/b"]:  T0=$(date +%s); source .gpu/b/setup.sh && '
        'make gpu-window ARGS="--since $T0"\n'
        "     (no make there: python3 -m bench gpu-window --since $T0)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
