"""Names the node tests share (import them from here: ``conftest`` is ambiguous
when the whole suite runs, since every test directory has one)."""

BUSYBOX = "kubeplane.local/busybox:latest"
PAUSE = "kubeplane.local/pause:3.10"


def own_cgroup_root(name: str) -> str:
    """A cgroup root of this test process's own (nodes of tests running side by side stay apart)."""
    import os

    return f"/kubeplane-test-{os.getpid()}-{name}"


def remove_cgroup_root(root: str) -> None:
    """Remove the cgroups under ``root`` in every hierarchy (only empty ones can go: a
    cgroup still holding a process stays, and the check that follows sees it)."""
    import os

    from kubeplane.node.cgroups import mounted_hierarchies

    for h in mounted_hierarchies():
        top = os.path.join(h.path, root.strip("/"))
        for d, _, _ in os.walk(top, topdown=False):
            try:
                os.rmdir(d)
            except OSError:
                pass
