"""The version of the Ray this Python imports, read from its metadata; fails (ModuleNotFoundError)
where it has none. Importing ray to ask would cost a second on every node at every `up`."""
import importlib.util, os, sys
spec = importlib.util.find_spec("ray")
if spec is None or not spec.submodule_search_locations:
    sys.exit("ModuleNotFoundError: No module named 'ray'")
site = os.path.dirname(list(spec.submodule_search_locations)[0])
for name in sorted(os.listdir(site)):
    if name.startswith("ray-") and name.endswith((".dist-info", ".egg-info")):
        for meta in ("METADATA", "PKG-INFO"):
            try:
                with open(os.path.join(site, name, meta), encoding="utf-8", errors="replace") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            print(line.split(":", 1)[1].strip())
                            sys.exit(0)
            except OSError:
                continue
import ray  # a Ray without metadata (run from a source tree): ask it
print(ray.__version__)
