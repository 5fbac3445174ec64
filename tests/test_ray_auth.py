"""Ray's own token authentication: the inventory choice, the token's one file per node, the
variables every Ray process and client gets, the state query's bearer token, and `check`.

The lab test (tests/test_ray_e2e.py::test_ray_refuses_whoever_lacks_the_token) proves the same
against real Ray; these prove the commands and records that get it there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spark_cluster.ops import health

from spark_cluster import ui
from spark_cluster.core.inventory import InventoryError, load_inventory, parse_inventory
from spark_cluster.core.programs import source
from spark_cluster.ops.ray_cluster import RayError, bring_up, describe_plans, query_state, start_host_command
from spark_cluster.core.ray_plan import (
    auth_warning,
    config_digest,
    docker_run,
    has_token_auth,
    plan,
    plan_mp,
    version_tuple,
)
from spark_cluster.transport.remote import Fleet, Result
from spark_cluster.ops.serve import start_command
from spark_cluster.core.serve_plan import serve_plan

REPO = Path(__file__).resolve().parents[1]
SIM_PATH = REPO / "inventories" / "sim.yaml"
SIM = load_inventory(SIM_PATH)
LAB = load_inventory(REPO / "inventories" / "lab.yaml")
TOKEN_FILE = "~/.cache/spark-cluster/sim/ray_auth_token"


def with_cluster(inv, **changes):  # type: ignore[no-untyped-def]
    return dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, **changes))


def sim_text(extra: str) -> str:
    text = SIM_PATH.read_text()
    assert "  executor: ray\n" in text
    return text.replace("  executor: ray\n", f"  executor: ray\n{extra}")


# --- the inventory choice ---------------------------------------------------------------------

def test_ray_auth_is_token_unless_the_inventory_says_none() -> None:
    assert SIM.cluster.ray_auth == "token" and LAB.cluster.ray_auth == "token"
    assert parse_inventory(sim_text("  ray_auth: none\n"), SIM_PATH).cluster.ray_auth == "none"


def test_a_wrong_ray_auth_names_the_file_and_line() -> None:
    text = sim_text("  ray_auth: nope\n")
    line = text.splitlines().index("  ray_auth: nope") + 1
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, SIM_PATH)
    assert str(caught.value) == (f"{SIM_PATH}:{line}: cluster.ray_auth must be one of token, none, got 'nope' "
                                 "(hint: did you mean 'none'?)")


@pytest.mark.parametrize("name", ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"])
def test_cluster_env_may_not_set_what_ray_auth_sets(name: str) -> None:
    text = sim_text("").replace("  env: {", f"  env: {{{name}: x, ")
    line = next(i for i, row in enumerate(text.splitlines(), 1) if name in row)
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, SIM_PATH)
    (problem,) = caught.value.problems
    assert (problem.line, problem.message) == (line, f"cluster.env sets {name}, which spark-cluster sets from "
                                                     "cluster.ray_auth")


# --- what Ray and vLLM are started with --------------------------------------------------------

@pytest.mark.parametrize("base", [SIM, LAB], ids=["host", "container"])
def test_every_ray_node_and_the_vllm_driver_get_the_mode_and_the_file(base) -> None:  # type: ignore[no-untyped-def]
    name = base.cluster.name
    path = f"~/.cache/spark-cluster/{name}/ray_auth_token"
    for p in plan(base):
        assert (p.env["RAY_AUTH_MODE"], p.env["RAY_AUTH_TOKEN_PATH"]) == ("token", path)
        assert "RAY_AUTH_TOKEN_PATH" not in p.secrets  # a path: public, shown and recorded
        command = docker_run(base, p) if base is LAB else start_host_command(base, p)
        # The node's shell expands its own home: Ray reads an absolute path.
        assert f"RAY_AUTH_TOKEN_PATH=\"$HOME\"/.cache/spark-cluster/{name}/ray_auth_token" in command
        if base is LAB:  # the file is at the same path inside the container
            volumes = [w for i, w in enumerate(shlex.split(command)) if shlex.split(command)[i - 1] == "-v"]
            assert f"$HOME/.cache/spark-cluster/{name}:$HOME/.cache/spark-cluster/{name}" in volumes
    head = serve_plan(base).head  # vLLM's driver calls ray.init: a Ray client like any other
    assert (head.env["RAY_AUTH_MODE"], head.env["RAY_AUTH_TOKEN_PATH"]) == ("token", path)
    line = start_command(head)
    assert "RAY_AUTH_MODE=token" in line
    assert f"RAY_AUTH_TOKEN_PATH=\"$HOME\"/.cache/spark-cluster/{name}/ray_auth_token" in line


def test_none_says_disabled_and_warns_in_the_plan() -> None:
    open_ray = parse_inventory(sim_text("  ray_auth: none\n"), SIM_PATH)
    for p in plan(open_ray):
        assert p.env["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN_PATH" not in p.env
    warning = auth_warning(open_ray)
    assert warning is not None and "firewall" in warning and "ray_auth: none" in warning
    served = serve_plan(open_ray)
    assert warning in served.warnings and f"# warning: {warning}" in served.render()
    assert auth_warning(SIM) is None and not [w for w in serve_plan(SIM).warnings if "Ray" in w]


def test_executor_mp_has_no_ray_and_no_ray_auth() -> None:
    mp = with_cluster(SIM, executor="mp")
    assert auth_warning(with_cluster(mp, ray_auth="none")) is None
    for p in plan_mp(mp, ["spark-lab/tiny-moe"]):
        assert not [k for k in p.env if k.startswith("RAY_")]
    for c in serve_plan(mp).commands:
        assert not [k for k in c.env if k.startswith("RAY_AUTH")]


def test_the_auth_mode_is_part_of_the_configuration() -> None:
    """A running cluster of the other mode is another configuration: `up` says so, `--restart` replaces it."""
    assert config_digest(SIM) != config_digest(with_cluster(SIM, ray_auth="none"))


# --- the token: one per cluster, a 0600 file on each node, never on a command line ----------------

TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)


class Node:
    """A node whose token file commands really run (under its own HOME); Ray is pretended:
    a `ray start` makes its address alive in the state query."""

    def __init__(self, name: str, home: Path, alive: set[str], address: str) -> None:
        self.name, self.home, self.alive, self.address = name, home, alive, address
        self.calls: list[tuple[str, str | None]] = []

    def run(self, command: str, *, stdin: str | None = None, **_: object) -> Result:
        self.calls.append((command, stdin))
        if "python3 -I -S -c" in command and "api/v0/nodes" in command:
            nodes = [{"ip": ip, "state": "ALIVE", "head": ip.endswith(".10"), "gpus": 1, "message": ""}
                     for ip in sorted(self.alive)]
            out = json.dumps({"version": "2.60.0", "nodes": nodes}) if self.alive else \
                json.dumps({"error": "URLError: <urlopen error [Errno 111] Connection refused>"})
            return Result(self.name, command, out, "", 0, 0.01)
        if "ray_auth_token" in command and "ray.scripts.scripts" not in command:
            done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True,
                                  env={**os.environ, "HOME": str(self.home)})
            return Result(self.name, command, done.stdout, done.stderr, done.returncode, 0.01)
        if "ray.scripts.scripts" in command:
            self.alive.add(self.address)
            return Result(self.name, command, "started\n", "", 0, 0.01)
        if "ray.json" in command and command.startswith("cat "):
            return Result(self.name, command, "", "", 1, 0.01)
        return Result(self.name, command, "", "", 0, 0.01)

    def close(self) -> None:
        pass


@pytest.fixture
def nodes(tmp_path: Path) -> list[Node]:
    alive: set[str] = set()
    return [Node(spec.name, tmp_path / spec.name, alive, str(spec.link_address)) for spec in SIM.nodes]


def token_file(node: Node) -> Path:
    return node.home / ".cache" / "spark-cluster" / "sim" / "ray_auth_token"


def every_word(nodes: list[Node]) -> Iterator[str]:
    for node in nodes:
        for command, stdin in node.calls:
            yield command
            if stdin is not None and "ray_auth_token" not in command:
                yield stdin


def test_up_makes_one_token_per_cluster_in_a_0600_file_sent_on_stdin(nodes: list[Node]) -> None:
    result = bring_up(SIM, Fleet(nodes), deadline_s=5)
    assert result.started == ["spark-a", "spark-b"]
    tokens = {n.name: token_file(n).read_text() for n in nodes}
    token = tokens["spark-a"]
    assert TOKEN_SHAPE.fullmatch(token) and tokens == {"spark-a": token, "spark-b": token}
    for node in nodes:
        assert stat.S_IMODE(token_file(node).stat().st_mode) == 0o600
        assert not list(token_file(node).parent.glob("*.new"))
    # On no command line (`ps`), in no other stdin, in no record ray.json keeps.
    assert not [w for w in every_word(nodes) if token in w]
    written = [(c, s) for n in nodes for c, s in n.calls if s == token]
    assert len(written) == 2 and all("umask 077" in c and "chmod 600" in c for c, _ in written)
    record = next(c for c, _ in nodes[0].calls if "> " in c and "ray.json" in c)
    assert token not in record and token not in json.dumps(describe_plans(plan(SIM)))


def test_a_running_cluster_keeps_its_token_and_a_joining_worker_gets_the_heads(nodes: list[Node]) -> None:
    bring_up(SIM, Fleet(nodes), deadline_s=5)
    token = token_file(nodes[0]).read_text()
    token_file(nodes[1]).unlink()
    nodes[0].alive.discard("192.168.100.11")  # the worker dropped out; the head runs on
    for node in nodes:
        node.calls.clear()
    head_record = nodes[0].run  # `up` finds its record on the head this time

    def with_record(command: str, **kwargs: object) -> Result:
        if command.startswith("cat ") and "ray.json" in command:
            wanted = {"digest": config_digest(SIM), "nodes": describe_plans(plan(SIM))}
            return Result("spark-a", command, json.dumps(wanted), "", 0, 0.01)
        return head_record(command, **kwargs)  # type: ignore[arg-type]

    nodes[0].run = with_record  # type: ignore[method-assign]
    result = bring_up(SIM, Fleet(nodes), deadline_s=5)
    assert result.started == ["spark-b"]
    assert token_file(nodes[0]).read_text() == token == token_file(nodes[1]).read_text()
    assert not [c for c, s in nodes[0].calls if s is not None]  # the head's file was only read


def test_an_unwritable_state_directory_is_one_line_naming_the_node(nodes: list[Node]) -> None:
    nodes[1].home.mkdir(parents=True)
    (nodes[1].home / ".cache").write_text("a file where a directory belongs")
    with pytest.raises(RayError) as caught:
        bring_up(SIM, Fleet(nodes), deadline_s=5)
    assert str(caught.value).startswith("spark-b: could not write the Ray token file "
                                        "~/.cache/spark-cluster/sim/ray_auth_token: ")
    assert "192.168.100.11" not in nodes[0].alive


# --- the state query: the bearer token, read on the head ------------------------------------------

class Dashboard(BaseHTTPRequestHandler):
    token = "tok-" + "x" * 39

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_response(401 if "Authorization" not in self.headers else 403)
            self.end_headers()
            self.wfile.write(b"Unauthorized: Missing authentication token")
            return
        body = {"/api/version": {"ray_version": "2.60.0"}}.get(self.path, {"data": {"result": {"result": [
            {"node_ip": "192.168.100.10", "state": "ALIVE", "is_head_node": True, "resources_total": {"GPU": 1}}]}}})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def ask(url: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-I", "-c", source("ray_state"), url, *args], capture_output=True, text=True,
                          timeout=30)
    return json.loads(done.stdout)


def test_the_state_query_sends_the_token_from_the_file(dashboard: str, tmp_path: Path) -> None:
    path = tmp_path / "ray_auth_token"
    path.write_text(Dashboard.token)
    answer = ask(dashboard, str(path))
    assert answer["version"] == "2.60.0" and answer["nodes"][0]["ip"] == "192.168.100.10"
    path.write_text("another")
    assert ask(dashboard, str(path)) == {"error": "HTTP 403 Forbidden", "refused": 403, "unread": None}
    refused = ask(dashboard, str(tmp_path / "gone"))
    assert refused["refused"] == 401 and refused["unread"].startswith(f"cannot read {tmp_path / 'gone'}: ")
    assert ask(dashboard)["refused"] == 401  # ray_auth: none, and a Ray that wants a token


class Answering:
    def __init__(self, answer: dict) -> None:
        self.name, self.answer, self.commands = "spark-a", answer, []

    def run(self, command: str, **_: object) -> Result:
        self.commands.append(command)
        return Result(self.name, command, json.dumps(self.answer), "", 0, 0.01)

    def close(self) -> None:
        pass


def test_the_query_names_the_file_never_the_token() -> None:
    head = Answering({"version": "2.60.0", "nodes": []})
    assert query_state(SIM, head).reachable  # type: ignore[arg-type]
    assert head.commands[0].endswith(' "$HOME"/.cache/spark-cluster/sim/ray_auth_token')
    query_state(with_cluster(SIM, ray_auth="none"), head)  # type: ignore[arg-type]
    assert head.commands[1].endswith(":8265")  # no file, no header


@pytest.mark.parametrize("answer, inventory, says", [
    ({"error": "HTTP 403 Forbidden", "refused": 403, "unread": None}, SIM,
     "Ray refuses our token (HTTP 403 Forbidden): the running Ray was started with another token than the one "
     "in ~/.cache/spark-cluster/sim/ray_auth_token on spark-a\n  hint: run `up --restart`"),
    ({"error": "HTTP 401 Unauthorized", "refused": 401, "unread": "cannot read /x: No such file or directory"}, SIM,
     "Ray refuses our token (HTTP 401 Unauthorized): the head has no token to send, cannot read /x: No such file "
     "or directory\n  hint: run `up --restart`"),
    ({"error": "HTTP 401 Unauthorized", "refused": 401, "unread": None}, with_cluster(SIM, ray_auth="none"),
     "Ray refuses requests without a token (HTTP 401 Unauthorized): it was started with token authentication, "
     "the inventory says cluster.ray_auth: none\n  hint: run `up --restart`"),
])
def test_a_ray_that_refuses_us_is_not_called_unreachable(answer: dict, inventory, says: str) -> None:  # type: ignore[no-untyped-def]
    state = query_state(inventory, Answering(answer))  # type: ignore[arg-type]
    assert state.refused and not state.reachable and state.error.startswith(says)
    # `up` stops there, saying so, rather than starting a second Ray over the running one.
    with pytest.raises(RayError) as caught:
        bring_up(inventory, Fleet([Answering(answer)]))  # type: ignore[list-item]
    assert str(caught.value) == state.error


def test_status_says_ray_refuses_our_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    refusal = {"error": "HTTP 403 Forbidden", "refused": 403, "unread": None}

    class Head(Answering):
        def run(self, command: str, **_: object) -> Result:
            if "api/v0/nodes" in command:
                return super().run(command)
            return Result(self.name, command, "127601228 123731620 \n36, 4.32\nup up\n", "", 0, 0.01)

    head, worker = Head(refusal), Head(refusal)
    worker.name = "spark-b"
    inventory = dataclasses.replace(SIM, model=None)
    data = health.collect_status(inventory, Fleet([head, worker]))
    assert data["ray"]["refused"] is True and data["healthy"] is False
    out = io.StringIO()
    monkeypatch.setattr(ui.CONSOLES, "out", Console(file=out, width=300))
    ui.status_view(data, inventory)
    shown = out.getvalue()
    assert "ray: Ray refuses our token (HTTP 403 Forbidden)" in shown and "up --restart" in shown
    assert "not running" not in shown
    assert "ray refuses our token" in ui.summary_line(data)


# --- check: a Ray that has token authentication ----------------------------------------------------

@pytest.mark.parametrize("version, has", [("2.52.0", True), ("2.60.0", True), ("2.52.0rc1", True),
                                          ("2.51.1", False), ("2.9.3", False), ("3.0.0", True)])
def test_token_authentication_came_with_ray_2_52(version: str, has: bool) -> None:
    assert has_token_auth(version) is has


def test_version_tuple_reads_the_leading_numbers() -> None:
    assert version_tuple("2.52.0rc1") == (2, 52, 0) and version_tuple("2.60.0.dev0") == (2, 60, 0)
    assert version_tuple("nightly") == ()
