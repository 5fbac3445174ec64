"""Faults of the running vLLM. The emulator reads them from its node's state: `engine-hang` through
node_memory.hang_flag, which vllm_scheduler's pacing asks before each token.
"""

from __future__ import annotations

from spark_cluster_lab.faults.base import Fault, until_healed

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any


def _hang_now(state: dict[str, Any]) -> None:
    import time

    state["engine_hang_at"] = time.time()  # engines started before this hang (vllm_emulator)


ENGINE_HANG = Fault(
    "engine-hang",
    summary="the running vLLM makes no more tokens, its process and /health up; one started later is not hung",
    said="{node}: the running vLLM makes no more tokens; its process and /health stay up",
    apply=_hang_now,
    in_force=until_healed,  # a restarted engine is not hung, but the node keeps the fault until `lab heal`
)

FAULTS = (ENGINE_HANG,)
