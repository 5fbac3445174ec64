"""What a lab fault is: one object holding all of it, as a fact is one `Fact` in the product.

A fault is written once, in the module of its concern (faults/driver.py, link.py, ...), and
listed in that module's FAULTS; faults/__init__ gathers them into the registry and checks each
at import (`problems`), so a fault that forgets how it is undone, or whether it is in force,
stops the lab from importing instead of breaking a node for good.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:  # kept out of the stand-ins' start-up: a repair through them prunes the faults
    from collections.abc import Callable
    from typing import Any

    from spark_cluster_lab.faults.live import LiveNode

    State = dict[str, Any]

# Who puts the fault's name into the node's state["faults"]:
RECORDED = (
    "break",  # `lab break`, once the live part (if any) is done
    "live",   # the live part, as only it can (the hog records its own pid, as the node numbers it)
    "never",  # nobody: an event, over once done (a reboot)
)
# What `said` may name besides what the live part returns (faults.live.LiveNode.words).
WORDS = ("node", "rail0", "rail1", "other_port", "mtu", "user", "home")


def until_healed(state: State) -> bool:
    """In force until `lab heal`: a fault on the running node that its state cannot show."""
    return True


def never(state: State) -> bool:
    """Never in force: an event, over once done."""
    return False


class Fault:
    """One fault as a real Spark gets it.

    name      what `lab break NODE NAME` takes
    summary   one line: what the fault leaves on the node (`lab faults`, README's list)
    said      the line `lab break` prints, a str.format template of WORDS and what `live` returns
    in_force  state -> bool: whether the node still shows it. A repair made through the stand-ins
              ends a fault of the state; `lab status` lists those in force
    apply     (state, **details) -> None: what it changes in the node's state, which the stand-ins
              read; `lab heal` puts the state back to healthy, which undoes it. None: nothing
    live      LiveNode -> dict | None: what it does to the running node (interfaces, processes,
              files), before the state records it; the dict's words go into `said`. None: nothing
    undo      (LiveNode, state) -> None: what `lab heal` does to the running node, `state` being
              the state heal found; one function may undo several faults (heal calls it once)
    recorded  one of RECORDED
    again     what `lab break` says, doing nothing, when the fault is recorded already: for a
              fault that is its own undo (crossing the rails twice uncrosses them)

    A plain class, not a dataclass, for the reason layout.NodePaths gives: the stand-ins import the
    registry, and the dataclasses machinery alone costs ~15 ms of each start. It is frozen all the same.
    """

    __slots__ = ("name", "summary", "said", "in_force", "apply", "live", "undo", "recorded", "again")

    def __init__(self, name: str, *, summary: str, said: str, in_force: Callable[[State], bool],
                 apply: Callable[..., None] | None = None,
                 live: Callable[[LiveNode], dict[str, Any] | None] | None = None,
                 undo: Callable[[LiveNode, State], None] | None = None,
                 recorded: str = "break", again: str | None = None) -> None:
        for key, value in (("name", name), ("summary", summary), ("said", said), ("in_force", in_force),
                           ("apply", apply), ("live", live), ("undo", undo), ("recorded", recorded),
                           ("again", again)):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"fault {self.name}: a Fault cannot be changed ({key})")

    def __repr__(self) -> str:
        return f"Fault({self.name!r})"


_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
_FIELD = re.compile(r"{([a-z_0-9]*)}")
SUMMARY_MAX = 110  # `lab faults` prints name and summary on one line of a wide terminal


def problems(fault: Fault) -> list[str]:
    """What is wrong with a fault's definition: each fault must say what it does, how it is
    undone and whether it is in force."""
    found = []
    if not _NAME.fullmatch(fault.name):
        found.append("its name must be lower-case words joined by '-'")
    for key in ("summary", "said"):
        text = getattr(fault, key)
        if not isinstance(text, str) or not text.strip() or "\n" in text:
            found.append(f"{key} must be one line")
    if isinstance(fault.summary, str) and len(fault.summary) > SUMMARY_MAX:
        found.append(f"summary is over {SUMMARY_MAX} characters")
    if isinstance(fault.said, str) and "{node}" not in fault.said:
        found.append("said must name {node}")
    if not callable(fault.in_force):
        found.append("in_force must say whether the fault is in force (until_healed, never, or a test of the state)")
    if fault.apply is None and fault.live is None:
        found.append("it does nothing: give it apply (the state) or live (the running node)")
    if fault.recorded not in RECORDED:
        found.append(f"recorded must be one of {', '.join(RECORDED)}")
    if fault.recorded == "live" and fault.live is None:
        found.append("recorded by its live part, but it has none")
    if fault.live is not None and fault.recorded != "never" and fault.undo is None:
        found.append("what live does to the running node outlasts the state's reset: give it undo")
    if fault.again is not None and fault.live is None:
        found.append("again is for a live fault that is its own undo")
    for key in ("said", "again"):
        text = getattr(fault, key)
        if isinstance(text, str) and fault.live is None and set(_FIELD.findall(text)) - set(WORDS):
            found.append(f"{key} names words nothing gives: {sorted(set(_FIELD.findall(text)) - set(WORDS))}")
    return [f"fault {fault.name}: {p}" for p in found]


def check(defined: list[Fault]) -> list[str]:
    """What is wrong with a registry of these faults: each one's problems, and names used twice."""
    names = [f.name for f in defined]
    found = [p for f in defined for p in problems(f)]
    twice = sorted({n for n in names if names.count(n) > 1})
    return found + ([f"faults defined twice: {', '.join(twice)}"] if twice else [])


def record(state: State, fault: Fault, **details: Any) -> State:
    """Break `state` in place the way `fault` breaks a real Spark, and list the fault as in force."""
    if fault.apply is not None:
        fault.apply(state, **details)
    if fault.name not in state["faults"]:
        state["faults"].append(fault.name)
    state["fault_details"][fault.name] = details
    return state
