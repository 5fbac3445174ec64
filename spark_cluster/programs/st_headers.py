"""config.json and the safetensors headers of one checkpoint, as zlib-compressed base64 JSON.

    python3 st_headers.py PATH

PATH is a checkpoint directory, or a Hugging Face cache entry (hub/models--org--name), whose
snapshot refs/main names (else the newest). Of each .safetensors file only the first 8 bytes
(the header's length) and the JSON header are read, never the weights. The answer is
{"snapshot", "config", "files": {name: header}}; compressed because a large MoE lists some
hundred thousand tensors whose names repeat.
"""

import base64
import json
import os
import struct
import sys
import zlib

MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit


def snapshot_of(path):
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    snapshots = os.path.join(path, "snapshots")
    if not os.path.isdir(snapshots):
        raise SystemExit("no config.json and no snapshots/ under " + path)
    try:
        with open(os.path.join(path, "refs", "main")) as f:
            named = os.path.join(snapshots, f.read().strip())
        if os.path.isdir(named):
            return named
    except OSError:
        pass
    found = [os.path.join(snapshots, d) for d in os.listdir(snapshots)]
    if not found:
        raise SystemExit("no snapshot under " + snapshots)
    return max(found, key=os.path.getmtime)


def header_of(path):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise SystemExit(path + ": shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER:
            raise SystemExit(path + ": header length %d is not a safetensors one" % length)
        return json.loads(f.read(length))


def collect(path):
    snapshot = snapshot_of(os.path.expanduser(path))
    with open(os.path.join(snapshot, "config.json")) as f:
        config = json.load(f)
    files = {}
    for root, _, names in os.walk(snapshot, followlinks=True):
        for name in sorted(names):
            if name.endswith(".safetensors"):
                full = os.path.join(root, name)
                files[os.path.relpath(full, snapshot)] = header_of(full)
    return {"snapshot": snapshot, "config": config, "files": files}


def encode(answer):
    return base64.b64encode(zlib.compress(json.dumps(answer).encode(), 6)).decode()


if __name__ == "__main__":
    try:
        sys.stdout.write(encode(collect(sys.argv[1])) + "\n")
    except (OSError, ValueError) as exc:
        raise SystemExit("%s: %s" % (type(exc).__name__, exc))
