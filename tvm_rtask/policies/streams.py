"""A multi-stream run simulated: Opara's baseline as the GPU would execute it.

TVM 0.27's Relax VM launches every kernel on one stream (and ``RewriteCUDAGraph`` captures
one stream), so Opara's streams cannot run through TVM's runtime; this module gives their
timing on the vDevice instead, beside the persistent-kernel plans.

Model: the host issues one launch per operator in Opara's launch order, each costing the
launch overhead of host time; a kernel starts when it is issued, when the previous kernel of
its stream has finished, and when its predecessors on other streams have finished (event
waits). Its thread blocks (rTasks of its fastest rKernel) then take the earliest free vEUs
(SMs), in launch order, as the hardware block scheduler does with concurrent kernels.
Operators without rKernels hold the whole device while they run.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..core.graph import RGraph
from ..core.vdevice import VDevice
from .cost import CostModel
from .opara import OparaPolicy


@dataclass
class StreamTiming:
    """Result of :func:`simulate_streams`."""

    total_us: float
    launches: int
    streams: int
    start_us: dict[str, float]
    end_us: dict[str, float]


def simulate_streams(graph: RGraph, vdevice: VDevice, cost: CostModel) -> StreamTiming:
    """Opara's stream allocation and launch order, one kernel launch per operator."""
    policy = OparaPolicy()
    stream_of = policy.streams(graph)
    launch = cost.launch_us(vdevice)
    free = [(0.0, v) for v in range(vdevice.num_veu)]  # heap of (time a vEU frees, vEU)
    stream_end: dict[int, float] = {}
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    host = 0.0
    for name in policy.launch_order(graph, vdevice, cost):
        op = graph.op(name)
        host += launch
        ready = max(
            [host, stream_end.get(stream_of[name], 0.0), *(end[p] for p in graph.preds(name))]
        )
        if op.supported and op.rkernels:
            kernel = cost.fastest(op, vdevice)
            # at its own width, as an ordinary kernel (kernels of other streams beside it
            # are not counted)
            d = cost.rtask_us_at(op, kernel, vdevice, kernel.num_rtasks)
            first, last = float("inf"), ready
            for _ in range(kernel.num_rtasks):
                t, v = heapq.heappop(free)
                s = max(t, ready)
                first, last = min(first, s), max(last, s + d)
                heapq.heappush(free, (s + d, v))
        else:  # the whole device: wait for every vEU, hold them all
            first = max(ready, max(t for t, _ in free))
            last = first + cost.ordinary_us(op, vdevice)
            free = [(last, v) for _, v in free]
            heapq.heapify(free)
        start[name], end[name] = first, last
        stream_end[stream_of[name]] = last
    total = max(end.values(), default=0.0)
    return StreamTiming(total, len(graph), len(set(stream_of.values())), start, end)
