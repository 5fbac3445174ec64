"""Every command, fed what users mistype: one line naming the node or file and the next step.

No traceback, no "internal error"; exit 2 for bad input, 1 for a node that cannot be reached.
"""

from __future__ import annotations

import contextlib
import io
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_cluster.cli import main

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "inventories" / "sim.yaml"


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(argv)
    return exit_.value.code, out.getvalue(), err.getvalue()


def assert_clean(code: int, out: str, err: str) -> None:
    text = out + err
    assert "Traceback" not in text and "internal error" not in text, text
    assert code in (0, 1, 2), (code, text)


def test_logs_of_an_unknown_node_exits_2_naming_the_nodes() -> None:
    code, out, err = run(["logs", str(SIM), "--node", "nosuch"])
    assert code == 2 and out == ""
    assert "'nosuch'" in err and "spark-a, spark-b" in err and "hint:" in err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is


@pytest.fixture(scope="module")
def closed_inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sim.yaml with both nodes on a closed local port and a key file that exists."""
    base = tmp_path_factory.mktemp("inv")
    key = base / "id_ed25519"
    key.write_text("not a key\n")
    known = base / "known_hosts"
    known.write_text("")
    text = SIM.read_text()
    text = text.replace("/run/spark-lab/id_ed25519", str(key)).replace("/run/spark-lab/known_hosts", str(known))
    port = _closed_port()
    text = text.replace("name: sim", "name: closed-port-test").replace("10.117.0.11", "127.0.0.1").replace("10.117.0.12", "127.0.0.2")
    text = text.replace("    port: 22\n", f"    port: {port}\n").replace("connect_timeout: 5", "connect_timeout: 2")
    path = base / "closed.yaml"
    path.write_text(text)
    return path


COMMANDS = (
    ["validate"], ["check"], ["check", "--json"], ["fix", "--dry-run"], ["up", "--dry-run"], ["up"],
    ["up", "--until", "ray"], ["status"], ["status", "--json"], ["logs"], ["down"], ["bench"],
    ["exec", "--", "true"], ["watch", "--count", "1"],
)
NODE_COMMANDS = (["logs"], ["exec", "--", "true"])


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_every_command_on_closed_ports_says_which_node_in_one_line(argv: list[str], closed_inventory: Path) -> None:
    code, out, err = run([argv[0], str(closed_inventory), *argv[1:]])
    assert_clean(code, out, err)
    if argv[0] == "validate" or "--dry-run" in argv:
        assert code == 0, out + err  # no node is asked: the file alone, and it is valid
    else:
        assert code == 1, out + err
        assert "spark-a" in out + err  # the node that did not answer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
       .filter(lambda n: n not in ("spark-a", "spark-b") and not n.startswith("-")),
       argv=st.sampled_from(NODE_COMMANDS))
def test_random_node_names_exit_2(name: str, argv: list[str]) -> None:
    code, out, err = run([argv[0], str(SIM), "--node", name, *argv[1:]])
    assert_clean(code, out, err)
    assert code == 2 and "spark-a, spark-b" in err


@settings(max_examples=30, deadline=None)
@given(command=st.sampled_from(COMMANDS),
       missing=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters="-"),
                       min_size=1, max_size=20))
def test_missing_files_exit_2_naming_the_file(command: list[str], missing: str) -> None:
    path = f"/nonexistent/{missing}.yaml"
    code, out, err = run([command[0], path, *command[1:]])
    assert_clean(code, out, err)
    assert code == 2 and "cannot read" in err


@settings(max_examples=20, deadline=None)
@given(missing=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=20))
def test_diagnose_of_a_missing_log_exits_2(missing: str) -> None:
    code, out, err = run(["diagnose", "--log", f"/nonexistent/{missing}"])
    assert_clean(code, out, err)
    assert code == 2 and "hint:" in err


def test_lan_without_a_key_needs_the_opt_in(tmp_path: Path) -> None:
    lab = (ROOT / "inventories" / "lab.yaml").read_text()
    inv = tmp_path / "open.yaml"
    inv.write_text(lab.replace("  hf_cache: ~/.cache/huggingface", "  hf_cache: ~/.cache/huggingface\n  listen: lan"))
    code, out, err = run(["validate", str(inv)])
    line = next(i + 1 for i, text in enumerate(inv.read_text().splitlines()) if text == "  listen: lan")
    assert code == 2 and f"{inv}:{line}: model.listen: lan without model.api_key_env" in err
    assert "open_without_key: true" in err
    inv.write_text(inv.read_text().replace("  listen: lan", "  listen: lan\n  open_without_key: true"))
    code, out, err = run(["up", str(inv), "--dry-run"])
    assert code == 0 and "--host 0.0.0.0" in out
    assert "# warning: vLLM listens on every interface of spark-a without an API key" in out
    code, out, err = run(["up", str(ROOT / "inventories" / "lab.yaml"), "--dry-run"])
    assert code == 0 and "0.0.0.0" not in out and "--host 127.0.0.1" in out


def test_ray_without_authentication_warns_at_every_up(closed_inventory: Path, tmp_path: Path) -> None:
    """cluster.ray_auth: none leaves Ray's ports open: `up` says so each time, with or without a model."""
    inv = tmp_path / "open-ray.yaml"
    inv.write_text(closed_inventory.read_text().replace("  executor: ray\n", "  executor: ray\n  ray_auth: none\n"))
    said = "Ray runs without authentication (cluster.ray_auth: none)"
    code, out, err = run(["up", str(inv), "--dry-run"])
    assert code == 0 and f"# warning: {said}" in out
    for until in ("ray", "vllm"):
        code, out, err = run(["up", str(inv), "--until", until])
        assert_clean(code, out, err)
        assert code == 1 and err.count(f"warning: {said}") == 1, err
    code, out, err = run(["up", str(closed_inventory), "--until", "ray"])  # token: nothing to warn of
    assert code == 1 and "without authentication" not in err
