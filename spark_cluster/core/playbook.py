"""Playbooks (playbooks/*.yaml): the steps that repair what a finding names.

A playbook is data: steps with a command each, `sudo`, an optional `skip_if` (a command
whose success means the step is not needed, so a second run changes nothing), `confirm`
(ask before this step) and `reboot` (only with --reboot); a `verify` command; and
`persist`, text shown to the user for what belongs in a config file. `{param}` in a
command is replaced by the finding's value, each word validated and shell-quoted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from spark_cluster.core import shell
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.session import sudo_line

PLAYBOOK_DIR = Path(__file__).resolve().parents[1] / "playbooks"
# Values come from facts (package names, interfaces, pids, numbers): nothing else passes.
SAFE_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+:/=@-]*$")
_PARAM = re.compile(r"\{([a-z_]+)\}")


class PlaybookError(SparkClusterError):
    pass


@dataclass(frozen=True)
class Step:
    name: str
    run: str
    sudo: bool = False
    skip_if: str | None = None
    confirm: str | None = None
    reboot: bool = False


@dataclass(frozen=True)
class Playbook:
    id: str
    title: str
    fixes: tuple[str, ...]
    params: tuple[str, ...]
    steps: tuple[Step, ...]
    verify: str | None = None
    persist: str | None = None


@dataclass(frozen=True)
class PlannedStep:
    name: str
    command: str
    sudo: bool
    skip_if: str | None
    confirm: str | None
    reboot: bool

    @property
    def shown(self) -> str:
        """The command as a person would type it; exactly what runs on the node (the password,
        when --ask-sudo-pass gave one, goes on its standard input: see shown_with)."""
        return self.shown_with(password=False)

    def shown_with(self, *, password: bool) -> str:
        return sudo_line(self.command, password=password) if self.sudo else self.command


@dataclass(frozen=True)
class Plan:
    """One playbook rendered for one node."""

    node: str
    playbook: Playbook
    finding_ids: tuple[str, ...]
    steps: tuple[PlannedStep, ...]
    verify: str | None
    persist: str | None


def _step(raw: object, where: str) -> Step:
    if not isinstance(raw, dict) or not isinstance(raw.get("run"), str):
        raise PlaybookError(f"{where}: a step needs `run:` (a command)")
    unknown = set(raw) - {"name", "run", "sudo", "skip_if", "confirm", "reboot"}
    if unknown:
        raise PlaybookError(f"{where}: unknown keys {sorted(unknown)}")
    return Step(str(raw.get("name", raw["run"])), raw["run"], bool(raw.get("sudo", False)),
                raw.get("skip_if"), raw.get("confirm"), bool(raw.get("reboot", False)))


def load_playbook(path: Path) -> Playbook:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PlaybookError(f"{path}: cannot read the playbook: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list) or "id" not in raw:
        raise PlaybookError(f"{path}: a playbook needs `id:` and a list of `steps:`")
    steps = tuple(_step(s, f"{path}: step {i + 1}") for i, s in enumerate(raw["steps"]))
    playbook = Playbook(str(raw["id"]), str(raw.get("title", raw["id"])),
                        tuple(raw.get("fixes", ())), tuple(raw.get("params", ())), steps,
                        raw.get("verify"), raw.get("persist"))
    texts = [s.run for s in steps] + [s.skip_if or "" for s in steps] + [playbook.verify or ""]
    used = {m for text in texts for m in _PARAM.findall(text)}
    if not used <= set(playbook.params):
        raise PlaybookError(f"{path}: commands use undeclared params {sorted(used - set(playbook.params))}")
    return playbook


@cache
def playbooks(directory: Path = PLAYBOOK_DIR) -> dict[str, Playbook]:
    found = {}
    for path in sorted(directory.glob("*.yaml")):
        playbook = load_playbook(path)
        found[playbook.id] = playbook
    return found


def quote_param(name: str, value: str) -> str:
    words = value.split()
    for word in words:
        if not SAFE_WORD.match(word):
            raise PlaybookError(f"refusing to put {word!r} into a command (parameter {name})")
    return " ".join(shell.word(w) for w in words)


def fill(template: str, params: Mapping[str, str], quote: bool = True) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in params:
            raise PlaybookError(f"no value for {{{name}}}")
        return quote_param(name, params[name]) if quote else params[name]

    return _PARAM.sub(value, template)


def plan(node: str, playbook: Playbook, params: Mapping[str, str],
         finding_ids: tuple[str, ...]) -> Plan:
    steps = tuple(
        PlannedStep(s.name, fill(s.run, params), s.sudo,
                    fill(s.skip_if, params) if s.skip_if else None,
                    fill(s.confirm, params, quote=False) if s.confirm else None, s.reboot)
        for s in playbook.steps
    )
    return Plan(node, playbook, finding_ids, steps,
                fill(playbook.verify, params) if playbook.verify else None,
                fill(playbook.persist, params, quote=False) if playbook.persist else None)
