"""vLLM's health as its own endpoints tell it: /health, /v1/models, /metrics."""

from __future__ import annotations

import re

from .serve import api_key, http, unauthorized_hint
from .serve_plan import ServePlan

# vLLM's metric names (vllm-ray.md §5) -> the key status reports them under.
METRICS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
}
_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each known metric over its label sets (pure)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and match.group(1) in METRICS:
            key = METRICS[match.group(1)]
            values[key] = values.get(key, 0.0) + float(match.group(2))
    return values


def vllm_health(plan: ServePlan) -> dict[str, object]:
    base = plan.endpoint.removesuffix("/v1")
    code, _ = http(f"{base}/health")
    models_code, models = http(f"{plan.endpoint}/models", key=api_key(plan))
    metrics_code, metrics = http(f"{base}/metrics")
    serves = models_code == 200 and f'"{plan.served_model_name}"' in models
    return {
        "endpoint": plan.endpoint,
        "health": code or None,
        "model": plan.served_model_name if serves else None,
        "healthy": code == 200 and serves,
        "error": f"/v1/models answered 401: {unauthorized_hint(plan)}" if models_code == 401 else None,
        "metrics": parse_metrics(metrics) if metrics_code == 200 else {},
    }


def _node_probe(interfaces: list[str]) -> str:
    links = " ".join(f"$(cat /sys/class/net/{i}/operstate 2>/dev/null || echo missing)" for i in interfaces)
    return ("awk '/^MemTotal|^MemAvailable/ {print $2}' /proc/meminfo | tr '\\n' ' '; echo; "
            "nvidia-smi --query-gpu=temperature.gpu,power.draw --format=csv,noheader,nounits 2>/dev/null"
            " | head -n 1 || echo; "
            f"echo {links}")


def parse_node(stdout: str) -> dict[str, object]:
    """The answer of `_node_probe` (pure)."""
    lines = stdout.split("\n") + ["", "", ""]
    memory = [int(v) for v in lines[0].split() if v.isdigit()]
    gpu = [c.strip() for c in lines[1].split(",")]

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    return {
        "memory_used_gib": round((memory[0] - memory[1]) / 1024**2, 1) if len(memory) == 2 else None,
        "memory_available_gib": round(memory[1] / 1024**2, 1) if len(memory) == 2 else None,
        "gpu_temperature_c": number(gpu[0]) if gpu and gpu[0] else None,
        "gpu_power_w": number(gpu[1]) if len(gpu) > 1 else None,
        "links": lines[2].split(),
    }


def collect_status(inventory, fleet) -> dict[str, object]:  # noqa: ANN001 - Inventory, Fleet
    """Every layer at once: each node, Ray's view, vLLM's endpoints."""
    from .ray_cluster import query_state

    def node_status(node) -> dict[str, object]:  # noqa: ANN001 - Node
        spec = inventory.node(node.name)
        result = node.run(_node_probe([r.interface for r in spec.link.rails]), timeout=15)
        return parse_node(result.stdout)

    answers = fleet.map(node_status)
    nodes: dict[str, dict[str, object]] = {}
    for name, value in answers.items():
        if isinstance(value, Exception):
            nodes[name] = {"reachable": False, "error": str(value).splitlines()[0]}
        else:
            nodes[name] = {"reachable": True, "error": None, **value}
    head_ok = nodes[inventory.head.name]["reachable"]
    state = query_state(inventory, fleet.node(inventory.head.name)) if head_ok else None
    healthy = all(n["reachable"] for n in nodes.values()) and state is not None and state.healthy(inventory)
    data: dict[str, object] = {
        "cluster": inventory.cluster.name, "healthy": healthy, "nodes": nodes,
        "ray": state.as_dict() if state else {"reachable": False, "error": "head unreachable"}}
    if inventory.model is not None:
        from .facts_probe import remote_path
        from .serve_plan import serve_plan

        plan = serve_plan(inventory)
        vllm = vllm_health(plan)
        # Started by `up` (its pid file is there) or answering: then it must be healthy. Never
        # started (`up --until ray`) is said as such and does not make the cluster unhealthy.
        started = head_ok and fleet.node(inventory.head.name).run(
            f"test -f {remote_path(plan.head.log_path.rsplit('/', 1)[0])}/vllm.pid", timeout=15).ok
        vllm["started"] = bool(started or vllm["health"])
        data["vllm"] = vllm
        if vllm["started"]:
            data["healthy"] = healthy and vllm["healthy"]
    return data
