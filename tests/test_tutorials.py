"""The notebooks of tutorials/ are committed with their outputs, and those outputs come from
the current code: each notebook is executed again and the structure of its fresh outputs
must equal the stored one (cells, output types, and every output line without a number).

After changing a notebook or the code it shows, execute it and save it with its outputs::

    .venv/bin/jupyter execute --inplace tutorials/NAME.ipynb

(nbclient's command line), then commit it.
"""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TUTORIALS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))
DIGIT = re.compile(r"\d")


def test_there_are_tutorials():
    names = [p.name for p in TUTORIALS]
    assert names == [
        "01_quick_start.ipynb",
        "02_writing_a_policy.ipynb",
        "03_comparing_policies.ipynb",
    ]


def _code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _coalesced(outputs):
    """Consecutive stream outputs of one stream joined (the kernel splits them by timing)."""
    merged = []
    for out in outputs:
        if (
            merged
            and out.output_type == "stream"
            and merged[-1]["output_type"] == "stream"
            and merged[-1]["name"] == out.name
        ):
            merged[-1]["text"] += out.text
        else:
            merged.append(dict(out))
    return merged


def structure(nb) -> list:
    """Per cell: its type and, for code, each output's type with the stream name and the
    lines that hold no digit (numbers and timings vary), or the MIME types of rich data."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            cells.append((cell.cell_type,))
            continue
        outputs = []
        for out in _coalesced(cell.outputs):
            kind = out["output_type"]
            if kind == "stream":
                lines = [ln for ln in out["text"].splitlines() if ln.strip()]
                outputs.append((kind, out["name"], [ln for ln in lines if not DIGIT.search(ln)]))
            elif kind in ("display_data", "execute_result"):
                outputs.append((kind, sorted(out["data"])))
            else:
                outputs.append((kind, out.get("ename"), out.get("evalue")))
        cells.append(("code", outputs))
    return cells


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_committed_with_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    cells = _code_cells(nb)
    # executed top to bottom in one kernel, every cell once
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), path.name
    outputs = [out for c in cells for out in c.outputs]
    assert outputs, path.name
    assert not [o for o in outputs if o.output_type == "error"], path.name
    # TVM's known C++ warnings are filtered (tvm_rtask.progress.quiet_tvm_warnings); anything
    # else on stderr would be noise a reader has to interpret
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, (path.name, stderr)


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_only_user_api(path):
    """What a user would write: no test helpers, no fallbacks for APIs that exist."""
    nb = nbformat.read(path, as_version=4)
    source = "\n".join(c.source for c in _code_cells(nb))
    assert "tvm_rtask.testing" not in source, path.name
    assert "getattr(" not in source, path.name
    assert "not available" not in source, path.name


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_stored_outputs_are_current(path, tmp_path):
    stored = nbformat.read(path, as_version=4)
    fresh = nbformat.read(path, as_version=4)
    # The kernel is this interpreter (the venv with tvm-rtask), whatever kernels exist.
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    client = nbclient.NotebookClient(
        fresh,
        timeout=300,
        kernel_name=NATIVE_KERNEL_NAME,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [
        out for cell in _code_cells(fresh) for out in cell.outputs if out.output_type == "error"
    ]
    assert not errors, errors
    want, got = structure(stored), structure(fresh)
    assert len(got) == len(want), path.name
    for index, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g == w, (
            f"{path.name}, cell {index}: the stored outputs are not what the code gives now; "
            "execute the notebook and save it (see this file's docstring)"
        )
