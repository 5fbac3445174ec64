"""Which environment variables are secrets, and how their values travel without being seen.

A variable is a secret when its name says so (HF_TOKEN, VLLM_API_KEY, ..._PASSWORD) or when it
carries the API key named by `model.api_key_env`. A secret's value is never written into a
state file, a diff, a command line (`ps`), a container's configuration (`docker inspect`), a
log or `--json`. It reaches a node on the SSH channel's stdin and is either exported in the
shell that starts the process (`exports`), or, for a container's own process, written into a
mode-0600 file that the container reads and removes as it starts (`container_file`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from spark_cluster.core import shell

SECRET_NAME = re.compile(r"(?i)(token|secret|passw|credential|api_?key|(^|_)key$|^auth)")
REDACTED = "<redacted>"
# The container's start reads its secrets from this file (a path on the node, under the
# cluster's state directory, mounted at the same path) and removes it.
FILE_VAR = "SPARK_CLUSTER_SECRETS_FILE"


# Names that match SECRET_NAME but hold no secret: where Ray reads its token from (a path).
NOT_SECRET = frozenset({"RAY_AUTH_TOKEN_PATH"})


def is_secret(name: str) -> bool:
    return name not in NOT_SECRET and bool(SECRET_NAME.search(name))


def split(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the public variables, the secret ones)."""
    public = {k: v for k, v in env.items() if not is_secret(k)}
    return public, {k: v for k, v in env.items() if is_secret(k)}


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    return {k: REDACTED if is_secret(k) else v for k, v in env.items()}


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every one of the secret ``values`` replaced by REDACTED: for what a node
    sends back (a program may print its environment) before it reaches a report or ``--json``."""
    for value in sorted(set(values), key=len, reverse=True):
        if value:
            text = text.replace(value, REDACTED)
    return text


def stdin_lines(values: Mapping[str, str]) -> str:
    """What `exports` reads: one value per line, in the mapping's order."""
    for name, value in values.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"the value of {name} holds a line break; a secret here is one line")
    return "".join(f"{v}\n" for v in values.values())


def exports(names: list[str] | tuple[str, ...]) -> str:
    """Shell that reads each secret from stdin and exports it (nothing if there is none)."""
    return "".join(f"IFS= read -r {n} && export {n} && " for n in names)


def container_file_lines(values: Mapping[str, str]) -> str:
    """The file the container sources (`set -a; . FILE`): `NAME='value'` lines."""
    stdin_lines(values)  # the same one-line rule
    return "".join(f"{k}={shell.word(v)}\n" for k, v in values.items())


def source_and_remove() -> str:
    """The container's first words: take the secrets into its environment, then delete the file."""
    return (f'if [ -n "${FILE_VAR}" ] && [ -f "${FILE_VAR}" ]; then set -a; . "${FILE_VAR}"; set +a; '
            f'rm -f "${FILE_VAR}"; fi; unset {FILE_VAR}; ')
