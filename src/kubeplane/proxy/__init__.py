"""Services on every node: kube-proxy's nftables mode (``kubeplane proxy``, or inside ``kubeplane node``)."""

from kubeplane.proxy.proxier import Proxier, ProxyConfig
from kubeplane.proxy.server import ServiceProxy

__all__ = ["Proxier", "ProxyConfig", "ServiceProxy"]
