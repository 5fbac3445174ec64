"""Shell command lines built from words: every word is quoted unless it is marked shell on purpose.

Values from an inventory (paths, interface names, image names) reach a node's shell only through
`join`, so none is ever read as shell. A word that must be shell (`"$HOME"/x`, `"$d/ray.pid"`) is
a `Raw`, which says so where it is made.
"""

from __future__ import annotations

import shlex


class Raw(str):
    """A word that is shell on purpose and goes into a command line as it is."""

    __slots__ = ()


Word = str | int | float


def word(value: Word) -> str:
    """One word for a command line: a Raw as it is, anything else quoted."""
    return value if isinstance(value, Raw) else shlex.quote(str(value))


def join(*words: Word) -> str:
    """A command line of `words`, each quoted unless it is a Raw."""
    return " ".join(word(w) for w in words)


def remote_path(path: str) -> Raw:
    """A validated remote path as a shell word: `~/x` becomes "$HOME"/'x', the rest is quoted."""
    if path == "~":
        return Raw('"$HOME"')
    if path.startswith("~/"):
        return Raw('"$HOME"/' + shlex.quote(path[2:]))
    return Raw(shlex.quote(path))


def model_dir(hf_cache: str, repo: str) -> Raw:
    """The HF cache folder of a repo, as a shell word (snapshots live below it)."""
    return remote_path(f"{hf_cache.rstrip('/')}/hub/models--{repo.replace('/', '--')}")
