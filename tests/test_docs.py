"""The docs cannot drift from the code: every `spark-cluster ...` line in README.md and docs/*.md
names commands and flags that exist (click's own parser, no process per line), every inventory
snippet validates, every finding id has its next step and every lab fault is listed. Each check
is also fed a doctored text, to show that it fails when a doc goes wrong."""

from __future__ import annotations

import copy
import functools
import re
import shlex
from pathlib import Path

import click
import pytest
import yaml

from spark_cluster.cli import cli
from spark_cluster.core.inventory import InventoryError, parse_inventory

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^[ \t]*```([a-z]*)\n(.*?)^[ \t]*```", re.M | re.S)
INDENTED = re.compile(r"^ {4,}((?:\S*/)?spark-cluster .*)$", re.M)  # a Markdown indented code line
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SHELLS = {"", "bash", "sh", "console", "shell"}
# A word a user replaces (INVENTORY, NODE, HOST_A), or a part left out (`...`, `<name>`).
PLACEHOLDER = re.compile(r"^[\[(]*([A-Z][A-Z0-9_]*|<[^>]*>|\.\.\.|…)[,\])]*$|…|\.\.\.|<[a-z]")
SEPARATORS = {"&&", "||", ";", "|", "&"}


# --- extraction -------------------------------------------------------------------------------

def pieces(text: str) -> list[tuple[int, str, bool]]:
    """(line number, text, from a shell block) of every shell block line and every code span."""
    found = []
    for m in FENCE.finditer(text):
        if m.group(1) in SHELLS:
            first = text.count("\n", 0, m.start(2)) + 1
            lines = m.group(2).splitlines()
            i = 0
            while i < len(lines):  # a line ending in a backslash goes on in the next
                start, line = i, lines[i]
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                found.append((first + start, line, True))
                i += 1
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found += [(prose.count("\n", 0, m.start()) + 1, m.group(1), True) for m in INDENTED.finditer(prose)]
    prose = INDENTED.sub("", prose)
    found += [(prose.count("\n", 0, m.start()) + 1, m.group(1), False) for m in SPAN.finditer(prose)]
    return found


def is_synopsis(words: list[str]) -> bool:
    return any(PLACEHOLDER.search(w) or "[" in w or "|" in w for w in words)


def command_lines(text: str) -> list[tuple[int, list[str], bool]]:
    """Every `spark-cluster` invocation: (line, its words after `spark-cluster`, a synopsis?).
    A segment counts when it starts with the command (after `.venv/bin/` or `sudo`), as typed."""
    lines = []
    for number, piece, block in pieces(text):
        if "spark-cluster" not in piece:
            continue
        raw = piece.replace("\\|", "|")
        if block:  # a comment after the command is prose
            raw = re.sub(r"\s#\s.*$", "", raw)
        for segment in re.split(r"\s(?:&&|\|\||;|\|)\s", raw):  # `a|b` without spaces is a choice
            words = segment.split()
            while words and words[0] in ("sudo", "$", "#"):
                words = words[1:]
            if not words or not re.fullmatch(r"(?:[\w./-]*/)?spark-cluster", words[0]):
                continue
            rest = segment.split(words[0], 1)[1]
            synopsis = is_synopsis(rest.split())
            if not synopsis:
                try:
                    lexer = shlex.shlex(rest, posix=True, punctuation_chars="|&;")
                    lexer.whitespace_split = True
                    tokens = list(lexer)
                except ValueError:  # an open quote: the span holds part of a line
                    tokens = rest.split()
                cut = next((i for i, t in enumerate(tokens) if t in SEPARATORS), len(tokens))
                words_after = tokens[:cut]
            else:
                words_after = rest.split()
            lines.append((number, words_after, synopsis))
    return lines


# --- the parse ---------------------------------------------------------------------------------

@functools.cache
def subcommands(group: click.Group) -> dict[str, click.Command]:
    """A group's commands as a user reaches them: the CLI loads each command's module by name only
    when it runs, so `group.commands` alone is empty. Once per group: listing them reads every
    installed package's entry points, and each doc line walks the groups again."""
    ctx = click.Context(group)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def resolve(words: list[str]) -> tuple[list[click.Command], list[str], str, list[str]]:
    """Walks the group: the command(s) the words name (an `a|b` alternative names several), the
    words left, the path as typed, and problems."""
    command: click.Command = cli
    path = "spark-cluster"
    words = list(words)
    while words and words[0] in option_names(cli) | {"--version"}:  # `spark-cluster --debug check`
        path, words = f"{path} {words[0]}", words[1:]
    if words and words[0].startswith("-"):
        return [], [], path, [f"`{path}` has no option {words[0]}"]
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        head = words[0]
        if PLACEHOLDER.search(head):
            return [command], words[1:], path, []
        names = head.split("|") if "|" in head else [head]
        if "/" in head and all(n.strip() for n in head.split("/")):
            names = head.split("/")
        known = subcommands(command)
        missing = [n for n in names if n not in known]
        if missing:
            return [], [], path, [f"`{path} {missing[0]}`: no such command "
                                 f"(it has {', '.join(sorted(known))})"]
        if len(names) > 1:
            return [known[n] for n in names], words[1:], f"{path} {head}", []
        command, path, words = known[head], f"{path} {head}", words[1:]
    return [command], words, path, []


def option_names(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def check_synopsis(words: list[str]) -> list[str]:
    """A synopsis (`up INVENTORY [--until check|ray|vllm]`): its commands and every flag exist,
    and a choice's spelled-out values are the choice's."""
    commands, rest, path, problems = resolve(words)
    if problems:
        return problems
    known = set().union(*(option_names(c) for c in commands))
    choices = {o: p.type for c in commands for p in c.params if isinstance(p, click.Option)
               and isinstance(p.type, click.Choice) for o in p.opts}
    for i, word in enumerate(rest):
        if word == "--":
            break
        for flag in re.split(r"[|/]", word.strip("[](),")):
            flag = flag.strip("[](),")
            if not flag.startswith("-") or flag == "-":
                continue
            flag = flag.split("=", 1)[0]
            if flag not in known:
                problems.append(f"`{path}` has no option {flag}")
            elif flag in choices and i + 1 < len(rest):
                values = rest[i + 1].strip("[](),").split("|")
                if len(values) > 1 and not any(PLACEHOLDER.search(v) for v in values):
                    wrong = [v for v in values if v not in choices[flag].choices]
                    if wrong:
                        problems.append(f"`{path} {flag}` takes no {wrong[0]!r} "
                                        f"(it takes {', '.join(map(str, choices[flag].choices))})")
    return problems


def check_concrete(words: list[str]) -> list[str]:
    """A line as a user types it: click's own parser (no command runs, no file is opened),
    then each value through its type (a Path is only a string here), and the arguments counted."""
    commands, rest, path, problems = resolve(words)
    if problems:
        return problems
    command = commands[0]
    if not rest:  # the command named in prose (`spark-cluster status`): it exists
        return []
    ctx = click.Context(command, info_name=path, resilient_parsing=False)
    try:
        values, extra, _ = command.make_parser(ctx).parse_args(list(rest))
    except click.UsageError as exc:
        return [f"`{path} {' '.join(rest)}`: {exc.format_message()}"]
    for param in command.params:
        value = values.get(param.name)  # type: ignore[arg-type]
        if value is None or value is getattr(click.core, "UNSET", None):  # click 8.3 on: a sentinel
            if isinstance(param, click.Argument) and param.required:
                problems.append(f"`{path} {' '.join(rest)}`: missing {param.human_readable_name}")
            continue
        if param.name == "inventory" and not str(value).endswith((".yaml", ".yml")):
            problems.append(f"`{path} {' '.join(rest)}`: {value!r} is not an inventory (a .yaml file)")
        if isinstance(param.type, click.Path) or getattr(param, "is_flag", False):
            continue
        try:
            param.type_cast_value(ctx, value)
        except click.BadParameter as exc:
            problems.append(f"`{path} {' '.join(rest)}`: {param.name}: {exc.format_message()}")
    if extra and not ctx.allow_extra_args:
        problems.append(f"`{path} {' '.join(rest)}`: unexpected argument(s) {' '.join(extra)}")
    if path == "spark-cluster lab break" and values.get("fault") not in lab_faults():
        problems.append(f"`{path} {' '.join(rest)}`: no lab fault {values.get('fault')!r} (`lab faults` lists them)")
    return problems


def lab_faults() -> set[str]:
    from spark_cluster_lab.faults import FAULTS

    return set(FAULTS)


def command_problems(name: str, text: str) -> list[str]:
    found = []
    for number, words, synopsis in command_lines(text):
        for problem in (check_synopsis if synopsis else check_concrete)(words):
            found.append(f"{name}:{number}: {problem}")
    return found


# --- inventory snippets ------------------------------------------------------------------------

TOP_KEYS = {"cluster", "nodes", "model"}
LAB = REPO / "inventories" / "lab.yaml"


def merged(base: object, part: object) -> object:
    if isinstance(base, dict) and isinstance(part, dict):
        out = dict(base)
        for key, value in part.items():
            out[key] = merged(base.get(key), value) if key in base else value
        return out
    return copy.deepcopy(part)


def snippet_problems(name: str, text: str) -> list[str]:
    """Every YAML block whose keys are an inventory's validates: whole, as it is; a part
    (`model:` with one key), laid over inventories/lab.yaml."""
    found = []
    for m in FENCE.finditer(text):
        if m.group(1) != "yaml":
            continue
        line = text.count("\n", 0, m.start(2)) + 1
        try:
            data = yaml.safe_load(m.group(2))
        except yaml.YAMLError as exc:
            found.append(f"{name}:{line}: not YAML: {exc}")
            continue
        if not isinstance(data, dict) or not set(data) <= TOP_KEYS:
            continue  # a recipe, a playbook
        whole = {"cluster", "nodes"} <= set(data)
        body = m.group(2) if whole else yaml.safe_dump(
            merged(yaml.safe_load(LAB.read_text()), data), sort_keys=False)
        try:
            parse_inventory(body, f"{name}:{line}")
        except InventoryError as exc:
            found += [f"{name}:{line}: {p}" for p in exc.problems]
    return found


# --- finding ids and their next steps ----------------------------------------------------------

FAMILIES = ("check", "clock", "disk", "driver", "facts", "guard", "link", "memory", "model", "os",
            "probe", "rdma", "runtime", "ssh", "sudo", "versions")
ID_LITERAL = re.compile(r"""f?["']((?:%s)\.[a-z0-9]+(?:-[a-z0-9{}]+)*)["']""" % "|".join(FAMILIES))


def finding_ids() -> set[str]:
    """Every finding id the product can emit (`check`, `linktest`, `guard`), from its source."""
    ids = set()
    for path in (REPO / "spark_cluster").rglob("*.py"):
        for found in ID_LITERAL.findall(path.read_text()):
            if "{" not in found and not found.endswith((".json", ".pid", ".log", ".yaml")):
                ids.add(found)
    return ids


def next_steps(texts: dict[str, str]) -> dict[str, str]:
    """id -> its next step as the docs give it: a `#### \\`id\\`` section's **By hand:** line, or
    the `next step` cell of a table row that starts with the id."""
    steps: dict[str, str] = {}
    for text in texts.values():
        for m in re.finditer(r"^#### `([a-z0-9.-]+)`\n(.*?)(?=^#|\Z)", text, re.M | re.S):
            hand = re.search(r"\*\*By hand[^*]*\*\*:?\s*(\S.*)", m.group(2))
            if hand and hand.group(1).strip():
                steps[m.group(1)] = hand.group(1).strip()
        header: list[str] = []
        for line in text.splitlines():
            if not line.startswith("|"):
                header = []
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not header:
                header = [c.lower() for c in cells]
                continue
            if "next step" not in header or set("".join(cells)) <= set("-: "):
                continue
            step = cells[header.index("next step")] if len(cells) > header.index("next step") else ""
            for one in re.findall(r"`([a-z]+\.[a-z0-9-]+)`", cells[0]):
                if step:
                    steps[one] = step
    return steps


# --- the tests ---------------------------------------------------------------------------------

def test_the_docs_hold_command_lines_and_every_command_is_used() -> None:
    """The extraction finds the lines (so that the test below is not passing on nothing), and
    every command of the CLI appears in the README."""
    lines = [line for path in DOCS for line in command_lines(path.read_text())]
    assert len(lines) > 80
    readme = {words[0] for _, words, _ in command_lines((REPO / "README.md").read_text()) if words}
    commands = set(subcommands(cli))
    assert {"check", "up", "init", "lab"} <= commands
    assert commands <= readme | {"--help"}, commands - readme


def test_every_command_line_in_the_docs_parses() -> None:
    problems = [p for path in DOCS for p in command_problems(path.name, path.read_text())]
    assert not problems, "\n".join(problems)


def test_every_command_in_the_inventories_comments_parses() -> None:
    """The inventories' comments say how to use them (`#   spark-cluster up inventories/lab.yaml`)."""
    said = 0
    for path in sorted((REPO / "inventories").glob("*.yaml")):
        # Each comment line as a line of a shell block (other lines blank, so that numbers hold).
        text = "```bash\n" + "\n".join(re.sub(r"^\s*#\s*", "", line) if line.lstrip().startswith("#") else ""
                                      for line in path.read_text().splitlines()) + "\n```\n"
        said += len(command_lines(text))
        problems = [re.sub(r"^([^:]+):(\d+):", lambda m: f"{m.group(1)}:{int(m.group(2)) - 1}:", p)
                    for p in command_problems(path.name, text)]  # less the fence's own line
        assert not problems, "\n".join(problems)
    assert said >= 3


@pytest.mark.parametrize(("line", "said"), [
    ("spark-cluster up inventories/lab.yaml --untill vllm", "No such option '--untill'"),
    ("spark-cluster up inventories/lab.yaml --until vlm", "'vlm' is not one of"),
    ("spark-cluster logs spark-b", "'spark-b' is not an inventory"),
    ("spark-cluster logs --node spark-b", "missing INVENTORY"),
    ("spark-cluster chek inventories/lab.yaml", "no such command"),
    ("spark-cluster lab break spark-b kernel-updates", "kernel-updates"),
    ("spark-cluster sync inventories/lab.yaml --streams many", "streams"),
    ("spark-cluster validate a.yaml b.yaml", "unexpected argument"),
    ("`spark-cluster up INVENTORY [--stall-after S]`", "has no option --stall-after"),
    ("`spark-cluster up INVENTORY [--until check\\|ray\\|vlm]`", "takes no 'vlm'"),
    ("`spark-cluster service install\\|uninstal INVENTORY`", "no such command"),
])
def test_a_doctored_line_fails(line: str, said: str | None) -> None:
    text = f"x\n```bash\n{line}\n```\n" if not line.startswith("`") else f"x\n\n{line}\n"
    problems = command_problems("doc.md", text)
    if said is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(("doc.md:3:", "doc.md:3:")), problems
        assert said in problems[0], problems


def test_a_flag_renamed_in_the_readme_fails_on_its_line() -> None:
    """The acceptance: rename one flag in the README as it is, and the check names that line."""
    readme = (REPO / "README.md").read_text()
    assert command_problems("README.md", readme) == []
    for flag, renamed in (("--stalled-after", "--stall-after"), ("--dry-run", "--dryrun"),
                          ("--no-allgather", "--no-all-gather"), ("--hang-after", "--hang")):
        assert flag in readme
        doctored = readme.replace(flag, renamed, 1)
        line = doctored[:doctored.index(renamed)].count("\n") + 1
        problems = command_problems("README.md", doctored)
        assert problems and all(p.startswith(f"README.md:{line}: ") for p in problems), problems
        assert all(renamed in p for p in problems), problems


def test_every_inventory_snippet_validates() -> None:
    problems = [p for path in DOCS for p in snippet_problems(path.name, path.read_text())]
    assert not problems, "\n".join(problems)
    for path in sorted((REPO / "inventories").glob("*.yaml")):
        parse_inventory(path.read_text(), path)


def test_a_doctored_inventory_snippet_fails() -> None:
    whole = (REPO / "inventories" / "lab.yaml").read_text()
    assert snippet_problems("doc.md", f"```yaml\n{whole}```\n") == []
    assert snippet_problems("doc.md", "```yaml\nmodel:\n  sync: true\n```\n") == []
    bad = snippet_problems("doc.md", "```yaml\nmodel:\n  synk: true\n```\n")
    assert len(bad) == 1 and "synk" in bad[0] and bad[0].startswith("doc.md:2:"), bad
    bad = snippet_problems("doc.md", f"```yaml\n{whole.replace('install_ray: true', 'install_ray: yes please')}```\n")
    assert bad and "install_ray" in bad[0], bad


def test_every_finding_id_has_its_next_step_in_the_docs() -> None:
    ids = finding_ids()
    assert {"driver.modules-missing", "link.crossed", "guard.known-bad-kernel", "model.missing"} <= ids
    steps = next_steps({p.name: p.read_text() for p in DOCS})
    missing = sorted(ids - set(steps))
    assert not missing, f"finding ids without a next step in docs/: {missing}"


def test_a_finding_without_its_next_step_is_caught() -> None:
    docs = {p.name: p.read_text() for p in DOCS}
    link = docs["link.md"]
    row = next(line for line in link.splitlines() if line.startswith("| `link.crossed` |"))
    cells = row.split("|")
    cells[-2] = " "
    docs["link.md"] = link.replace(row, "|".join(cells))
    assert "link.crossed" not in next_steps(docs)
    checks = docs["checks.md"]
    docs["checks.md"] = re.sub(r"(#### `model.missing`.*?)\*\*By hand:\*\*", r"\1**Hand:**", checks,
                               count=1, flags=re.S)
    assert "model.missing" not in next_steps(docs)


def test_every_lab_fault_is_listed_where_a_user_looks() -> None:
    from spark_cluster_lab.faults import FAULTS

    readme = (REPO / "README.md").read_text()
    lab = (REPO / "docs" / "lab.md").read_text()
    for fault in FAULTS:
        assert f"| `{fault}` |" in readme, fault
        assert f"| `{fault}` |" in lab, fault


def python_examples(text: str) -> list[tuple[int, str]]:
    """The complete Python examples (a block that starts with an import); an excerpt of the
    code, such as docs/architecture.md's, starts otherwise."""
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text)
            if m.group(1) == "python" and m.group(2).startswith(("from ", "import "))]


def test_every_python_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import io

    monkeypatch.chdir(REPO)
    ran = 0
    for path in DOCS:
        for line, code in python_examples(path.read_text()):
            with contextlib.redirect_stdout(io.StringIO()) as out:
                exec(compile(code, f"{path.name}:{line}", "exec"), {"__name__": "docs_example"})  # noqa: S102
            assert out.getvalue(), f"{path.name}:{line} printed nothing"
            ran += 1
    assert ran >= 2


def test_one_image_everywhere_and_the_template_stages_the_model() -> None:
    """The real pair's template pulls one NGC image, the one the reference recipe was measured
    on, and every doc names that one; it installs Ray into it and syncs the weights."""
    from spark_cluster.core.inventory import load_inventory
    from spark_cluster.core.recipes import load_recipe

    lab = load_inventory(LAB)
    assert lab.cluster.install_ray is True and lab.model is not None and lab.model.sync is True
    recipe = load_recipe(lab.model.recipe)
    assert recipe.reference.image.split()[0] == lab.cluster.image
    from spark_cluster_lab.image_store import EMULATOR_IMAGE

    for path in [*DOCS, LAB]:
        # The lab's page also names the tag the lab builds for its own nodes (no registry there).
        allowed = {lab.cluster.image, EMULATOR_IMAGE} if path.name == "lab.md" else {lab.cluster.image}
        for line, text in enumerate(path.read_text().splitlines(), 1):
            for image in re.findall(r"nvcr\.io/nvidia/vllm:[\w.-]+", text):
                assert image in allowed, f"{path.name}:{line}: {image}, the template runs {lab.cluster.image}"


def test_diagnoses_json_table_names_every_field() -> None:
    from spark_cluster.core.diagnose import FIELDS

    text = (REPO / "docs" / "diagnose.md").read_text()
    table = text[text.index("## JSON fields (`--json`)"):text.index("## Causes and what to do")]
    rows = {name for line in table.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    assert set(FIELDS) <= rows, set(FIELDS) - rows


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def link_problems(path: Path, text: str) -> list[str]:
    """Every relative link names a file that exists and, after `#`, one of its headings."""
    found = []
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in re.finditer(r"\]\(([^)\s]+)\)", prose):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        line = prose.count("\n", 0, m.start()) + 1
        if not where.exists():
            found.append(f"{path.name}:{line}: {target}: no such file")
            continue
        if anchor and where.suffix == ".md":
            headings = {slug(h) for h in re.findall(r"^#+ (.+)$", where.read_text(), re.M)}
            if anchor not in headings:
                found.append(f"{path.name}:{line}: {target}: no heading #{anchor} in {where.name}")
    return found


def test_every_link_between_the_docs_lands() -> None:
    problems = [p for path in DOCS for p in link_problems(path, path.read_text())]
    assert not problems, "\n".join(problems)
    assert link_problems(REPO / "README.md", "[x](docs/bench.md#fitt)") == [
        "README.md:1: docs/bench.md#fitt: no heading #fitt in bench.md"]


def test_the_readme_walks_a_real_pair_from_two_boxes_to_a_request() -> None:
    """The README's first section: every step an owner of two Sparks takes, in order, on the
    template inventory, and the request names the model as the plan serves it."""
    from spark_cluster.core.inventory import load_inventory
    from spark_cluster.core.serve_plan import serve_plan

    readme = (REPO / "README.md").read_text()
    assert readme.index("## Two Sparks to a served model") < readme.index("## Try it without hardware")
    section = readme[readme.index("## Two Sparks to a served model"):readme.index("\n## ", readme.index(
        "## Two Sparks to a served model") + 3)]
    typed = [words for _, words, synopsis in command_lines(section)
             if not synopsis and "inventories/lab.yaml" in words]
    steps = [["init"], ["check"], ["linktest"], ["sync"], ["fit"], ["up"], ["status"], ["guard", "--install"]]
    at = [next((i for i, words in enumerate(typed) if words[0] == step[0] and set(step) <= set(words)), None)
          for step in steps]
    assert None not in at, f"the README's real pair lacks {[s for s, i in zip(steps, at) if i is None]}"
    assert at == sorted(at), f"the README's real pair takes its steps out of order: {typed}"
    plan = serve_plan(load_inventory(LAB))
    blocks = [m.group(2) for m in FENCE.finditer(section)]
    assert any(b.startswith("hf download " + plan.model) or f"\nhf download {plan.model}" in b for b in blocks)
    assert any(plan.forward is not None and plan.forward.split(" nvidia@")[0] in b for b in blocks)
    assert any(f'"model": "{plan.served_model_name}"' in b and b.startswith("curl ") for b in blocks)
    for words in ("What you need", "How it is wired", "The link by hand", "120 GB", "15 minutes",
                  "runtime.image-missing"):
        assert words in section, words
    glossary = readme[readme.index("## Glossary"):]
    for term in ("rail", "twin", "HCA", "placement group", "TTFT, TPOT, ITL", "mp"):
        assert f"| {term} |" in glossary, term


def test_ci_runs_the_readmes_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Run the tests"):]
    command = next(m.group(2).strip() for m in FENCE.finditer(section))
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [command]
