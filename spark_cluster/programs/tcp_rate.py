"""TCP throughput over one rail with several streams, as iperf3 -P would measure it.

    python3 tcp_rate.py serve BIND_ADDR PORT STREAMS SECONDS   # on the receiving node
    python3 tcp_rate.py send  BIND_ADDR PEER_ADDR PORT STREAMS SECONDS  # on the sending node

Both bind to the rail's own address, so the bytes take that rail and no other. The server
counts what arrives and prints {"bytes", "seconds"}; the client retries its connections
until the server listens, sends for SECONDS, and prints what it sent.
"""

import json
import socket
import sys
import threading
import time

BLOCK = 1 << 20


def serve(bind, port, streams, seconds):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bind, port))
    listener.listen(streams)
    listener.settimeout(seconds + 20)
    counts, firsts, lasts = [0] * streams, [None] * streams, [None] * streams

    def drain(i, conn):
        buffer = bytearray(BLOCK)
        view = memoryview(buffer)
        conn.settimeout(seconds + 20)
        while True:
            try:
                n = conn.recv_into(view)
            except OSError:
                break
            if not n:
                break
            now = time.monotonic()
            if firsts[i] is None:
                firsts[i] = now
            lasts[i] = now
            counts[i] += n
        conn.close()

    threads = []
    try:
        for i in range(streams):
            conn, _ = listener.accept()
            t = threading.Thread(target=drain, args=(i, conn))
            t.start()
            threads.append(t)
    except socket.timeout:
        pass
    for t in threads:
        t.join()
    began = min((f for f in firsts if f is not None), default=None)
    ended = max((f for f in lasts if f is not None), default=None)
    elapsed = (ended - began) if began is not None and ended is not None else 0.0
    print(json.dumps({"bytes": sum(counts), "seconds": round(elapsed, 4), "streams": len(threads)}))


def send(bind, peer, port, streams, seconds):
    deadline = time.monotonic() + 10
    conns = []
    while len(conns) < streams:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((bind, 0))
        s.settimeout(3)
        try:
            s.connect((peer, port))
        except OSError as exc:
            s.close()
            if time.monotonic() > deadline:
                print(json.dumps({"error": "connect %s:%d from %s: %s" % (peer, port, bind, exc)}))
                for c in conns:
                    c.close()
                return 1
            time.sleep(0.1)
            continue
        conns.append(s)
    payload = b"\0" * BLOCK
    sent = [0] * streams
    end = time.monotonic() + seconds

    def pump(i, conn):
        conn.settimeout(seconds + 10)
        try:
            while time.monotonic() < end:
                sent[i] += conn.send(payload)
        except OSError:
            pass
        conn.close()

    threads = [threading.Thread(target=pump, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"bytes": sum(sent), "seconds": seconds}))
    return 0


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        serve(rest[0], int(rest[1]), int(rest[2]), float(rest[3]))
    else:
        sys.exit(send(rest[0], rest[1], int(rest[2]), int(rest[3]), float(rest[4])))
