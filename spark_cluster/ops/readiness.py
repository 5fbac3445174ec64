"""Whether vLLM serves, asked of the server itself over HTTP: /health, /v1/models, one chat."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from spark_cluster.ops.serve import ServeError, api_key
from spark_cluster.core.serve_plan import ServePlan

HTTP_TIMEOUT_S = 10.0
# A server's first completion pays its warm-up (kernels, allocator, on CPUs the first GEMMs):
# waited for once, patiently. One that does not come back in that time will not: the caller
# says hung rather than asking again (each ask would wait as long).
FIRST_COMPLETION_TIMEOUT_S = 300.0
NO_ANSWER = "no answer to a one-token chat completion in"


def http(url: str, body: dict | None = None, key: str | None = None,
         timeout: float = HTTP_TIMEOUT_S) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def readiness(plan: ServePlan) -> str | None:
    """None when /health is 200, /v1/models lists the model and one chat completion returns."""
    base = plan.endpoint.removesuffix("/v1")
    key = api_key(plan)
    code, text = http(f"{base}/health")
    if code != 200:
        return f"/health answered {code or 'nothing'}"
    code, text = http(f"{plan.endpoint}/models", key=key)
    if code == 401:
        return f"/v1/models wants the API key: {unauthorized_hint(plan)}"
    if code != 200 or plan.served_model_name not in text:
        return f"/v1/models does not list {plan.served_model_name} ({code})"
    # One token: the answer proves the engine runs a forward pass; decoding more only delays ready.
    code, text = http(f"{plan.endpoint}/chat/completions", {
        "model": plan.served_model_name, "max_tokens": 1,
        "messages": [{"role": "user", "content": "Hi"}]}, key=key, timeout=FIRST_COMPLETION_TIMEOUT_S)
    if code == 0 and "timed out" in text:
        return f"{NO_ANSWER} {FIRST_COMPLETION_TIMEOUT_S:.0f} s"
    if code != 200 or '"choices"' not in text:
        return f"a chat completion failed ({code}): {text[:200]}"
    return None


def hung(plan: ServePlan, phase: str | None, problem: str) -> ServeError:
    """What `up` says when vLLM serves /health and lists its model, but a first completion
    (`problem`, a NO_ANSWER) never came back: its engine runs no forward pass."""
    next_step = ("read every node's log (`spark-cluster logs INVENTORY --node NODE`): a rank that died or "
                 "froze is the cause; then `spark-cluster up INVENTORY --restart`")
    return ServeError(f"{plan.head.node}: vLLM answers /health and lists {plan.served_model_name}, but {problem}: "
                      f"its engine is hung (it still runs)\n  next step: {next_step}",
                      cause="hung", node=plan.head.node, phase=phase, evidence=problem,
                      next_step=next_step, log=plan.head.log_path)


def unauthorized_hint(plan: ServePlan) -> str:
    if not plan.secret_env:
        return "the server was started with a key; name its variable in model.api_key_env"
    name = plan.secret_env[0]
    if os.environ.get(name):
        return f"${name} here is not the key the server was started with"
    return f"export {name}=<the key> here"
