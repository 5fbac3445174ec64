"""The manifest of one model's Hugging Face cache entry on this node, as one JSON object.

    python3 hfmanifest.py MODEL_DIR CACHE_FILE CHUNK_BYTES

MODEL_DIR is hub/models--org--name. Every regular file under blobs/, refs/ and snapshots/
gets its size, mode, mtime and a fast content hash: SHA-256 of each CHUNK_BYTES chunk (the
chunk digests let a copy verify each chunk as it arrives, in any order), and of the file the
SHA-256 of its chunk digests. Chunks are hashed in parallel (hashlib lets go of the GIL);
a file whose size, mtime and inode match CACHE_FILE is not read again. Every symlink under
snapshots/ gets its target and whether it resolves. Partial copies an interrupted sync left
(NAME.sync-partial and its .chunks journal) are listed with their verified chunks, so a
second sync resumes them. Also: free bytes of the filesystem and the owner of the hub.
"""

import hashlib
import json
import os
import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

PARTIAL = ".sync-partial"


def chunk_digest(path, offset, length):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left > 0:
            block = f.read(min(left, 8 << 20))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def file_hash(chunks):
    return hashlib.sha256("".join(chunks).encode()).hexdigest()


def load_cache(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_cache(path, cache):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp%d" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(cache, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the hashes are computed again next time


def main(root, cache_file, chunk):
    root = os.path.abspath(root)
    out = {"root": root, "exists": os.path.isdir(root), "files": {}, "links": {}, "partials": {},
           "chunk": chunk, "cache": os.path.abspath(cache_file)}
    probe = root
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    fs = os.statvfs(probe)
    out["free"] = fs.f_bavail * fs.f_frsize
    hub = os.path.dirname(root)
    owner = os.stat(hub if os.path.isdir(hub) else probe)
    out["owner"] = [owner.st_uid, owner.st_gid]
    if not out["exists"]:
        print(json.dumps(out))
        return 0
    cache = load_cache(cache_file)
    todo = []  # (rel, path, st)
    for top in ("blobs", "refs", "snapshots"):
        base = os.path.join(root, top)
        for here, dirs, names in os.walk(base):
            dirs.sort()
            for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(here, d))]:
                path = os.path.join(here, name)
                rel = os.path.relpath(path, root)
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    out["links"][rel] = {"target": os.readlink(path), "ok": os.path.exists(path)}
                elif name.endswith(PARTIAL + ".chunks"):
                    continue
                elif name.endswith(PARTIAL):
                    done = []
                    try:
                        with open(path + ".chunks") as f:
                            done = sorted({int(x) for x in f.read().split() if x.isdigit()})
                    except OSError:
                        pass
                    out["partials"][rel[: -len(PARTIAL)]] = {"size": st.st_size, "done": done}
                elif stat.S_ISREG(st.st_mode):
                    todo.append((rel, path, st))
    jobs, results, lock = [], {}, threading.Lock()
    for rel, path, st in todo:
        key = "%d:%d:%d" % (st.st_size, st.st_mtime_ns, st.st_ino)
        hit = cache.get(path)
        entry = {"size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "mtime_ns": st.st_mtime_ns}
        out["files"][rel] = entry
        if hit and hit[0] == key:
            entry["chunks"] = hit[1]
            continue
        count = max(1, -(-st.st_size // chunk))
        results[rel] = [None] * count
        for i in range(count):
            jobs.append((rel, path, i, min(chunk, st.st_size - i * chunk)))

    def work(job):
        rel, path, i, length = job
        digest = chunk_digest(path, i * chunk, length)
        with lock:
            results[rel][i] = digest

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        list(pool.map(work, jobs))
    for rel, path, st in todo:
        entry = out["files"][rel]
        if rel in results:
            entry["chunks"] = results[rel]
            cache[path] = ["%d:%d:%d" % (st.st_size, st.st_mtime_ns, st.st_ino), results[rel]]
        entry["hash"] = file_hash(entry["chunks"])
    if results:
        save_cache(cache_file, cache)
    out["hashed_bytes"] = sum(j[3] for j in jobs)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
