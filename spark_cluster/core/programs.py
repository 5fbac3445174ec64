"""The shell line that runs one of the programs shipped to the nodes (spark_cluster/programs/,
found there by name) as `python -c` text.

`command` builds the whole invocation through core.shell, so a program's arguments are quoted
words and its text is never spliced into a command line by hand. The programs themselves import
nothing of the package: this is the only way from the layers to them.
"""

from __future__ import annotations

from importlib import resources

from spark_cluster.core.shell import Raw, Word, join

PYTHON = Raw("python3")
PACKAGE = "spark_cluster.programs"


def source(name: str) -> str:
    """The text of one of these programs, to hand to `python -c`."""
    return resources.files(PACKAGE).joinpath(f"{name}.py").read_text()


def words(name: str, *args: Word, python: Word = PYTHON, isolated: bool = False) -> list[Word]:
    """The words that run program `name` with `args`: PYTHON [-I -S] -c TEXT ARGS. `isolated`
    keeps the user's environment (-I) and every site-packages with its .pth files (-S) out, for
    programs that need only the standard library: a .pth may import anything at every start,
    and `check` starts some of these on every node."""
    return [python, *(["-I", "-S"] if isolated else []), "-c", source(name), *args]


def command(name: str, *args: Word, python: Word = PYTHON, isolated: bool = False) -> str:
    """The shell line that runs program `name` with `args` (see `words`)."""
    return join(*words(name, *args, python=python, isolated=isolated))
