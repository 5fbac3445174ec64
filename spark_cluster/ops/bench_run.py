"""`bench` as one call: its options read from the flags' text, this cluster's vLLM asked over SSH
whether it runs and serves, then the sweeps in order (concurrency, prompt lengths, rates). What
happens is told through `emit`, one record per event (the progress bar and the lines as levels
end); the figures come back in a `BenchRun`. Nothing here prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark_cluster.core.errors import SparkClusterError, UsageError
from spark_cluster.core.inventory import Inventory
from spark_cluster.ops import bench_out
from spark_cluster.ops.bench import PROMPT, Level, Sample, parse_levels, sweep
from spark_cluster.ops.bench_sweeps import parse_list, prompt_sweep, rate_run

if TYPE_CHECKING:
    from spark_cluster.core.recipes import Reference
    from spark_cluster.core.serve_plan import ServePlan


@dataclass(frozen=True)
class BenchOptions:
    """What to measure, and where the figures go."""

    levels: tuple[int, ...] = (1, 2, 4)   # concurrency levels; () skips the sweep
    lengths: tuple[int, ...] = ()         # prompt lengths in tokens
    rates: tuple[float, ...] = ()         # open-loop arrivals per second
    duration_s: float = 30.0              # of arrivals at each rate
    seed: int = 0                         # of the arrivals
    max_tokens: int = 256                 # each request decodes (ignore_eos)
    prompt: str = PROMPT
    out_dir: Path | None = None           # bench.json and a CSV per sweep written there
    compare_dir: str | None = None        # an earlier out_dir, as the user named it

    @property
    def expected(self) -> int:
        """Requests the run will send (a rate's count is its expectation)."""
        return sum(self.levels) + len(self.lengths) + sum(round(r * self.duration_s) for r in self.rates)


def bench_options(concurrency: str, prompt_lengths: str | None = None, rate: str | None = None, *,
                  duration_s: float = 30.0, seed: int = 0, max_tokens: int = 256, prompt: str | None = None,
                  out_dir: str | None = None, compare_dir: str | None = None) -> BenchOptions:
    """The options from the flags' text: '1,2,4' (or 'none'), '128,1024', '0.5,1'; a UsageError
    naming the bad part, or saying there is nothing to measure."""
    try:
        levels = () if concurrency.strip().lower() == "none" else parse_levels(concurrency)
        lengths = parse_list(prompt_lengths, int, "prompt length", 1, 1_000_000) if prompt_lengths else ()
        rates = parse_list(rate, float, "rate", 0.01, 1000) if rate else ()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not (levels or lengths or rates):
        raise UsageError("nothing to measure: give --concurrency, --prompt-lengths or --rate")
    return BenchOptions(levels, lengths, rates, duration_s, seed, max_tokens, prompt or PROMPT,
                        Path(out_dir) if out_dir else None, compare_dir)


# The events, in the order they come: Began, then per sweep a Phase and its Samples (from the
# requests' threads), a Level as each concurrency level ends, and Ended once the sweeps are done.
@dataclass(frozen=True)
class Began:
    model: str
    endpoint: str
    max_tokens: int
    expected: int


@dataclass(frozen=True)
class Phase:
    name: str


@dataclass(frozen=True)
class Ended:
    pass


BenchEvent = Began | Phase | Sample | Level | Ended


@dataclass(frozen=True)
class BenchRun:
    """The figures (`data`: what --json prints and bench.json holds), the levels measured, the
    recipe's published figures, the files written and the change against --compare's run."""

    data: dict
    levels: tuple[Level, ...]
    reference: Reference | None
    written: tuple[Path, ...] = ()
    compared_with: str | None = None
    changes: list[dict] | None = None

    @property
    def failed(self) -> bool:
        """A request failed (or a point could not be measured)."""
        return any(r.get("failed") or r.get("error") for section in ("levels", "prompt_lengths", "rates")
                   for r in self.data.get(section) or ())

    def as_json(self) -> dict:
        """What --json prints: the figures, and the change against --compare's run."""
        if self.changes is None:
            return self.data
        return {**self.data, "compare": {"against": self.compared_with, "changes": self.changes}}


def run_bench(inv: Inventory, options: BenchOptions, emit: Callable[[BenchEvent], None]) -> BenchRun:
    """Measure this cluster's vLLM; a stopped or not yet serving one is a SparkClusterError
    with the next step, before any request."""
    from spark_cluster.core.serve_plan import serve_plan
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.reach import reach
    from spark_cluster.ops.serve import running

    earlier = bench_out.load(Path(options.compare_dir)) if options.compare_dir else None
    plan = serve_plan(inv)
    # Asked over SSH first: a stopped cluster is said as such, and no request goes to an
    # endpoint that is not this cluster's.
    with fleet_for(inv, only=inv.head.name) as fleet, reach(plan, fleet) as reachable:
        if not running(fleet.node(plan.head.node), plan.head):
            raise SparkClusterError(f"vLLM of this cluster is not running on {plan.head.node}\n"
                                    f"  hint: spark-cluster up {inv.path}")
        data, levels, reference = _measure(str(inv.path), plan, reachable, options, emit)
    written = tuple(bench_out.write(options.out_dir, data)) if options.out_dir else ()
    changes = bench_out.compare(data, earlier) if earlier is not None else None
    return BenchRun(data, levels, reference, written, options.compare_dir, changes)


def _measure(inventory: str, plan: ServePlan, reachable: ServePlan, options: BenchOptions,
             emit: Callable[[BenchEvent], None]) -> tuple[dict, tuple[Level, ...], Reference | None]:
    from spark_cluster.core.recipes import load_recipe
    from spark_cluster.ops.readiness import readiness
    from spark_cluster.ops.serve import api_key

    problem = readiness(reachable)  # also the warm-up request
    if problem is not None:
        raise SparkClusterError(f"vLLM at {plan.endpoint} does not serve yet: {problem}\n"
                                f"  hint: `spark-cluster up {inventory}` follows its start")
    reference = load_recipe(plan.recipe).reference if plan.recipe else None
    endpoint, model, key = reachable.endpoint, plan.served_model_name, api_key(plan)
    o = options
    data: dict = {"model": model, "endpoint": plan.endpoint, "max_tokens": o.max_tokens,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    levels: list[Level] = []
    emit(Began(model, plan.endpoint, o.max_tokens, o.expected))
    if o.levels:
        emit(Phase("concurrency"))
        levels = sweep(endpoint, model, key, o.levels, o.max_tokens, o.prompt, on_level=emit, on_sample=emit)
        data["levels"] = [level.as_dict() for level in levels]
        data["reference"] = {"source": reference.source, "aggregate_tok_s": dict(reference.tok_s)} \
            if reference and reference.tok_s else None
    if o.lengths:
        emit(Phase("prompt lengths"))
        data["prompt_lengths"] = [p.as_dict() for p in prompt_sweep(endpoint, model, key, o.lengths, on_sample=emit)]
    if o.rates:
        data["rates"] = []
        for r in o.rates:
            emit(Phase(f"rate {r:g}/s for {o.duration_s:g} s"))
            point = rate_run(endpoint, model, key, r, o.duration_s, o.max_tokens, o.prompt, o.seed, on_sample=emit)
            data["rates"].append(point.as_dict())
    emit(Ended())
    return data, tuple(levels), reference
