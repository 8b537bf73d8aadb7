"""Opara as Opara runs it: one ordinary kernel per operator, launched on Opara's streams in
its launch order, events where a result crosses streams, the whole run captured into one
CUDA graph (``runtime/streams.StreamGraph``).

The ``opara`` policy takes only Opara's launch order, as the rTask order of persistent
kernels; this one keeps TVM's own kernels and changes nothing but the streams and the order,
so that beside TVM + CUDA graph (the same kernels on one stream) it measures what streams
alone give. The plan's steps are ordinary calls in the launch order; ``Plan.streams`` holds
the stream allocation (``OparaPolicy.streams``), and lowering puts the host's stream calls
around the launches (``relax_passes/launch_on_streams``). On the CPU there is one stream:
the calls do nothing and the operators run one after the other as ordinary kernels, slower
than the rKernels (light Inception v1, 2 threads: 74.8 ms against sequential's 40.3): it is
a GPU baseline.
"""

from __future__ import annotations

from ..core.graph import RGraph
from ..core.plan import OrdinaryCall
from ..core.rprogram import RProgram
from ..core.vdevice import VDevice
from .cost import CostModel
from .opara import OparaPolicy
from .policy import Policy
from .streams import simulate_streams


class OparaStreamsPolicy(Policy):
    """Every operator an ordinary launch, in Opara's launch order, on Opara's streams."""

    name = "opara_streams"

    def plan(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel
    ) -> list[RProgram | OrdinaryCall]:
        return [OrdinaryCall(name) for name in OparaPolicy().launch_order(graph, vdevice, cost)]

    def launch_streams(self, graph: RGraph) -> dict[str, int]:
        return OparaPolicy.streams(graph)

    def estimate_us(
        self, graph: RGraph, vdevice: VDevice, cost: CostModel, steps: list
    ) -> float | None:
        del steps
        return simulate_streams(graph, vdevice, cost).total_us
