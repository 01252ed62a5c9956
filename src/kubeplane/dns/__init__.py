"""Cluster DNS: a DNS server for the Kubernetes DNS schema, run by the control plane.

* :mod:`kubeplane.dns.records` — the records of the cluster domain, from the
  informers' stores of Services, EndpointSlices, Namespaces (and Pods);
* :mod:`kubeplane.dns.server` — the UDP/TCP server and the forwarding of
  other names to the upstream resolvers;
* :mod:`kubeplane.dns.kubedns` — the ``kube-dns`` Service and its endpoints;
* :mod:`kubeplane.dns.component` — the three together, as ``kubeplane up``
  and ``kubeplane dns`` run them.
"""
