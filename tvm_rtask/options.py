"""Options of the rTask pipeline: keyword arguments, PassContext ``rtask.*`` keys, defaults.

An explicit keyword wins over the PassContext config key of the same name (``rtask.policy``,
``rtask.num_veu``, ``rtask.cuda_threads``, ...), which wins over the default. Options are
resolved once into a frozen :class:`RTaskOptions`. Its fields are the target-independent
options; an option of one backend (``cuda_threads``, ``cpu_rules``, ...) is declared by that
backend, as a field of its ``TargetOptions`` (``tvm_rtask.backend``), and travels as given in
``RTaskOptions.target_options``: checked here against the declaration, parsed by the chosen
target's backend, refused by every other one.

Every option is declared once, with its default and a one-line help (:func:`option`): the
PassContext keys (:func:`config_types`) and the table of docs/options.md
(:func:`option_table_markdown`) are generated from the declarations of the core and of every
registered backend.
"""

from __future__ import annotations

import os
import re
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .errors import OptionError

BARRIERS = ("fine", "global", "counter")
FUSIONS = ("fuseops", "stitch", "none")
# "measured": every rKernel timed alone on the device present and the synchronisation
# benchmark (runtime.profiler, cached on disk), resolved by PlanRPrograms, which has the module
COST_MODELS = ("analytical", "measured")
# Options that travel outside PassContext config keys (a dict, an object, the backends' own).
_NOT_CONFIG = ("policy_options", "cost", "target_options")


def option(
    default: Any = MISSING,
    *,
    help: str,
    name: str | None = None,
    values: str | None = None,
    shown: str | None = None,
    choices: tuple | None = None,
    bounds: tuple[int, int | None] | None = None,
    default_factory: Any = MISSING,
) -> Any:
    """A dataclass field that is a user option, of :class:`RTaskOptions` or of a backend's
    ``TargetOptions``: its default, ``help`` (one line, markdown: a row of docs/options.md),
    ``name`` (the keyword, when it is not the field's name: CUDA's ``threads`` is
    ``cuda_threads``), ``choices`` or ``bounds`` (``(lo, hi)``, ``hi`` None for none) that a
    value is checked against (:func:`check_option_value`), and what the table shows as its
    type (``values``) and default (``shown``) when the annotation and default do not say."""
    metadata = {
        "help": help,
        "name": name,
        "values": values,
        "shown": shown,
        "choices": choices,
        "bounds": bounds,
    }
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def declared_options(cls) -> dict[str, Field]:
    """The user options dataclass ``cls`` declares (its fields made by :func:`option`), by
    keyword, in declaration order."""
    return {f.metadata.get("name") or f.name: f for f in fields(cls) if "help" in f.metadata}


def option_kind(f: Field) -> str:
    """The PassContext config type of an option ("int", "str", "bool"), from its annotation
    (``db``, ``str | bool | None``, is a "str": a path, or "none" for no records)."""
    annotation = str(f.type)
    if annotation.startswith("str"):
        return "str"
    return "bool" if "bool" in annotation else "int" if "int" in annotation else "str"


def check_option_value(name: str, f: Field, value) -> None:
    """OptionError unless ``value`` fits option ``name``'s declaration (its choices, its
    bounds, its type)."""
    kind, choices = option_kind(f), f.metadata.get("choices")
    if choices is not None:
        if isinstance(value, bool) or value not in choices:
            raise OptionError(f"{name} must be one of {choices}, not {value!r}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise OptionError(f"{name} must be True or False, not {value!r}")
    elif kind == "int":
        lo, hi = f.metadata.get("bounds") or (None, None)
        if _is_int(value) and (lo is None or value >= lo) and (hi is None or value <= hi):
            return
        if hi is not None:
            raise OptionError(f"{name} must be in {lo}..{hi}, not {value!r}")
        if lo == 1:
            raise OptionError(f"{name} must be a positive integer, not {value!r}")
        at_least = "" if lo is None else f" >= {lo}"
        raise OptionError(f"{name} must be an integer{at_least}, not {value!r}")
    elif not isinstance(value, str):
        raise OptionError(f"{name} must be a string, not {value!r}")


@dataclass(frozen=True)
class RTaskOptions:
    """The target-independent options, and the backends' own as given (``target_options``);
    docs/options.md shows what each changes (generated from these declarations)."""

    policy: str = option(
        "auto",
        values="`auto`, `wavefront`, `wavefront_global`, `ios`, `opara`, `opara_streams`, "
        "`sequential`",
        help="`auto`: whichever of sequential and wavefront the cost model puts first "
        '(`Plan.report()["policy_choice"]` says why); Rammer\'s wavefront packing (fine or '
        "global barriers between waves), IOS's DP stages, Opara's stream order, Opara's "
        "streams themselves (TVM's kernels on several CUDA streams, events between them), or "
        'one launch per operator ("RammerBase"); see [scheduling.md](scheduling.md)',
    )
    # None: the backend's default (its TargetOptions.CORE_DEFAULTS)
    barrier: str | None = option(
        None,
        choices=BARRIERS,
        help="step-array barriers between vEUs (`fine`), TVM's parallel barrier between waves "
        "(`global`, llvm only), or dependency counters (`counter`, CUDA only: one per "
        "operator; a vEU waits for its predecessors, not for every producer vEU)",
    )
    num_veu: int | None = option(
        None,
        bounds=(1, None),
        shown="the device's capacity (llvm: the worker threads allowed)",
        help="vEUs; more than can be resident at once (llvm: more than `TVM_NUM_THREADS`, or "
        "the core count) is a `CapacityError`",
    )
    rtasks_per_veu: int | None = option(
        None,
        bounds=(1, None),
        help="llvm: an operator is cut into up to `num_veu * rtasks_per_veu` rTasks; CUDA: one "
        "rTask per thread block of the source kernel, consecutive blocks grouped into one "
        "rTask where an operator has more than `rtasks_per_veu` blocks per vEU",
    )
    fusion: str = option(
        "fuseops",
        choices=FUSIONS,
        help="TVM's FuseOps kept from chaining independent branches, FusionStitching "
        "(memory-bound operators stitched vertically and side by side, chosen by an ILP; see "
        "[fusion.md](fusion.md)), or no fusion",
    )
    spin_timeout_ms: int = option(
        60_000,
        bounds=(1, None),
        help="bound of every barrier wait; on timeout the call raises (llvm; CUDA: see "
        "`check_status`) instead of hanging",
    )
    max_ops_per_program: int | None = option(
        None,
        bounds=(0, None),
        help="wavefront, wavefront_global, ios, opara: the most operators in one rProgram "
        "(bounds LLVM's time and, on llvm, the persistent function's parameter count on large "
        "models; CUDA packs workspaces and weights into arenas; 0: no limit)",
    )
    max_kernels_per_program: int | None = option(
        None,
        bounds=(0, None),
        help="the same policies: the most distinct kernels in one rProgram (bounds nvcc's "
        "time; 0: no limit)",
    )
    ios_merge: bool = option(
        True,
        help="`ios`: convolutions sharing an input are merged into one where IOS's DP chooses "
        "it ([scheduling.md](scheduling.md))",
    )
    ordinary_fallback: bool | None = option(
        None,
        shown='on with a measured cost model (`cost="measured"` or a calibrated one), off '
        "with the analytical one",
        help="an rProgram the cost model predicts slower than its operators as ordinary "
        "kernels is replaced by them, so the plan's estimate never exceeds ordinary launches "
        "(trustworthy as far as the cost model is calibrated)",
    )
    db: str | bool | None = option(
        None,
        values="path, `False`",
        shown="the shipped set",
        help="a `tvm-rtask tune` work directory: rKernels are made from its tuned schedules, "
        "several per operator ([tuning.md](tuning.md)). Unset: the record set shipped for "
        "the target's device (`x86_64-avx2` for llvm targets with AVX2, `h100`/`h200` for "
        "`sm_90` once they exist), used only for operators it has a record for; `False` "
        "(CLI `--db none`): no records, the rules everywhere",
    )
    nan_fill: bool = option(
        False,
        help="debug: every float output of every kernel and every workspace filled with NaN "
        "before each call, so a read of memory no kernel wrote shows as NaN instead of "
        'passing by luck ([findings.md](findings.md), "The NaN fill")',
    )
    trace: bool = option(
        False,
        help="each vEU records when each rTask and each wait started and ended, and each "
        "rProgram call its span (`runtime/trace.py`, `tvm-rtask trace`); the untraced build "
        "is unchanged. llvm: CLOCK_MONOTONIC; CUDA: `%globaltimer`, each rTask followed by "
        "`__syncthreads`",
    )
    policy_options: dict = option(
        default_factory=dict,
        values="dict",
        shown="none",
        help="the policy's own options (ios: `r`, `s`, ...), also taken as keywords of their "
        "own, e.g. `r=2, s=4` for `ios`; `Plan.policy_options` shows what it used, and an "
        "option no policy field knows is an error",
    )
    cost: Any = option(
        "analytical",
        values="`analytical`, `measured` or a `tvm_rtask.policies.CostModel`",
        help='the cost model the policy plans with; `"measured"`: every rKernel and the '
        "barrier and launch costs timed on the device present, cached on disk (`tvm-rtask "
        "profile`, [scheduling.md](scheduling.md))",
    )
    # the options a backend declares (``TargetOptions``), as given, by keyword: the chosen
    # target's backend parses them (``Backend.options_for``) and refuses another target's
    target_options: dict = field(default_factory=dict)

    def validate(self) -> RTaskOptions:
        from .policies import policy_names
        from .policies.cost import CostModel

        if self.policy not in policy_names():
            raise OptionError(
                f"unknown policy {self.policy!r}; choose one of {', '.join(policy_names())}"
            )
        if self.barrier is not None and self.barrier not in BARRIERS:
            raise OptionError(f"barrier must be one of {BARRIERS}, not {self.barrier!r}")
        if self.fusion not in FUSIONS:
            raise OptionError(f"fusion must be one of {FUSIONS}, not {self.fusion!r}")
        for key in ("num_veu", "rtasks_per_veu"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value < 1):
                raise OptionError(f"{key} must be a positive integer, not {value!r}")
        for key in ("max_kernels_per_program", "max_ops_per_program"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value < 0):
                raise OptionError(f"{key} must be >= 0 (0: no limit), not {value!r}")
        for key in ("ios_merge", "ordinary_fallback", "nan_fill", "trace"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, bool):
                raise OptionError(f"{key} must be True or False, not {value!r}")
        if self.db is not None and self.db is not False and not isinstance(self.db, str):
            raise OptionError(
                f"db must be a directory path (str), False or 'none' (no records), or unset "
                f"(the shipped record set of the target), not {self.db!r}"
            )
        if not _is_int(self.spin_timeout_ms) or self.spin_timeout_ms < 1:
            raise OptionError(f"spin_timeout_ms must be >= 1, not {self.spin_timeout_ms!r}")
        if not isinstance(self.cost, CostModel) and self.cost not in COST_MODELS:
            raise OptionError(
                f"cost must be one of {COST_MODELS} or a tvm_rtask.policies.CostModel "
                f"(e.g. runtime.measured_cost_model(...)), not {self.cost!r}"
            )
        _check_policy_options(self.policy, self.policy_options)
        _check_target_options(self.target_options)
        return self

    def falls_back_to_ordinary(self) -> bool:
        """Whether ``ordinary_fallback`` applies: by default only with a measured cost model,
        whose predictions can be trusted to rank an rProgram against ordinary kernels."""
        if self.ordinary_fallback is not None:
            return self.ordinary_fallback
        from .policies.cost import CalibratedCostModel

        return self.cost == "measured" or isinstance(self.cost, CalibratedCostModel)

    def cost_model(self):
        """The cost model object the planner uses (``"measured"`` needs the module's
        rKernels: ``PlanRPrograms`` resolves it with ``runtime.profiler``)."""
        from .policies.cost import AnalyticalCostModel

        if self.cost == "measured":
            raise OptionError(
                "cost='measured' is measured from the module's rKernels: PlanRPrograms "
                "resolves it (runtime.profiler.measured_model_for)"
            )
        return AnalyticalCostModel() if self.cost == "analytical" else self.cost

    def to_dict(self) -> dict:
        """Plain data (the cost model by name), as stored in a Plan's JSON."""
        d = asdict(replace(self, cost="analytical"))
        d["cost"] = self.cost if isinstance(self.cost, str) else type(self.cost).__name__
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RTaskOptions:
        """The options a Plan was made with (a measured cost model comes back as its name,
        which only names what planned it: planning is over by then).

        Keys it does not know are ignored, except a backend's option at the top level (plans
        made before ``target_options`` held them, or a key added by hand), which goes to
        ``target_options`` unless it is None (unset)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        owned = backend_options()
        flat = {k: v for k, v in d.items() if k in owned and k not in known and v is not None}
        values["target_options"] = {**(values.get("target_options") or {}), **flat}
        return cls(**values)


#: The target-independent options, by keyword (every field of RTaskOptions but
#: ``target_options``).
CORE_OPTIONS: dict[str, Field] = declared_options(RTaskOptions)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_policy_options(policy: str, options: dict) -> None:
    from .policies.registry import get_policy

    if not isinstance(options, dict):
        raise OptionError(f"policy_options must be a dict, not {options!r}")
    get_policy(policy, **options)  # raises OptionError naming an option the policy lacks


def _check_target_options(options: dict) -> None:
    """Each backend option given must be one a registered backend declares, with a value
    its declaration takes (the chosen target's backend checks that the option is its own)."""
    if not isinstance(options, dict):
        raise OptionError(f"target_options must be a dict, not {options!r}")
    owned = backend_options()
    for name, value in options.items():
        if name not in owned:
            raise OptionError(f"unknown option {name!r}; {_known_names(owned)}")
        errors = []
        for _, f in owned[name]:  # fits one declaration (several backends may declare it)
            try:
                check_option_value(name, f, value)
                break
            except OptionError as err:
                errors.append(err)
        else:
            raise errors[0]


# Backend classes whose ``Options`` declare options of tvm-rtask, in registration order
# (the built-in ones first). ``tvm_rtask.backend.registry`` adds them (it imports this module,
# not the other way round), and whoever must know of a new one (the PassContext keys,
# runtime/config.py) listens with :func:`on_backend_added`.
_BACKENDS: list = []
_LISTENERS: list = []


def add_backend(backend) -> None:
    """Declare ``backend``'s options (its ``Options`` class) as options of tvm-rtask."""
    if backend not in _BACKENDS:
        _BACKENDS.append(backend)
        for listener in list(_LISTENERS):
            listener()


def on_backend_added(listener) -> None:
    """Call ``listener()`` whenever :func:`add_backend` declares a new backend."""
    _LISTENERS.append(listener)


def registered_backends() -> list:
    """The backend classes whose options are options of tvm-rtask, built-in ones first."""
    return list(_BACKENDS)


def backend_options() -> dict[str, list[tuple[Any, Field]]]:
    """Every option a registered backend declares, by keyword: ``[(backend class, field)]``
    (several backends may declare one option)."""
    owned: dict[str, list[tuple[Any, Field]]] = {}
    for backend in registered_backends():
        for name, f in declared_options(backend.Options).items():
            owned.setdefault(name, []).append((backend, f))
    return owned


def _known_names(owned: dict, backend=None) -> str:
    """The valid option names, for an error: the core's and ``backend``'s (a Backend or its
    class), or every registered backend's when it is None."""
    core = sorted(CORE_OPTIONS)
    if backend is not None:
        own = sorted(declared_options(backend.Options))
        return f"known options: {core}; options of {backend.label} targets: {own or 'none'}"
    labels: dict[str, list[str]] = {}
    for name, owners in owned.items():
        for b, _ in owners:
            labels.setdefault(b.label, []).append(name)
    per_target = "; ".join(f"{label}: {sorted(names)}" for label, names in labels.items())
    return f"known options: {core}; options of one target ({per_target})"


def config_types() -> dict[str, str]:
    """``rtask.<name>`` -> TVM config type ("int", "str", "bool"): every option declared by
    :class:`RTaskOptions` and by the registered backends, as declared."""
    types = {f"rtask.{n}": option_kind(f) for n, f in CORE_OPTIONS.items() if n not in _NOT_CONFIG}
    for name, owners in backend_options().items():
        types.setdefault(f"rtask.{name}", option_kind(owners[0][1]))
    return types


def resolve_options(explicit: dict, pass_config=None, backend=None) -> RTaskOptions:
    """Merge explicit keywords, ``rtask.*`` PassContext keys and defaults; reject unknowns.

    A keyword that a registered backend declares (``cuda_threads``, ``cpu_rules``, ...) goes,
    as given, to ``target_options``, checked against the declaration; the target's backend
    refuses another target's (``Backend.check_options``). A keyword that is neither but an
    option of the chosen policy (ios's ``r``, ``s``, ...) goes to ``policy_options``.
    ``backend`` (a Backend or its class), when known, narrows the names an unknown option's
    error lists to the core's and that backend's.
    """
    core = set(CORE_OPTIONS)
    owned = backend_options()
    values: dict[str, Any] = {}
    given: dict[str, Any] = {}
    config = pass_config if pass_config is not None else {}
    for name in sorted((core - set(_NOT_CONFIG)) | set(owned)):
        key = f"rtask.{name}"
        if key in config:
            value = config[key]
            value = value if isinstance(value, (bool, type(None))) else _plain(value)
            (values if name in core else given)[name] = value
    for key, value in explicit.items():
        if value is not None and key in core:
            values[key] = value
        elif value is not None and key in owned:
            given[key] = value
    extra = {k: v for k, v in explicit.items() if k not in core | set(owned) and v is not None}
    if extra:
        policy = values.get("policy", RTaskOptions.policy)
        accepted = _policy_option_names(policy)
        unknown = sorted(set(extra) - accepted)
        if unknown:
            raise OptionError(
                f"unknown option(s) {unknown}; {_known_names(owned, backend)}; "
                f"options of policy {policy!r}: {sorted(accepted) or 'none'}"
            )
        values["policy_options"] = {**values.get("policy_options", {}), **extra}
    if isinstance(values.get("db"), os.PathLike):  # a pathlib.Path names a directory too
        values["db"] = os.fspath(values["db"])
    return RTaskOptions(**values, target_options=given).validate()


def _policy_option_names(policy: str) -> set[str]:
    from .policies.limits import LIMIT_OPTIONS
    from .policies.registry import get_policy

    try:
        return set(get_policy(policy).OPTIONS) - set(LIMIT_OPTIONS)
    except OptionError:
        return set()


def _plain(value):
    """FFI strings and integers from a PassContext turned into Python values."""
    if isinstance(value, str):
        return str(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)


# -- docs/options.md's table, generated from the declarations --------------------------------
OPTIONS_DOC = Path(__file__).resolve().parents[1] / "docs" / "options.md"
TABLE_BEGIN = (
    "<!-- options: generated by `python -m tvm_rtask.cli.options_doc` "
    "from the declarations (tvm_rtask/options.py and each backend's TargetOptions) -->"
)
TABLE_END = "<!-- /options -->"


def option_table_markdown() -> str:
    """The table of every option: the target-independent ones (:class:`RTaskOptions`), then
    each registered backend's (its ``TargetOptions``), with type, default, target and help.
    A target-independent option a backend defaults (``CORE_DEFAULTS``) shows each default."""
    backends = registered_backends()
    rows = ["| option | type | default | target | help |", "|---|---|---|---|---|"]
    for name, f in CORE_OPTIONS.items():
        per_target = [
            f"{b.label}: `{b.Options.CORE_DEFAULTS[f.name]}`"
            for b in backends
            if f.name in b.Options.CORE_DEFAULTS
        ]
        rows.append(_table_row(name, f, "any", per_target))
    for backend in backends:
        for name, f in declared_options(backend.Options).items():
            rows.append(_table_row(name, f, backend.label, []))
    return "\n".join(rows) + "\n"


def _table_row(name: str, f: Field, target: str, per_target: list[str]) -> str:
    meta, kind = f.metadata, option_kind(f)
    if meta["values"]:
        values = meta["values"]
    elif meta["choices"]:
        values = ", ".join(f"`{c}`" for c in meta["choices"])
    elif meta["bounds"] and kind == "int":
        lo, hi = meta["bounds"]
        values = f"int, {lo}..{hi}" if hi is not None else f"int >= {lo}"
    else:
        values = kind
    default = [meta["shown"]] if meta["shown"] else []
    if not default and not per_target:
        default = ["unset" if f.default is None else f"`{f.default}`"]
    cells = [f"`{name}`", values, "; ".join(default + per_target), target, meta["help"]]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def option_table_block(text: str) -> str | None:
    """The generated table in ``text`` (docs/options.md), between the markers; None if the
    markers are missing."""
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        return None
    return text[begin + len(TABLE_BEGIN) : end].strip("\n") + "\n"


def update_option_table(path: str | Path = OPTIONS_DOC) -> bool:
    """Write :func:`option_table_markdown` between the markers of ``path``; whether it
    changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if option_table_block(text) is None:
        raise OptionError(f"{path} has no generated options block ({TABLE_END!r} missing)")
    begin = text.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    new = text[:begin] + "\n\n" + option_table_markdown() + "\n" + text[text.index(TABLE_END) :]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


# -- options as text (the command lines' --option / --pass-config, bench ab's --*-option) ------
def parse_value(text: str) -> Any:
    """``2`` -> 2, ``true`` -> True, anything else stays a string."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_key_values(items: list[str] | None, flag: str) -> dict[str, Any]:
    """``["a=1", "b=fine"]`` -> ``{"a": 1, "b": "fine"}``; an item without ``=`` is refused
    naming ``flag``."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise OptionError(f"{flag} expects name=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = parse_value(value.strip())
    return out
