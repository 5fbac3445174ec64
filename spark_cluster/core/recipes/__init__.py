"""Model recipes: the vLLM arguments, environment and known figures for one model on Sparks.

One YAML file per recipe in this package (``<name>.yaml``); ``load_recipe(name)`` reads and
validates one into a frozen ``Recipe``, ``recipe_names()`` lists them. Every problem is a
``RecipeError`` naming the file and the key. The format is documented in docs/recipes.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from spark_cluster.core.errors import UsageError

__all__ = ["Recipe", "RecipeError", "Reference", "Variant", "load_recipe", "load_recipe_file", "recipe_names"]

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_FLAG = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
_HF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_KEYS = {"model", "nodes", "args", "weights_gib_per_node", "reference", "pitfalls", "env", "vllm", "layouts"}
_REQUIRED = _KEYS - {"env", "vllm", "layouts"}
_VARIANT_KEYS = {"versions", "image", "args", "env"}
_REFERENCE_KEYS = {"source", "image", "tok_s", "start_minutes", "notes"}


class RecipeError(UsageError):
    """A recipe is unknown or its file is invalid; the message names the file or the known recipes."""


@dataclass(frozen=True)
class Reference:
    """Published figures for a recipe: aggregate tok/s by concurrency, minutes to first token."""

    source: str
    image: str | None = None
    tok_s: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    start_minutes: float | None = None
    notes: str | None = None


@dataclass(frozen=True)
class Variant:
    """What one range of vLLM versions needs on top of the recipe's common args and env: vLLM
    renames its kernel choices between versions (variables in 0.19/0.20, flags from 0.32)."""

    versions: str  # a PEP 440 specifier set, like ">=0.32,<0.34"
    image: str | None = None  # the NGC image tag known to hold such a vLLM
    args: tuple[tuple[str, tuple[str, ...]], ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def covers(self, version: str) -> bool:
        """``version`` as vLLM reports it (``0.19.0+abc.nv26.04``, ``0.20.1rc1``): release part only."""
        try:
            release = Version(".".join(str(n) for n in Version(version).release))
        except InvalidVersion:
            return False
        return SpecifierSet(self.versions).contains(release, prereleases=True)

    def describe(self) -> str:
        return f"vLLM {self.versions}" + (f" ({self.image})" if self.image else "")


@dataclass(frozen=True)
class Recipe:
    """One validated recipe. ``args`` is ordered (flag, values): ``("--kv-cache-dtype", ("fp8",))``,
    a switch has no values."""

    name: str
    path: str
    model: str
    nodes: int
    args: tuple[tuple[str, tuple[str, ...]], ...]
    weights_gib_per_node: float
    reference: Reference
    pitfalls: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # The vLLM versions the recipe is written for, newest first; empty: it names none.
    variants: tuple[Variant, ...] = ()
    variant: Variant | None = None  # set by for_vllm: the one whose spelling args and env hold
    # The (tensor, pipeline) parallel sizes the model divides into; empty: the recipe says none.
    layouts: tuple[tuple[int, int], ...] = ()

    def describe_layouts(self) -> str:
        return ", ".join(f"TP={tp}" + (f" x PP={pp}" if pp > 1 else "") for tp, pp in self.layouts)

    def for_vllm(self, version: str | None) -> Recipe:
        """The recipe in the spelling of vLLM ``version``: the first variant that covers it, its
        args merged over the common ones flag by flag and its env over the common env.
        ``None`` (not known yet, as in a dry run) takes the newest variant. A RecipeError names
        the versions the recipe knows when none covers ``version``."""
        if not self.variants:
            return self
        if version is None:
            chosen = self.variants[0]
        else:
            chosen = next((v for v in self.variants if v.covers(version)), None)
            if chosen is None:
                known = "; ".join(v.describe() for v in self.variants)
                raise RecipeError(f"recipe {self.name} is not written for vLLM {version}: it knows {known}. "
                                  "Use an image or environment with one of those, or add a variant for "
                                  f"{version} to {Path(self.path).name}")
        args = dict(self.args)
        args.update(chosen.args)
        return dataclasses.replace(self, args=tuple(args.items()), env=MappingProxyType({**self.env, **chosen.env}),
                                   variant=chosen)

    @property
    def argv(self) -> tuple[str, ...]:
        """The recipe's vLLM arguments as argv words, in file order."""
        return tuple(word for flag, values in self.args for word in (flag, *values))

    def arg(self, flag: str) -> tuple[str, ...] | None:
        """The values of ``--flag`` (``()`` for a switch), or None when the recipe leaves it out."""
        flag = flag if flag.startswith("-") else "--" + flag
        return next((values for f, values in self.args if f == flag), None)


def _recipe_dir() -> Path:
    return Path(str(resources.files(__name__)))


def recipe_names() -> list[str]:
    """Every recipe shipped with spark-cluster, sorted."""
    return sorted(p.stem for p in _recipe_dir().glob("*.yaml"))


def load_recipe(name: str) -> Recipe:
    """The recipe called ``name``; a RecipeError listing the known recipes (and the likeliest) if none."""
    names = recipe_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise RecipeError(f"no recipe named {name!r}: {hint}known recipes: {', '.join(names)}")
    return load_recipe_file(_recipe_dir() / f"{name}.yaml")


def load_recipe_file(path: str | Path) -> Recipe:
    """Read and validate one recipe file; the recipe's name is the file's stem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"{path}: cannot read the recipe: {exc}") from None
    return parse_recipe(text, path)


def parse_recipe(text: str, path: str | Path) -> Recipe:
    path = Path(path)
    file = path.name
    if not _NAME.fullmatch(path.stem):
        raise RecipeError(f"{file}: a recipe file name is lowercase letters, digits, '.', '_' and '-' then .yaml")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"{file}{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    problems: list[str] = []
    recipe = _parse(data, path, problems)
    if problems or recipe is None:
        raise RecipeError("\n".join(f"{file}: {p}" for p in problems) or f"{file}: invalid recipe")
    return recipe


def _parse(data: Any, path: Path, problems: list[str]) -> Recipe | None:
    if not isinstance(data, dict):
        problems.append(f"a recipe is a mapping of {', '.join(sorted(_KEYS))}, got {_kind(data)}")
        return None
    for key in data:
        if key not in _KEYS:
            close = difflib.get_close_matches(str(key), sorted(_KEYS), n=1)
            problems.append(f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; allowed: {', '.join(sorted(_KEYS))}")
    for key in sorted(_REQUIRED - set(data)):
        problems.append(f"missing key {key!r}")
    model = data.get("model")
    if "model" in data and not (isinstance(model, str) and _HF_NAME.fullmatch(model)):
        problems.append(f"model must be a Hugging Face repo id like Qwen/Qwen3-235B-A22B-GPTQ-Int4, got {model!r}")
    nodes = data.get("nodes")
    if "nodes" in data and not (type(nodes) is int and 1 <= nodes <= 64):
        problems.append(f"nodes must be a whole number from 1 to 64, got {nodes!r}")
    weights = data.get("weights_gib_per_node")
    if "weights_gib_per_node" in data and not (_is_number(weights) and 0 < weights < 1024):
        problems.append(f"weights_gib_per_node must be a number of GiB above 0, got {weights!r}")
    args = _parse_args(data.get("args"), problems) if "args" in data else None
    reference = _parse_reference(data.get("reference"), problems) if "reference" in data else None
    pitfalls = data.get("pitfalls")
    if "pitfalls" in data and not (isinstance(pitfalls, list) and all(_is_text(p) for p in pitfalls)):
        problems.append("pitfalls must be a list of one-line texts")
    env = _parse_env(data.get("env", {}), problems)
    variants = _parse_variants(data.get("vllm", []), problems)
    layouts = _parse_layouts(data.get("layouts", []), problems)
    if problems or args is None or reference is None:
        return None
    return Recipe(path.stem, str(path), model, nodes, args, float(weights), reference, tuple(pitfalls), env,
                  variants, layouts=layouts)


def _parse_layouts(value: Any, problems: list[str]) -> tuple[tuple[int, int], ...]:
    """`layouts: [{tp: 2}, {tp: 2, pp: 2}]`: each a tensor-parallel size and a pipeline one (1 if left out)."""
    if not isinstance(value, list):
        problems.append("layouts must be a list like [{tp: 2}, {tp: 4}, {tp: 2, pp: 2}]")
        return ()
    layouts = []
    for i, item in enumerate(value):
        sizes = item if isinstance(item, dict) else {}
        tp, pp = sizes.get("tp"), sizes.get("pp", 1)
        if set(sizes) - {"tp", "pp"} or not all(type(n) is int and 1 <= n <= 64 for n in (tp, pp)):
            problems.append(f"layouts[{i}] must be {{tp: N}} or {{tp: N, pp: M}} with whole numbers from 1 to 64, "
                            f"got {item!r}")
            continue
        layouts.append((tp, pp))
    return tuple(layouts)


def _parse_variants(value: Any, problems: list[str]) -> tuple[Variant, ...]:
    if not isinstance(value, list):
        problems.append("vllm must be a list of {versions, image, args, env}, newest first")
        return ()
    variants = []
    for i, item in enumerate(value):
        where = f"vllm[{i}]"
        if not isinstance(item, dict):
            problems.append(f"{where} must be a mapping with versions (like '>=0.32,<0.34'), got {_kind(item)}")
            continue
        for key in item:
            if key not in _VARIANT_KEYS:
                problems.append(f"unknown key {where}.{key}; allowed: {', '.join(sorted(_VARIANT_KEYS))}")
        spec = item.get("versions")
        try:
            if not (isinstance(spec, str) and spec.strip()):
                raise InvalidSpecifier(str(spec))
            SpecifierSet(spec)
        except InvalidSpecifier:
            problems.append(f"{where}.versions must be a version range like '>=0.32,<0.34', got {spec!r}")
            continue
        image = item.get("image")
        if image is not None and not _is_text(image):
            problems.append(f"{where}.image must be one line of text")
        args = _parse_args(item.get("args", {}), problems)
        env = _parse_env(item.get("env", {}), problems)
        variants.append(Variant(spec, image, args or (), env))
    return tuple(variants)


def _parse_args(value: Any, problems: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    if not isinstance(value, dict):
        problems.append(f"args must be a mapping of flag: value, got {_kind(value)}")
        return None
    start = len(problems)
    items: list[tuple[str, tuple[str, ...]]] = []
    for key, raw in value.items():
        if not (isinstance(key, str) and _FLAG.fullmatch(key)):
            problems.append(f"args: {key!r} is not a vLLM flag name (lowercase letters, digits and '-', "
                            "without the leading --, like max-model-len)")
            continue
        flag = "--" + key
        if raw is True:
            items.append((flag, ()))
        elif raw is False:
            continue  # a switch written out as off: the recipe documents it, vLLM never sees it
        elif isinstance(raw, list) and raw and all(_is_word(v) for v in raw):
            items.append((flag, tuple(_word(v) for v in raw)))
        elif isinstance(raw, dict):
            try:  # vLLM takes JSON for its config flags (--compilation-config, --speculative-config)
                items.append((flag, (json.dumps(raw, allow_nan=False, separators=(",", ":")),)))
            except (TypeError, ValueError) as exc:
                problems.append(f"args.{key}: cannot be written as JSON: {exc}")
        elif _is_word(raw):
            items.append((flag, (_word(raw),)))
        else:
            problems.append(f"args.{key} must be text, a number, true/false, a list or a mapping, got {_kind(raw)}")
    return tuple(items) if len(problems) == start else None


def _parse_reference(value: Any, problems: list[str]) -> Reference | None:
    if not isinstance(value, dict):
        problems.append(f"reference must be a mapping with at least source, got {_kind(value)}")
        return None
    start = len(problems)
    for key in value:
        if key not in _REFERENCE_KEYS:
            problems.append(f"unknown key reference.{key}; allowed: {', '.join(sorted(_REFERENCE_KEYS))}")
    if not _is_text(value.get("source")):
        problems.append("reference.source must say where the figures come from")
    for key in ("image", "notes"):
        if value.get(key) is not None and not _is_text(value[key]):
            problems.append(f"reference.{key} must be one line of text")
    minutes = value.get("start_minutes")
    if minutes is not None and not (_is_number(minutes) and minutes > 0):
        problems.append(f"reference.start_minutes must be a positive number, got {minutes!r}")
    tok_s = value.get("tok_s", {})
    if not (isinstance(tok_s, dict) and all(type(k) is int and k >= 1 and _is_number(v) and v > 0
                                            for k, v in tok_s.items())):
        problems.append("reference.tok_s must map a concurrency (1, 2, 4...) to aggregate tok/s, like {1: 17.0}")
    if len(problems) != start:
        return None
    return Reference(value["source"], value.get("image"),
                     MappingProxyType({k: float(v) for k, v in tok_s.items()}),
                     None if minutes is None else float(minutes), value.get("notes"))


def _parse_env(value: Any, problems: list[str]) -> Mapping[str, str]:
    if not isinstance(value, dict):
        problems.append(f"env must be a mapping of NAME: value, got {_kind(value)}")
        return MappingProxyType({})
    env: dict[str, str] = {}
    for key, raw in value.items():
        if not (isinstance(key, str) and _ENV_KEY.fullmatch(key)):
            problems.append(f"env: {key!r} is not an environment variable name")
        elif not _is_word(raw) or isinstance(raw, bool):
            problems.append(f"env.{key} must be text or a number, got {_kind(raw)}")
        else:
            env[key] = _word(raw)
    return MappingProxyType(env)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and not _CONTROL.search(value)


def _is_word(value: Any) -> bool:
    return _is_number(value) or (isinstance(value, str) and not _CONTROL.search(value))


def _word(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:80]
