"""The package's floor plan holds: layers import only downward, the product never imports the
lab, no import circle (through a package's __init__ and imports inside functions too), the
programs import nothing of the package, no private name crosses a module, no module of the
product or the lab over 400 lines, and `--help` loads no SSH library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "transport", "ops", "ui", "cli")  # bottom to top
MAX_LINES = 400


def modules(package: str, root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of `known` that `name` imports, at its top or inside a function (not under
    TYPE_CHECKING: annotations only)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import mod` runs mod; `from pkg import name` runs pkg's __init__, whose
            # names it takes: a submodule importing its package back that way closes a circle.
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    resolved = set()
    for target in found:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


PRODUCT = modules("spark_cluster")
LAB = modules("spark_cluster_lab")
KNOWN = set(PRODUCT) | set(LAB) | {"spark_cluster_lab"}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imports_of(name, path, KNOWN) for name, path in mods.items()}


def test_the_product_never_imports_the_lab() -> None:
    offenders = {name: sorted(t for t in targets if t.startswith("spark_cluster_lab"))
                 for name, targets in graph(PRODUCT).items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_layers_import_only_downward() -> None:
    upward = []
    for name, targets in graph(PRODUCT).items():
        mine = layer(name)
        if mine is None:
            continue
        for target in targets:
            theirs = layer(target)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
                upward.append(f"{name} -> {target}")
    assert upward == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            strong(v)
    return out


@pytest.mark.parametrize("package", [PRODUCT, LAB], ids=["spark_cluster", "spark_cluster_lab"])
def test_no_import_circle(package: dict[str, Path]) -> None:
    assert _cycles(graph(package)) == []


CIRCLES = {  # module -> its text; each package holds one circle, except `fine`
    # A view that takes the console from its package's __init__, which imports the view last.
    "through_init": {"__init__": "console = 1\nfrom through_init.view import show\n",
                     "view": "from through_init import console\ndef show(): return console\n"},
    # The same, the view importing its package inside a function.
    "late": {"__init__": "from late import view\n",
             "view": "def show():\n    import late\n    return late.X\n"},
    # A package importing its own submodules, which import each other's modules only: no circle.
    "fine": {"__init__": "from fine import a, b\n", "a": "from fine import b\n", "b": "X = 1\n"},
}


def test_the_circle_check_sees_circles_through_a_packages_init_and_late_imports(tmp_path: Path) -> None:
    for package, files in CIRCLES.items():
        (tmp_path / package).mkdir()
        for name, text in files.items():
            (tmp_path / package / f"{name}.py").write_text(text)
    found = {}
    for package in CIRCLES:
        mods = modules(package, tmp_path)
        found[package] = _cycles({name: imports_of(name, path, set(mods)) for name, path in mods.items()})
    assert found == {"through_init": [["through_init", "through_init.view"]], "late": [["late", "late.view"]],
                     "fine": []}


def test_programs_import_nothing_of_the_package() -> None:
    # They are data to the layers (core.programs ships them by name), and run alone on a node.
    programs = {name: sorted(targets) for name, targets in graph(PRODUCT).items()
                if name.startswith("spark_cluster.programs")}
    assert {name: targets for name, targets in programs.items() if targets} == {}


def _private_imports(name: str, path: Path) -> list[str]:
    """`from other import _name`: a module's private name used by another module."""
    return [f"{name}: from {node.module} import {alias.name}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spark_cluster")
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]


def test_no_private_name_is_imported_across_product_modules() -> None:
    assert [line for name, path in PRODUCT.items() for line in _private_imports(name, path)] == []


@pytest.mark.parametrize("package", [PRODUCT, LAB], ids=["spark_cluster", "spark_cluster_lab"])
def test_no_module_over_400_lines(package: dict[str, Path]) -> None:
    long = {name: n for name, path in package.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_help_loads_no_ssh_library() -> None:
    code = ("import sys; from spark_cluster.cli import cli; "
            "import click.testing as t; r = t.CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('paramiko', 'fabric', 'invoke', 'httpx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# What `--help` may not load: the SSH stack, HTTP, YAML and the layers that use them. Listing the
# commands needs click, the console and the commands' own modules, nothing that talks to a node.
HEAVY_FOR_HELP = ("paramiko", "fabric", "invoke", "httpx", "cryptography", "yaml",
                  "spark_cluster.transport", "spark_cluster.ops", "spark_cluster.core.inventory")
# Modules `--help` may add to what `import click` loads: 113 when this was written (rich's console
# is most of them); the 150 before the inventory and rich.progress moved into the commands.
HELP_MODULE_BUDGET = 135


def _imported(code: str) -> list[str]:
    """The modules a fresh interpreter imports to run `code`, in order, from -X importtime
    (counting modules does not depend on how busy the machine is, as timing them would)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stderr
    return [line.rpartition("|")[2].strip() for line in err.splitlines()
            if line.startswith("import time:") and "self [us]" not in line]


def test_help_imports_little() -> None:
    help_run = _imported("import sys; sys.argv = ['spark-cluster', '--help']\n"
                         "from spark_cluster.cli import main\n"
                         "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code")
    heavy = sorted({m for m in help_run if any(m == h or m.startswith(h + ".") for h in HEAVY_FOR_HELP)})
    assert heavy == []
    added = set(help_run) - set(_imported("import click"))
    assert len(added) <= HELP_MODULE_BUDGET, sorted(added)


def test_a_command_loads_no_other_commands_modules() -> None:
    # `check` runs in about a second: it must not pay for diagnose's log patterns or the views of
    # bench and watch (cli imports a command's module when it runs; ui a view on first use).
    loaded = _imported("import sys; sys.argv = ['spark-cluster', 'check', '--help']\n"
                       "from spark_cluster.cli import main\n"
                       "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code")
    assert "spark_cluster.cli.preflight" in loaded
    others = ("spark_cluster.cli.diagnose", "spark_cluster.cli.observe", "spark_cluster.cli.serve",
              "spark_cluster.core.vllm_events", "spark_cluster.ui.bench_view", "spark_cluster.ui.watch_view",
              "spark_cluster_lab")
    assert sorted(m for m in loaded if m.startswith(others)) == []


def test_every_name_the_lazy_tables_promise_is_there() -> None:
    # cli and ui name what they import later by string: a misspelt module or name would show only
    # when a user runs that command.
    import click

    from spark_cluster import ui
    from spark_cluster.cli import COMMANDS, cli

    for name in ui.__all__:
        assert getattr(ui, name) is not None, name
    ctx = click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name, name
    assert set(COMMANDS) <= set(cli.list_commands(ctx))
