"""vLLM's command line as data: argv words read into ordered (flag, values), a recipe's flags
merged with the inventory's overrides, and the flags the launch plan reads or sets (pure)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from spark_cluster.core.errors import UsageError

# vLLM's default --gpu-memory-utilization; on unified memory it must find this fraction of the
# node's whole memory free when it starts, whatever the weights.
VLLM_DEFAULT_UTILIZATION = 0.9

# Short spellings vLLM accepts, written out so an override meets the recipe's flag.
_ALIASES = {
    "-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size",
    "-ep": "--enable-expert-parallel", "-q": "--quantization", "-O": "--compilation-config",
}
_NUMBER = re.compile(r"-\.?[0-9]")

Args = list[tuple[str, list[str]]]


class ServePlanError(UsageError):
    """The recipe and the inventory do not make a servable plan; the message says what to change."""


def parse_argv(words: Iterable[str]) -> Args:
    """argv words -> ordered (flag, values); ``--x=v`` splits, short aliases and ``_`` are normalised."""
    items: Args = []
    for word in words:
        if word.startswith("-") and not _NUMBER.match(word) and word != "-":
            flag, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
            items.append((normal_flag(flag), [value] if eq else []))
        elif items:
            items[-1][1].append(word)
        else:
            raise ServePlanError(f"model.args must start with a flag, got {word[:60]!r}")
    return items


def merge_args(base: Sequence[tuple[str, Sequence[str]]], overrides: Sequence[tuple[str, Sequence[str]]]) -> Args:
    """``overrides`` win flag by flag, in ``base``'s order; new flags go last.

    ``--no-x`` drops ``--x`` from ``base``; when ``base`` has no ``--x`` it is passed on to vLLM
    (which turns off a default that is on). ``--x`` in turn drops a ``--no-x``.
    """
    merged: dict[str, list[str]] = {f: list(v) for f, v in base}
    for flag, values in overrides:
        if flag.startswith("--no-"):
            positive = "--" + flag[len("--no-"):]
            if positive in merged or positive.startswith("--disable-"):
                # vLLM's --disable-x switches have no --no- form: off is their default.
                merged.pop(positive, None)
                continue
        else:
            merged.pop("--no-" + flag[2:], None)
        merged[flag] = list(values)  # an existing key keeps its place
    return list(merged.items())


def normal_flag(flag: str) -> str:
    flag = _ALIASES.get(flag, flag)
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def flag_value(args: Args, flag: str) -> str | None:
    """The first value of ``flag``; None when it is missing or has none."""
    return next((v[0] for f, v in args if f == flag and v), None)


def put_flag(args: Args, flag: str, values: list[str]) -> None:
    """Set ``flag`` to ``values`` in its place, or last when it is missing."""
    for i, (f, _) in enumerate(args):
        if f == flag:
            args[i] = (flag, values)
            return
    args.append((flag, values))


def set_default(args: Args, flag: str, default: str, as_int: bool = True):  # type: ignore[no-untyped-def]
    """The flag's value, after appending ``flag default`` when it is missing."""
    value = flag_value(args, flag)
    if value is None:
        if any(f == flag for f, _ in args):
            raise ServePlanError(f"{flag} needs a value")
        put_flag(args, flag, [default])
        value = default
    if not as_int:
        return value
    try:
        number = int(value)
    except ValueError:
        raise ServePlanError(f"{flag} must be a whole number, got {value!r}") from None
    if number < 1:
        raise ServePlanError(f"{flag} must be at least 1, got {number}")
    return number


def utilization(head_argv: tuple[str, ...]) -> float | None:
    """--gpu-memory-utilization of the head's argv: vLLM's default when unset, None when no number."""
    argv = list(head_argv)
    if "--gpu-memory-utilization" in argv[:-1]:
        try:
            return float(argv[argv.index("--gpu-memory-utilization") + 1])
        except ValueError:
            return None
    return VLLM_DEFAULT_UTILIZATION
