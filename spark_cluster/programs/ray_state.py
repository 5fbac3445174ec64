"""Ray's view of the cluster from the head's dashboard, without importing ray (a second or two).

    python3 -I -S ray_state.py DASHBOARD_URL [TOKEN_FILE]
    -> {"version", "nodes": [{"ip", "state", "head", "gpus", "message"}]}
       or {"error", ["refused", "unread"]}

With token authentication the token is read here, on the head, from its file: it never
travels, and is on no command line.
"""
import json, sys, urllib.error, urllib.request
base = sys.argv[1]
headers, unread = {}, None
if len(sys.argv) > 2:
    try:
        with open(sys.argv[2]) as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    except OSError as e:
        unread = "cannot read %s: %s" % (sys.argv[2], e.strerror)
def get(path):
    request = urllib.request.Request(base + path, headers=headers)
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.load(r)
try:
    nodes = get("/api/v0/nodes?detail=1&limit=100")["data"]["result"]["result"]
    version = get("/api/version").get("ray_version")
except urllib.error.HTTPError as e:
    if e.code in (401, 403):
        print(json.dumps({"error": "HTTP %d %s" % (e.code, e.reason), "refused": e.code, "unread": unread}))
        sys.exit(0)
    print(json.dumps({"error": "HTTPError: %s" % e})); sys.exit(0)
except Exception as e:
    print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)})); sys.exit(0)
print(json.dumps({"version": version, "nodes": [
    {"ip": n.get("node_ip"), "state": n.get("state"), "head": bool(n.get("is_head_node")),
     "gpus": (n.get("resources_total") or {}).get("GPU", 0), "message": n.get("state_message") or ""}
    for n in nodes]}))
