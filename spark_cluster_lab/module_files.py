"""The node's /lib/modules (bound over the system's in the lab): the nvidia.ko each installed module
package (or NVIDIA's .run installer) put there, and the `build` link kernel headers give, so that
`find /lib/modules -name 'nvidia.ko*'` and `[ -e /lib/modules/$(uname -r)/build ]` see what the
node's packages say."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from spark_cluster_lab.layout import NodePaths


def lib_modules(paths: NodePaths):  # noqa: ANN201 - a Path; pathlib is imported by the caller
    return paths.root / "lib-modules"


def render_modules(want: set[str], paths: NodePaths) -> None:
    """Make the node's /lib/modules hold exactly the files `want` names (paths under it, empty
    files); the state decides which (state.lib_module_files)."""
    top = lib_modules(paths)
    top.mkdir(parents=True, exist_ok=True)
    have = {str(p.relative_to(top)) for p in top.rglob("*") if p.is_file()}
    for rel in have - want:
        (top / rel).unlink()
    for rel in want - have:
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text("")
    for kdir in list(top.iterdir()):
        for d in sorted((p for p in kdir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            if not any(d.iterdir()):
                d.rmdir()
        if kdir.is_dir() and not any(kdir.iterdir()):
            # Here, not at the top: every stand-in imports this module, and shutil brings zlib,
            # bz2 and lzma with it; only a kernel's removal needs it.
            import shutil

            shutil.rmtree(kdir)
