"""``tvmc compile --pass rtask`` / ``tvmc run`` end to end, by subprocess; outputs must match
ONNX Runtime (relative error < 1e-4)."""

import json
import tarfile

from tests.cli.helpers import check_outputs, run


def test_tvmc_compile_pass_rtask_then_run_matches_onnxruntime(work, package):
    d, expected = work
    with tarfile.open(package) as tar:
        assert sorted(tar.getnames()) == ["metadata.json", "mod.so"]
        meta = json.load(tar.extractfile("metadata.json"))
    assert meta["pass"] == "rtask" and meta["threads"] == 2
    assert meta["options"] == {"num_veu": 2, "barrier": "global"}
    assert meta["inputs"] == [{"name": "input", "shape": [3, 1, 8], "dtype": "float32"}]
    proc = run(
        "tvmc",
        "run",
        package,
        "--inputs",
        "x.npz",
        "--outputs",
        "y.npz",
        "--print-time",
        "--repeat",
        "3",
        cwd=d,
    )
    assert "Execution time summary" in proc.stdout and "median (ms)" in proc.stdout
    check_outputs(d / "y.npz", expected)
    # The package's library alone runs with tvm-rtask run too (metadata embedded).
    with tarfile.open(package) as tar:
        tar.extract("mod.so", d / "unpacked")
    run("tvm-rtask", "run", d / "unpacked" / "mod.so", "-i", "x.npz", "-o", "z.npz", cwd=d)
    check_outputs(d / "z.npz", expected)


def test_tvmc_default_build_runs_too(work):
    d, expected = work
    run("tvmc", "compile", "lstm.onnx", "-o", "plain.tar", cwd=d)
    run("tvmc", "run", "plain.tar", "-i", "x.npz", "-o", "plain.npz", "--print-top", "3", cwd=d)
    check_outputs(d / "plain.npz", expected)


def test_tvmc_uses_only_public_names_of_the_cli_package():
    """tvmc shares the CLI's building blocks through their public names only."""
    import ast
    import inspect

    from tvm_rtask import tvmc

    tree = ast.parse(inspect.getsource(tvmc))
    imported = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cli")
        for alias in node.names
    ]
    assert imported, "tvmc imports nothing from tvm_rtask.cli"
    assert not [name for _, name in imported if name.startswith("_")]
