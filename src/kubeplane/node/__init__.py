"""The node agent: what the kubelet does on a host.

``agent`` registers the Node and runs the pods bound to it through the
Container Runtime Interface (``cri``) of a container runtime (containerd,
started and owned by ``containerd`` or reached through its socket);
``images`` imports image archives into it and builds the small test images.
Simulated nodes, which run no container, live in
:mod:`kubeplane.controllers.nodeagent`.
"""

import os as _os

# The node runs tools (ctr, ip, nft, mount) as child processes while gRPC calls to
# the runtime are in flight; its children exec at once and never use gRPC, so
# gRPC's fork handlers are not wanted (they only log "skipping fork() handlers").
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
