"""What one line of a vLLM log says about the start: an `Event`, or None. Pure.

The strings are those of real logs (tests/data/vllm-logs and its README name each source); the
lines of other programs that end a vLLM process are read too: PyTorch's NCCL watchdog, the
shell's `Killed`, the kernel's OOM killer, a batch scheduler cancelling the job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from spark_cluster.core.vllm_lines import clean, header, split_prefix

# In the order vLLM runs them: the KV cache is sized from the profile run, then the CUDA graphs
# are captured for the batch sizes it allows (both real Spark logs).
PHASES = ("engine-args", "ray", "workers", "weights", "compile", "kv-cache", "cuda-graphs",
          "api-server", "ready")
# Why a start failed (outcome `failed`), why it was ended from outside (`stopped`), and what
# a start that does not move waits on (`hung`).
CAUSES = ("nccl", "placement-group", "oom", "kv-cache-memory", "driver", "config", "port-in-use",
          "model-missing", "killed", "engine-died", "other")
STOP_CAUSES = ("sigterm", "scheduler-cancelled")
HANG_CAUSES = ("shm-broadcast-wait",)

_BAR = re.compile(
    r"(?P<desc>Loading (?:safetensors|pt|np_cache) checkpoint shards(?: \(eager\))?|Multi-thread loading shards"
    r"|Loading safetensors using [\w ]{1,40}?) {0,8}: {1,8}(?P<pct>\d{1,3})% Completed \| (?P<n>\d{1,9})/(?P<total>\d{1,9})")
_MODEL_LOADED = re.compile(
    r"Model loading took (\d{1,9}(?:\.\d{1,9})?) Gi?B(?: memory)?(?: and (\d{1,9}(?:\.\d{1,9})?) seconds)?")
_OLD_WEIGHTS = re.compile(r"Loading model weights took (\d{1,9}(?:\.\d{1,9})?) Gi?B")
_WEIGHTS_TOOK = re.compile(r"Loading weights took (\d{1,9}(?:\.\d{1,9})?) seconds")
# A variable the running vLLM does not read (removed or misspelt): the choice it made is lost.
_UNKNOWN_ENV = re.compile(r"Unknown vLLM environment variable detected: (\w+)")
_PG_WAIT = re.compile(r"Waiting for creating a placement group of specs for (\d{1,9}) seconds")
# The engine waited a minute for its workers to take the next broadcast (INFO, every 60 s while
# it lasts): during a compile once or twice, without end when a worker hangs.
_SHM_WAIT = re.compile(r"No available (?:shared memory broadcast )?block found in 60 second")
# The engine generates: it moves, whatever else the log says (vLLM's stats line, every 10 s).
_GENERATING = re.compile(r"Avg generation throughput: (?!0\.0 tokens)\d{1,9}(?:\.\d{1,9})? tokens/s")

# Failure patterns: (cause, regex). Searched in order; the specific causes come first.
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((cause, re.compile(rx)) for cause, rx in (
    ("placement-group", r"Cannot provide a placement group|Current node has no GPU available"
                        r"|Every node should have a unique IP address"),
    ("kv-cache-memory", r"No available memory for the cache blocks|Available KV cache memory: -\d"
                        r"|KV cache is needed, which is larger than the available KV cache memory"
                        r"|larger than the maximum number of tokens that can be stored in KV cache"),
    # `CUDA driver error` is how custom ops (e.g. gptq_marlin_repack while loading) report it; the
    # kernel's OOM killer names the process it killed.
    ("oom", r"CUDA out of memory|OutOfMemoryError|Failed to load model - not enough GPU memory"
            r"|CUDA (?:driver )?error: out of memory|is less than desired GPU memory utilization"
            r"|worker\(s\) were killed due to the node running low on memory"
            r"|[Oo]ut of memory: Killed process"
            # the host's memory: mmap and malloc refused (ENOMEM), C++'s and Python's own
            r"|Cannot allocate memory|std::bad_alloc|^MemoryError\b"),
    # PyTorch's NCCL watchdog: a collective that did not complete on a rank within its timeout.
    ("nccl", r"NCCL [Ee]rror|DistBackendError|ncclSystemError|ncclInternalError|ncclUnhandledCudaError"
             r"|Watchdog caught collective operation timeout|watchdog thread terminated with exception"
             r"|detected by watchdog|Some NCCL operations have failed or timed out|Timeout at NCCL work"
             r"|ProcessGroupNCCL's watchdog got stuck|Heartbeat monitor timed out|NCCL communicator was aborted"),
    ("driver", r"Unexpected error from cudaGetDeviceCount|Found no NVIDIA driver"
               r"|NVIDIA driver on your system is too old|CUDA driver version is insufficient"
               r"|no CUDA-capable device is detected|Failed to infer device type"
               r"|unsupported display driver / cuda driver combination"),
    ("port-in-use", r"Address already in use|EADDRINUSE|error while attempting to bind on address"),
    ("model-missing", r"Invalid repository ID or local directory|Repository Not Found|RepositoryNotFoundError"
                      r"|is not a local folder and is not a valid model identifier|HFValidationError"
                      r"|does not appear to have a file named config\.json|GatedRepoError"
                      r"|Cannot find any model weights|LocalEntryNotFoundError"),
    # SIGKILL from outside: the shell's report (alone, or glued to a tqdm bar that ended in \r),
    # a batch scheduler's task, Python's multiprocessing.
    ("killed", r"^Killed$|\]Killed$|: line \d{1,9}: {1,8}\d{1,10} Killed|: task \d{1,6}: Killed$"),
    ("engine-died", r"EngineCore failed to start|Engine core initialization failed|Engine process failed to start"
                    r"|EngineCore encountered a fatal error|died unexpectedly|EngineDeadError|ActorDiedError"
                    r"|The actor is dead because"  # Ray's reason under ActorDiedError; a log tail may keep only it
                    r"|Application startup failed|Timed out waiting for engine core processes"
                    r"|Timed out waiting for engines to send initial message"
                    r"|WorkerProc failed to start|AsyncLLM output_handler failed"
                    r"|Worker \w{1,64} pid \d{1,10} died, exit code"  # V0's multiproc workers (0.5-0.6)
                    r"|A worker died or was killed while executing a task"  # Ray's, with OOM boilerplate
                    # A rank killed by a signal: Python's faulthandler, absl's handler (Ray's C++
                    # processes), torch.distributed's elastic agent. Often the last line there is.
                    r"|^Fatal Python error: (?:Segmentation fault|Aborted|Bus error|Floating point exception"
                    r"|Illegal instruction)|\*\*\* SIG[A-Z]+ received at time"
                    r"|Signal \d+ \(SIG[A-Z]+\) received by PID|(?:killed|terminated) by signal SIG[A-Z]+"),
    ("other", r"^Traceback \(most recent call last\)|^(?:\w{1,64}\.){0,8}[A-Z]\w{0,80}?(?:Error|Exception): \S"),
))
_NEGATIVE_KV = re.compile(r"Available KV cache memory: -\d")
RAISED = re.compile(r"^(?:\w{1,64}\.){0,8}[A-Z]\w{0,80}?(?:Error|Exception): ")
# A setting refused while the engine is built: the exception's line, or pydantic's indented
# `Value error, ...` under `ValidationError: 1 validation error for SchedulerConfig`.
_CONFIG_RAISED = re.compile(r"^(?:(?:\w{1,64}\.){0,8}(?:ValueError|AssertionError|ValidationError)"
                            r"(?::|$)|Value error, |Assertion failed, )")
_CONFIG_CLASS = re.compile(r"validation errors? for (\w{1,80}Config)\b")
# The engine arguments vLLM names when it refuses one, as flags; and the words some messages use.
_ARGS = ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "tensor_parallel_size",
         "pipeline_parallel_size", "data_parallel_size", "gpu_memory_utilization", "kv_cache_dtype",
         "block_size", "quantization", "dtype", "swap_space", "cpu_offload_gb", "max_seq_len_to_capture",
         "num_gpu_blocks_override", "max_logprobs", "num_speculative_tokens", "speculative_config",
         "enable_chunked_prefill", "max_num_partial_prefills", "long_prefill_token_threshold", "max_lora_rank",
         "max_loras", "max_cpu_loras", "enable_expert_parallel", "distributed_executor_backend",
         "limit_mm_per_prompt", "max_parallel_loading_workers", "enforce_eager", "load_format",
         "compilation_config", "kv_transfer_config", "hf_overrides", "rope_scaling", "tokenizer_mode",
         "max_num_encoder_input_tokens")
_ARG = re.compile(r"(?<![\w-])(?:--)?(" + "|".join(a.replace("_", "[_-]") for a in _ARGS) + r")(?![\w-])")
_WORDED = ((re.compile(r"\btensor[ _-]parallel(?:ism| size)?\b", re.I), ("--tensor-parallel-size",)),
           (re.compile(r"\bpipeline[ _-]parallel(?:ism| size)?\b", re.I), ("--pipeline-parallel-size",)),
           (re.compile(r"\bdata[ _-]parallel(?:ism| size)?\b", re.I), ("--data-parallel-size",)),
           # The expert-parallel size is not a flag: it is the tensor- times the data-parallel size.
           (re.compile(r"\bep_size\b|\bexpert[ _-]parallel(?:ism)? size\b", re.I),
            ("--tensor-parallel-size", "--data-parallel-size")),
           (re.compile(r"\bGPU memory utili[sz]ation\b", re.I), ("--gpu-memory-utilization",)),
           (re.compile(r"\bmax(?:imum)? model len(?:gth)?\b", re.I), ("--max-model-len",)))
# PyTorch's watchdog line: the collective, its place in the sequence, the timeout and the wait.
_WORK = re.compile(r"WorkNCCL\(SeqNum=(\d{1,18}), OpType=(\w{1,40})[^)]{0,200}?Timeout\(ms\)=(\d{1,12})\)"
                   r"(?: ran for (\d{1,12}) milliseconds)?")
_RANK = re.compile(r"\[(?:PG [^\]]{0,60}?)?Rank (\d{1,6})\]")
_PREFIX_RANK = re.compile(r"\[rank(\d{1,6})\]:")
_STUCK = re.compile(r"watchdog got stuck for (\d{1,9}) seconds")

# An end from outside: (cause, regex, weight). A later line replaces the evidence only with a
# greater weight: slurm's JOB line over its STEP line over srun's own.
_STOPS: tuple[tuple[str, re.Pattern[str], int], ...] = tuple((cause, re.compile(rx), weight) for cause, rx, weight in (
    ("scheduler-cancelled", r"\*\*\* JOB [\w.+-]{1,40} (?:ON \S{1,100} )?CANCELLED AT", 3),
    ("scheduler-cancelled", r"\*\*\* STEP [\w.+-]{1,40} (?:ON \S{1,100} )?CANCELLED AT", 2),
    ("scheduler-cancelled", r"^srun: (?:forcing job termination|Job step aborted)|PBS: job killed: walltime"
                            r"|TERM_RUNLIMIT: job killed|TERM_OWNER: job killed", 1),
    # SIGTERM (docker stop, kill, Kubernetes, `spark-cluster down`) or Ctrl-C, as each vLLM says it:
    # 0.7-0.1x api_server's handler, 0.2x's [shutdown] lines, uvicorn, the engine leaving, the shell.
    ("sigterm", r"^KeyboardInterrupt(?:: terminated)?$|received signal=SIG(?:TERM|INT)|Received SIG(?:TERM|INT)"
                # not the executor's [shutdown] lines: a headless node's follow its head going away
                r"|\[shutdown\] API server: shutdown triggered"
                r"|^Shutting down$|^Application shutdown complete|^Finished server process"
                r"|^EngineCore exiting\.?$|^Terminated$|: line \d{1,9}: {1,8}\d{1,10} Terminated", 1),
))

# Phase markers: (phase, regex), searched in order on the message.
_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((phase, re.compile(rx)) for phase, rx in (
    ("ready", r"Application startup complete"),
    ("api-server", r"Starting vLLM (?:API )?server|Available routes are|Started server process"
                   r"|Uvicorn running on|Supported tasks:"),
    # The CPU build's worker sizes its KV cache in a line of its own ("Explicitly set (1.0/10.59)
    # GiB for KV cache on node 0."), before the engine checks the cache is big enough.
    ("kv-cache", r"Available KV cache memory|KV cache size: [\d,]+ tokens|# GPU blocks: \d+"
                 r"|init engine \(profile, create kv cache|GiB for KV cache on node \d"),
    ("cuda-graphs", r"Capturing CUDA graphs|Capturing the model for CUDA graphs|Capturing cudagraphs"
                    r"|Graph capturing finished"),
    ("compile", r"torch\.compile|Dynamo bytecode transform time|Compiling a graph for"
                r"|Directly load the compiled graph"),
    ("weights", r"Starting to load model|Loading weights took|Model loading took|Loading model weights took"
                r"|Filesystem type for checkpoints|Using model weights format|Loading drafter model"),
    ("workers", r"vLLM is using nccl==|Found nccl from|world_size=\d+ rank=\d+|Custom allreduce is disabled"
                r"|rank \d+ in world size \d+ is assigned|init_distributed_environment"),
    ("ray", r"Connecting to existing Ray cluster|Connected to Ray cluster|Started a local Ray instance"
            r"|placement group|Ray is already initialized|exceeds available GPUs"),
    ("engine-args", r"non-default args:|args: Namespace\(|vLLM API server version|Initializing an? (?:V1 )?LLM engine"
                    r"|Resolved architecture:|^\s*version\s+\d+\.\d+"),
))
NEW_RUN = re.compile(r"non-default args:|args: Namespace\(|vLLM API server version")
# Lines that name a phase only to say it will not run: `--enforce-eager`'s warning ("Enforce eager
# set, disabling torch.compile, CUDAGraphs, …", printed while the arguments are processed, long
# before the weights) is no compile phase.
_SKIPPED_PHASE = re.compile(r"Enforce eager set|disabling torch\.compile|compilation was disabled")


@dataclass(frozen=True)
class Event:
    """One recognised line. `kind`: phase | progress | loaded | weights-took | pg-wait | failure |
    stop (ended from outside) | shm-wait | generating | unknown-env."""

    kind: str
    phase: str | None
    line: str                      # the line as printed, ANSI and carriage returns removed
    message: str                   # the line without prefixes and logger header
    n: int | None = None           # progress: shards done
    total: int | None = None       # progress: shards in this bar
    gib: float | None = None       # loaded: weights on this rank
    seconds: float | None = None   # loaded / progress-done: seconds the load took
    cause: str | None = None       # failure: one of CAUSES; stop: one of STOP_CAUSES
    stamp: str | None = None       # the logger header's `MM-DD HH:MM:SS`
    weight: int = 0                # stop: how much the line says (slurm's JOB line most)
    detail: dict[str, object] = field(default_factory=dict)  # nccl: op, rank, seq...; config: flags


def flags_named(message: str) -> list[str]:
    """The engine arguments a refusal names, as flags, in the order it names them."""
    found: list[tuple[int, str]] = []
    for match in _ARG.finditer(message):
        found.append((match.start(), "--" + match[1].replace("_", "-")))
    for pattern, named in _WORDED:
        match = pattern.search(message)
        if match:
            found += [(match.start(), flag) for flag in named]
    flags: list[str] = []
    for _, flag in sorted(found, key=lambda item: item[0]):  # stable: a pair keeps its order
        if flag not in flags:
            flags.append(flag)
    return flags


def nccl_detail(message: str) -> dict[str, object]:
    """The watchdog's account: op, rank, collective number, timeout and wait in seconds."""
    detail: dict[str, object] = {}
    work = _WORK.search(message)
    if work:
        detail.update(op=work[2], seq=int(work[1]), timeout_s=int(work[3]) / 1000)
        if work[4]:
            detail["waited_s"] = int(work[4]) / 1000
    rank = _RANK.search(message)
    if rank and detail:
        detail["rank"] = int(rank[1])
    stuck = _STUCK.search(message)
    if stuck:
        detail["waited_s"] = float(stuck[1])
    return detail


def _failure(message: str, quiet: bool) -> tuple[str, dict[str, object]] | None:
    cause = None
    if not quiet or _NEGATIVE_KV.search(message):  # vLLM logs the negative budget at INFO
        cause = next((c for c, pattern in _FAILURES if pattern.search(message)), None)
    if cause in (None, "other") and not quiet and _CONFIG_RAISED.match(message):
        flags = flags_named(message)
        config = _CONFIG_CLASS.search(message)
        if flags or config:
            return "config", ({"flags": flags} if flags else {"config": config[1]})  # type: ignore[index]
    if cause == "nccl":
        return cause, nccl_detail(message)
    return (cause, {}) if cause else None


def parse_line(line: str) -> Event | None:
    """One log line -> the event it shows, or None for a line that says nothing about startup."""
    shown = clean(line)
    prefix, body = split_prefix(shown)
    body = body.strip()
    if not body:
        return None
    message, quiet, stamp = header(body)
    unknown = _UNKNOWN_ENV.search(message)
    if unknown:
        return Event("unknown-env", None, shown, unknown[1])
    for cause, pattern, weight in _STOPS:
        if pattern.search(message):
            return Event("stop", None, shown, message, cause=cause, stamp=stamp, weight=weight)
    if _SHM_WAIT.search(message):
        return Event("shm-wait", None, shown, message, stamp=stamp)
    failure = _failure(message, quiet)
    if failure and failure[0] == "killed":  # before the bar: `...2.83s/it]Killed` is a bar too
        return Event("failure", None, shown, message, cause="killed", stamp=stamp)
    bar = _BAR.search(message)
    if bar:
        return Event("progress", "weights", shown, message, n=int(bar["n"]), total=int(bar["total"]))
    if failure:
        detail = failure[1]
        rank = _PREFIX_RANK.search(prefix)
        if detail and "rank" not in detail and rank and failure[0] == "nccl":
            detail["rank"] = int(rank[1])
        return Event("failure", None, shown, message, cause=failure[0], stamp=stamp, detail=detail)
    if _GENERATING.search(message):
        return Event("generating", None, shown, message, stamp=stamp)
    pg = _PG_WAIT.search(message)
    if pg:
        return Event("pg-wait", "ray", shown, message, seconds=float(pg[1]))
    loaded = _MODEL_LOADED.search(message)
    if loaded:
        return Event("loaded", "weights", shown, message, gib=float(loaded[1]),
                     seconds=float(loaded[2]) if loaded[2] else None)
    old = _OLD_WEIGHTS.search(message)
    if old:
        return Event("loaded", "weights", shown, message, gib=float(old[1]))
    took = _WEIGHTS_TOOK.search(message)
    if took:
        return Event("weights-took", "weights", shown, message, seconds=float(took[1]))
    if _SKIPPED_PHASE.search(message):
        return None
    for phase, pattern in _MARKERS:
        if pattern.search(message):
            return Event("phase", phase, shown, message, stamp=stamp)
    return None
