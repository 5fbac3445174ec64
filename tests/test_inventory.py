"""Inventory loading: the example loads, and every class of mistake is reported at its line."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

import pytest

from spark_cluster.core.errors import UsageError
from spark_cluster.core.inventory import (
    Inventory,
    InventoryError,
    Problem,
    load_inventory,
    parse_inventory,
)

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "inventories" / "lab.yaml"

# Every line is numbered in the comment on its right; the cases below replace whole lines,
# so the numbers stay true in every variant.
BASE = """\
cluster:
  name: t
  runtime: container
  image: nvcr.io/nvidia/vllm:26.05-py3
  ray_port: 6379
  env: {NCCL_DEBUG: INFO}
  ssh: {host_key_policy: strict, connect_timeout: 10}
nodes:
  - name: a
    address: 10.0.0.1
    user: nvidia
    port: 22
    identity: ~/.ssh/id_ed25519
    role: head
    link:
      mtu: 9000
      rails:
        - {interface: enp1s0f1np1, hca: rocep1s0f1, address: 192.168.100.10/24}
        - {interface: enP2p1s0f1np1, hca: roceP2p1s0f1, address: 192.168.101.10/24}
  - name: b
    address: 10.0.0.2
    user: nvidia
    port: 22
    identity: keys/b
    role: worker
    link:
      mtu: 9000
      rails:
        - {interface: enp1s0f1np1, hca: rocep1s0f1, address: 192.168.100.11/24}
        - {interface: enP2p1s0f1np1, hca: roceP2p1s0f1, address: 192.168.101.11/24}
model:
  recipe: qwen3-235b-a22b-gptq-int4
  args: {max-model-len: 8192, enforce-eager: true}
  hf_cache: ~/.cache/huggingface
"""
#  1 cluster            9 - name: a          17 rails           25 role: worker     33 args
#  2 name              10 address            18 rail a0         26 link             34 hf_cache
#  3 runtime           11 user               19 rail a1         27 mtu
#  4 image             12 port               20 - name: b       28 rails
#  5 ray_port          13 identity           21 address         29 rail b0
#  6 env               14 role: head         22 user            30 rail b1
#  7 ssh               15 link               23 port            31 model
#  8 nodes             16 mtu                24 identity        32 recipe


def rail(address: str, interface: str = "enp1s0f1np1", hca: str = "rocep1s0f1") -> str:
    """A rail line as in BASE (rails are flow mappings, one line each)."""
    return f"        - {{interface: {interface}, hca: {hca}, address: {address}}}"


def variant(**lines: str) -> str:
    """BASE with whole lines replaced: variant(l12='    port: 70000')."""
    out = BASE.splitlines()
    for key, text in lines.items():
        out[int(key[1:]) - 1] = text
    return "\n".join(out) + "\n"


def problems_of(text: str, path: str = "/inv/test.yaml") -> tuple[Problem, ...]:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, path)
    return caught.value.problems


def test_base_is_valid() -> None:
    inv = parse_inventory(BASE, "/inv/test.yaml")
    assert [n.name for n in inv.nodes] == ["a", "b"]


def test_lab_example_loads_with_the_documented_values() -> None:
    inv = load_inventory(LAB)
    assert inv.path == LAB
    assert inv.cluster.name == "lab"
    assert inv.cluster.runtime == "container"
    assert inv.cluster.image == "nvcr.io/nvidia/vllm:26.04-py3"
    assert inv.cluster.executor == "ray" and inv.cluster.ray_port == 6379
    assert inv.cluster.ssh.host_key_policy == "strict"
    assert inv.head.name == "spark-a" and [w.name for w in inv.workers] == ["spark-b"]
    for node, host in zip(inv.nodes, (10, 11), strict=True):
        assert node.user == "nvidia" and node.port == 22
        assert node.link.mtu == 9000
        assert [(r.interface, r.hca) for r in node.link.rails] == [
            ("enp1s0f1np1", "rocep1s0f1"),
            ("enP2p1s0f1np1", "roceP2p1s0f1"),
        ]
        assert [str(r.address) for r in node.link.rails] == [f"192.168.100.{host}/24", f"192.168.101.{host}/24"]
        assert node.link_address == ipaddress.IPv4Address(f"192.168.100.{host}")
    assert inv.model is not None
    assert inv.model.recipe == "qwen3-235b-a22b-gptq-int4" and inv.model.name is None
    assert inv.model.hf_cache == "~/.cache/huggingface"
    lab_lines = LAB.read_text().splitlines()
    assert lab_lines[inv.head.line - 1].strip() == "- name: spark-a"


# (case id, replaced lines, line of the problem, words in its message, words in its hint)
CASES = [
    ("unknown key", {"l14": "    rol: head"}, 14, "unknown key 'rol' in nodes[0]", "did you mean 'role'?"),
    ("missing key", {"l10": "    # no address"}, 9, "missing required key 'address' in nodes[0]", "address:"),
    ("missing cluster name", {"l2": "  # none"}, 1, "missing required key 'name' in cluster", ""),
    ("key without value", {"l10": "    address:"}, 10, "nodes[0].address has no value", ""),
    ("quoted port", {"l12": '    port: "22"'}, 12, "port must be a whole number, got the string '22'", "quotes"),
    ("boolean port", {"l12": "    port: yes"}, 12, "got the boolean true", ""),
    ("port range", {"l12": "    port: 70000"}, 12, "between 1 and 65535, got 70000", ""),
    ("number as name", {"l9": "  - name: 1"}, 9, "nodes[0].name must be text, got the number 1", "quotes"),
    ("bad node name", {"l9": "  - name: Spark_A"}, 9, "a node name is 1-63 lowercase", ""),
    ("bad cluster name", {"l2": "  name: -lab"}, 2, "a cluster name is 1-40", ""),
    ("runtime typo", {"l3": "  runtime: contaner"}, 3, "must be one of container, host", "'container'"),
    ("image required", {"l4": "  # no image"}, 1, "cluster.image is required when runtime is container", ""),
    ("image with a space", {"l4": "  image: nvcr.io/nvidia/vllm 26.05"}, 4, "an image is a docker reference", ""),
    ("image uppercase path", {"l4": "  image: nvcr.io/NVIDIA/vllm:1"}, 4, "docker reference", ""),
    ("ray_port boolean", {"l5": "  ray_port: true"}, 5, "got the boolean true", ""),
    ("env name", {"l6": "  env: {1BAD: x}"}, 6, "key '1BAD' in cluster.env is not allowed", ""),
    ("env boolean", {"l6": "  env: {A: on}"}, 6, "cluster.env.A must be text or a number, got the boolean", ""),
    ("env newline", {"l6": '  env: {A: "x\\ny"}'}, 6, "control characters", ""),
    ("timeout zero", {"l7": "  ssh: {connect_timeout: 0}"}, 7, "connect_timeout must be more than 0", ""),
    ("timeout nan", {"l7": "  ssh: {connect_timeout: .nan}"}, 7, "connect_timeout must be more than 0", ""),
    ("host key typo", {"l7": "  ssh: {host_key_policy: accept_new}"}, 7, "strict, accept-new", "'accept-new'"),
    ("known_hosts unsafe", {"l7": "  ssh: {known_hosts: '~/kh;ls'}"}, 7, "a local path may contain only", ""),
    ("shell in address", {"l10": '    address: "a; rm -rf /"'}, 10, "host name may contain only letters", ""),
    ("option as address", {"l10": "    address: -oProxyCommand=x"}, 10, "host name", ""),
    ("bad IPv4", {"l10": "    address: 10.0.0.256"}, 10, "'10.0.0.256' is not a valid IP address", ""),
    ("bad IPv6", {"l10": "    address: 'fe80::1::2'"}, 10, "not a valid IP address", ""),
    ("bad user", {"l11": "    user: Nvidia"}, 11, "a user name is 1-32 lowercase", ""),
    ("identity unsafe", {"l13": "    identity: ~/.ssh/id rsa"}, 13, "a local path may contain only", ""),
    ("role choice", {"l25": "    role: wroker"}, 25, "must be one of head, worker", "'worker'"),
    ("mtu range", {"l16": "      mtu: 100"}, 16, "between 576 and 9216", ""),
    ("shell in interface", {"l18": rail("192.168.100.10/24", '"eth0 $(x)"')}, 18, "an interface name is 1-15", ""),
    ("interface too long", {"l18": rail("192.168.100.10/24", "enp1s0f1np1xxxxx")}, 18, "IFNAMSIZ", ""),
    ("hca as option", {"l18": rail("192.168.100.10/24", "enp1s0f1np1", "-x")}, 18, "RDMA device", ""),
    (
        "rail without prefix",
        {"l29": rail("192.168.100.11")},
        29,
        "not an IPv4 address with a prefix length",
        "192.168.100.10/24",
    ),
    ("rail network address", {"l29": rail("192.168.100.0/24")}, 29, "is the network address of 192.168.100.0/24", ""),
    ("rail broadcast address", {"l29": rail("192.168.100.255/24")}, 29, "is the broadcast address", ""),
    ("rail /32", {"l29": rail("192.168.100.11/32")}, 29, "/8 to /31", ""),
    ("rail loopback", {"l29": rail("127.0.0.2/8")}, 29, "unicast", ""),
    (
        "rail other subnet",
        {"l29": rail("192.168.200.11/24")},
        29,
        "192.168.200.11/24 is not in 192.168.100.0/24, the subnet of rails[0] on 'a'",
        "rail 0 of every node",
    ),
    ("rail prefix differs", {"l29": rail("192.168.100.11/25")}, 29, "is not in 192.168.100.0/24", ""),
    (
        "rail address reused",
        {"l29": rail("192.168.100.10/24")},
        29,
        "rail address 192.168.100.10 is also used by nodes[0].link.rails[0] (line 18)",
        "",
    ),
    (
        "twins share subnet",
        {"l19": rail("192.168.100.20/24", "enP2p1s0f1np1", "roceP2p1s0f1")},
        19,
        "rails[0] and rails[1] of one node share subnet 192.168.100.0/24",
        "one subnet per twin",
    ),
    (
        "twins share interface",
        {"l19": rail("192.168.101.10/24", "enp1s0f1np1", "roceP2p1s0f1")},
        19,
        "use the same interface 'enp1s0f1np1'",
        "",
    ),
    ("rail count differs", {"l30": "        # one rail"}, 28, "node 'b' has 1 rail(s) but 'a' has 2", ""),
    (
        "too many rails",
        {
            "l19": "        - {interface: enP2p1s0f1np1, hca: roceP2p1s0f1, address: 192.168.101.10/24}\n"
            + "        - {interface: e3, hca: r3, address: 10.3.0.1/24}\n" * 4
        },
        17,
        "rails must be a list of 1 to 4 rails",
        "",
    ),
    ("mtu differs", {"l27": "      mtu: 1500"}, 27, "node 'b' has mtu 1500 but 'a' has 9000", "same MTU"),
    ("duplicate node name", {"l20": "  - name: a"}, 20, "duplicate node name 'a' (also nodes[0], line 9)", ""),
    ("duplicate address", {"l21": "    address: 10.0.0.1"}, 21, "duplicate node address '10.0.0.1'", ""),
    ("two heads", {"l25": "    role: head"}, 25, "node 'b' is a second head (the first is 'a', line 14)", ""),
    ("no head", {"l14": "    role: worker"}, 8, "no node has role: head", "role: head"),
    ("model both", {"l33": "  name: Qwen/Qwen3-235B-A22B-GPTQ-Int4"}, 31, "model sets both recipe and name", ""),
    ("model neither", {"l32": "  # none"}, 31, "model needs a recipe or a name", ""),
    ("model name", {"l32": "  name: Qwen/Qwen3/x"}, 32, "Hugging Face repo id", ""),
    ("args flag", {"l33": "  args: {Max_Len: 1}"}, 33, "key 'Max_Len' in model.args is not allowed", ""),
    ("args null", {"l33": "  args: {enforce-eager: null}"}, 33, "flag 'enforce-eager' has no value", "true"),
    ("args type", {"l33": "  args: --x"}, 33, "a mapping of flag: value or a list of words", ""),
    ("hf_cache ..", {"l34": "  hf_cache: ~/../etc"}, 34, "a remote path", ""),
    ("hf_cache shell", {"l34": "  hf_cache: ~/x;rm"}, 34, "a remote path", ""),
    ("hf_cache relative", {"l34": "  hf_cache: cache"}, 34, "starts with / or ~/", ""),
    ("duplicate key", {"l13": "    user: root"}, 13, "duplicate key 'user' (first at line 11)", ""),
    ("tab indent", {"l12": "\tport: 22"}, 12, "YAML syntax error", "tabs"),
    ("colon in value", {"l10": "    address: a: b"}, 10, "YAML syntax error: mapping values are not allowed", ""),
    ("unsupported tag", {"l12": "    port: !!float 22"}, 12, "unsupported YAML tag", ""),
    ("python tag", {"l12": "    port: !!python/object:os.system x"}, 12, "unsupported YAML tag", ""),
    ("merge key", {"l12": "    <<: {port: 22}"}, 12, "merge keys", ""),
    ("bad number", {"l12": "    port: 0x_"}, 12, "'0x_' is not a valid number", ""),
    ("unknown top key", {"l31": "modle:"}, 31, "unknown key 'modle' in the top level", "did you mean 'model'?"),
]


@pytest.mark.parametrize(("edits", "line", "message", "hint"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_mistake_is_reported_at_its_line(edits: dict[str, str], line: int, message: str, hint: str) -> None:
    found = problems_of(variant(**edits))
    matching = [p for p in found if message in p.message]
    assert matching, f"no problem says {message!r}; got:\n" + "\n".join(map(str, found))
    assert matching[0].line == line, str(matching[0])
    assert hint in matching[0].hint
    assert all(p.file == "/inv/test.yaml" for p in found)


def test_unknown_key_message_matches_the_documented_form() -> None:
    (problem,) = [p for p in problems_of(variant(l25="    rol: worker")) if "unknown" in p.message]
    assert str(problem) == "/inv/test.yaml:25: unknown key 'rol' in nodes[1] (hint: did you mean 'role'?)"


def test_unclosed_flow_mapping_points_at_the_line_after_it() -> None:
    (problem,) = problems_of(variant(l18="        - {interface: enp1s0f1np1, hca: rocep1s0f1"))
    assert problem.message.startswith("YAML syntax error")
    assert problem.line == 19


def test_all_problems_are_reported_at_once_in_file_order() -> None:
    found = problems_of(variant(l3="  runtime: contaner", l12="    port: nope", l27="      mtu: 1500"))
    assert [p.line for p in found] == [3, 12, 27]
    assert "runtime" in found[0].message and "port" in found[1].message and "mtu" in found[2].message
    assert len(str(InventoryError(found)).splitlines()) == 3


def test_yaml_and_schema_problems_are_reported_together() -> None:
    found = problems_of(variant(l13="    user: root", l27="      mtu: 1500"))
    assert [(p.line, p.message.split(" ")[0]) for p in found] == [(13, "duplicate"), (27, "node")]


def test_duplicate_keys_are_found_at_every_level() -> None:
    text = variant(l2="  name: t\n  name: u", l17="      rails:\n      mtu: 9000\n      rails:")
    lines = text.splitlines()
    found = problems_of(text)
    dups = [p for p in found if p.message.startswith("duplicate key")]
    assert [p.line for p in dups] == [3, 19, 20]
    assert lines[2] == "  name: u" and lines[18] == "      mtu: 9000" and lines[19] == "      rails:"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("", 0, "the file is empty"),
        ("# only a comment\n", 0, "the file is empty"),
        ("- a\n- b\n", 1, "the top level must be a mapping of keys to values, got a list"),
        ("just text\n", 1, "the top level must be a mapping"),
        ("cluster: {name: x}\n---\nnodes: []\n", 2, "another document"),
        ("a: *nowhere\n", 1, "undefined alias"),
        ("a: 1\nb: \x00\n", 2, "character '\\x00' is not allowed"),
        ("cluster:\n  name: x\n  image: i\nnodes: []\n", 4, "nodes must be a list of at least one node"),
        ("cluster:\n  name: x\n  image: i\nnodes: {a: 1}\n", 4, "got a mapping"),
        ("cluster: [x]\nnodes:\n  - 3\n", 1, "cluster must be a mapping"),
    ],
)
def test_whole_file_mistakes(text: str, line: int, message: str) -> None:
    found = problems_of(text)
    assert any(p.line == line and message in p.message for p in found), found


def test_a_node_that_is_not_a_mapping_does_not_also_claim_no_head() -> None:
    found = problems_of(BASE.replace("  - name: a\n", "  - 3\n  - name: c\n", 1).replace("role: head", "role: worker"))
    assert not any("no node has role: head" in p.message for p in found)
    assert any(p.message == "nodes[0] must be a mapping of keys to values, got the number 3" for p in found)


def test_alias_bombs_and_deep_nesting_are_refused_quickly() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for level in "bcdefgh":
        prev = chr(ord(level) - 1)
        bomb += f"{level}: &{level} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
    assert "expands to more than" in problems_of(bomb)[0].message
    assert "nest" in problems_of("a: " + "[" * 5000 + "]" * 5000)[0].message
    assert "contains it" in problems_of("a: &a [*a]\n")[0].message


def test_aliases_are_allowed() -> None:
    text = BASE.replace("  env: {NCCL_DEBUG: INFO}", "  env: &e {NCCL_DEBUG: INFO}").replace(
        "model:\n", "x-unused: 1\nmodel:\n"
    )
    assert "unknown key 'x-unused'" in problems_of(text)[0].message
    ok = BASE.replace("    user: nvidia\n", "    user: &u nvidia\n", 1).replace("    user: nvidia\n", "    user: *u\n")
    assert parse_inventory(ok, "x.yaml").nodes[1].user == "nvidia"
    # A problem in an aliased value is reported where the alias is used, not only at the anchor.
    bad = BASE.replace("    port: 22\n", '    port: &p "22"\n', 1).replace("    port: 22\n", "    port: *p\n", 1)
    assert [p.line for p in problems_of(bad)] == [12, 23]


def test_local_paths_expand_home_and_resolve_against_the_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/tester")
    text = BASE.replace("  ssh: {host_key_policy: strict, connect_timeout: 10}", "  ssh: {known_hosts: ./kh}")
    inv = parse_inventory(text, "/srv/inv/lab.yaml")
    assert inv.nodes[0].identity == "/home/tester/.ssh/id_ed25519"
    assert inv.nodes[1].identity == "/srv/inv/keys/b"
    assert inv.cluster.ssh.known_hosts == "/srv/inv/kh"
    assert inv.cluster.ssh.host_key_policy == "strict" and inv.cluster.ssh.connect_timeout == 10.0
    assert inv.path == Path("/srv/inv/lab.yaml")
    assert inv.model is not None and inv.model.hf_cache == "~/.cache/huggingface"  # remote: not expanded here


def test_args_mapping_is_flattened_to_argv_words() -> None:
    args = (
        "  args: {max-model-len: 8192, enforce-eager: true, trust-remote-code: false, --dtype: auto,"
        " gpu-memory-utilization: 0.85, cuda-graph-sizes: [1, 2], speculative-config: {method: ngram, n: 3}}"
    )
    inv = parse_inventory(variant(l33=args), "x.yaml")
    assert inv.model is not None
    assert inv.model.args == (
        "--max-model-len", "8192", "--enforce-eager", "--no-trust-remote-code", "--dtype", "auto",
        "--gpu-memory-utilization", "0.85",
        "--cuda-graph-sizes", "1", "2", "--speculative-config", '{"method":"ngram","n":3}',
    )  # fmt: skip


def test_args_list_is_kept_as_given() -> None:
    inv = parse_inventory(variant(l33='  args: ["--max-model-len", 8192, "--served-model-name", "q 3"]'), "x.yaml")
    assert inv.model is not None and inv.model.args == ("--max-model-len", "8192", "--served-model-name", "q 3")


def test_api_key_env_names_a_variable_and_never_echoes_a_key() -> None:
    inv = parse_inventory(variant(l34="  api_key_env: SPARK_API_KEY"), "x.yaml")
    assert inv.model is not None and inv.model.api_key_env == "SPARK_API_KEY"
    assert parse_inventory(BASE, "x.yaml").model.api_key_env is None  # type: ignore[union-attr]
    key = "sk-proj-4f9a8b7c6d5e"
    (problem,) = problems_of(variant(l34=f"  api_key_env: {key}"))
    assert problem.line == 34 and "NAME of an environment variable" in problem.message
    assert key not in str(problem)


def test_model_by_name_and_no_model() -> None:
    inv = parse_inventory(variant(l32="  name: Qwen/Qwen3-235B-A22B-GPTQ-Int4"), "x.yaml")
    assert inv.model is not None and inv.model.name == "Qwen/Qwen3-235B-A22B-GPTQ-Int4" and inv.model.recipe is None
    no_model = BASE.split("model:\n")[0]
    assert parse_inventory(no_model, "x.yaml").model is None


def test_defaults_apply_when_keys_are_left_out() -> None:
    text = """\
cluster: {name: solo, runtime: host, python: /opt/vllm/bin/python}
nodes:
  - name: s
    address: spark-a.local
    user: nvidia
    role: head
    link: {rails: [{interface: enp1s0f1np1, hca: rocep1s0f1, address: 192.168.100.10/24}]}
"""
    inv = parse_inventory(text, "x.yaml")
    c = inv.cluster
    assert (c.runtime, c.image, c.python, c.ray_port, c.executor, dict(c.env)) == (
        "host",
        None,
        "/opt/vllm/bin/python",
        6379,
        "ray",
        {},
    )
    assert c.ssh == dataclasses.replace(c.ssh, host_key_policy="strict", known_hosts=None, connect_timeout=10.0)
    node = inv.head
    assert (node.port, node.identity, node.link.mtu, node.line) == (22, None, 9000, 3)
    assert inv.workers == () and inv.model is None


@pytest.mark.parametrize(
    "address", ["10.0.0.11", "spark-a.local", "spark_a", "fe80::1%enp1s0", "2001:db8::1", "SPARK-A.lan."]
)
def test_management_address_forms(address: str) -> None:
    inv = parse_inventory(variant(l10=f"    address: '{address}'"), "x.yaml")
    assert inv.nodes[0].address == address


def test_duplicate_addresses_compare_case_insensitively_and_by_ip_value() -> None:
    found = problems_of(variant(l10="    address: Spark.local", l21="    address: spark.local"))
    assert any(p.line == 21 and "duplicate node address" in p.message for p in found)
    found = problems_of(variant(l10="    address: '2001:db8::1'", l21="    address: '2001:db8:0::1'"))
    assert any(p.line == 21 and "duplicate node address" in p.message for p in found)


def test_env_numbers_become_strings_and_env_is_read_only() -> None:
    inv = parse_inventory(variant(l6="  env: {NCCL_IB_TIMEOUT: 22, RATIO: 0.5, NCCL_DEBUG: INFO}"), "x.yaml")
    assert dict(inv.cluster.env) == {"NCCL_IB_TIMEOUT": "22", "RATIO": "0.5", "NCCL_DEBUG": "INFO"}
    with pytest.raises(TypeError):
        inv.cluster.env["X"] = "y"  # type: ignore[index]


def test_records_are_frozen_and_hashable() -> None:
    inv = parse_inventory(BASE, "x.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        inv.nodes[0].port = 2222  # type: ignore[misc]
    assert isinstance(hash(inv), int)
    assert parse_inventory(BASE, "x.yaml") == inv


def test_node_lookup() -> None:
    inv = parse_inventory(BASE, "/inv/x.yaml")
    assert inv.node("b").address == "10.0.0.2"
    with pytest.raises(KeyError, match="/inv/x.yaml: no node named 'c' \\(nodes: a, b\\)"):
        inv.node("c")


def test_problem_and_error_text() -> None:
    assert str(Problem("f.yaml", 3, "bad", "fix it")) == "f.yaml:3: bad (hint: fix it)"
    assert str(Problem("f.yaml", 3, "bad")) == "f.yaml:3: bad"
    assert str(Problem("f.yaml", 0, "unreadable")) == "f.yaml: unreadable"
    err = InventoryError([Problem("f", 1, "a"), Problem("f", 2, "b", "c")])
    assert str(err) == "f:1: a\nf:2: b (hint: c)"
    assert isinstance(err, UsageError) and err.exit_code == 2


def test_load_inventory_reports_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError) as caught:
        load_inventory(missing)
    (problem,) = caught.value.problems
    assert problem.line == 0 and problem.file == str(missing) and "No such file" in problem.message
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"cluster:\n  name: caf\xe9\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(latin)
    assert [(p.line, p.message) for p in caught.value.problems] == [(2, "the file is not UTF-8 text")]


def test_load_inventory_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE)
    inv = load_inventory(path)
    assert isinstance(inv, Inventory) and inv.path == path
    assert inv.nodes[1].identity == str(tmp_path / "keys" / "b")


@pytest.mark.parametrize("args", ["  args: {served-model-name: $VLLM_API_KEY}",
                                  '  args: ["--served-model-name", "x${HF_TOKEN}"]',
                                  "  args: {cuda-graph-sizes: [1, $N]}"])
def test_a_dollar_in_model_args_is_refused_at_its_line(args: str) -> None:
    (problem,) = problems_of(variant(l33=args))
    assert problem.line == 33 and "holds a `$`" in problem.message and "never in model.args" in problem.hint
    assert "VLLM_API_KEY" not in problem.message and "HF_TOKEN" not in problem.message


def test_a_dollar_in_a_cluster_env_value_is_kept() -> None:
    inv = parse_inventory(variant(l6="  env: {DB_PASSWORD: 'pa$$word'}"), "x.yaml")
    assert inv.cluster.env["DB_PASSWORD"] == "pa$$word"
