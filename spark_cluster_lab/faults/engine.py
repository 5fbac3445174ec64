"""Faults of the running vLLM. `engine-hang` freezes what a rank frozen in a collective freezes:

- the real vLLM: its rank processes on the node are stopped (SIGSTOP), `VLLM::Worker*` as vLLM
  titles them, or `VLLM::EngineCore` where the model runs in the engine's own process (TP=1);
- the emulator: the node's state says so (node_memory.hang_flag): the steps of an engine on the node
  stop (vllm_scheduler), and a headless node's ranks stop answering its head (vllm_mp_head).
Either way /health stays 200 and vLLM's gauges stay where the last step left them. `lab heal`
continues the stopped processes.
"""

from __future__ import annotations

from spark_cluster_lab.faults.base import Fault, until_healed

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

    from spark_cluster_lab.faults.live import LiveNode

# vLLM's process titles (setproctitle): a rank of the mp executor, and the engine that runs the
# model itself with one GPU. The brackets keep pgrep from matching a command line that names them.
RANK_TITLES = ("[V]LLM::Worker", "[V]LLM::EngineCore")


def _hang_now(state: dict[str, Any]) -> None:
    import time

    state["engine_hang_at"] = time.time()  # engines started before this hang (vllm_emulator)


def _freeze(node: LiveNode) -> dict[str, Any]:
    for title in RANK_TITLES:
        pids = node.run(["pgrep", "-f", title]).stdout.split()
        if pids:
            node.run(["kill", "-STOP", *pids])
            return {"frozen": f"{title.replace('[V]', 'V')}* stopped (pid {', '.join(pids)})"}
    return {"frozen": "the emulator's steps stop"}


def _thaw(node: LiveNode, state: dict[str, Any]) -> None:
    for title in RANK_TITLES:
        node.run(["pkill", "-CONT", "-f", title])


ENGINE_HANG = Fault(
    "engine-hang",
    summary="the running vLLM's ranks freeze: no step returns, its process and /health stay up",
    said="{node}: the running vLLM makes no more steps ({frozen}); its process and /health stay up",
    apply=_hang_now,
    live=_freeze,
    undo=_thaw,
    in_force=until_healed,  # a restarted engine is not hung, but the node keeps the fault until `lab heal`
)

FAULTS = (ENGINE_HANG,)
