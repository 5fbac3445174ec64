"""`status`'s look at every layer: each node (memory, GPU, carrier per rail), Ray, vLLM as its own
endpoints tell it (/health, /v1/models, /metrics), its engine judged for a hang, and the verdict."""

from __future__ import annotations

import time

from spark_cluster.core.observation import NodeSample, Observation
from spark_cluster.core.serve_plan import ServePlan
from spark_cluster.core.verdict import verdict
from spark_cluster.ops.readiness import http, unauthorized_hint
from spark_cluster.ops.serve import api_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from spark_cluster.ops.engine_watch import Watcher

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
# `status` alone: how long one probe may go unanswered with no engine step before vLLM is hung
# (a healthy engine answers in well under a second; a busy one steps meanwhile).
STATUS_HANG_AFTER_S = 10.0


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


def node_view(sample: NodeSample, rails: list[str]) -> dict[str, object]:
    """One node as `status --json` shows it: memory, GPU, each rail's carrier in the inventory's order."""
    return {"memory_used_gib": round(sample.memory_used_gib, 1) if sample.memory_used_gib is not None else None,
            "memory_available_gib": round(sample.memory_available_gib, 1)
            if sample.memory_available_gib is not None else None,
            "gpu_temperature_c": sample.gpu_temperature_c, "gpu_power_w": sample.gpu_power_w,
            "links": [{True: "up", False: "down"}.get(sample.carrier.get(rail), "?") for rail in rails],  # type: ignore[arg-type]
            "links_down": sample.links_down, "boot_id": sample.boot_id}


def collect_status(inventory, fleet, previous: dict | None = None, watcher: Watcher | None = None,  # noqa: ANN001
                   hang_after_s: float = STATUS_HANG_AFTER_S) -> dict[str, object]:
    """Every layer at once: each node, Ray's view, vLLM's endpoints and engine, and the verdict.

    Throughput comes from two samples of vLLM's counters: `previous` (watch's last snapshot)
    and now, or, without one, a sample taken first and another at least RATE_WINDOW_S later.
    The engine is judged by `watcher` (watch's, kept from refresh to refresh) or, alone, by one
    probe and the engine's step counter for at most `hang_after_s` (at once when it answers).
    """
    plan = None
    if inventory.model is not None:
        from spark_cluster.ops.reach import reach
        from spark_cluster.core.serve_plan import serve_plan

        plan = serve_plan(inventory)
        with reach(plan, fleet) as api:
            return _collect(inventory, fleet, previous, plan, api, watcher, hang_after_s)
    return _collect(inventory, fleet, previous, None, None, watcher, hang_after_s)


def _collect(inventory, fleet, previous, plan, api, watcher, hang_after_s) -> dict[str, object]:  # noqa: ANN001, PLR0913
    """`api`: the plan with an endpoint this machine reaches (a forward to a loopback API)."""
    first: tuple[float, dict[str, float] | None] | None = None
    if plan is not None and previous is None:
        first = (time.monotonic(), _metrics(api))
    obs, ray = _nodes_and_runtime(inventory, fleet)
    nodes = {name: ({"reachable": True, "error": None,
                     **node_view(s, [r.interface for r in inventory.node(name).link.rails])}
                    if s.reachable else {"reachable": False, "error": s.error}) for name, s in obs.nodes.items()}
    data: dict[str, object] = {"cluster": inventory.cluster.name, "nodes": nodes, "ray": ray,
                               "time": round(time.time(), 3)}
    obs.vllm_started = False
    reading = None
    if plan is not None:
        vllm, reading, probe_usage = _vllm(inventory, fleet, plan, api, obs, watcher, hang_after_s)
        if first is not None and first[1]:
            time.sleep(max(0.0, RATE_WINDOW_S - (time.monotonic() - first[0])))
            last = _metrics(api) or vllm["metrics"]
            vllm["throughput"] = throughput(first[1], _less(last, probe_usage), time.monotonic() - first[0])
        elif previous and (previous.get("vllm") or {}).get("metrics"):
            vllm["throughput"] = throughput(previous["vllm"]["metrics"], vllm["metrics"],
                                            data["time"] - previous.get("time", data["time"]))
        else:
            vllm["throughput"] = {}
        data["vllm"] = vllm
    v = verdict(obs, reading)
    data["verdict"] = v.as_dict()
    data["healthy"] = v.exit_code == 0
    return data


def _nodes_and_runtime(inventory, fleet) -> tuple[Observation, dict[str, object]]:  # noqa: ANN001
    from spark_cluster.core.node_sample import parse_probe, probe_command
    from spark_cluster.ops.ray_state import query_state

    def node_status(node) -> NodeSample:  # noqa: ANN001 - Node
        rails = [r.interface for r in inventory.node(node.name).link.rails]
        return parse_probe(node.run(probe_command(rails), timeout=20).stdout)

    samples = {name: NodeSample(False, error=str(value).splitlines()[0]) if isinstance(value, Exception) else value
               for name, value in fleet.map(node_status).items()}
    obs = Observation(time=time.monotonic(), nodes=samples)
    if inventory.cluster.executor == "mp":  # vLLM joins its nodes itself: there is no Ray to ask
        return obs, {"used": False, "reachable": False, "nodes": [], "error": "not used (executor mp)"}
    if not samples[inventory.head.name].reachable:
        obs.runtime_ok = False
        obs.runtime_detail = f"{inventory.head.name}, Ray's head, does not answer"
        return obs, {"used": True, "reachable": False, "error": "head unreachable"}
    state = query_state(inventory, fleet.node(inventory.head.name))
    obs.runtime_ok = state.healthy(inventory)
    if not obs.runtime_ok:
        missing = [s.name for s in inventory.nodes if not state.alive(str(s.link_address))]
        obs.runtime_detail = (state.error.splitlines()[0] if not state.reachable and state.error
                              else f"Ray has no live node with a GPU for {', '.join(missing)}")
    return obs, {"used": True, **state.as_dict()}


def _vllm(inventory, fleet, plan, api, obs, watcher, hang_after_s):  # noqa: ANN001, ANN202
    """vLLM's endpoints, whether it runs, why not, and its engine judged (fills `obs`)."""
    from spark_cluster.core.errors import SparkClusterError
    from spark_cluster.core.shell import remote_path
    from spark_cluster.ops import serve
    from spark_cluster.ops.engine_watch import Prober, judge_once, log_hint, opened

    vllm = vllm_health(api)
    vllm["endpoint"] = plan.endpoint
    head_ok = obs.nodes[inventory.head.name].reachable
    # Started by `up` (its pid file is there) or answering: then it must be healthy. Never
    # started (`up --until ray`) is said as such and does not make the cluster unhealthy.
    started = head_ok and fleet.node(inventory.head.name).run(
        f"test -f {remote_path(plan.head.log_path.rsplit('/', 1)[0])}/vllm.pid", timeout=15).ok
    vllm["started"] = obs.vllm_started = bool(started or vllm["health"])
    obs.vllm_healthy = bool(vllm["healthy"])
    obs.vllm_detail = vllm["error"] or (f"/health answered {vllm['health']}" if vllm["health"] else
                                        f"nothing answers at {plan.endpoint}")
    try:
        obs.vllm_running = bool(vllm["health"]) or all(
            serve.running(fleet.node(c.node), c) for c in plan.commands if obs.nodes[c.node].reachable)
    except SparkClusterError:
        obs.vllm_running = bool(vllm["health"])
    vllm["failure"] = None
    if vllm["started"] and not vllm["healthy"]:
        from spark_cluster.ops.follow import stopped_failure

        vllm["failure"] = obs.failure = stopped_failure(fleet, plan)
    reading, usage = None, (0, 0)
    if vllm["healthy"]:
        if watcher is not None:
            reading = watcher.look(api)
        else:
            # The probe outlives the look: one timed out before the verdict would leave nothing to judge by.
            prober = Prober(lambda: opened(plan, fleet), plan.served_model_name, api_key(plan), 2 * hang_after_s + 5)
            reading, _, last = judge_once(api, prober, hang_after_s, hint=lambda: log_hint(fleet, plan))
            prober.wait(0)
            usage = prober.usage
            obs.probe = prober.view()
        vllm["engine"] = {"state": reading.state, "frozen_s": reading.frozen_s, "evidence": list(reading.evidence)}
    return vllm, reading, usage


def _less(metrics: dict[str, float], usage: tuple[int, int]) -> dict[str, float]:
    """The counters without our probe's own tokens: it is not the users' load."""
    out = dict(metrics)
    for key, own in (("prompt_tokens_total", usage[0]), ("generation_tokens_total", usage[1])):
        if key in out and own:
            out[key] = max(0.0, out[key] - own)
    return out
