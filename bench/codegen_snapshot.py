"""Write the code tvm-rtask generates for a fixed set of models, to compare two versions.

A refactoring must not change generated code. This writes, into ``OUT``, the CUDA source
(sm_90, no GPU needed) of the reduced zoo SqueezeNet and NASNet, of reduced SqueezeNet with
``cuda_veu_placement="smid"``, ``barrier="fine"`` and inlined bodies, and the lowered CPU
module (TVMScript, before LLVM) of the light SqueezeNet, Inception v1 and ShuffleNet under
wavefront and sequential, with a SHA-256 per file in ``OUT/hashes.txt``. Run it before and
after a change and compare: ``diff before/hashes.txt after/hashes.txt``.

``--root DIR`` imports tvm_rtask from the checkout ``DIR`` (for instance a ``git worktree``
of the commit before) instead of the installed package; the native libraries are the
installed ones unless ``TVM_RTASK_RUNTIME_LIB`` / ``TVM_RTASK_PASS_CONFIG_LIB`` say otherwise.

    python bench/codegen_snapshot.py /tmp/after
    git worktree add /tmp/before HEAD~1
    python bench/codegen_snapshot.py /tmp/before-out --root /tmp/before
    diff /tmp/before-out/hashes.txt /tmp/after/hashes.txt
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

CUDA = {"kind": "cuda", "arch": "sm_90"}
CUDA_CASES = [
    ("cuda_squeezenet", "squeezenet", {}),
    ("cuda_nasnet_cifar", "nasnet_cifar", {}),
    ("cuda_squeezenet_smid", "squeezenet", {"cuda_veu_placement": "smid"}),
    ("cuda_squeezenet_fine", "squeezenet", {"barrier": "fine"}),
    ("cuda_squeezenet_inlined", "squeezenet", {"cuda_body_functions": False}),
]
CPU_MODELS = ("squeezenet", "inception_v1", "shufflenet")
CPU_POLICIES = ("wavefront", "sequential")


def _import_from(root: str) -> None:
    """Import tvm_rtask from ``root``: ahead of sys.path and of an editable install's finder
    (which would otherwise answer for the installed checkout)."""
    sys.meta_path[:] = [f for f in sys.meta_path if "Redirect" not in type(f).__name__]
    sys.path.insert(0, os.path.abspath(root))
    build = Path(__file__).resolve().parents[1] / "build"
    for env, name in (
        ("TVM_RTASK_RUNTIME_LIB", "libtvm_rtask_runtime.so"),
        ("TVM_RTASK_PASS_CONFIG_LIB", "libtvm_rtask_pass_config.so"),
    ):
        found = sorted(build.glob(f"*/{name}"))
        if env not in os.environ and found:
            os.environ[env] = str(found[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="folder to write the generated code into")
    p.add_argument("--root", default=None, help="import tvm_rtask from this checkout")
    p.add_argument("--only", nargs="*", default=None, help="case names (file stems) to write")
    args = p.parse_args(argv)
    if args.root:
        _import_from(args.root)
    import tvm_rtask
    from tvm_rtask import models
    from tvm_rtask.testing.onnx_light import load_light_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"tvm_rtask from {Path(tvm_rtask.__file__).parent}", flush=True)
    hashes = []

    def write(stem: str, suffix: str, text: str) -> None:
        (out / f"{stem}{suffix}").write_text(text)
        digest = hashlib.sha256(text.encode()).hexdigest()
        hashes.append(f"{digest}  {stem}{suffix}")
        print(f"{stem}{suffix}: {len(text)} chars, {digest[:16]}", flush=True)

    def wanted(stem: str) -> bool:
        return args.only is None or stem in args.only

    for stem, model, options in CUDA_CASES:
        if wanted(stem):
            mod, _ = models.get(model, reduced=True)
            ex = tvm_rtask.compile(mod, CUDA, verify_occupancy=False, **options)
            write(stem, ".cu", tvm_rtask.cuda_source(ex))
    for model in CPU_MODELS:
        for policy in CPU_POLICIES:
            stem = f"cpu_{model}_{policy}"
            if wanted(stem):
                light = load_light_model(model, seed=0)
                lowered = tvm_rtask.lower(light, "llvm", policy, num_veu=2)
                write(stem, ".py", lowered.script())
    (out / "hashes.txt").write_text("\n".join(sorted(hashes, key=lambda h: h.split()[1])) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
