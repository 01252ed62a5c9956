"""CRI v1 (runtime.v1): the gRPC API between a kubelet and its container runtime.

``api_pb2``/``api_pb2_grpc`` are generated from upstream's
``k8s.io/cri-api/pkg/apis/runtime/v1/api.proto`` by :mod:`kubeplane.node.cri.gen`;
``client`` is the asyncio client the node agent uses.
"""

#: the labels a kubelet puts on the sandboxes and containers it asks the runtime
#: for (upstream's kuberuntime), by which it finds its pods again
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"
