"""The CPU rKernel record and its chunk annotation, shared by the default and the tuned
rKernel makers (and read by the dispatcher)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

CHUNK_ANNOTATION = "rtask.chunk"


@dataclass
class CPURKernel:
    """A scheduled PrimFunc whose annotated chunk loop enumerates its rTasks."""

    func: tirx.PrimFunc
    num_rtasks: int
