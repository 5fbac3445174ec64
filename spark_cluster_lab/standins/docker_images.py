"""docker version, info, images, image, inspect, tag and rmi: the engine and its (offline) image store."""

from __future__ import annotations

import time

from spark_cluster_lab.standins import containers as ct
from spark_cluster_lab.standins.common import Ctx, err, out
from spark_cluster_lab.standins.docker_cli import (
    BUILD, VERSION, Usage, any_of, find_image, last, normalize, options, print_json, pull_error, template_out,
)
from spark_cluster_lab.standins.docker_fmt import format_rows, human_duration, human_size, iso, parse_iso, table

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

IMAGE_HEADERS = {"Repository": "REPOSITORY", "Tag": "TAG", "ID": "IMAGE ID", "CreatedSince": "CREATED",
                 "CreatedAt": "CREATED AT", "Size": "SIZE", "Digest": "DIGEST"}

def container_inspect(state: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    status = ct.status(c)
    argv = c["entrypoint"] + c["cmd"]
    return {
        "Id": c["id"], "Created": iso(c["created"]), "Path": argv[0] if argv else "", "Args": argv[1:],
        "State": {"Status": status, "Running": status == "running", "Paused": False, "Restarting": False,
                  "OOMKilled": False, "Dead": False, "Pid": c["pid"] if status == "running" else 0,
                  "ExitCode": ct.exit_code(c) if status == "exited" else 0, "Error": c.get("error", ""),
                  "StartedAt": iso(c.get("started") or 0), "FinishedAt": iso(c.get("finished") or 0)},
        "Image": c["image_id"], "LogPath": str(c["log"]), "Name": "/" + c["name"], "RestartCount": 0,
        "Driver": "overlayfs", "Platform": "linux",
        "HostConfig": c["host_config"],
        "Config": {"Hostname": state["identity"]["hostname"], "Env": [f"{k}={v}" for k, v in c["env"].items()],
                   "Cmd": c["cmd"] or None, "Image": c["image"], "WorkingDir": c["workdir"] or "",
                   "Entrypoint": c["entrypoint"] or None, "Labels": {}},
        "NetworkSettings": {"Networks": {c["host_config"]["NetworkMode"]: {"NetworkID": c["id"][::-1]}}},
    }


def image_view(ref: str, img: dict[str, Any]) -> dict[str, Any]:
    repo, _, tag = ref.rpartition(":")
    created = parse_iso(img["created"])
    return {"Repository": repo, "Tag": tag, "ID": img["id"].removeprefix("sha256:")[:12], "Digest": "<none>",
            "CreatedAt": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(created)),
            "CreatedSince": f"{human_duration(time.time() - created)} ago", "Size": human_size(img["size"]),
            "Containers": "N/A", "SharedSize": "N/A", "UniqueSize": "N/A", "VirtualSize": human_size(img["size"])}


def image_inspect(ref: str, img: dict[str, Any]) -> dict[str, Any]:
    digest = f"{ref.rpartition(':')[0]}@sha256:{img['id'][-64:][::-1]}"
    return {"Id": img["id"], "RepoTags": [ref], "RepoDigests": [digest],
            "Parent": "", "Comment": "", "Created": img["created"], "DockerVersion": "", "Author": "",
            "Config": {"Env": ["PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:"
                               "/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": img["cmd"], "Entrypoint": img["entrypoint"],
                       "WorkingDir": img["workdir"], "Labels": {}},
            "Architecture": "arm64", "Os": "linux", "Size": img["size"],
            "RootFS": {"Type": "layers", "Layers": [img["id"]]}, "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"}}


def cmd_version(ctx: Ctx, argv: list[str]) -> int:
    opts, _ = options(argv, {"-f", "--format"}, set(), "version")
    data = {"Client": {"Version": VERSION, "ApiVersion": "1.52", "GitCommit": BUILD, "Os": "linux", "Arch": "arm64"},
            "Server": {"Version": VERSION, "ApiVersion": "1.52", "MinAPIVersion": "1.24", "Os": "linux",
                       "Arch": "arm64"}}
    fmt = last(opts, "-f", "--format")
    if fmt:
        return template_out(fmt, [data])
    out(f"Client: Docker Engine - Community\n Version:           {VERSION}\n API version:       1.52\n"
        f" Go version:        go1.25.6\n Git commit:        {BUILD}\n OS/Arch:           linux/arm64\n"
        f" Context:           default\n\nServer: Docker Engine - Community\n Engine:\n  Version:          {VERSION}\n"
        f"  API version:      1.52 (minimum version 1.24)\n  OS/Arch:          linux/arm64")
    return 0


def cmd_info(ctx: Ctx, argv: list[str]) -> int:
    opts, _ = options(argv, {"-f", "--format"}, set(), "info")
    state = ctx.state
    cs = [ct.status(c) for c in state["docker"]["containers"].values()]
    mem_bytes = state["memory"]["total_kib"] * 1024
    data = {"ID": state["identity"]["machine_id"][:8].upper(), "Containers": len(cs),
            "ContainersRunning": cs.count("running"), "ContainersPaused": 0,
            "ContainersStopped": len(cs) - cs.count("running"), "Images": len(state["docker"]["images"]),
            "Driver": "overlayfs", "LoggingDriver": "json-file", "CgroupDriver": "systemd", "CgroupVersion": "2",
            "KernelVersion": state["kernel"]["running"], "OperatingSystem": state["identity"]["os"]["pretty_name"],
            "OSType": "linux", "Architecture": "aarch64", "NCPU": 20, "MemTotal": mem_bytes,
            "Name": state["identity"]["hostname"], "ServerVersion": VERSION, "DockerRootDir": "/var/lib/docker",
            "Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}},
            "DefaultRuntime": "runc", "Swarm": {"LocalNodeState": "inactive"}}
    fmt = last(opts, "-f", "--format")
    if fmt:
        return template_out(fmt, [data])
    out(f"""Client: Docker Engine - Community
 Version:    {VERSION}
 Context:    default
 Debug Mode: false
 Plugins:
  buildx: Docker Buildx (Docker Inc.)
    Version:  v0.31.1
    Path:     /usr/libexec/docker/cli-plugins/docker-buildx
  compose: Docker Compose (Docker Inc.)
    Version:  v5.0.2
    Path:     /usr/libexec/docker/cli-plugins/docker-compose

Server:
 Containers: {data['Containers']}
  Running: {data['ContainersRunning']}
  Paused: 0
  Stopped: {data['ContainersStopped']}
 Images: {data['Images']}
 Server Version: {VERSION}
 Storage Driver: overlayfs
  driver-type: io.containerd.snapshotter.v1
 Logging Driver: json-file
 Cgroup Driver: systemd
 Cgroup Version: 2
 Plugins:
  Volume: local
  Network: bridge host ipvlan macvlan null overlay
  Log: awslogs fluentd gcplogs gelf journald json-file local splunk syslog
 CDI spec directories:
  /etc/cdi
  /var/run/cdi
 Swarm: inactive
 Runtimes: io.containerd.runc.v2 runc
 Default Runtime: runc
 Init Binary: docker-init
 Security Options:
  apparmor
  seccomp
   Profile: builtin
  cgroupns
 Kernel Version: {data['KernelVersion']}
 Operating System: {data['OperatingSystem']}
 OSType: linux
 Architecture: aarch64
 CPUs: 20
 Total Memory: {mem_bytes / 2**30:.1f}GiB
 Name: {data['Name']}
 ID: {data['ID']}
 Docker Root Dir: /var/lib/docker
 Debug Mode: false
 Experimental: false
 Insecure Registries:
  ::1/128
  127.0.0.0/8
 Live Restore Enabled: false
 Firewall Backend: iptables""")
    return 0


def cmd_images(ctx: Ctx, argv: list[str]) -> int:
    opts, rest = options(argv, {"--format", "-f", "--filter"},
                         {"-q", "--quiet", "-a", "--all", "--no-trunc", "--digests"}, "images")
    images = sorted(ctx.state["docker"]["images"].items(), key=lambda kv: kv[1]["created"], reverse=True)
    if rest:
        images = [(r, i) for r, i in images if r == normalize(rest[0]) or r.rpartition(":")[0] == rest[0]]
    views = [image_view(r, i) for r, i in images]
    if any_of(opts, "-q", "--quiet"):
        if views:
            out("\n".join(v["ID"] for v in views))
        return 0
    fmt = last(opts, "--format")
    if fmt:
        if views:
            out(format_rows(fmt, views, IMAGE_HEADERS))
        return 0
    out(table([["REPOSITORY", "TAG", "IMAGE ID", "CREATED", "SIZE"]]
              + [[v["Repository"], v["Tag"], v["ID"], v["CreatedSince"], v["Size"]] for v in views]))
    return 0


def cmd_image(ctx: Ctx, argv: list[str]) -> int:
    sub, rest = (argv[0], argv[1:]) if argv else ("", [])
    if sub in ("ls", "list"):
        return cmd_images(ctx, rest)
    if sub == "inspect":
        return cmd_inspect(ctx, rest, kind="image")
    if sub in ("rm", "remove"):
        return cmd_rmi(ctx, rest)
    if sub == "pull":
        return cmd_pull(ctx, rest)
    if sub == "tag":
        return cmd_tag(ctx, rest)
    raise Usage(f"docker: unknown command: docker image {sub}\n\nRun 'docker image --help' for more information")


def cmd_inspect(ctx: Ctx, argv: list[str], kind: str | None = None) -> int:
    opts, names = options(argv, {"-f", "--format", "--type"}, {"-s", "--size"}, "inspect")
    kind = kind or last(opts, "--type")
    if not names:
        raise Usage(f"\"docker {'image ' if kind == 'image' else ''}inspect\" requires at least 1 argument.")
    state = ctx.state
    found, rc = [], 0
    for name in names:
        c = ct.find(state, name) if kind in (None, "container") else None
        img = find_image(state, name) if kind in (None, "image") and c is None else None
        if c is not None:
            found.append(container_inspect(state, c))
        elif img is not None:
            found.append(image_inspect(*img))
        else:
            rc = 1
            err(f"Error response from daemon: No such image: {normalize(name)}" if kind == "image"
                else f"Error response from daemon: No such container: {name}" if kind == "container"
                else f"Error: No such object: {name}")
    fmt = last(opts, "-f", "--format")
    if fmt:
        if found and template_out(fmt, found):
            return 1
    else:
        print_json(found)
    return rc


def cmd_pull(ctx: Ctx, argv: list[str]) -> int:
    _, rest = options(argv, {"--platform"}, {"-q", "--quiet", "-a", "--all-tags"}, "pull")
    if len(rest) != 1:
        raise Usage("\"docker pull\" requires exactly 1 argument.")
    raise Usage(pull_error(rest[0]))


def cmd_tag(ctx: Ctx, argv: list[str]) -> int:
    if len(argv) != 2:
        raise Usage("\"docker tag\" requires exactly 2 arguments.")
    with ctx.locked() as state:
        src = find_image(state, argv[0])
        if src is None:
            raise Usage(f"Error response from daemon: No such image: {normalize(argv[0])}")
        state["docker"]["images"][normalize(argv[1])] = dict(src[1])
    return 0


def cmd_rmi(ctx: Ctx, argv: list[str]) -> int:
    _, names = options(argv, set(), {"-f", "--force", "--no-prune"}, "rmi")
    rc = 0
    with ctx.locked() as state:
        for name in names:
            hit = find_image(state, name)
            if hit is None:
                err(f"Error response from daemon: No such image: {normalize(name)}")
                rc = 1
                continue
            ref, img = hit
            del state["docker"]["images"][ref]
            out(f"Untagged: {ref}")
            if not any(i["id"] == img["id"] for i in state["docker"]["images"].values()):
                out(f"Deleted: {img['id']}")
    return rc
