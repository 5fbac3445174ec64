"""`vllm serve` argument parsing for the lab's vLLM TEST DOUBLE (emulating vLLM 0.33.0, the version
the recipes are written for first and `up` spells them for when the emulator reports it).

Flag names, short forms, choices and defaults follow vLLM 0.33's `vllm/engine/arg_utils.py`
(`--gpu-memory-utilization` 0.92).
Unknown flags are rejected the way argparse does for vLLM:
`vllm: error: unrecognized arguments: --x`, exit status 2.
"""

from __future__ import annotations

import argparse

VERSION = "0.33.0"
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4",
                   "fp8_per_token_head")  # the last two: 0.33
# 0.33's KernelConfig choices (vllm/config/kernel.py); vLLM lower-cases them and reads '-' as '_'.
MOE_BACKENDS = ("auto", "triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass", "flashinfer_trtllm",
                "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl", "flashinfer_b12x", "b12x",
                "flashinfer_moe_ep_mega_deep_gemm", "marlin", "humming", "triton_unfused", "aiter", "aiter_mega_moe",
                "aiter_triton_mxfp4_bf16", "flydsl", "hpc", "emulation", "rdna3")
LINEAR_BACKENDS = ("auto", "cutlass", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm",
                   "flashinfer_cudnn", "flashinfer_b12x", "b12x", "marlin", "humming", "triton", "deep_gemm", "torch",
                   "aiter", "machete", "fbgemm", "conch", "exllama", "emulation", "xpu", "xpu_woq")
LOAD_FORMATS = ("auto", "hf", "bitsandbytes", "dummy", "fastsafetensors", "gguf", "instanttensor", "mistral",
                "npcache", "pt", "runai_streamer", "runai_streamer_sharded", "safetensors", "sharded_state",
                "tensorizer")
BACKENDS = ("ray", "mp", "uni", "external_launcher")
# Variables 0.19/0.20 read that 0.33's vllm/envs.py no longer has: it warns "Unknown vLLM environment
# variable detected" and goes on (the kernel choices are flags now: --moe-backend, --linear-backend).
REMOVED_ENV = ("VLLM_ATTENTION_BACKEND", "VLLM_FLASHINFER_MOE_BACKEND", "VLLM_MXFP4_USE_MARLIN",
               "VLLM_NVFP4_GEMM_BACKEND")
DTYPES = ("auto", "bfloat16", "float", "float16", "float32", "half")

# (dest, default) pairs whose non-default values appear in the `non-default args:` dump.
DESCRIPTION = (
    f"TEST DOUBLE of vLLM {VERSION} for spark-cluster's lab: it parses `vllm serve` arguments, builds a Ray "
    "placement group as vLLM's Ray executor does (or joins --nnodes nodes as its mp executor does, "
    "--headless on node ranks > 0), reads a small real safetensors checkpoint, prints vLLM's "
    "log lines and serves an OpenAI-compatible API with a model of the engine. It is not vLLM and runs no model."
)


def _int_or_auto(value: str) -> int:
    """vLLM's human_readable_int_or_auto for --max-model-len: 32k, 1K, auto/-1."""
    v = value.strip()
    if v.lower() in ("auto", "-1"):
        return -1
    units = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    if v and v[-1] in units:
        return int(float(v[:-1]) * units[v[-1]])
    return int(v)


def _human_int(value: str) -> int:
    """vLLM's human_readable_int: 8k, 1K, 2M (lower case: powers of 1000, upper: of 1024)."""
    number = _int_or_auto(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}")
    return number


def _backend(value: str) -> str:
    return value.lower().replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="subcommand", required=True)
    serve = sub.add_parser("serve", prog="vllm serve", description=DESCRIPTION,
                           help="Start the (emulated) vLLM OpenAI-compatible API server.")
    serve.add_argument("model_tag", nargs="?", default=None, help="The model tag to serve (or --model).")
    serve.add_argument("--model", default=None)
    a = serve.add_argument
    a("--host", default=None)
    a("--port", type=int, default=8000)
    a("--served-model-name", nargs="+", default=None)
    a("--api-key", nargs="+", default=None)
    a("--tensor-parallel-size", "-tp", type=int, default=1)
    a("--pipeline-parallel-size", "-pp", type=int, default=1)
    a("--data-parallel-size", "-dp", type=int, default=1)
    switch = argparse.BooleanOptionalAction  # vLLM's switches take --no-x too
    a("--enable-expert-parallel", "-ep", action=switch, default=False)
    a("--disable-expert-parallel", dest="enable_expert_parallel", action="store_false")  # 0.33's other spelling
    a("--distributed-executor-backend", choices=BACKENDS, default=None)
    a("--quantization", "-q", default=None)
    a("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    a("--gpu-memory-utilization", type=float, default=0.92)
    a("--kv-cache-memory-bytes", default=None)
    a("--max-model-len", type=_int_or_auto, default=None)
    a("--max-num-seqs", type=int, default=None)
    a("--max-num-batched-tokens", type=_human_int, default=None)
    a("--attention-backend", default=None)
    a("--nnodes", "-n", type=int, default=1)
    a("--node-rank", "-r", type=int, default=0)
    a("--master-addr", default="127.0.0.1")
    a("--master-port", type=int, default=29501)
    a("--headless", action="store_true", default=False)
    a("--trust-remote-code", action=switch, default=False)
    a("--enforce-eager", action=switch, default=False)
    a("--moe-backend", type=_backend, choices=MOE_BACKENDS, default="auto")
    a("--linear-backend", type=_backend, choices=LINEAR_BACKENDS, default="auto")
    a("--compilation-config", "-O", default=None)  # JSON or a level: -O3, -O 3
    a("--speculative-config", default=None)
    a("--enable-chunked-prefill", action=switch, default=None)
    a("--async-scheduling", action=switch, default=None)
    a("--block-size", type=int, default=None)
    a("--disable-custom-all-reduce", action="store_true", default=False)
    a("--disable-log-stats", action="store_true", default=False)
    a("--enable-log-requests", action=switch, default=False)
    a("--enable-server-load-tracking", action=switch, default=False)
    a("--tool-call-parser", default=None)
    a("--reasoning-parser", default=None)
    a("--enable-auto-tool-choice", action=switch, default=False)
    a("--chat-template", default=None)
    a("--load-format", choices=LOAD_FORMATS, default="auto")
    a("--safetensors-load-strategy", choices=("lazy", "eager", "prefetch", "torchao"), default=None)
    a("--download-dir", default=None)
    a("--dtype", choices=DTYPES, default="auto")
    a("--seed", type=int, default=0)
    a("--revision", default=None)
    a("--tokenizer", default=None)
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse `serve MODEL ARGS`; argparse's own error/exit 2 on unknown flags or bad choices."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model_tag and args.model and args.model_tag != args.model:
        parser.error("model should only be specified once, as a positional argument or via --model")
    args.model = args.model_tag or args.model or "Qwen/Qwen3-0.6B"
    return args


def non_default_args(args: argparse.Namespace) -> dict[str, object]:
    """The `non-default args:` dict vLLM logs: every field that differs from its default."""
    parser = build_parser()
    defaults = vars(parser._subparsers._group_actions[0].choices["serve"].parse_args([]))
    out: dict[str, object] = {}
    for key, value in vars(args).items():
        if key in ("subcommand", "model"):
            continue
        if key == "model_tag":
            if value is not None:
                out["model_tag"] = value
            continue
        if defaults.get(key) != value:
            out[key] = value
    return out
