"""Reading an inventory file: YAML with line numbers in, frozen records out, or an
InventoryError listing every problem as ``FILE:LINE: message (hint: ...)``."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from spark_cluster.core.inventory.model import (
    ClusterSettings,
    Inventory,
    InventoryError,
    LinktestSettings,
    ModelSpec,
    NodeSpec,
    NoSSHConfig,
    Problem,
    Resolve,
    SSHSettings,
)
from spark_cluster.core.inventory.models import check_models, given_in_args, parse_models
from spark_cluster.core.inventory.nodes import check_nodes, local_path, parse_nodes
from spark_cluster.core.inventory.topology import TOPOLOGIES, check_topology, default_topology
from spark_cluster.core.inventory.rules import (
    CLUSTER_NAME,
    ENV_KEY,
    FLAG,
    HF_NAME,
    IMAGE,
    IMAGE_HINT,
    LISTEN_CHOICES,
    NODE_NAME,
    PYTHON,
    RAY_AUTH_CHOICES,
    RAY_AUTH_VARS,
    RECIPE,
    REMOTE_PATH,
    WORD,
)
from spark_cluster.core.yaml_checker import (
    REQUIRED,
    Checker,
    Reader,
    Rule,
    describe,
    number_text,
    where,
)
from spark_cluster.core.yaml_lines import MAX_BYTES, YamlPath, compose


def load_inventory(path: str | Path, resolve: Resolve = NoSSHConfig) -> Inventory:
    """Read and validate an inventory file; ``resolve`` gives what the ssh configuration says
    about an address (ops.inventory.load_inventory passes the user's).

    >>> load_inventory("inventories/lab.yaml").head.name  # doctest: +SKIP
    'spark-a'
    """
    try:
        # Asked before opening: opening a FIFO waits for a writer that never comes.
        if not stat.S_ISREG(Path(path).stat().st_mode):
            raise InventoryError([Problem(str(path), 0, "cannot read the inventory: not a regular file (a FIFO, "
                                          "device or directory)", "pass the YAML file itself")])
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)  # compose() refuses what is over the bound, by its size
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InventoryError([Problem(str(path), 0, f"cannot read the inventory: {reason}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InventoryError([Problem(str(path), line, "the file is not UTF-8 text", "save it as UTF-8")]) from None
    return parse_inventory(text, path, resolve)


def parse_inventory(text: str, path: str | Path, resolve: Resolve = NoSSHConfig) -> Inventory:
    """Validate inventory text; ``path`` names the file in messages and anchors relative local paths."""
    file = os.fspath(path)
    doc = compose(text)
    problems = [Problem(file, i.line, i.message, i.hint) for i in doc.issues]
    absolute = Path(os.path.abspath(file))
    inventory = None
    if doc.readable:
        checker = Checker(doc.lines, {i.line for i in doc.issues})
        inventory = _parse(checker, doc.data, absolute, resolve)
        problems += [Problem(file, i.line, i.message, i.hint) for i in checker.problems]
    if problems or inventory is None:
        # sorted() is stable: problems on one line keep the order they were found in.
        raise InventoryError(sorted(dict.fromkeys(problems), key=lambda p: p.line))
    return inventory



def _parse(c: Checker, data: object, source: Path, resolve: Resolve) -> Inventory | None:
    base = source.parent
    fields: dict[str, tuple[Reader, object]] = {
        "cluster": (lambda v, p: _parse_cluster(c, v, p, base), REQUIRED),
        "nodes": (lambda v, p: parse_nodes(c, v, p, base, resolve), REQUIRED),
        "model": (lambda v, p: _parse_model(c, v, p), None),
        "models": (lambda v, p: parse_models(c, v, p, _parse_model), None),
    }
    top = c.fill(data, (), fields, partial=True)
    if top is None:
        return None
    topology = _topology(c, data, top["nodes"])
    models, paths = _models(c, top)
    if top["nodes"] is not None and models:
        check_models(c, models, paths, [str(d.fields.get("name")) for d in top["nodes"]])
    if c.failures or top["cluster"] is None or top["nodes"] is None:
        return None
    nodes = tuple(NodeSpec(**d.fields) for d in top["nodes"])
    return Inventory(source, replace(top["cluster"], topology=topology), nodes,
                     models[0] if models else None, tuple(models[1:]))


def _models(c: Checker, top: dict) -> tuple[tuple[ModelSpec, ...], list[YamlPath]]:
    """The models to serve, `model:` being a list of one, and where each is written."""
    if top["model"] is not None and top["models"] is not None:
        c.report(("models",), "the inventory has both model and models",
                 "keep models: (a list) and move the model: entry into it")
        return (), []
    if top["models"] is not None:
        return top["models"], [("models", i) for i in range(len(top["models"]))]
    return ((top["model"],), [("model",)]) if top["model"] is not None else ((), [])


def _topology(c: Checker, data: object, drafts: list | None) -> str:
    """The nodes checked across, by the topology written (read raw: a cluster section wrong
    elsewhere still says how its nodes are cabled) or the one their count means."""
    written = _given(_given(data, "cluster"), "topology")
    topology = written if written in TOPOLOGIES else default_topology(len(drafts or ()))
    if drafts:
        check_nodes(c, drafts, shared_rails=topology != "ring")
        if written is None or written in TOPOLOGIES:
            check_topology(c, drafts, topology, written is not None)
    return topology


def _parse_cluster(c: Checker, value: object, path: YamlPath, base: Path) -> ClusterSettings | None:
    fields: dict[str, tuple[Reader, object]] = {
        "name": (lambda v, p: c.text(v, p, CLUSTER_NAME), REQUIRED),
        "runtime": (lambda v, p: c.choice(v, p, ("container", "host")), "container"),
        "image": (lambda v, p: c.text(v, p, IMAGE), None),
        "python": (lambda v, p: c.text(v, p, PYTHON), None),
        "ray_port": (lambda v, p: c.integer(v, p, 1, 65535), 6379),
        "executor": (lambda v, p: c.choice(v, p, ("ray", "mp")), "ray"),
        "install_ray": (lambda v, p: _flag(c, v, p), False),
        "ray_auth": (lambda v, p: c.choice(v, p, RAY_AUTH_CHOICES), "token"),
        "env": (lambda v, p: _parse_env(c, v, p), MappingProxyType({})),
        "ssh": (lambda v, p: _parse_ssh(c, v, p, base), SSHSettings()),
        "linktest": (lambda v, p: _parse_linktest(c, v, p), LinktestSettings()),
        "topology": (lambda v, p: c.choice(v, p, TOPOLOGIES), None),
    }
    f = c.fill(value, path, fields)
    env = _given(value, "env")
    for key in env if isinstance(env, dict) else ():
        if key in RAY_AUTH_VARS:
            c.report(path + ("env", key), f"cluster.env sets {key}, which spark-cluster sets from cluster.ray_auth",
                     "remove it: ray_auth: token (the default) gives the cluster a token of its own, "
                     "ray_auth: none turns Ray's authentication off")
            f = None
    # Judged on the raw values: an invalid runtime is reported already and says nothing here.
    if _given(value, "runtime") in (None, "container") and isinstance(value, dict) and value.get("image") is None:
        c.report(path, "cluster.image is required when runtime is container", IMAGE_HINT)
        return None
    return None if f is None else ClusterSettings(**f)


def _flag(c: Checker, value: object, path: YamlPath) -> bool | None:
    if isinstance(value, bool):
        return value
    got = repr(value) if isinstance(value, str) and len(value) <= 60 else describe(value)  # describe: a huge int too
    c.report(path, f"{path[-1]} must be true or false, got {got}", "write true or false")
    return None


def _given(value: object, key: str) -> object:
    return value.get(key) if isinstance(value, dict) else None


def _parse_ssh(c: Checker, value: object, path: YamlPath, base: Path) -> SSHSettings | None:
    fields: dict[str, tuple[Reader, object]] = {
        "host_key_policy": (lambda v, p: c.choice(v, p, ("strict", "accept-new")), "strict"),
        "known_hosts": (lambda v, p: local_path(c, v, p, base), None),
        "connect_timeout": (lambda v, p: c.number(v, p, 0, 300), 10.0),
    }
    f = c.fill(value, path, fields)
    return None if f is None else SSHSettings(**f)


def _parse_linktest(c: Checker, value: object, path: YamlPath) -> LinktestSettings | None:
    fields: dict[str, tuple[Reader, object]] = {
        "min_bus_gbs": (lambda v, p: c.number(v, p, 0, 10000), LinktestSettings.min_bus_gbs),
        "min_tcp_gbps": (lambda v, p: c.number(v, p, 0, 10000), LinktestSettings.min_tcp_gbps),
        "streams": (lambda v, p: c.integer(v, p, 1, 64), LinktestSettings.streams),
        "seconds": (lambda v, p: c.number(v, p, 0, 600), LinktestSettings.seconds),
    }
    f = c.fill(value, path, fields)
    return None if f is None else LinktestSettings(**f)


def _parse_env(c: Checker, value: object, path: YamlPath) -> Mapping[str, str] | None:
    sec = c.section(value, path)
    if sec is None:
        return None
    start = c.failures
    env = {_key(c, key, path, ENV_KEY): _word(c, raw, path + (key,)) for key, raw in sec.data.items()}
    return MappingProxyType(env) if c.failures == start else None  # type: ignore[arg-type]


def _key(c: Checker, key: str, path: YamlPath, rule: Rule) -> str | None:
    """A mapping key that is itself data (an env name, a vLLM flag), checked against ``rule``."""
    if rule.allows(key):
        return key
    c.report(path + (key,), f"key {key[:60]!r} in {where(path)} is not allowed: {rule.says}")
    return None


def _word(c: Checker, value: object, path: YamlPath) -> str | None:
    """One argv word: text or a number (written as text); never a boolean or a control character."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        # Python cannot even print an int of over 4,300 digits; no setting takes one.
        c.report(path, f"{where(path)} is {number_text(value)}: too long for any setting", "write the value meant")
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        c.report(path, f"{where(path)} must be text or a number, got {describe(value)}")
        return None
    return c.text(value, path, WORD)


def _arg_word(c: Checker, value: object, path: YamlPath) -> str | None:
    """A word of model.args. `$` is refused: no vLLM flag value needs it, and a `$NAME` there
    would be a way to put a secret of the node's environment (the API key) on vLLM's argv."""
    word = _word(c, value, path)
    if word is not None and "$" in word:
        c.report(path, f"{where(path)} holds a `$`: model.args are passed to vLLM as written, never expanded",
                 "write the value itself; a secret goes in cluster.env or model.api_key_env, never in model.args")
        return None
    return word

def _parse_model(c: Checker, value: object, path: YamlPath) -> ModelSpec | None:
    fields: dict[str, tuple[Reader, object]] = {
        "recipe": (lambda v, p: c.text(v, p, RECIPE), None),
        "name": (lambda v, p: c.text(v, p, HF_NAME), None),
        "args": (lambda v, p: _parse_args(c, v, p), ()),
        "hf_cache": (lambda v, p: c.text(v, p, REMOTE_PATH), "~/.cache/huggingface"),
        "api_key_env": (lambda v, p: _env_name(c, v, p), None),
        "listen": (lambda v, p: c.choice(v, p, LISTEN_CHOICES), None),
        "open_without_key": (lambda v, p: _flag(c, v, p), False),
        "sync": (lambda v, p: _flag(c, v, p), False),
        "nodes": (lambda v, p: _node_names(c, v, p), ()),
        "gpu_memory_utilization": (lambda v, p: c.number(v, p, 0, 1), None),
        "port": (lambda v, p: c.integer(v, p, 1024, 65535), None),
    }
    f = c.fill(value, path, fields)
    if f is not None and f["listen"] == "lan" and f["api_key_env"] is None and not f["open_without_key"]:
        c.report(path + ("listen",), "model.listen: lan without model.api_key_env serves the model to anyone "
                 "on the head's network, unauthenticated",
                 "name the variable that holds a key in api_key_env, or write open_without_key: true "
                 "to accept an open endpoint, or use listen: loopback")
        return None
    given = [key for key in ("recipe", "name") if _given(value, key) is not None]
    if isinstance(value, dict) and len(given) != 1:
        says = "sets both recipe and name" if given else "needs a recipe or a name"
        c.report(path, f"model {says}", "recipe: a spark-cluster recipe, or name: a Hugging Face repo id; not both")
        return None
    for key, flag in (("gpu_memory_utilization", "--gpu-memory-utilization"), ("port", "--port")):
        if f is not None and f[key] is not None and given_in_args(f["args"], flag) is not None:
            c.report(path + (key,), f"{where(path + (key,))} and {flag} in its args say the same thing twice",
                     f"keep {key}: and remove {flag} from args")
            return None
    return None if f is None else ModelSpec(**f)


def _node_names(c: Checker, value: object, path: YamlPath) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not value:
        c.report(path, f"{where(path)} must be a list of node names, got {describe(value)}",
                 "nodes: [spark-a, spark-b], or leave it out to place the model on every node")
        return None
    names = [c.text(item, path + (i,), NODE_NAME) for i, item in enumerate(value)]
    return None if any(n is None for n in names) else tuple(str(n) for n in names)


def _env_name(c: Checker, value: object, path: YamlPath) -> str | None:
    """The name of the variable that holds the API key. What was written is never echoed:
    a wrong value here is most often the key itself."""
    if isinstance(value, str) and ENV_KEY.allows(value):
        return value
    c.report(path, "model.api_key_env must be the NAME of an environment variable (like SPARK_API_KEY), "
                   "not the key", "export SPARK_API_KEY=<the key> where you run spark-cluster, and write "
                   "api_key_env: SPARK_API_KEY")
    return None


def _parse_args(c: Checker, value: object, path: YamlPath) -> tuple[str, ...] | None:
    """Extra vLLM arguments as argv words: a list as given, or {flag: value} flattened."""
    start = c.failures
    words: list[str | None] = []
    if isinstance(value, list):
        words = [_arg_word(c, item, path + (i,)) for i, item in enumerate(value)]
    elif isinstance(value, dict):
        for key, arg in value.items():
            words += _flag_words(c, key, arg, path + (key,))
    else:
        c.report(path, f"model.args must be a mapping of flag: value or a list of words, got {describe(value)}")
    return tuple(w for w in words if w is not None) if c.failures == start else None


def _flag_words(c: Checker, key: str, value: object, path: YamlPath) -> list[str | None]:
    flag = _key(c, key, path[:-1], FLAG)
    flag = flag if flag is None or flag.startswith("-") else "--" + flag
    if value is True or value is False:
        if value or flag is None:
            return [flag]
        # Off is said out loud: vLLM's switches take --no-x, which also removes a recipe's --x.
        return ["--" + flag[len("--no-"):] if flag.startswith("--no-") else "--no-" + flag[2:]]
    if value is None:
        c.report(path, f"flag {key!r} has no value", "write true to pass the flag alone, or false to leave it out")
        return []
    if isinstance(value, list):
        return [flag] + [_arg_word(c, item, path + (i,)) for i, item in enumerate(value)]
    if isinstance(value, dict):
        try:  # vLLM takes JSON for its config flags (--compilation-config, --speculative-config)
            return [flag, json.dumps(value, allow_nan=False, separators=(",", ":"))]
        except ValueError:
            c.report(path, f"flag {key!r} holds .nan or .inf, which JSON cannot carry")
            return []
    return [flag, _arg_word(c, value, path)]
