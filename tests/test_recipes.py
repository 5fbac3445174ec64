"""Recipes: every shipped file loads and validates; unknown names and bad files say what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.recipes import Recipe, RecipeError, load_recipe, load_recipe_file, parse_recipe, recipe_names

SEED_003 = ("--tensor-parallel-size 2 --enable-expert-parallel --quantization gptq_marlin --kv-cache-dtype fp8 "
            "--gpu-memory-utilization 0.87 --attention-backend TRITON_ATTN")
GOOD = """\
model: org/model
nodes: 1
args: {max-model-len: 4096}
weights_gib_per_node: 10
reference: {source: a test}
pitfalls: []
"""


def test_the_shipped_recipes() -> None:
    assert {"qwen3-235b-a22b-gptq-int4", "gpt-oss-120b", "qwen3-30b-a3b-fp8", "nemotron-3-nano-nvfp4"} \
        <= set(recipe_names())


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_loads_and_validates(name: str) -> None:
    recipe = load_recipe(name)
    assert isinstance(recipe, Recipe) and recipe.name == name
    assert recipe.reference.source and recipe.pitfalls and recipe.weights_gib_per_node > 0
    assert all(flag.startswith("--") for flag, _ in recipe.args)
    with pytest.raises(AttributeError):
        recipe.model = "x"  # type: ignore[misc]


def test_qwen3_235b_is_seed_003() -> None:
    r = load_recipe("qwen3-235b-a22b-gptq-int4")
    assert r.model == "Qwen/Qwen3-235B-A22B-GPTQ-Int4" and r.nodes == 2
    assert " ".join(r.argv) == SEED_003 + " --distributed-executor-backend ray"
    assert r.weights_gib_per_node == 57.64
    assert dict(r.reference.tok_s) == {1: 17.0, 2: 24.1, 4: 36.4} and r.reference.start_minutes == 15


# weights_gib_per_node of each shipped recipe, and what the comment on that line must name: where the
# figure comes from (URL or seed), the line or size read there, and the tensor-parallel size it holds at.
WEIGHTS = {
    "qwen3-235b-a22b-gptq-int4": (57.64, ("Conselara Labs benchmark", "Weight resident per node: 57.64 GiB", "TP=2")),
    "gpt-oss-120b": (64.38, ("https://github.com/vllm-project/vllm/issues/33155",
                             "Model loading took 64.38 GiB memory", "TP=1")),
    "qwen3-30b-a3b-fp8": (29.1, ("https://github.com/vllm-project/vllm/issues/25928",
                                 "Model loading took 29.0972 GiB", "TP=1")),
    "nemotron-3-nano-nvfp4": (18.5, ("ESTIMATE", "Nemotron-Cascade-2-30B-A3B-NVFP4",
                                     "Model loading took 18.54 GiB memory", "TP=1")),
}


def weights_comment(recipe: Recipe) -> str:
    """The comment on the recipe file's weights_gib_per_node line plus the comment lines right under it."""
    lines = Path(recipe.path).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("weights_gib_per_node:"))
    parts = [lines[start].partition("#")[2]]
    for line in lines[start + 1:]:
        if not line.lstrip().startswith("#") or not line.startswith(" "):
            break
        parts.append(line.lstrip()[1:])
    return " ".join(part.strip() for part in parts).strip()


@pytest.mark.parametrize("name", sorted(WEIGHTS))
def test_recipe_weights_are_the_sourced_figures(name: str) -> None:
    figure, cited = WEIGHTS[name]
    recipe = load_recipe(name)
    assert recipe.weights_gib_per_node == figure
    comment = weights_comment(recipe)
    for text in cited:
        assert text in comment, f"{name}: the weights comment no longer cites {text!r}"


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_says_where_its_weights_figure_comes_from(name: str) -> None:
    """Measured or an estimate, with its source and the TP size it holds at, matching the recipe's own size:
    the plan scales the figure from the recipe's tensor x pipeline size (1 without --tensor-parallel-size)."""
    recipe = load_recipe(name)
    comment = weights_comment(recipe)
    assert re.match(r"(measured|ESTIMATE)\b", comment), f"{name}: say 'measured' or 'ESTIMATE' first: {comment!r}"
    assert re.search(r"https?://|github\.com/|Conselara Labs", comment), f"{name}: name a source: {comment!r}"
    tp = re.search(r"\bTP=(\d+)", comment)
    assert tp, f"{name}: say at which tensor-parallel size the figure holds: {comment!r}"
    own = recipe.arg("tensor-parallel-size")
    assert int(tp.group(1)) == (int(own[0]) if own else recipe.nodes)


def test_unknown_recipe_names_the_known_ones_and_the_likeliest() -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe("qwen3-235b-gptq-int4")
    message = str(err.value)
    assert "did you mean 'qwen3-235b-a22b-gptq-int4'" in message
    for name in recipe_names():
        assert name in message
    assert isinstance(err.value, SparkClusterError)


def test_a_good_minimal_recipe(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD + "env: {A: 1}\n")
    r = load_recipe_file(path)
    assert r.argv == ("--max-model-len", "4096") and dict(r.env) == {"A": "1"}


@pytest.mark.parametrize(("text", "says"), [
    (GOOD + "extra: 1\n", "unknown key 'extra'"),
    (GOOD + "envv: {}\n", "did you mean 'env'"),
    (GOOD.replace("nodes: 1", "nodes: two"), "nodes must be a whole number"),
    (GOOD.replace("nodes: 1", "nodes: true"), "nodes must be a whole number"),
    (GOOD.replace("model: org/model", "model: 3"), "model must be a Hugging Face repo id"),
    (GOOD.replace("args: {max-model-len: 4096}", "args: [--x]"), "args must be a mapping"),
    (GOOD.replace("max-model-len", "--max-model-len"), "is not a vLLM flag name"),
    (GOOD.replace("4096", "null"), "args.max-model-len must be"),
    (GOOD.replace("weights_gib_per_node: 10", "weights_gib_per_node: '10'"), "weights_gib_per_node must be"),
    (GOOD.replace("{source: a test}", "{notes: x}"), "reference.source"),
    (GOOD.replace("{source: a test}", "{source: s, tok_s: {one: 3}}"), "reference.tok_s"),
    (GOOD.replace("{source: a test}", "{source: s, speed: 3}"), "unknown key reference.speed"),
    (GOOD.replace("pitfalls: []", "pitfalls: [1]"), "pitfalls must be"),
    (GOOD + "env: {A: [1]}\n", "env.A must be"),
    (GOOD + "env: {1A: x}\n", "not an environment variable name"),
    (GOOD.replace("nodes: 1\n", ""), "missing key 'nodes'"),
    (GOOD + "layouts: {tp: 2}\n", "layouts must be a list"),
    (GOOD + "layouts: [{tp: 0}]\n", "layouts[0] must be {tp: N}"),
    (GOOD + "layouts: [{tp: 2, ep: 2}]\n", "layouts[0] must be {tp: N}"),
    ("- a list\n", "a recipe is a mapping"),
    ("model: [unclosed\n", "not valid YAML"),
])
def test_invalid_recipes_name_the_file_and_the_key(text: str, says: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(text, "broken.yaml")
    assert str(err.value).startswith("broken.yaml")
    assert says in str(err.value)


def test_recipe_args_forms(tmp_path: Path) -> None:
    text = GOOD.replace("args: {max-model-len: 4096}",
                        "args: {enforce-eager: true, enable-eplb: false, kv-cache-dtype: fp8, "
                        "compilation-config: {level: 3}, allowed-origins: [a, b]}")
    r = parse_recipe(text, "forms.yaml")
    assert r.argv == ("--enforce-eager", "--kv-cache-dtype", "fp8", "--compilation-config", '{"level":3}',
                      "--allowed-origins", "a", "b")
    assert r.arg("kv-cache-dtype") == ("fp8",) and r.arg("enable-eplb") is None


def test_layouts_are_read_with_a_pipeline_of_one_when_left_out() -> None:
    recipe = parse_recipe(GOOD + "layouts: [{tp: 2}, {tp: 2, pp: 2}]\n", "good.yaml")
    assert recipe.layouts == ((2, 1), (2, 2))
    assert recipe.describe_layouts() == "TP=2, TP=2 x PP=2"
    assert load_recipe("qwen3-235b-a22b-gptq-int4").layouts == ((2, 1), (4, 1), (2, 2))
