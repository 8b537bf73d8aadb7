"""Opara: operator parallelism through streams and a resource-aware launch order (Chen et al.,
"Opara: Exploiting Operator Parallelism for Expediting DNN Inference on GPUs", IEEE
Transactions on Computers, 2024; arXiv:2312.10351, section 3).

* **Stream allocation** (Opara's Algorithm 1): operators in topological order; an operator
  takes the stream of a predecessor when it is that predecessor's first successor, else a
  new stream. A stream is therefore a chain of data-dependent operators.
* **Launch order** (Opara's Algorithm 2): among the operators whose predecessors are all
  launched, alternate between compute-bound and memory-bound ones, each time taking the one
  with the smallest resource demand, so that a small kernel is not stuck behind a large one
  and kernels that stress different units overlap. Operators are classified by their TVM
  operator pattern kind (``ROperator.pattern``): ``out_ewise_fusable`` (convolution,
  matmul) and ``opaque`` are compute-bound; ``elemwise``, ``broadcast``, ``injective`` and
  ``reduce`` are memory-bound. The resource demand of an operator is what its rKernel asks
  of the device: rTasks x threads per rTask (thread blocks x threads on CUDA), ties broken
  by its work (rTasks x time per rTask), then by graph order.

Mapping onto persistent kernels: a persistent kernel has no streams; its vEUs are the
hardware the streams would share. Because a stream only ever follows data dependencies, the
order it imposes is already implied by the barriers, so streams add no constraint to an
rProgram; what Opara decides there is the *launch order*. Operators are appended in that
order, each rTask to the vEU where it starts earliest (what a GPU's block scheduler does
with the kernels of concurrent streams), waiting with fine barriers for its predecessors.
All operators between two ordinary calls form one rProgram (Opara captures the whole model
in one CUDA graph). The ``wave`` of an operator's rTasks is a phase that grows along the
launch order and exceeds every predecessor's, so a global-barrier lowering stays correct.
:meth:`OparaPolicy.streams` gives the stream allocation itself, for a multi-stream
baseline where a runtime can launch on streams.
"""

from __future__ import annotations

import heapq

from ..core.graph import RGraph, ROperator
from ..core.plan import OrdinaryCall
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from .builder import ProgramBuilder
from .cost import CostModel
from .limits import LIMIT_OPTIONS, ProgramLimit, check_limit_options
from .policy import Policy

COMPUTE_PATTERNS = frozenset({"out_ewise_fusable", "opaque"})
MEMORY_PATTERNS = frozenset({"elemwise", "broadcast", "injective", "reduce", "tuple"})


def is_compute_bound(op: ROperator) -> bool:
    """Compute-bound by TVM's operator pattern kind (see the module docstring)."""
    return op.pattern in COMPUTE_PATTERNS


class OparaPolicy(Policy):
    """Opara's launch order as the rTask order of persistent kernels."""

    name = "opara"
    # An operator that would push an rProgram past a limit (policies/limits.py) starts a new one.
    OPTIONS = dict(LIMIT_OPTIONS)

    def __init__(self, **options) -> None:
        super().__init__(**options)
        check_limit_options(self.name, self.options)

    @staticmethod
    def streams(graph: RGraph) -> dict[str, int]:
        """Opara's stream allocation: a predecessor's stream passes to its first successor."""
        stream: dict[str, int] = {}
        count = 0
        for op in graph:
            for p in graph.preds(op.name):
                if graph.succs(p)[0] == op.name:
                    stream[op.name] = stream[p]
                    break
            else:
                stream[op.name] = count
                count += 1
        return stream

    @staticmethod
    def demand(op: ROperator, vdevice: VDevice, cost: CostModel) -> tuple[float, float]:
        """Resource demand of an operator's fastest rKernel: (rTasks x threads, work)."""
        if not op.rkernels:
            return (float(vdevice.num_veu), cost.ordinary_us(op, vdevice) * vdevice.num_veu)
        k = cost.fastest(op, vdevice)
        return (float(k.num_rtasks * k.threads), cost.work_us(op, k, vdevice))

    def launch_order(self, graph: RGraph, vdevice: VDevice, cost: CostModel) -> list[str]:
        """Opara's resource-aware launch order (a topological order of all operators)."""
        missing = {op.name: len(graph.preds(op.name)) for op in graph}
        queues: dict[bool, list[tuple[float, float, int, str]]] = {True: [], False: []}

        def ready(name: str) -> None:
            op = graph.op(name)
            key = (*self.demand(op, vdevice, cost), graph.index(name), name)
            heapq.heappush(queues[is_compute_bound(op)], key)

        for op in graph:
            if not missing[op.name]:
                ready(op.name)
        order: list[str] = []
        compute = True  # start with a compute-bound operator when one is ready
        while queues[True] or queues[False]:
            if not queues[compute]:
                compute = not compute
            name = heapq.heappop(queues[compute])[-1]
            order.append(name)
            compute = not compute
            for s in graph.succs(name):
                missing[s] -= 1
                if not missing[s]:
                    ready(s)
        return order

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        steps: list[RProgram | OrdinaryCall] = []
        cur = ProgramBuilder(graph, vdevice, cost, "rprogram_0", self.sync)
        phase: dict[str, int] = {}
        last = 0
        limit = ProgramLimit(graph, self.options)
        for name in self.launch_order(graph, vdevice, cost):
            op = graph.op(name)
            if not op.supported or limit.would_exceed([name]):
                # launch order is topological: ending cur here cuts no dependence backwards
                if not cur.is_empty():
                    steps.append(cur.program)
                if not op.supported:
                    steps.append(OrdinaryCall(name))
                cur = ProgramBuilder(graph, vdevice, cost, f"rprogram_{len(steps)}", self.sync)
                phase.clear()
                last = 0
                limit.reset()
                if not op.supported:
                    continue
            limit.add([name])
            p = max([last, *(phase[q] + 1 for q in graph.preds(name) if q in phase)])
            phase[name] = last = p
            cur.place_op(p, name, cost.fastest(op, vdevice))
        if not cur.is_empty():
            steps.append(cur.program)
        return steps
