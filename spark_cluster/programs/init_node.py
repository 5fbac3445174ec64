"""What `spark-cluster init` runs on a node as root: read what it may change, check candidate
files with the tools that read them, and change files through a journal written first.

    inspect USER IFACE...   JSON: /etc/netplan's files, USER's authorized_keys, init's sudoers
                            file, the interfaces' addresses, open journals, which tools exist
    validate                stdin JSON {"netplan": {path: text}, "sudoers": {path: text}}: the
                            netplan files as they would be, through `netplan generate --root-dir`;
                            each sudoers file through `visudo -cf`. JSON {"errors": [...]}
    apply ID                stdin JSON {"files": [...], "groups": [[user, group]], "interfaces":
                            [...]}: the journal of all of it first (what each file was, the
                            interfaces' addresses and MTU), then the changes. JSON of what changed
    restore ID|--all        put back what journal ID (every journal not yet restored, newest
                            first, with --all) recorded; netplan applied again when its files
                            changed, then the interfaces' addresses and MTU. JSON of what it did
    --root DIR              (first) every path under DIR: for tests

Standard library only, Python 3.8: it runs on the node's own python3.
"""

import base64
import datetime
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

ROOT = "/"
JOURNALS = "var/lib/spark-cluster/init"
NETPLAN = "etc/netplan"


def real(path):
    """`path` (absolute on the node) under ROOT."""
    return os.path.join(ROOT, path.lstrip("/"))


def journal_dir():
    return real("/" + JOURNALS)


def read_file(path):
    """What a file is now: its text (base64), mode and owner; None when there is none."""
    try:
        st = os.lstat(real(path))
        with open(real(path), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return {"b64": base64.b64encode(data).decode(), "mode": st.st_mode & 0o7777, "uid": st.st_uid, "gid": st.st_gid}


def text_of(record):
    return None if record is None else base64.b64decode(record["b64"]).decode("utf-8", "replace")


def write_file(path, data, mode, uid, gid):
    """Replace `path` in one step (a temporary file beside it, renamed): never half written."""
    target = real(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".spark-cluster-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.chown(tmp, uid, gid)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def ip_json(*args):
    done = subprocess.run(["ip", "-j", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    try:
        return json.loads(done.stdout or "[]")
    except ValueError:
        return []


def interface_state(name):
    rows = ip_json("addr", "show", "dev", name)
    if not rows:
        return None
    row = rows[0]
    ipv4 = ["%s/%s" % (a["local"], a["prefixlen"]) for a in row.get("addr_info", [])
            if a.get("family") == "inet" and a.get("scope") == "global"]
    return {"name": name, "mtu": row.get("mtu"), "up": "UP" in row.get("flags", []), "ipv4": ipv4}


def journals():
    """Every journal on this node, oldest first."""
    found = []
    try:
        names = sorted(os.listdir(journal_dir()))
    except FileNotFoundError:
        return []
    for name in names:
        if name.endswith(".json"):
            with open(os.path.join(journal_dir(), name)) as f:
                found.append(json.load(f))
    return found


def save_journal(journal):
    """Written whole and synced before any change it describes: root's alone (0700, 0600)."""
    os.makedirs(journal_dir(), mode=0o700, exist_ok=True)
    os.chmod(journal_dir(), 0o700)
    data = (json.dumps(journal, indent=1) + "\n").encode()
    write_file("/%s/%s.json" % (JOURNALS, journal["id"]), data, 0o600, 0, 0)
    dirfd = os.open(journal_dir(), os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def inspect(user, interfaces):
    netplan = {}
    directory = real("/" + NETPLAN)
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.endswith(".yaml"):
            record = read_file("/%s/%s" % (NETPLAN, name))
            if record is not None:
                netplan["/%s/%s" % (NETPLAN, name)] = {"text": text_of(record), "mode": record["mode"]}
    home = pwd.getpwnam(user).pw_dir
    keys = read_file(home + "/.ssh/authorized_keys")
    return {
        "netplan": netplan, "home": home, "authorized_keys": text_of(keys),
        "sudoers": {p: text_of(read_file(p)) for p in ("/etc/sudoers.d/spark-cluster",) if read_file(p)},
        "groups": [g.gr_name for g in grp.getgrall() if user in g.gr_mem],
        "interfaces": [s for s in (interface_state(i) for i in interfaces) if s],
        "journals": [{"id": j["id"], "state": j["state"], "created": j["created"]} for j in journals()],
        "tools": {t: shutil.which(t) is not None for t in ("netplan", "visudo", "usermod", "gpasswd")},
    }


def validate(request):
    errors = []
    candidates = request.get("netplan") or {}
    if candidates:
        scratch = tempfile.mkdtemp(prefix="spark-cluster-netplan-")
        try:
            target = os.path.join(scratch, NETPLAN)
            os.makedirs(target)
            directory = real("/" + NETPLAN)
            for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
                if name.endswith(".yaml"):
                    shutil.copy(os.path.join(directory, name), os.path.join(target, name))
            for path, text in candidates.items():
                dest = os.path.join(target, os.path.basename(path))
                with open(dest, "w") as f:
                    f.write(text)
                os.chmod(dest, 0o600)
            done = subprocess.run(["netplan", "generate", "--root-dir", scratch], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, universal_newlines=True)
            if done.returncode != 0:
                errors.append("netplan generate: " + done.stdout.replace(scratch, "").strip())
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    for path, text in (request.get("sudoers") or {}).items():
        fd, tmp = tempfile.mkstemp(prefix="spark-cluster-sudoers-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            done = subprocess.run(["visudo", "-cf", tmp], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  universal_newlines=True)
            if done.returncode != 0:
                errors.append("visudo -cf %s: %s" % (path, done.stdout.replace(tmp, path).strip()))
        finally:
            os.unlink(tmp)
    return {"errors": errors}


def _owner(name):
    entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def apply(journal_id, request):
    entries = []
    for item in request.get("files", []):
        parent = os.path.dirname(item["path"])
        if item.get("owner") and not os.path.isdir(real(parent)):
            entries.append({"kind": "dir", "path": parent})
        entries.append({"kind": "file", "path": item["path"], "before": read_file(item["path"])})
    for user, group in request.get("groups", []):
        entries.append({"kind": "group", "user": user, "group": group})
    for name in request.get("interfaces", []):
        state = interface_state(name)
        if state is not None:
            entries.append(dict(state, kind="interface"))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    journal = {"id": journal_id, "created": stamp, "by": "spark-cluster init", "state": "open", "entries": entries}
    save_journal(journal)
    changed = []
    for item in request.get("files", []):
        uid, gid = _owner(item["owner"]) if item.get("owner") else (0, 0)
        parent = os.path.dirname(item["path"])
        if not os.path.isdir(real(parent)):
            os.makedirs(real(parent), mode=0o700)
            os.chown(real(parent), uid, gid)
            changed.append("made %s" % parent)
        write_file(item["path"], item["text"].encode(), item["mode"], uid, gid)
        changed.append("wrote %s" % item["path"])
    for user, group in request.get("groups", []):
        subprocess.run(["usermod", "-aG", group, user], check=True)
        changed.append("added %s to the %s group" % (user, group))
    journal["state"] = "applied"
    save_journal(journal)
    return {"journal": "/%s/%s.json" % (JOURNALS, journal_id), "changed": changed}


def _ip(*args):
    done = subprocess.run(["ip", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if done.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), done.stderr.strip()))


def restore_one(journal):
    said = []
    netplan_changed = False
    for entry in reversed(journal["entries"]):
        if entry["kind"] == "file":
            before = entry["before"]
            if before is None:
                if os.path.lexists(real(entry["path"])):
                    os.unlink(real(entry["path"]))
                    said.append("removed %s" % entry["path"])
            else:
                current = read_file(entry["path"])
                if current is None or current["b64"] != before["b64"] or current["mode"] != before["mode"]:
                    write_file(entry["path"], base64.b64decode(before["b64"]), before["mode"], before["uid"],
                               before["gid"])
                    said.append("restored %s" % entry["path"])
            netplan_changed = netplan_changed or entry["path"].startswith("/%s/" % NETPLAN)
        elif entry["kind"] == "dir":
            try:
                os.rmdir(real(entry["path"]))
                said.append("removed %s" % entry["path"])
            except OSError:
                pass  # not empty: something else lives there now
        elif entry["kind"] == "group":
            subprocess.run(["gpasswd", "-d", entry["user"], entry["group"]], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            said.append("took %s out of the %s group" % (entry["user"], entry["group"]))
    if netplan_changed and ROOT == "/":
        done = subprocess.run(["netplan", "apply"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)
        said.append("netplan apply" + ("" if done.returncode == 0 else " failed: " + done.stdout.strip()))
    for entry in journal["entries"]:
        if entry["kind"] == "interface" and ROOT == "/":
            now = interface_state(entry["name"])
            if now is None:
                continue
            if now["mtu"] != entry["mtu"]:
                _ip("link", "set", "dev", entry["name"], "mtu", str(entry["mtu"]))
            if sorted(now["ipv4"]) != sorted(entry["ipv4"]):
                _ip("-4", "addr", "flush", "dev", entry["name"], "scope", "global")
                for address in entry["ipv4"]:
                    _ip("addr", "add", address, "dev", entry["name"])
            if now["up"] != entry["up"]:
                _ip("link", "set", "dev", entry["name"], "up" if entry["up"] else "down")
            if now["mtu"] != entry["mtu"] or sorted(now["ipv4"]) != sorted(entry["ipv4"]) or now["up"] != entry["up"]:
                said.append("%s back to MTU %s, %s" % (entry["name"], entry["mtu"],
                                                       ", ".join(entry["ipv4"]) or "no address"))
    journal["state"] = "restored"
    save_journal(journal)
    return said


def restore(which):
    done = []
    for journal in reversed(journals()):
        if journal["state"] != "restored" and which in ("--all", journal["id"]):
            done.append({"journal": journal["id"], "restored": restore_one(journal)})
    return {"journals": done}


def main(argv):
    global ROOT
    if argv[:1] == ["--root"]:
        ROOT, argv = argv[1], argv[2:]
    command, args = argv[0], argv[1:]
    if command == "inspect":
        result = inspect(args[0], args[1:])
    elif command == "validate":
        result = validate(json.load(sys.stdin))
    elif command == "apply":
        result = apply(args[0], json.load(sys.stdin))
    elif command == "restore":
        result = restore(args[0])
    else:
        sys.stderr.write("usage: init_node.py inspect|validate|apply|restore ...\n")
        return 2
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
