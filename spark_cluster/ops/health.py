"""vLLM's health as its own endpoints tell it: /health, /v1/models, /metrics."""

from __future__ import annotations

import time

from spark_cluster.ops.readiness import http, unauthorized_hint
from spark_cluster.ops.serve import api_key
from spark_cluster.core.serve_plan import ServePlan

# vLLM's metric names (as samples) -> the key status reports them under.
METRICS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each known metric over its label sets (pure); read with prometheus_client's parser."""
    from spark_cluster.ops.metrics import parse_vllm, sample_sum

    families = parse_vllm(text)
    values = {key: sample_sum(families, name) for name, key in METRICS.items()}
    return {key: value for key, value in values.items() if value is not None}


RATE_WINDOW_S = 1.0  # `status` alone: two /metrics samples at least this far apart


def throughput(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Prompt and generation tokens per second between two samples of vLLM's counters (pure).
    A counter that went down (vLLM restarted in between) gives no figure."""
    rates = {}
    for counter, key in (("prompt_tokens_total", "prompt_tokens_per_s"),
                         ("generation_tokens_total", "generation_tokens_per_s")):
        if seconds > 0 and counter in before and counter in after and after[counter] >= before[counter]:
            rates[key] = round((after[counter] - before[counter]) / seconds, 1)
    return rates


def _metrics(plan: ServePlan) -> dict[str, float] | None:
    code, text = http(f"{plan.endpoint.removesuffix('/v1')}/metrics")
    return parse_metrics(text) if code == 200 else None


def vllm_health(plan: ServePlan) -> dict[str, object]:
    base = plan.endpoint.removesuffix("/v1")
    metrics_code, metrics = http(f"{base}/metrics")
    code, _ = http(f"{base}/health")
    models_code, models = http(f"{plan.endpoint}/models", key=api_key(plan))
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


def collect_status(inventory, fleet, previous: dict | None = None) -> dict[str, object]:  # noqa: ANN001
    """Every layer at once: each node, Ray's view, vLLM's endpoints.

    Throughput comes from two samples of vLLM's counters: `previous` (watch's last snapshot)
    and now, or, without one, a sample taken first and another at least RATE_WINDOW_S later.
    """
    plan = None
    if inventory.model is not None:
        from spark_cluster.ops.reach import reach
        from spark_cluster.core.serve_plan import serve_plan

        plan = serve_plan(inventory)
        with reach(plan, fleet) as api:
            return _collect(inventory, fleet, previous, plan, api)
    return _collect(inventory, fleet, previous, None, None)


def _collect(inventory, fleet, previous, plan, api) -> dict[str, object]:  # noqa: ANN001 - Inventory, Fleet, dict, ServePlan, ServePlan
    """`api`: the plan with an endpoint this machine reaches (a forward to a loopback API)."""
    from spark_cluster.ops.ray_state import query_state

    first: tuple[float, dict[str, float] | None] | None = None
    if plan is not None and previous is None:
        first = (time.monotonic(), _metrics(api))

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
    reachable = all(n["reachable"] for n in nodes.values())
    if inventory.cluster.executor == "mp":  # vLLM joins its nodes itself: there is no Ray to ask
        healthy = reachable
        ray: dict[str, object] = {"used": False, "reachable": False, "nodes": [],
                                  "error": "not used (executor mp)"}
    else:
        state = query_state(inventory, fleet.node(inventory.head.name)) if head_ok else None
        healthy = reachable and state is not None and state.healthy(inventory)
        ray = {"used": True, **(state.as_dict() if state else {"reachable": False, "error": "head unreachable"})}
    data: dict[str, object] = {"cluster": inventory.cluster.name, "healthy": healthy, "nodes": nodes, "ray": ray}
    data["time"] = round(time.time(), 3)
    if plan is not None:
        from spark_cluster.core.shell import remote_path

        if first is not None and first[1]:
            time.sleep(max(0.0, RATE_WINDOW_S - (time.monotonic() - first[0])))
        sampled = time.monotonic()  # vllm_health reads /metrics first
        vllm = vllm_health(api)
        vllm["endpoint"] = plan.endpoint
        if first is not None and first[1]:
            vllm["throughput"] = throughput(first[1], vllm["metrics"], sampled - first[0])
        elif previous and (previous.get("vllm") or {}).get("metrics"):
            vllm["throughput"] = throughput(previous["vllm"]["metrics"], vllm["metrics"],
                                            data["time"] - previous.get("time", data["time"]))
        else:
            vllm["throughput"] = {}
        # Started by `up` (its pid file is there) or answering: then it must be healthy. Never
        # started (`up --until ray`) is said as such and does not make the cluster unhealthy.
        started = head_ok and fleet.node(inventory.head.name).run(
            f"test -f {remote_path(plan.head.log_path.rsplit('/', 1)[0])}/vllm.pid", timeout=15).ok
        vllm["started"] = bool(started or vllm["health"])
        vllm["failure"] = None
        if vllm["started"] and not vllm["healthy"]:
            from spark_cluster.ops.follow import stopped_failure

            vllm["failure"] = stopped_failure(fleet, plan)
        data["vllm"] = vllm
        if vllm["started"]:
            data["healthy"] = healthy and vllm["healthy"]
    return data
