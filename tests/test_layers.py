"""The package's layers hold: no module imports a package above its own layer (lazy imports
inside functions included), and module-level imports form no cycle. The checkout's benchmark
package ``bench/`` is read too: it sits above the models and the test helpers it measures.

Read from the source with ``ast`` (nothing is imported), so a new upward arrow fails here
before it becomes an import cycle at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

CHECKOUT = Path(__file__).resolve().parents[1]
ROOT = CHECKOUT / "tvm_rtask"
BENCH = CHECKOUT / "bench"

# Lowest first. A package may import from its own layer and the layers below it.
LAYERS = [
    ["errors", "fallbacks"],
    ["core", "frontend", "records", "native", "progress"],
    ["policies", "options"],  # pure Python: policies, cost models, the options they check
    ["tir", "viz", "relax_exprs"],
    ["backend"],
    ["relax_passes"],
    ["runtime", "tuning"],
    ["api", "<package>"],
    ["models"],  # the zoo, torchvision's architectures, onnx's light models, seeded weights
    # test helpers: references (ONNX Runtime, TVM's build), random graphs
    ["testing"],
    # the benchmark package of the checkout (timing, process isolation, the GPU window)
    ["bench"],
    ["cli", "demo", "tvmc"],
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}
PURE = {"core", "policies"}  # must not import TVM's compiler at module level


def _modules() -> dict[str, Path]:
    out = {}
    for name, root in (("tvm_rtask", ROOT), ("bench", BENCH)):
        for path in root.rglob("*.py"):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "bench":
        return "bench"
    return parts[1] if len(parts) > 1 else "<package>"


def _imports(module: str, path: Path, module_level_only: bool):
    """(imported tvm_rtask module, line) pairs; ``from pkg import sub`` names the submodule."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(("tvm_rtask", "bench")):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULES else target), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(("tvm_rtask", "bench")):
                    yield alias.name, node.lineno


def test_every_package_has_a_layer():
    packages = {_package(m) for m in MODULES}
    assert packages <= set(LAYER), f"add {sorted(packages - set(LAYER))} to LAYERS"


def test_no_module_imports_a_package_above_its_layer():
    upward = [
        f"{module}:{line} imports {target}"
        for module, path in MODULES.items()
        for target, line in _imports(module, path, module_level_only=False)
        if LAYER[_package(target)] > LAYER[_package(module)]
    ]
    assert not upward, "\n".join(upward)


def test_module_level_imports_form_no_cycle():
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        for target, _ in _imports(module, path, module_level_only=True):
            if target != module:
                graph.add_edge(module, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_pure_packages_do_not_import_tvm_at_module_level():
    found = []
    for module, path in MODULES.items():
        if _package(module) not in PURE:
            continue
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            found += [f"{module}: {n}" for n in names if n == "tvm" or n.startswith("tvm.")]
    assert not found, found


def test_an_upward_import_is_caught(tmp_path):
    """The check is not vacuous: a core module importing the backend is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ..backend import get_backend\n")
    targets = [t for t, _ in _imports("tvm_rtask.core.bad", bad, module_level_only=False)]
    assert targets == ["tvm_rtask.backend"]
    assert LAYER[_package(targets[0])] > LAYER["core"]


def test_bench_is_read_and_sits_above_the_helpers(tmp_path):
    assert "bench.peers" in MODULES and "tvm_rtask.testing.onnx_light" in MODULES
    bad = tmp_path / "bad.py"
    bad.write_text("from bench import peers\n")
    targets = [t for t, _ in _imports("tvm_rtask.testing.bad", bad, module_level_only=False)]
    assert targets == ["bench.peers"]
    assert LAYER[_package(targets[0])] > LAYER["testing"] > LAYER["models"]
