"""The notebooks of tutorials/ are committed without outputs and execute without error."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))


def test_there_are_tutorials():
    names = [p.name for p in TUTORIALS]
    assert names == [
        "01_quick_start.ipynb",
        "02_writing_a_policy.ipynb",
        "03_comparing_policies.ipynb",
    ]


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    # The kernel is this interpreter (the venv with tvm-rtask), whatever kernels exist.
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name=NATIVE_KERNEL_NAME,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "error"
    ]
    assert not errors, errors
