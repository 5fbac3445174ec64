"""All-gather across the nodes with torch.distributed, as vLLM's tensor parallelism uses the link.

Run once per node (rank 0 on the head):
    python allgather.py --rank R --world N --master ADDR --port P [--backend auto|nccl|gloo]
NCCL where a GPU is, Gloo where none is. Rank 0 prints one JSON line per message size, in
nccl-tests' terms: size is the gathered (output) bytes, algbw = size / time, and
busbw = algbw * (n - 1) / n. Then a closing {"done": ...} line. Set NCCL_DEBUG=INFO to
learn the transport NCCL chose (printed on stderr by NCCL itself).
"""

import argparse
import json
import sys
import time
from datetime import timedelta


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    parser.add_argument("--sizes", default="1048576,8388608,67108864",
                        help="gathered bytes per all-gather, comma-separated")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        print(json.dumps({"error": "no-torch", "python": sys.executable, "detail": str(exc)}), flush=True)
        return 3
    gpu = torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("nccl" if gpu else "gloo")
    if backend == "nccl" and not gpu:
        print(json.dumps({"error": "no-gpu", "python": sys.executable}), flush=True)
        return 3
    device = torch.device("cuda", args.rank % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method="tcp://%s:%d" % (args.master, args.port),
                            rank=args.rank, world_size=args.world, timeout=timedelta(seconds=args.timeout))
    n = args.world

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        per_rank = max(1, size // n // 4)  # float32 elements each rank contributes
        send = torch.full((per_rank,), float(args.rank), dtype=torch.float32, device=device)
        if backend == "nccl":
            out = torch.empty(per_rank * n, dtype=torch.float32, device=device)
            step = lambda: dist.all_gather_into_tensor(out, send)  # noqa: E731
        else:
            outs = [torch.empty_like(send) for _ in range(n)]
            step = lambda: dist.all_gather(outs, send)  # noqa: E731
        for _ in range(args.warmup):
            step()
        sync()
        dist.barrier()
        began = time.perf_counter()
        for _ in range(args.iters):
            step()
        sync()
        seconds = (time.perf_counter() - began) / args.iters
        # The slowest rank is the collective's time.
        took = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        seconds = float(took.item())
        gathered = per_rank * n * 4
        if backend == "nccl":
            ok = bool((out.view(n, per_rank)[:, 0].cpu() == torch.arange(n, dtype=torch.float32)).all())
        else:
            ok = all(float(o[0]) == float(i) for i, o in enumerate(outs))
        if args.rank == 0:
            algbw = gathered / seconds / 1e9
            print(json.dumps({"size": gathered, "time_us": round(seconds * 1e6, 1), "algbw_gbs": round(algbw, 3),
                              "busbw_gbs": round(algbw * (n - 1) / n, 3), "correct": ok}), flush=True)
    done = {"done": True, "backend": backend, "world": n, "device": str(device), "torch": torch.__version__}
    if backend == "nccl":
        version = torch.cuda.nccl.version()
        done["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        done["gpu"] = torch.cuda.get_device_name(device)
    if args.rank == 0:
        print(json.dumps(done), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
