"""The Python, and the Ray, vLLM and torch installed for it, read from package metadata
(importing ray would cost a second per node).

    python3 versions.py  ->  one line `3.12.3`, then `ray 2.49.2`, `vllm -`, `torch 2.9.0`

The first distribution of each name on sys.path wins, as importlib.metadata.version finds it;
read here from the `Version:` header of its METADATA (PKG-INFO for an egg-info) without
importing importlib.metadata, whose imports (email, zipfile, csv, pathlib, re) are most of this
program's time: every `check` runs it on every node.
"""
import os, sys
WANTED = ('ray', 'vllm', 'torch')
def norm(name): return name.lower().replace('-', '_').replace('.', '_')
def version(folder):
    for meta in ('METADATA', 'PKG-INFO'):
        try:
            with open(os.path.join(folder, meta), encoding='utf-8', errors='replace') as f:
                for line in f:
                    if line.startswith('Version:'): return line.split(':', 1)[1].strip()
                    if not line.strip(): break  # the headers end at the first blank line
        except OSError:
            continue
    return None
found = {}
for entry in sys.path:
    try: names = os.listdir(entry or '.')
    except OSError: continue
    for n in sorted(names):
        stem, dot, kind = n.rpartition('.')
        if not dot or kind not in ('dist-info', 'egg-info'): continue
        name = norm(stem.split('-', 1)[0])
        if name in WANTED and name not in found:
            v = version(os.path.join(entry or '.', n))
            if v is not None: found[name] = v
print(sys.version.split()[0])
for d in WANTED: print(d, found.get(d, '-'))
