"""docs/options.md's table is generated from the options' declarations and cannot drift."""

from __future__ import annotations

from dataclasses import MISSING

import tvm_rtask.api  # noqa: F401 - registers every backend: their options are rows too
from tvm_rtask import options
from tvm_rtask.options import CORE_OPTIONS, backend_options, option_table_markdown


def test_the_docs_table_is_the_generated_one():
    text = options.OPTIONS_DOC.read_text(encoding="utf-8")
    block = options.option_table_block(text)
    assert block is not None, f"{options.OPTIONS_DOC} has no generated options block"
    assert block == option_table_markdown(), (
        "docs/options.md's table differs from the options' declarations: run "
        "`python -m tvm_rtask.cli.options_doc`"
    )


def test_every_option_is_a_row_with_a_one_line_help_and_a_default():
    table = option_table_markdown()
    declared = [*CORE_OPTIONS.items()]
    declared += [(name, f) for name, owners in backend_options().items() for _, f in owners]
    for name, f in declared:
        help_text = f.metadata["help"]
        assert help_text and "\n" not in help_text, name
        assert f"| `{name}` |" in table
        if f.default is MISSING:  # a default computed when parsed: the table says what
            assert f.metadata["shown"], name
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(declared)
    assert all(line.count(" | ") == 4 for line in rows)  # a help's "|" is escaped


def test_update_rewrites_only_the_block(tmp_path):
    doc = tmp_path / "options.md"
    doc.write_text(f"# Head\n\n{options.TABLE_BEGIN}\nstale\n{options.TABLE_END}\n\n## Tail\n")
    assert options.update_option_table(doc) is True
    text = doc.read_text()
    assert text.startswith("# Head\n\n") and text.endswith(f"{options.TABLE_END}\n\n## Tail\n")
    assert options.option_table_block(text) == option_table_markdown()
    assert options.update_option_table(doc) is False
