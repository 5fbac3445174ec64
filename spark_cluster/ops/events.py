"""What `up` reports as it goes: one frozen record per kind of event, in the order the
pipeline emits them. The pipeline builds them; the view (human and `--json`) dispatches on
their type. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_cluster.core.serve_plan import ServePlan
    from spark_cluster.ops.follow import Progress
    from spark_cluster.ops.preflight import Report
    from spark_cluster.ops.ray_cluster import RayState, UpResult


@dataclass(frozen=True)
class Stage:
    """A stage begins: `[number] name: detail`."""

    number: int
    name: str
    detail: str


@dataclass(frozen=True)
class PullLine:
    """A line of `docker pull` on a node that lacked the image."""

    node: str
    line: str


@dataclass(frozen=True)
class Pulled:
    """The image is on every node that lacked it: seconds per node."""

    image: str
    nodes: Mapping[str, float]


@dataclass(frozen=True)
class CheckBlocked:
    """Check found blockers: `up` stops after showing them."""

    report: Report


@dataclass(frozen=True)
class Checked:
    """Every node passes check."""

    ok: bool
    seconds: float


@dataclass(frozen=True)
class VllmVersion:
    """The recipe's variant picked for the vLLM found on `node` (version None: not readable)."""

    node: str
    version: str | None
    variant: str
    recipe: str | None


@dataclass(frozen=True)
class WeightsEvent:
    """One of sync's own events (`kind` with its data) while the weights are staged."""

    kind: str
    data: Mapping[str, object]


@dataclass(frozen=True)
class WeightsSynced:
    """The model's HF-cache entry is the same on every node."""

    copied_bytes: int
    source: str | None
    seconds: float


@dataclass(frozen=True)
class RestartStop:
    """--restart stops the running vLLM on `node` before Ray is replaced."""

    node: str


@dataclass(frozen=True)
class RayStart:
    """Ray is being brought up: the waits follow."""


@dataclass(frozen=True)
class RayWait:
    """What Ray's start waits for now, and the cluster's state when known."""

    message: str
    state: RayState | None


@dataclass(frozen=True)
class RayEnd:
    """Ray's start is over (up or failed)."""


@dataclass(frozen=True)
class RayReady:
    """Ray runs on every node."""

    result: UpResult


@dataclass(frozen=True)
class RuntimeReady:
    """executor mp: the containers vLLM's own mode runs in (started: None with runtime host)."""

    executor: str
    runtime: str
    started: list[str] | None
    seconds: float


@dataclass(frozen=True)
class VllmFollowing:
    """A vLLM of this cluster is still starting on `node` (an earlier `up`): followed."""

    node: str


@dataclass(frozen=True)
class FollowStart:
    """Following vLLM's start on these nodes begins."""

    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FollowProgress:
    """One poll of vLLM's start."""

    progress: Progress


@dataclass(frozen=True)
class FollowEnd:
    """Following is over (ready, failed or stopped)."""


@dataclass(frozen=True)
class Ready:
    """vLLM serves `plan`'s model; progress None: a running vLLM was reused."""

    plan: ServePlan
    progress: Progress | None = field(default=None)


@dataclass(frozen=True)
class RouterReady:
    """The one endpoint serves, in front of the models named (`how`: started, reused, restarted)."""

    plan: ServePlan
    models: tuple[str, ...]
    how: str


@dataclass(frozen=True)
class Done:
    """`up` is done up to `until`."""

    seconds: float
    until: str


Event = (Stage | PullLine | Pulled | CheckBlocked | Checked | VllmVersion | WeightsEvent | WeightsSynced
         | RestartStop | RayStart | RayWait | RayEnd | RayReady | RuntimeReady | VllmFollowing | FollowStart
         | FollowProgress | FollowEnd | Ready | RouterReady | Done)
Emit = Callable[[Event], None]
