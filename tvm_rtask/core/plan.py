"""Plan: the whole model as a sequence of rPrograms and ordinary kernel launches.

It is what a policy produces and what lowering consumes; it is plain data (JSON round trip)
so a plan can be inspected, stored with a benchmark, or lowered later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import PlanError
from .counters import CounterWait, check_counter_scripts, counter_scripts
from .graph import RGraph
from .rprogram import RProgram
from .vdevice import VDevice


@dataclass(frozen=True)
class OrdinaryCall:
    """An operator that stays a normal kernel launch between rPrograms."""

    op: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "ordinary", "op": self.op}


Step = RProgram | OrdinaryCall

# What rPrograms synchronise with: their barrier entries (step arrays) or dependency
# counters derived from the placement (core/counters.py)
SYNC_MODES = ("steps", "counters")


@dataclass
class Plan:
    """rPrograms and ordinary calls in launch order, with the policy's time estimates (us)."""

    graph: RGraph
    vdevice: VDevice
    steps: list[Step]
    policy: str = ""
    estimated_us: float = 0.0
    ideal_us: float = 0.0
    # The options it was planned with (tvm_rtask.options.RTaskOptions.to_dict()), and the
    # policy's own options as the policy saw them (defaults filled in).
    options: dict[str, Any] = field(default_factory=dict)
    policy_options: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)  # Target.export() it was planned for
    # what the rPrograms synchronise with: "steps" (their barrier entries) or "counters"
    # (dependency counters derived from the placement; the programs then hold no barriers)
    sync: str = "steps"
    # CUDA, after build with nvcc found: ptxas -v of each persistent kernel (registers per
    # thread, shared memory bytes) and the co-resident blocks they allow. Not serialized.
    kernel_usage: dict[str, dict[str, int]] = field(default_factory=dict)
    # The fallbacks planning took ({"kind", "subject", "reason"}, tvm_rtask.fallbacks): a
    # schedule rule skipped, an operator kept ordinary, a layout kept, ...; api.build adds
    # the build's own to the Plan it returns (they happen after the JSON is in the module).
    fallbacks: list[dict[str, str]] = field(default_factory=list)
    # policy "auto": the candidates' estimates and the one chosen (``policy`` names it)
    choice: dict[str, Any] = field(default_factory=dict)
    # the stream of each operator where the steps launch on several streams (policy
    # "opara_streams", core/streams.py); empty: every step on the caller's stream
    streams: dict[str, int] = field(default_factory=dict)

    def programs(self) -> list[RProgram]:
        return [s for s in self.steps if isinstance(s, RProgram)]

    def ordinary_calls(self) -> list[OrdinaryCall]:
        return [s for s in self.steps if isinstance(s, OrdinaryCall)]

    def step_of(self) -> dict[str, int]:
        """Index of the step that runs each operator."""
        where: dict[str, int] = {}
        for s, step in enumerate(self.steps):
            for op in _step_ops(step):
                if op in where:
                    raise PlanError(f"operator {op!r} appears in step {where[op]} and step {s}")
                where[op] = s
        return where

    def validate(self, sync: str = "steps") -> None:
        """Raise PlanError (or Deadlock/CapacityError) naming the first inconsistency.

        ``sync``: what the rPrograms will synchronise with, ``"steps"`` (their barrier
        entries, as the CPU runs them) or ``"counters"`` (dependency counters derived from
        the placement, as CUDA runs them by default): the model that runs is the one checked.
        """
        if sync not in SYNC_MODES:
            raise PlanError(f"sync must be 'steps' or 'counters', not {sync!r}")
        where = self.step_of()
        for op in where:
            if op not in self.graph:
                raise PlanError(f"the plan runs operator {op!r}, which is not in the graph")
        for rop in self.graph:
            s = where.get(rop.name)
            if s is None:
                raise PlanError(f"operator {rop.name!r} is in no step of the plan")
            if not rop.supported and not isinstance(self.steps[s], OrdinaryCall):
                raise PlanError(
                    f"operator {rop.name!r} is unsupported ({rop.reason or 'no reason given'}) "
                    f"but step {s} runs it inside an rProgram; it must be an ordinary call"
                )
            for p in self.graph.preds(rop.name):
                sp = where[p]
                if sp > s or (sp == s and isinstance(self.steps[s], OrdinaryCall)):
                    raise PlanError(
                        f"operator {rop.name!r} (step {s}) reads the output of {p!r} "
                        f"(step {sp}), which does not run before it"
                    )
        for prog in self.programs():
            prog.validate(self.graph, self.vdevice.capacity, barriers=sync == "steps")
            if sync == "counters":
                check_counter_scripts(prog, self.graph, counter_scripts(prog, self.graph))

    def waits_in(self, program: RProgram) -> int:
        """Synchronisation points of ``program`` as it runs: its barrier rTasks, or with
        dependency counters its counter waits (the program then holds no barriers)."""
        if self.sync == "counters":
            return sum(
                isinstance(item, CounterWait)
                for script in counter_scripts(program, self.graph)
                for item in script
            )
        return program.num_barriers

    def report(self) -> dict[str, Any]:
        """Counts and estimates a user or a benchmark wants to see at a glance."""
        progs = self.programs()
        ordinary = [c.op for c in self.ordinary_calls()]
        # Tuple plumbing (packing outputs, taking an element) is no kernel: not counted as
        # an operator or a launch, still listed among the ordinary ops.
        plumbing = {op.name for op in self.graph.ops if op.pattern == "tuple" and not op.supported}
        side_by_side = 0
        for p in progs:
            per_wave: dict[int, set[str]] = {}
            for t in p.tasks():
                per_wave.setdefault(t.wave, set()).add(t.op)
            side_by_side = max([side_by_side, *map(len, per_wave.values())])
        return {
            "device": self.vdevice.spec.name,
            "policy": self.policy,
            "operators": len(self.graph) - len(plumbing),
            "rtasks": sum(p.num_tasks for p in progs),
            "rprograms": len(progs),
            "kernel_launches": len(progs) + sum(op not in plumbing for op in ordinary),
            "sync": self.sync,
            "barriers": sum(self.waits_in(p) for p in progs),
            "veus": self.vdevice.num_veu,
            "capacity": self.vdevice.capacity,
            "estimated_us": self.estimated_us,
            "ideal_us": self.ideal_us,
            "ordinary_ops": len(ordinary),
            "ordinary_op_names": ordinary,
            "max_ops_per_program": max((len(p.ops()) for p in progs), default=0),
            "max_ops_side_by_side": side_by_side,
            "ptxas": dict(self.kernel_usage),
            "policy_choice": dict(self.choice),
            "streams": len(set(self.streams.values())) or 1,
            "fallbacks": [dict(note) for note in self.fallbacks],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph.to_dict(),
            "vdevice": self.vdevice.to_dict(),
            "steps": [
                {"kind": "rprogram", **s.to_dict()} if isinstance(s, RProgram) else s.to_dict()
                for s in self.steps
            ],
            "policy": self.policy,
            "estimated_us": self.estimated_us,
            "ideal_us": self.ideal_us,
            "options": _jsonable(self.options),
            "policy_options": _jsonable(self.policy_options),
            "target": _jsonable(self.target),
            "sync": self.sync,
            "fallbacks": [dict(note) for note in self.fallbacks],
            "choice": _jsonable(self.choice),
            "streams": dict(self.streams),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        steps: list[Step] = []
        sync = d.get("sync", "steps")
        for s in d["steps"]:
            if s["kind"] == "ordinary":
                steps.append(OrdinaryCall(s["op"]))
            elif s["kind"] == "rprogram":
                steps.append(RProgram.from_dict(s, clocks=sync == "steps"))
            else:
                raise PlanError(f"unknown plan step kind {s['kind']!r}")
        return cls(
            graph=RGraph.from_dict(d["graph"]),
            vdevice=VDevice.from_dict(d["vdevice"]),
            steps=steps,
            policy=d.get("policy", ""),
            estimated_us=d.get("estimated_us", 0.0),
            ideal_us=d.get("ideal_us", 0.0),
            options=dict(d.get("options", {})),
            policy_options=dict(d.get("policy_options", {})),
            target=dict(d.get("target", {})),
            sync=sync,
            fallbacks=[dict(note) for note in d.get("fallbacks", [])],  # absent before them
            choice=dict(d.get("choice", {})),
            streams={k: int(v) for k, v in d.get("streams", {}).items()},
        )

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, s: str) -> Plan:
        """The plan written as ``s`` (:meth:`to_json`)."""
        return cls.from_dict(json.loads(s))


def _step_ops(step: Step) -> list[str]:
    return [step.op] if isinstance(step, OrdinaryCall) else step.ops()


def _jsonable(x: Any) -> Any:
    """Options may hold objects (a cost model); JSON keeps their repr instead of failing."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return repr(x)
