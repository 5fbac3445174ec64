"""The Python, and the Ray, vLLM and torch installed for it, read from package metadata
(importing ray would cost a second per node).

    python3 versions.py  ->  one line `3.12.3`, then `ray 2.49.2`, `vllm -`, `torch 2.9.0`
"""
import importlib.metadata as m, sys
print(sys.version.split()[0])
for d in ('ray', 'vllm', 'torch'):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, '-')
