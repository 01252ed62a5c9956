"""Names the node tests share (import them from here: ``conftest`` is ambiguous
when the whole suite runs, since every test directory has one)."""

BUSYBOX = "kubeplane.local/busybox:latest"
PAUSE = "kubeplane.local/pause:3.10"
