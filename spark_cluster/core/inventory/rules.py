"""Patterns every inventory text is checked against, and the choices of its keyed values."""

from __future__ import annotations

import re

from spark_cluster.core.yaml_checker import Rule


# Patterns: the second wall behind shlex.quote. Every text that reaches a command matches
# one, and none lets a shell metacharacter through or starts with '-' (an option).
def _rule(pattern: str, says: str, longest: int = 255) -> Rule:
    return Rule(re.compile(pattern), says, longest)


_PATH_CHARS = "letters, digits and _ . / + @ % -"
_NO_DOTDOT = r"(?!(?:.*/)?\.\.(?:/|$))"
CLUSTER_NAME = _rule(
    r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?",
    "a cluster name is 1-40 lowercase letters, digits and '-', starting and ending with a letter or digit",
)
NODE_NAME = _rule(
    r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?",
    "a node name is 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
)
HOST = _rule(
    r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?",
    "a host name may contain only letters, digits, '.', '-' and '_', and no part of it may start or end with '-'",
    253,
)
IP_LITERAL = re.compile(r"[0-9.]+|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9_.-]+)?")
USER = _rule(
    r"[a-z_][a-z0-9_-]{0,31}",
    "a user name is 1-32 lowercase letters, digits, '_' and '-', starting with a letter or '_'",
)
LOCAL_PATH = _rule(
    r"(?!-)~?[A-Za-z0-9_./+@%-]+",
    f"a local path may contain only {_PATH_CHARS} (and a leading ~), and must not start with '-'",
    4096,
)
REMOTE_PATH = _rule(
    _NO_DOTDOT + r"(?:~|~?/[A-Za-z0-9_./+@%-]*)",
    f"a remote path starts with / or ~/, contains only {_PATH_CHARS}, and has no '..'",
    4096,
)
PYTHON = _rule(
    _NO_DOTDOT + r"(?:~?/[A-Za-z0-9_./+@%-]*|[A-Za-z0-9_][A-Za-z0-9_.+-]*)",
    f"python is a command name, or a remote path starting with / or ~/ that contains only {_PATH_CHARS}",
    4096,
)
IMAGE = _rule(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?",
    "an image is a docker reference, registry[:port]/path[:tag][@sha256:digest], with a lowercase path",
    400,
)
IFNAME = _rule(
    r"(?!-)(?!\.\.?$)[A-Za-z0-9_.-]{1,15}",
    "an interface name is 1-15 letters, digits, '_', '.' and '-' (Linux IFNAMSIZ), not starting with '-'",
)
HCA = _rule(
    r"(?!-)[A-Za-z0-9_.-]{1,64}",
    "an RDMA device name is 1-64 letters, digits, '_', '.' and '-', not starting with '-'",
)
ENV_KEY = _rule(
    r"[A-Za-z_][A-Za-z0-9_]{0,127}",
    "an environment variable name is letters, digits and '_', not starting with a digit",
)
WORD = _rule(r"[^\x00-\x08\x0a-\x1f\x7f]*", "it may not contain control characters such as NUL or a newline", 65536)
RECIPE = _rule(r"[a-z0-9][a-z0-9._-]{0,127}", "a recipe name is lowercase letters, digits, '.', '_' and '-'")
HF_NAME = _rule(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?",
    "a model name is a Hugging Face repo id such as Qwen/Qwen3-235B-A22B-GPTQ-Int4",
)
FLAG = _rule(
    r"(?:--?)?[a-z0-9][a-z0-9-]{0,127}", "a vLLM flag is lowercase letters, digits and '-', like max-model-len"
)
RAIL_ADDRESS = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}/[0-9]{1,2}")

LISTEN_CHOICES = ("loopback", "link", "lan")
RAY_AUTH_CHOICES = ("token", "none")
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
IMAGE_HINT = "set image: nvcr.io/nvidia/vllm:<tag>, or runtime: host"
