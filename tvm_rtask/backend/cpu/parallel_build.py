"""Build the outlined body functions of an llvm module in forked processes.

TVM builds an IRModule as one LLVM module in one thread, and the TIR passes and LLVM over the
rules' unrolled register tiles are most of a compile (docs/compile-time.md). Two threads
of one process gain little (each ran 45% slower than alone: ResNet-18's build 3.3 s alone,
4.8 s each in two threads), while two processes run at full speed. So the bodies compiled out
of line anyway (``dispatch.OUTLINED_ATTR``, or called by more than ``MAX_INLINED_CALLS``
runs) are cut into groups that forked children (which inherit the module: nothing is
serialised) build into object files, taking them from a queue, while this process builds the
rest (the persistent functions, the bodies LLVM may inline into them) and then joins in.

A moved body becomes a public C function called by name, with what its calls pass put into
it (a constant every call passes, the range of several: a run's rTask step, count and first
rTask), as LLVM infers for an internal function: the kernels' code does not change. The name
is hashed from that specialised code and the target, since every executable's library in the
process shares one namespace. The objects are linked into one
library loaded into the process's global scope, where the JIT of the executable's module
finds them; :class:`SideObjectsExecutable` links them into what ``export_library`` writes.

A group a child did not finish (it failed, or outlived its deadline and was killed) is built
here: the fork is an optimisation, never a new way to fail. Bodies built while the plan was
made (``early_build.py``) are taken as they are when their code is the one predicted.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import signal
import tempfile
import time
import warnings

import tvm
import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.relax import VMExecutable
from tvm.support import cc
from tvm.tirx import IntImm

from ... import native
from ...fallbacks import BUILT_LATE, note_fallback
from ...tir.common import substitute_vars
from .dispatch import (
    BODY_ATTR,
    BODY_RULE_ATTR,
    OUTLINED_ATTR,
    PUBLIC_BODY_ATTR,
    call_arguments,
    cpu_pipeline,
    is_outlined,
)

__all__ = ["SideObjectsExecutable", "build_jobs", "build_with_side_objects", "unrolled_size"]

MAX_JOBS = 8
# bodies smaller than this in all (statements after unrolling, :func:`unrolled_size`) are
# not worth a process: ResNet-18's 21 outlined bodies sum to about 1.7 K
MIN_GROUP_SIZE = 200
# a group takes this share of what is left to build, per process: the bodies' build times
# vary 5x at one size (ResNet-18: 0.13-0.64 s at about 91 statements), so the processes take
# groups from a queue as they finish, large ones first and small ones last
GUIDED_SHARE = 0.5
# the smallest group, as a share of all per process: each group is a module of its own, with
# about 40 ms of TVM's and LLVM's fixed costs
MIN_GROUP_SHARE = 1 / 8
# after this process's own build, how long children may still take (multiple of its time,
# at least the floor): a child stuck after the fork is killed, not waited for
DEADLINE_FACTOR = 4.0
DEADLINE_FLOOR_S = 60.0


def build_jobs(requested: int | None, ignored: tuple[int, ...] = ()) -> int:
    """The processes a build uses: ``requested``, else one per core this process may run on
    that the machine's other work leaves idle, this process included (at most
    :data:`MAX_JOBS`).

    As make's ``--load-average``: on cores already busy (a test runner's workers, other
    builds) the forked processes only add their overhead (the suite on 2 cores with 2
    workers: 15 -> 18 minutes). The work is counted now (the runnable tasks), not as the
    1-minute load average, which still counts work that ended up to a minute ago. The
    processes ``ignored`` (this compile's early builder, about to stop) are not counted."""
    if requested is not None:
        return requested
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    busy = _runnable_elsewhere(ignored=ignored)
    if busy is None:
        try:  # this compile is part of the average once it has run a while
            busy = max(os.getloadavg()[0] - 1, 0.0)
        except (AttributeError, OSError):
            busy = 0.0
    # rounded: a little other work (0.4 of a core) still leaves the core
    idle = math.floor(cores - busy + 0.5)
    return max(1, min(cores, idle, MAX_JOBS))


def _runnable_elsewhere(
    samples: int = 5, pause_s: float = 0.002, ignored: tuple[int, ...] = ()
) -> int | None:
    """Tasks (threads) of other processes runnable now: the median of three counts
    ``pause_s`` apart, of up to ``samples`` when they differ. One count can see a kernel
    worker that runs for a moment (on a quiet machine, about one count in a hundred, and
    then a 2-core build ran in one process, 1.1 s slower) or miss a busy process waiting a
    moment for memory or a file; ``None`` where Linux's counts cannot be read."""
    counts: list[int] = []
    while len(counts) < samples:
        count = _runnable_elsewhere_once(ignored)
        if count is None:
            return None
        counts.append(count)
        if len(counts) >= 3 and len(set(counts[-3:])) == 1:
            return count
        time.sleep(pause_s)
    return sorted(counts)[len(counts) // 2]


def _runnable_elsewhere_once(ignored: tuple[int, ...] = ()) -> int | None:
    """Linux's ``/proc/loadavg`` (fourth field, ``running/total``) less this process's own
    running threads (this one, and TVM's pool workers, which spin a while after parallel
    work and are not forked), counted before and after it, and the ``ignored`` processes'."""
    before = _running_threads()
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            running = int(f.read().split()[3].partition("/")[0])
    except (OSError, IndexError, ValueError):
        return None
    own = max(before, _running_threads())
    return max(running - max(own, 1) - sum(_running_threads(pid) for pid in ignored), 0)


def _running_threads(pid: int | str = "self") -> int:
    """The threads of process ``pid`` in state ``R`` (0 where ``/proc`` cannot be read)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    own = 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii", errors="replace") as f:
                # "pid (comm) state ...": the state follows the last parenthesis
                own += f.read().rpartition(")")[2].split()[:1] == ["R"]
        except OSError:  # the thread ended meanwhile
            continue
    return own


def unrolled_size(stmt: tirx.Stmt) -> int:
    """Statements of ``stmt`` once its unrolled loops are unrolled: what the TIR passes and
    LLVM work through (a vectorised loop is one statement). Walks statements only."""
    if isinstance(stmt, tirx.For):
        inner = unrolled_size(stmt.body)
        if stmt.kind == tirx.ForKind.UNROLLED and isinstance(stmt.extent, IntImm):
            return inner * max(int(stmt.extent.value), 1)
        return inner
    if isinstance(stmt, tirx.SeqStmt):
        return sum(unrolled_size(s) for s in stmt.seq)
    if isinstance(stmt, tirx.IfThenElse):
        rest = unrolled_size(stmt.else_case) if stmt.else_case is not None else 0
        return 1 + unrolled_size(stmt.then_case) + rest
    if isinstance(stmt, s_tir.SBlockRealize):
        return unrolled_size(stmt.block)
    if isinstance(stmt, s_tir.SBlock):
        init = unrolled_size(stmt.init) if stmt.init is not None else 0
        return init + unrolled_size(stmt.body)
    body = getattr(stmt, "body", None)
    if isinstance(body, tirx.Stmt):
        return 1 + unrolled_size(body)
    return 1


def symbol_of(func: tirx.PrimFunc, target: tvm.target.Target) -> str:
    """A name that only this body's code for this target has."""
    key = f"{tvm_ffi.structural_hash(func)}|{target}".encode()
    return f"tvm_rtask_body_{hashlib.sha256(key).hexdigest()[:24]}"


def _partition(sizes: dict[str, int], jobs: int) -> list[list[str]]:
    """Groups for ``jobs`` processes in the order they are taken, as OpenMP's guided
    schedule: each about :data:`GUIDED_SHARE` of what is left per process (the longest
    bodies first), at least :data:`MIN_GROUP_SHARE` of the whole per process. The last
    groups are single small bodies, so the process that finishes last runs alone briefly
    (ResNet-18, eight groups of equal size: one of 0.15-0.3 s alone at the end)."""
    left = sum(sizes.values())
    floor = MIN_GROUP_SHARE * left / jobs
    groups: list[list[str]] = []
    group: list[str] = []
    load = 0
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        if not group:
            goal = max(GUIDED_SHARE * left / jobs, floor)
        group.append(name)
        load += sizes[name]
        if load >= goal:
            groups.append(group)
            left -= load
            group, load = [], 0
    if group:
        groups.append(group)
    return groups


def _movable(mod: tvm.IRModule, calls: dict[str, list[list]]) -> dict[str, tirx.PrimFunc]:
    """The bodies compiled out of line wherever they are (``calls``: :func:`call_arguments`
    of ``mod``): moving them changes no code."""
    found = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None:
            continue
        name = gvar.name_hint
        if BODY_ATTR in func.attrs and is_outlined(func, len(calls.get(name, ()))):
            found[name] = func
    return found


def _argument_ranges(calls: dict[str, list[list]], names: set[str]) -> dict[str, dict]:
    """Per body of ``names``: for each integer argument that every call passes as a constant
    (a run's first rTask, step and count), the least and the greatest of them."""
    ranges = {}
    for name in names & calls.keys():
        found = {}
        for i in range(len(calls[name][0])):
            if all(isinstance(c[i], IntImm) for c in calls[name]):
                values = [int(c[i].value) for c in calls[name]]
                found[i] = (min(values), max(values))
        ranges[name] = found
    return ranges


# Bodies of these rules keep their parameters: injective operators' index arithmetic (the
# transposes, reshapes and rolls of Swin-T's shifted windows) is where TVM's simplifier went
# wrong once the bounds were written in (docs/findings.md, "TVM's simplifier and the rTask
# bounds"); they are memory-bound, and lose little by it.
UNSPECIALISED_RULES = ("Elementwise",)


def specialise(func: tirx.PrimFunc, ranges: dict[int, tuple]) -> tirx.PrimFunc:
    """``func`` knowing what its calls pass: a parameter every call gives the same constant
    becomes that constant, and one given several is clamped to their range (an identity on
    every call). LLVM infers both for an internal function from its call sites, and the
    index arithmetic of the rTask loops folds with them; a body in another module loses that
    (SqueezeNet and MobileNet v2 ran 14% slower at 2 threads). Bodies of
    :data:`UNSPECIALISED_RULES` stay as they are."""
    rule = func.attrs.get(BODY_RULE_ATTR) if func.attrs is not None else None
    if rule is not None and str(rule) in UNSPECIALISED_RULES:
        return func
    mapping = {}
    for i, (low, high) in ranges.items():
        param = func.params[i]
        dtype = str(param.ty.dtype)
        if low == high:
            mapping[param] = IntImm(dtype, low)
        else:
            mapping[param] = tirx.Max(tirx.Min(param, IntImm(dtype, high)), IntImm(dtype, low))
    if not mapping:
        return func
    return func.with_body(substitute_vars(func.body, mapping))


def side_module(funcs: dict[str, tirx.PrimFunc]) -> tvm.IRModule:
    """A module of specialised bodies, each a public C function named by its symbol."""
    attrs = {
        "calling_conv": 1,  # a C function already: MakePackedAPI leaves it as it is
        PUBLIC_BODY_ATTR: True,
        OUTLINED_ATTR: True,  # as in the whole module: out of line, own scope
    }
    return tvm.IRModule(
        {
            ir.GlobalVar(symbol): func.with_attrs({**attrs, "global_symbol": symbol})
            for symbol, func in funcs.items()
        }
    )


def _specialised(
    mod: tvm.IRModule, moved: set[str], target: tvm.target.Target, calls: dict[str, list[list]]
) -> tuple[dict[str, tirx.PrimFunc], dict[str, str]]:
    """The bodies of ``moved`` specialised on their calls, and their symbols: named after the
    code each becomes (the same body called with other constants by another executable in
    this process is other code, and the loaded libraries share one namespace)."""
    ranges = _argument_ranges(calls, moved)
    special = {name: specialise(mod[name], ranges.get(name, {})) for name in moved}
    return special, {name: symbol_of(func, target) for name, func in special.items()}


def _calling_by_symbol(mod: tvm.IRModule, symbols: dict[str, str]) -> tvm.IRModule:
    """This process's module, without the bodies of ``symbols``: their callers call them by
    symbol."""

    def by_symbol(call):
        if isinstance(call.op, ir.GlobalVar) and call.op.name_hint in symbols:
            return tirx.call_extern("int32", symbols[call.op.name_hint], *call.args)
        return call

    main = {}
    for gvar, func in mod.functions.items():
        if gvar.name_hint in symbols:
            continue
        if isinstance(func, tirx.PrimFunc):
            func = func.with_body(tvm_ffi.structural_map(func.body, (ir.Call, by_symbol)))
        main[gvar] = func
    return tvm.IRModule(main, attrs=mod.attrs, global_infos=mod.global_infos)


def build_object(mod: tvm.IRModule, target: tvm.target.Target, path: str) -> None:
    """``mod`` built into the object file ``path``, which appears whole or not at all."""
    lib = tvm.tirx.build(mod, target=target, pipeline=cpu_pipeline())
    lib.write_to_file(path + ".part.o")
    os.replace(path + ".part.o", path)


def _take(queue: int) -> int | None:
    """The next group from the queue (a pipe of 2-byte indices; a read of 2 bytes is
    atomic, so no two processes take one group), ``None`` when it is empty."""
    data = os.read(queue, 2)
    return int.from_bytes(data, "little") if len(data) == 2 else None


def _work(queue: int, sides, target: tvm.target.Target, paths: list[str]) -> None:
    while (index := _take(queue)) is not None:
        build_object(sides[index][0], target, paths[index])


def _fork_worker(queue: int, sides, target: tvm.target.Target, paths: list[str]) -> int:
    """A child that builds groups from ``queue`` until it is empty, then exits; its pid."""
    with warnings.catch_warnings():
        # Python 3.12+ warns that a fork of a threaded process may deadlock in the child:
        # the child only builds, and a stuck child is killed at its deadline
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: build, and leave without running the parent's exit handlers
        code = 1
        try:
            _work(queue, sides, target, paths)
            code = 0
        finally:
            os._exit(code)
    return pid


def _reap(pid: int, deadline: float) -> None:
    """Wait for the child ``pid`` until ``deadline``, then kill it."""
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.005)


def build_with_side_objects(
    build_main, mod: tvm.IRModule, target: tvm.target.Target, jobs: int, early=None
):
    """``build_main(module)`` (the Relax build of this process) while up to ``jobs - 1``
    forked processes build the outlined bodies of ``mod``, in groups taken from a queue that
    this process joins once its own build is done; ``None`` when there is too little to
    share and nothing built early (the caller builds ``mod`` as it is).

    ``early`` (:class:`early_build.EarlyBuilds`): bodies built while the plan was made;
    those whose code came out as predicted are taken from it, the others built here."""
    if not hasattr(os, "fork"):
        return None
    if jobs < 2 and (early is None or early.running_pid() is None):
        return None  # nothing to share, nothing built early
    calls = call_arguments(mod)
    movable = _movable(mod, calls)
    if not movable:
        if early is not None:
            early.claim(set()).close()
        return None
    special, symbols = _specialised(mod, set(movable), target, calls)
    claim = early.claim(set(symbols.values())) if early is not None else None
    try:
        early_made = (set(claim.ready) | claim.coming) if claim is not None else set()
        rest = [name for name in movable if symbols[name] not in early_made]
        sizes = {name: unrolled_size(movable[name].body) for name in rest}
        jobs = min(jobs, sum(sizes.values()) // MIN_GROUP_SIZE, len(rest))
        if jobs < 2 and not early_made:
            return None
        groups = _partition(sizes, jobs) if jobs >= 2 else [rest] if rest else []
        sides = [
            (side_module({symbols[n]: special[n] for n in group}), [symbols[n] for n in group])
            for group in groups
        ]
        main = _calling_by_symbol(mod, symbols)
        with tempfile.TemporaryDirectory(prefix="tvm_rtask_build_") as tmp:
            paths = [os.path.join(tmp, f"bodies_{i}.o") for i in range(len(sides))]
            executable, deadline = _build_sharing(build_main, main, sides, target, paths, jobs)
            for (side, names), path in zip(sides, paths, strict=True):
                if not os.path.exists(path):
                    note_fallback(BUILT_LATE, _bodies(names), "a build process failed: built here")
                    build_object(side, target, path)
            if claim is not None:
                paths += _early_objects(claim, deadline, special, symbols, target, tmp)
            return _with_side_library(executable, paths, tmp)
    finally:
        if claim is not None:
            claim.close()


def _build_sharing(build_main, main, sides, target, paths: list[str], jobs: int):
    """``build_main(main)`` here, and the ``sides`` into ``paths`` by this process and
    ``jobs - 1`` forked ones; the executable and the deadline for what is still running."""
    queue, feed = os.pipe()
    try:
        os.write(feed, b"".join(i.to_bytes(2, "little") for i in range(len(sides))))
        os.close(feed)
        pids = [_fork_worker(queue, sides, target, paths) for _ in range(jobs - 1)]
        start = time.monotonic()
        try:
            executable = build_main(main)
            _work(queue, sides, target, paths)
        except BaseException:
            deadline = time.monotonic()  # nothing to wait for: the build failed
            raise
        else:
            waited = max(DEADLINE_FLOOR_S, DEADLINE_FACTOR * (time.monotonic() - start))
            deadline = time.monotonic() + waited
        finally:
            for pid in pids:
                _reap(pid, deadline)
    finally:
        os.close(queue)
    return executable, deadline


def _early_objects(claim, deadline, special, symbols, target, tmp: str) -> list[str]:
    """The objects the early builder delivered for this module, and the bodies it did not
    deliver built here."""
    found = claim.finish(deadline)
    by_symbol = {symbol: name for name, symbol in symbols.items()}
    paths = []
    for symbol in sorted(set(claim.ready) | claim.coming):
        path = found.get(symbol)
        if path is None:
            note_fallback(
                BUILT_LATE, by_symbol[symbol], "the early build did not deliver it: built here"
            )
            path = os.path.join(tmp, f"{symbol}.o")
            build_object(side_module({symbol: special[by_symbol[symbol]]}), target, path)
        paths.append(path)
    return paths


def _bodies(names: list[str], shown: int = 3) -> str:
    """The body functions ``names`` in a note's subject, the first ``shown`` by name."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"bodies {', '.join(names[:shown])}{more}"


def _with_side_library(executable, paths: list[str], tmp: str):
    """The executable, with the objects linked into one library that this process loads
    into its global scope, where the JIT of the executable's own module finds the bodies."""
    library = os.path.join(tmp, "bodies.so")
    cc.create_shared(library, paths, options=native.link_options())
    # TVM's loader fills the library's context (its workspace allocator): load it first,
    # then make its symbols global (the same handle; it stays loaded for the process)
    module = tvm.runtime.load_module(library)
    ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    objects = []
    for path in paths:
        with open(path, "rb") as f:
            objects.append(f.read())
    return SideObjectsExecutable(executable.mod, module, objects)


class SideObjectsExecutable(VMExecutable):
    """A Relax executable whose outlined bodies were built beside its module: it runs as
    any other (their library is loaded), and ``export_library`` links their objects in."""

    def __init__(self, mod, side_library, side_objects: list[bytes]):
        super().__init__(mod)
        self.side_library = side_library
        self.side_objects = side_objects

    def export_library(self, file_name, *, addons=None, **kwargs):
        with tempfile.TemporaryDirectory(prefix="tvm_rtask_export_") as tmp:
            paths = []
            for i, data in enumerate(self.side_objects):
                paths.append(os.path.join(tmp, f"bodies_{i}.o"))
                with open(paths[-1], "wb") as f:
                    f.write(data)
            return super().export_library(file_name, addons=[*(addons or []), *paths], **kwargs)
