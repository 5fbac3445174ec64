"""Copy chunks of HF-cache files between two nodes over the link: plain TCP, several streams.

    python3 hfsync.py recv   < plan.json   # on the node that lacks files
    python3 hfsync.py send   < plan.json   # on the node that has them

The plan comes on stdin, with a one-time secret in it: never on a command line. Each stream
starts with a challenge: the receiver sends 32 random bytes, the sender answers their
HMAC-SHA256 under the secret, or the connection is dropped. Both ends bind to link
addresses only. The bytes are not encrypted: this is for the private point-to-point link,
where SSH's cipher would be the bottleneck.

A chunk on the wire: header (file index u32, chunk index u32, length u64), then the bytes.
The receiver writes it into NAME.sync-partial at its offset, checks its SHA-256 against the
plan, notes it in NAME.sync-partial.chunks and acknowledges (1 good, 0 bad). A file whose
chunks are all in is given its mode, owner and mtime, and renamed into place; snapshot links
are made last. A receiver killed halfway leaves the partial file and its journal: the next
run sends only the chunks missing from it.
"""

import errno
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import threading
import time

HEADER = struct.Struct("!IIQ")
END = 0xFFFFFFFF
PARTIAL = ".sync-partial"


def recv_exact(conn, n):
    data = bytearray()
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            raise EOFError("connection closed")
        data += got
    return bytes(data)


def write_progress(path, moved, done):
    """What the controller polls; a write that a full disk refuses leaves no .tmp behind (the
    chunks' own writes report the full disk)."""
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"bytes": moved, "files": done}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        try:
            os.unlink(path + ".tmp")
        except OSError:
            pass


def receive(plan):
    root, chunk = plan["root"], plan["chunk"]
    files = plan["files"]
    secret = bytes.fromhex(plan["secret"])
    owner = plan.get("owner")
    pid_file = os.path.join(root, ".spark-sync.recv.pid")
    os.makedirs(root, exist_ok=True)
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    state = {"bytes": 0, "done": 0, "bad": 0, "errors": []}
    hashed = {}  # path -> manifest cache entry: the chunks were checked on arrival
    lock = threading.Lock()
    fds, journals, left = {}, {}, {}
    for i, f in enumerate(files):
        path = os.path.join(root, f["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path + PARTIAL, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(fd).st_size != f["size"]:
            os.ftruncate(fd, f["size"])
        fds[i] = fd
        journals[i] = open(path + PARTIAL + ".chunks", "a")
        left[i] = set(f["send"])
    finished = threading.Event()
    full = threading.Event()
    if not any(left.values()):
        finished.set()

    def finish(i):
        f = files[i]
        path = os.path.join(root, f["path"])
        fd = fds.pop(i)
        os.fchmod(fd, f["mode"])
        if owner is not None and os.geteuid() == 0:
            os.fchown(fd, owner[0], owner[1])
        os.close(fd)
        journals.pop(i).close()
        os.utime(path + PARTIAL, ns=(f["mtime_ns"], f["mtime_ns"]))
        os.replace(path + PARTIAL, path)
        st = os.stat(path)
        hashed[path] = ["%d:%d:%d" % (st.st_size, st.st_mtime_ns, st.st_ino), f["chunks"]]
        try:
            os.unlink(path + PARTIAL + ".chunks")
        except OSError:
            pass

    for i in list(left):
        if not left[i]:
            finish(i)

    def serve(conn):
        try:
            nonce = os.urandom(32)
            conn.sendall(nonce)
            answer = recv_exact(conn, 32)
            if not hmac.compare_digest(answer, hmac.new(secret, nonce, hashlib.sha256).digest()):
                return
            buffer = bytearray(chunk)
            view = memoryview(buffer)
            while True:
                index, number, length = HEADER.unpack(recv_exact(conn, HEADER.size))
                if index == END:
                    return
                got = 0
                while got < length:
                    n = conn.recv_into(view[got:length])
                    if not n:
                        raise EOFError("connection closed mid-chunk")
                    got += n
                good = hashlib.sha256(view[:length]).hexdigest() == files[index]["chunks"][number]
                if good:
                    os.pwrite(fds[index], view[:length], number * chunk)
                with lock:
                    if good:
                        journals[index].write("%d\n" % number)
                        journals[index].flush()
                        left[index].discard(number)
                        state["bytes"] += length
                        if not left[index]:
                            finish(index)
                            state["done"] += 1
                        if not any(left.values()):
                            finished.set()
                    else:
                        state["bad"] += 1
                conn.sendall(b"\x01" if good else b"\x00")
        except (OSError, EOFError) as exc:
            with lock:
                state["errors"].append(str(exc))
                if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
                    full.set()  # no chunk can land any more: stop now, not after idle_s
        finally:
            conn.close()

    listeners = []
    for address in plan["bind"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address, plan["port"]))
        s.listen(64)
        s.settimeout(0.5)
        listeners.append(s)
    print(json.dumps({"listening": plan["bind"], "port": plan["port"]}), flush=True)

    def accept(s):
        while not finished.is_set():
            try:
                conn, _ = s.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    for s in listeners:
        threading.Thread(target=accept, args=(s,), daemon=True).start()
    last, seen = time.monotonic(), -1
    progress = plan.get("progress")
    while not finished.wait(0.25) and not full.is_set():
        with lock:
            now_bytes = state["bytes"]
        if progress:
            write_progress(progress, now_bytes, state["done"])
        if now_bytes != seen:
            seen, last = now_bytes, time.monotonic()
        elif time.monotonic() - last > plan.get("idle_s", 60):
            break
    for s in listeners:
        s.close()
    complete = finished.is_set()
    if complete:
        for name, link in plan.get("links", {}).items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.lexists(path):
                if os.path.islink(path) and os.readlink(path) == link:
                    continue
                os.unlink(path)
            os.symlink(link, path)
            if owner is not None and os.geteuid() == 0:
                os.lchown(path, owner[0], owner[1])
    if hashed and plan.get("cache"):
        # What arrived was hashed chunk by chunk on the way in: the manifest after the copy
        # (and the next sync) takes those hashes instead of reading every byte again.
        try:
            with open(plan["cache"]) as f:
                cache = json.load(f)
        except (OSError, ValueError):
            cache = {}
        cache.update(hashed)
        try:
            os.makedirs(os.path.dirname(plan["cache"]), exist_ok=True)
            with open(plan["cache"] + ".tmp", "w") as f:
                json.dump(cache, f)
            os.replace(plan["cache"] + ".tmp", plan["cache"])
        except OSError:
            pass
    if progress:
        write_progress(progress, state["bytes"], state["done"])
    try:
        os.unlink(pid_file)
    except OSError:
        pass
    print(json.dumps({"complete": complete, "bytes": state["bytes"], "files": state["done"],
                      "bad_chunks": state["bad"], "errors": state["errors"][:5]}), flush=True)
    return 0 if complete else 1


def send(plan):
    root, chunk = plan["root"], plan["chunk"]
    secret = bytes.fromhex(plan["secret"])
    files = plan["files"]
    jobs = [(i, n) for i, f in enumerate(files) for n in f["send"]]
    jobs.sort(key=lambda job: (job[1], job[0]))  # spread the streams over files
    lock = threading.Lock()
    sent = {"bytes": 0, "errors": []}
    streams = [(plan["targets"][k % len(plan["targets"])]) for k in range(plan["streams"])]
    per_stream = (plan["max_mbps"] * 1e6 / 8 / len(streams)) if plan.get("max_mbps") else None
    with open(os.path.join(root, ".spark-sync.send.pid"), "w") as f:
        f.write(str(os.getpid()))

    def next_job():
        with lock:
            return jobs.pop() if jobs else None

    def give_back(job):
        with lock:
            jobs.append(job)

    def pump(bind, address, port):
        deadline = time.monotonic() + 15
        while True:
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.bind((bind, 0))
            conn.settimeout(60)
            try:
                conn.connect((address, port))
                break
            except OSError as exc:
                conn.close()
                if time.monotonic() > deadline:
                    with lock:
                        sent["errors"].append("connect %s:%d from %s: %s" % (address, port, bind, exc))
                    return
                time.sleep(0.1)
        try:
            nonce = recv_exact(conn, 32)
            conn.sendall(hmac.new(secret, nonce, hashlib.sha256).digest())
            handles = {}
            began, moved = time.monotonic(), 0
            while True:
                job = next_job()
                if job is None:
                    try:
                        conn.sendall(HEADER.pack(END, 0, 0))
                    except OSError:
                        pass  # the receiver has everything and may have gone already
                    return
                index, number = job
                size = files[index]["size"]
                offset = number * chunk
                length = min(chunk, size - offset)
                if index not in handles:
                    handles[index] = open(os.path.join(root, files[index]["path"]), "rb")
                conn.sendall(HEADER.pack(index, number, length))
                try:
                    if length:
                        conn.sendfile(handles[index], offset, length)
                    ack = recv_exact(conn, 1)
                except (OSError, EOFError):
                    give_back(job)  # another stream takes it
                    raise
                if ack != b"\x01":
                    with lock:
                        sent["errors"].append("chunk %d of %s did not verify" % (number, files[index]["path"]))
                    continue
                moved += length
                with lock:
                    sent["bytes"] += length
                if per_stream:
                    ahead = moved / per_stream - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        except (OSError, EOFError) as exc:
            with lock:
                sent["errors"].append(str(exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=pump, args=tuple(t)) for t in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        os.unlink(os.path.join(root, ".spark-sync.send.pid"))
    except OSError:
        pass
    print(json.dumps({"bytes": sent["bytes"], "errors": sent["errors"][:5], "left": len(jobs)}), flush=True)
    return 0 if not jobs and not sent["errors"] else 1


if __name__ == "__main__":
    plan = json.loads(sys.stdin.read())
    sys.exit(receive(plan) if sys.argv[1] == "recv" else send(plan))
