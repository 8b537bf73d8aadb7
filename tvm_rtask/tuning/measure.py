"""Builders and runners for MetaSchedule: local processes, or an RPC tracker's devices.

TVM's ``default_build`` imports ``tvm.s_tir.tensor_intrin`` in every builder process, and
``LocalBuilder`` starts fresh processes for each batch; on a 2-core machine two such imports
(~20 s each) exceed the 30 s build timeout and every candidate fails. :func:`build` is the
same build without that import: a schedule that tensorized already carries the intrinsic's
body, so the builder does not need the registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionError


def build(mod, target, _params):
    """MetaSchedule's default build, minus the tensor-intrinsic import (see module doc)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


@dataclass(frozen=True)
class RPCSettings:
    """Where measurements run: a TVM RPC tracker and the key its servers registered with.

    Servers on measurement machines connect to the tracker
    (``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY``); MetaSchedule's
    ``RPCRunner`` asks the tracker for a free one per candidate.
    """

    host: str
    port: int
    key: str
    session_timeout_s: int = 60

    @classmethod
    def parse(cls, text: str) -> RPCSettings:
        """``HOST:PORT:KEY`` (the form of ``--rpc``)."""
        parts = text.rsplit(":", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not parts[0] or not parts[2]:
            raise OptionError(
                f"RPC tracker {text!r} must be HOST:PORT:KEY, e.g. 127.0.0.1:9190:cpu"
            )
        return cls(parts[0], int(parts[1]), parts[2])


def make_builder(num_workers: int, timeout_s: float = 60.0):
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    return LocalBuilder(max_workers=num_workers, timeout_sec=timeout_s, f_build=build)


def make_runner(rpc: RPCSettings | None = None, timeout_s: float = 60.0, repeat: int = 3):
    """A ``LocalRunner``, or an ``RPCRunner`` through ``rpc``'s tracker."""
    from tvm.s_tir.meta_schedule.runner import (
        EvaluatorConfig,
        LocalRunner,
        RPCConfig,
        RPCRunner,
    )

    evaluator = EvaluatorConfig(
        number=3, repeat=repeat, min_repeat_ms=0, enable_cpu_cache_flush=False
    )
    if rpc is None:
        return LocalRunner(timeout_sec=timeout_s, evaluator_config=evaluator)
    config = RPCConfig(
        tracker_host=rpc.host,
        tracker_port=rpc.port,
        tracker_key=rpc.key,
        session_timeout_sec=rpc.session_timeout_s,
    )
    return RPCRunner(rpc_config=config, evaluator_config=evaluator, max_workers=1)
