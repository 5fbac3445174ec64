"""The version of the Ray this Python imports; fails (ModuleNotFoundError) where it has none."""
import ray
print(ray.__version__)
