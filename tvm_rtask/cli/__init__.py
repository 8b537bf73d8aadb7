"""The ``tvm-rtask`` command line: compile, run, plan, tune, bench, list and export models.

::

    tvm-rtask compile MODEL [-o model.so] [--target llvm] [--policy wavefront] [--num-veu N]
                      [--report r.json] [--gantt g.png] [--emit-source DIR]
    tvm-rtask run ARTIFACT [--inputs x.npz] [--outputs y.npz] [--repeat N]
    tvm-rtask plan MODEL [--policy P ...] [--num-veu N] [--json plan.json]
    tvm-rtask tune MODEL --db DIR [--target llvm] [--trials N] [--seconds S] [--rpc H:P:KEY]
    tvm-rtask bench [--out-dir DIR] [harness options]   (bench/harness.py of a source checkout)
    tvm-rtask models                                    (the zoo)
    tvm-rtask export-onnx NAME -o model.onnx

``MODEL`` is an ``.onnx`` file or a name of :mod:`tvm_rtask.models`; an artifact is described
in :mod:`tvm_rtask.cli.artifact`. ``run`` needs nothing else: it sizes TVM's thread pool to
the artifact's vEU count before the first call.

Errors are one line on stderr (``tvm-rtask: error: ...``) and exit status 1; set
``TVM_RTASK_DEBUG=1`` to get the traceback instead.

The modules, each usable on its own (``tvm_rtask.tvmc`` uses them too):

- :mod:`~tvm_rtask.cli.build`: load a model, check target and options, compile;
- :mod:`~tvm_rtask.cli.artifact`: write, check and open artifacts (``.so`` / ``.tar``);
- :mod:`~tvm_rtask.cli.inputs`: ``--input-shapes``, input and output ``.npz`` files;
- :mod:`~tvm_rtask.cli.runner`: run an artifact and time it;
- :mod:`~tvm_rtask.cli.report`: plans per policy, the summary table, Gantt charts;
- :mod:`~tvm_rtask.cli.paths`: output paths checked before any work;
- :mod:`~tvm_rtask.cli.errors`: :class:`CLIError` and one-line messages;
- :mod:`~tvm_rtask.cli.main`: the parser, the commands, :func:`run_main`.

``tvm_rtask.cli.main`` the *attribute* is the console-script function (``tvm-rtask =
"tvm_rtask.cli:main"``); the module of the same name is
``importlib.import_module("tvm_rtask.cli.main")``.
"""

from .main import find_harness, main

__all__ = ["main", "find_harness"]
