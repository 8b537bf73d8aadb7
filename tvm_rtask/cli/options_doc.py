"""``python -m tvm_rtask.cli.options_doc [PATH]``: rewrite docs/options.md's table from the
options' declarations (``tests/test_options_doc.py`` fails when it differs). Here, above every
backend, because the table has a row for each option a registered backend declares: run from
``tvm_rtask.options`` itself it lost every backend's rows."""

from __future__ import annotations

import sys

import tvm_rtask.api  # noqa: F401 - registers every backend, whose options are rows
from tvm_rtask import options


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else options.OPTIONS_DOC
    changed = options.update_option_table(path)
    print(f"{path}: {'updated' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
