"""The node agent: what the kubelet does on a host.

``agent`` registers the Node and runs the pods bound to it through the
Container Runtime Interface (``cri``) of a container runtime (containerd,
started and owned by ``containerd`` or reached through its socket);
``images`` imports image archives into it and builds the small test images.
Simulated nodes, which run no container, live in
:mod:`kubeplane.controllers.nodeagent`.
"""
