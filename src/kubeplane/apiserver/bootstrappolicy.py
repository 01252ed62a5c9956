"""Upstream's RBAC bootstrap policy, reconciled when the API server starts.

The roles and bindings every cluster starts with (upstream's
plugin/pkg/auth/authorizer/rbac/bootstrappolicy): the user-facing roles
(cluster-admin; admin, edit and view, filled by aggregation from the
``system:aggregate-to-*`` roles), the discovery and public-info roles every
client needs, the roles of the components (scheduler, controller manager,
nodes, volume scheduler) and of the controllers kubeplane runs.

Reconciliation is upstream's ``autoupdate``: a missing object is created; an
existing one annotated ``rbac.authorization.kubernetes.io/autoupdate: "true"``
(or not annotated) gets what it lacks (rules, aggregation selectors,
subjects, labels and annotations) and keeps what an administrator added; one
annotated ``"false"`` is left alone. A binding whose roleRef changed is
recreated, since roleRef is immutable.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.auth.rbac import GROUP, uncovered

log = logging.getLogger("kubeplane.apiserver")

Obj = dict[str, Any]

AUTOUPDATE = "rbac.authorization.kubernetes.io/autoupdate"
BOOTSTRAPPING = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"

CRUD = "create,delete,deletecollection,patch,update"
READ = "get,list,watch"
EVENT_WRITE = "create,patch,update"


def r(verbs: str, groups: str, resources: str, names: str = "") -> Obj:
    """A resource rule; each argument a comma-separated list ("" in groups is the core group)."""
    out: Obj = {"verbs": verbs.split(","), "apiGroups": groups.split(","), "resources": resources.split(",")}
    if names:
        out["resourceNames"] = names.split(",")
    return out


def urls(verbs: str, paths: str) -> Obj:
    return {"verbs": verbs.split(","), "nonResourceURLs": paths.split(",")}


EVENTS = r(EVENT_WRITE, ",events.k8s.io", "events")


def _role(name: str, rules: list[Obj] | None = None, *, labels: dict[str, str] | None = None,
          aggregate: str | None = None) -> Obj:
    obj: Obj = {
        "apiVersion": f"{GROUP}/v1", "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {**BOOTSTRAPPING, **(labels or {})},
                     "annotations": {AUTOUPDATE: "true"}},
    }
    if aggregate is not None:
        obj["aggregationRule"] = {"clusterRoleSelectors": [{"matchLabels": {AGGREGATE_TO + aggregate: "true"}}]}
        obj["rules"] = []
    else:
        obj["rules"] = rules or []
    return obj


def _to(which: str) -> dict[str, str]:
    return {AGGREGATE_TO + which: "true"}


def _binding(name: str, role: str, subjects: list[Obj]) -> Obj:
    obj: Obj = {
        "apiVersion": f"{GROUP}/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": dict(BOOTSTRAPPING), "annotations": {AUTOUPDATE: "true"}},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
    }
    if subjects:
        obj["subjects"] = subjects
    return obj


def group(name: str) -> Obj:
    return {"apiGroup": GROUP, "kind": "Group", "name": name}


def user(name: str) -> Obj:
    return {"apiGroup": GROUP, "kind": "User", "name": name}


def service_account(namespace: str, name: str) -> Obj:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def cluster_roles() -> list[Obj]:
    return [
        _role("cluster-admin", [r("*", "*", "*"), urls("*", "*")]),
        _role("admin", aggregate="admin"),
        _role("edit", labels=_to("admin"), aggregate="edit"),
        _role("view", labels=_to("edit"), aggregate="view"),
        _role("system:aggregate-to-admin", [
            r("create", "authorization.k8s.io", "localsubjectaccessreviews"),
            r(f"{CRUD},get,list,watch", GROUP, "rolebindings,roles"),
        ], labels=_to("admin")),
        _role("system:aggregate-to-edit", [
            r(READ, "", "pods/attach,pods/exec,pods/portforward,pods/proxy,secrets,services/proxy"),
            r("impersonate", "", "serviceaccounts"),
            r(CRUD, "", "pods,pods/attach,pods/exec,pods/portforward,pods/proxy"),
            r("create", "", "pods/eviction"),
            r(CRUD, "", "configmaps,persistentvolumeclaims,replicationcontrollers,replicationcontrollers/scale,"
                        "secrets,serviceaccounts,services,services/proxy"),
            r("create", "", "serviceaccounts/token"),
            r(CRUD, ",events.k8s.io", "events"),
            r(CRUD, "apps", "daemonsets,deployments,deployments/rollback,deployments/scale,replicasets,"
                            "replicasets/scale,statefulsets,statefulsets/scale"),
            r(CRUD, "autoscaling", "horizontalpodautoscalers"),
            r(CRUD, "batch", "cronjobs,jobs"),
            r(CRUD, "extensions", "daemonsets,deployments,deployments/rollback,deployments/scale,ingresses,"
                                  "networkpolicies,replicasets,replicasets/scale,replicationcontrollers/scale"),
            r(CRUD, "policy", "poddisruptionbudgets"),
            r(CRUD, "networking.k8s.io", "ingresses,networkpolicies"),
            r(f"{CRUD},get,list,watch", "coordination.k8s.io", "leases"),
            r(CRUD, "resource.k8s.io", "resourceclaims,resourceclaimtemplates"),
        ], labels=_to("edit")),
        _role("system:aggregate-to-view", [
            r(READ, "", "configmaps,endpoints,persistentvolumeclaims,persistentvolumeclaims/status,pods,"
                        "replicationcontrollers,replicationcontrollers/scale,serviceaccounts,services,"
                        "services/status"),
            r(READ, "", "bindings,limitranges,namespaces/status,pods/log,pods/status,replicationcontrollers/status,"
                        "resourcequotas,resourcequotas/status"),
            r(READ, "", "namespaces"),
            r(READ, ",events.k8s.io", "events"),
            r(READ, "discovery.k8s.io", "endpointslices"),
            r(READ, "apps", "controllerrevisions,daemonsets,daemonsets/status,deployments,deployments/scale,"
                            "deployments/status,replicasets,replicasets/scale,replicasets/status,statefulsets,"
                            "statefulsets/scale,statefulsets/status"),
            r(READ, "autoscaling", "horizontalpodautoscalers,horizontalpodautoscalers/status"),
            r(READ, "batch", "cronjobs,cronjobs/status,jobs,jobs/status"),
            r(READ, "extensions", "daemonsets,daemonsets/status,deployments,deployments/scale,deployments/status,"
                                  "ingresses,ingresses/status,networkpolicies,replicasets,replicasets/scale,"
                                  "replicasets/status,replicationcontrollers/scale"),
            r(READ, "policy", "poddisruptionbudgets,poddisruptionbudgets/status"),
            r(READ, "networking.k8s.io", "ingresses,ingresses/status,networkpolicies"),
            r(READ, "resource.k8s.io", "resourceclaims,resourceclaims/status,resourceclaimtemplates"),
        ], labels=_to("view")),
        _role("system:auth-delegator", [
            r("create", "authentication.k8s.io", "tokenreviews"),
            r("create", "authorization.k8s.io", "subjectaccessreviews"),
        ]),
        _role("system:basic-user", [
            r("create", "authorization.k8s.io", "selfsubjectaccessreviews,selfsubjectrulesreviews"),
            r("create", "authentication.k8s.io", "selfsubjectreviews"),
        ]),
        _role("system:certificates.k8s.io:certificatesigningrequests:nodeclient", [
            r("create", "certificates.k8s.io", "certificatesigningrequests/nodeclient"),
        ]),
        _role("system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", [
            r("create", "certificates.k8s.io", "certificatesigningrequests/selfnodeclient"),
        ]),
        *(_role(f"system:certificates.k8s.io:{which}-approver", [
            r("approve", "certificates.k8s.io", "signers", f"kubernetes.io/{which}"),
        ]) for which in ("kube-apiserver-client", "kube-apiserver-client-kubelet", "kubelet-serving",
                         "legacy-unknown")),
        _role("system:discovery", [
            urls("get", "/api,/api/*,/apis,/apis/*,/healthz,/livez,/openapi,/openapi/*,/readyz,/version,/version/"),
        ]),
        _role("system:heapster", [r(READ, "", "events,namespaces,nodes,pods"), r(READ, "extensions", "deployments")]),
        _role("system:kube-aggregator", [r(READ, "", "endpoints,services")]),
        _role("system:kube-controller-manager", [
            EVENTS,
            r("create", "coordination.k8s.io", "leases"),
            r("get,update", "coordination.k8s.io", "leases", "kube-controller-manager"),
            r("create", "", "secrets,serviceaccounts"),
            r("delete", "", "secrets"),
            r("get", "", "configmaps,namespaces,secrets,serviceaccounts"),
            r("update", "", "secrets,serviceaccounts"),
            r("create", "authentication.k8s.io", "tokenreviews"),
            r("create", "authorization.k8s.io", "subjectaccessreviews"),
            r("list,watch", "*", "*"),
            r("create", "", "serviceaccounts/token"),
        ]),
        _role("system:kube-dns", [r("list,watch", "", "endpoints,services")]),
        _role("system:kube-scheduler", [
            EVENTS,
            r("create", "coordination.k8s.io", "leases"),
            r("get,list,update,watch", "coordination.k8s.io", "leases", "kube-scheduler"),
            r(f"{CRUD},get,list,watch", "coordination.k8s.io", "leasecandidates"),
            r(READ, "", "nodes"),
            r("delete,get,list,watch", "", "pods"),
            r("create", "", "bindings,pods/binding"),
            r("patch,update", "", "pods/status"),
            r(READ, "", "replicationcontrollers,services"),
            r(READ, "apps,extensions", "replicasets"),
            r(READ, "apps", "statefulsets"),
            r(READ, "policy", "poddisruptionbudgets"),
            r(READ, "", "persistentvolumeclaims,persistentvolumes"),
            r("create", "authentication.k8s.io", "tokenreviews"),
            r("create", "authorization.k8s.io", "subjectaccessreviews"),
            r(READ, "storage.k8s.io", "csinodes"),
            r(READ, "storage.k8s.io", "volumeattachments"),
            r(READ, "", "namespaces"),
            r(READ, "storage.k8s.io", "csidrivers"),
            r(READ, "storage.k8s.io", "csistoragecapacities"),
            r(READ, "resource.k8s.io", "deviceclasses"),
            r("get,list,patch,update,watch", "resource.k8s.io", "resourceclaims"),
            r("get,list,patch,update,watch", "resource.k8s.io", "resourceclaims/status"),
            r("update", "", "pods/finalizers"),
            r(READ, "resource.k8s.io", "resourceslices"),
        ]),
        _role("system:kubelet-api-admin", [
            r(READ, "", "nodes"),
            r("proxy", "", "nodes"),
            r("*", "", "nodes/log,nodes/metrics,nodes/proxy,nodes/stats"),
            r("*", "", "nodes/configz,nodes/healthz,nodes/pods"),
        ]),
        _role("system:monitoring", [
            urls("get", "/healthz,/healthz/*,/livez,/livez/*,/metrics,/metrics/slis,/readyz,/readyz/*"),
            r("get", "", "nodes/metrics"),
        ]),
        _role("system:node", [
            r("create", "authentication.k8s.io", "tokenreviews"),
            r("create", "authorization.k8s.io", "localsubjectaccessreviews,subjectaccessreviews"),
            r(READ, "", "services"),
            r("create,get,list,watch", "", "nodes"),
            r("patch,update", "", "nodes/status"),
            r("patch,update", "", "nodes"),
            EVENTS,
            r(READ, "", "pods"),
            r("create,delete", "", "pods"),
            r("patch,update", "", "pods/status"),
            r("create", "", "pods/eviction"),
            r(READ, "", "configmaps,secrets"),
            r("get", "", "persistentvolumeclaims,persistentvolumes"),
            r("get", "", "endpoints"),
            r("create,get,list,watch", "certificates.k8s.io", "certificatesigningrequests"),
            r("create,delete,get,patch,update", "coordination.k8s.io", "leases"),
            r("get", "storage.k8s.io", "volumeattachments"),
            r("create", "", "serviceaccounts/token"),
            r("get,patch,update", "", "persistentvolumeclaims/status"),
            r(READ, "storage.k8s.io", "csidrivers"),
            r("create,delete,get,patch,update", "storage.k8s.io", "csinodes"),
            r(READ, "node.k8s.io", "runtimeclasses"),
            r("get", "resource.k8s.io", "resourceclaims"),
            r("deletecollection", "resource.k8s.io", "resourceslices"),
            r("get", "", "serviceaccounts"),
        ]),
        _role("system:node-bootstrapper", [r("create,get,list,watch", "certificates.k8s.io",
                                             "certificatesigningrequests")]),
        _role("system:node-problem-detector", [r("get", "", "nodes"), r("patch", "", "nodes/status"), EVENTS]),
        _role("system:node-proxier", [
            r("list,watch", "", "endpoints,services"),
            r(READ, "", "nodes"),
            EVENTS,
            r("list,watch", "networking.k8s.io", "servicecidrs"),
            r("list,watch", "discovery.k8s.io", "endpointslices"),
        ]),
        _role("system:persistent-volume-provisioner", [
            r("create,delete,get,list,watch", "", "persistentvolumes"),
            r("get,list,update,watch", "", "persistentvolumeclaims"),
            r(READ, "storage.k8s.io", "storageclasses"),
            r("watch", "", "events"),
            EVENTS,
        ]),
        _role("system:public-info-viewer", [urls("get", "/healthz,/livez,/readyz,/version,/version/")]),
        _role("system:service-account-issuer-discovery", [
            urls("get", "/.well-known/openid-configuration,/.well-known/openid-configuration/,"
                        "/openid/v1/jwks,/openid/v1/jwks/"),
        ]),
        _role("system:volume-scheduler", [
            r("get,list,patch,update,watch", "", "persistentvolumes"),
            r(READ, "storage.k8s.io", "storageclasses"),
            r("get,list,patch,update,watch", "", "persistentvolumeclaims"),
        ]),
    ]


#: the controller roles of the controllers kubeplane runs (upstream's
#: controller_policy.go), each bound to the controller's ServiceAccount in kube-system
def controller_roles() -> list[Obj]:
    c = "system:controller:"
    return [
        _role(c + "certificate-controller", [
            r("delete,get,list,watch", "certificates.k8s.io", "certificatesigningrequests"),
            r("update", "certificates.k8s.io", "certificatesigningrequests/approval,certificatesigningrequests/status"),
            r("approve", "certificates.k8s.io", "signers", "kubernetes.io/kube-apiserver-client-kubelet"),
            r("sign", "certificates.k8s.io", "signers",
              "kubernetes.io/kube-apiserver-client,kubernetes.io/kube-apiserver-client-kubelet,"
              "kubernetes.io/kubelet-serving,kubernetes.io/legacy-unknown"),
            r("create", "authorization.k8s.io", "subjectaccessreviews"),
            EVENTS,
        ]),
        _role(c + "clusterrole-aggregation-controller", [
            r("escalate,get,list,patch,update,watch", GROUP, "clusterroles"),
        ]),
        _role(c + "deployment-controller", [
            r("get,list,update,watch", "apps,extensions", "deployments"),
            r("update", "apps,extensions", "deployments/status"),
            r("update", "apps,extensions", "deployments/finalizers"),
            r("create,delete,get,list,patch,update,watch", "apps,extensions", "replicasets"),
            r("get,list,update,watch", "", "pods"),
            EVENTS,
        ]),
        _role(c + "disruption-controller", [
            r(READ, "apps,extensions", "deployments"),
            r(READ, "apps,extensions", "replicasets"),
            r(READ, "", "replicationcontrollers"),
            r(READ, "policy", "poddisruptionbudgets"),
            r(READ, "apps", "statefulsets"),
            r("update", "policy", "poddisruptionbudgets/status"),
            r("patch,update", "", "pods/status"),
            r("get", "*", "*/scale"),
            EVENTS,
        ]),
        _role(c + "generic-garbage-collector", [r("delete,get,list,patch,update,watch", "*", "*"), EVENTS]),
        _role(c + "job-controller", [
            r("get,list,patch,update,watch", "batch", "jobs"),
            r("update", "batch", "jobs/status"),
            r("update", "batch", "jobs/finalizers"),
            r("create,delete,list,patch,watch", "", "pods"),
            EVENTS,
        ]),
        _role(c + "namespace-controller", [
            r("delete,get,list,watch", "", "namespaces"),
            r("update", "", "namespaces/finalize,namespaces/status"),
            r("delete,deletecollection,get,list,watch", "*", "*"),
        ]),
        _role(c + "node-controller", [
            r("delete,get,list,patch,update,watch", "", "nodes"),
            r("patch,update", "", "nodes/status"),
            r("patch,update", "", "pods/status"),
            r("delete,get,list,watch", "", "pods"),
            EVENTS,
        ]),
        _role(c + "persistent-volume-binder", [
            r("create,delete,get,list,update,watch", "", "persistentvolumes"),
            r("update", "", "persistentvolumes/status"),
            r("get,list,update,watch", "", "persistentvolumeclaims"),
            r("update", "", "persistentvolumeclaims/status"),
            r("create,delete,get,list,watch", "", "pods"),
            r(READ, "storage.k8s.io", "storageclasses"),
            r("list,watch", "", "nodes"),
            EVENTS,
            r("watch", "", "events"),
            r("get", "", "services"),
        ]),
        _role(c + "replicaset-controller", [
            r("get,list,update,watch", "apps,extensions", "replicasets"),
            r("update", "apps,extensions", "replicasets/status"),
            r("update", "apps,extensions", "replicasets/finalizers"),
            r("create,delete,list,patch,watch", "", "pods"),
            EVENTS,
        ]),
        _role(c + "resource-claim-controller", [
            r(READ, "", "pods"),
            r("update", "", "pods/finalizers"),
            r("create,delete,get,list,watch", "resource.k8s.io", "resourceclaims"),
            r("patch,update", "resource.k8s.io", "resourceclaims,resourceclaims/status"),
            r("patch,update", "", "pods/status"),
            EVENTS,
        ]),
        _role(c + "root-ca-cert-publisher", [r("create,update", "", "configmaps"), EVENTS]),
        _role(c + "service-account-controller", [r("create", "", "serviceaccounts"), EVENTS]),
        # -- job --
        _role(c + "ttl-after-finished-controller", [r("delete,get,list,watch", "batch", "jobs"), EVENTS]),

        # -- cronjob --
        _role(c + "cronjob-controller", [
            r("get,list,update,watch", "batch", "cronjobs"),
            r("create,delete,get,list,patch,update,watch", "batch", "jobs"),
            r("update", "batch", "cronjobs/status"),
            r("update", "batch", "cronjobs/finalizers"),
            r("delete,list,watch", "", "pods"),
            EVENTS,
        ]),
        _role(c + "replication-controller", [
            r("get,list,update,watch", "", "replicationcontrollers"),
            r("update", "", "replicationcontrollers/status"),
            r("update", "", "replicationcontrollers/finalizers"),
            r("create,delete,list,patch,watch", "", "pods"),
            EVENTS,
        ]),

        # -- statefulset --
        _role(c + "statefulset-controller", [
            r("list,watch", "", "pods"),
            r("get,list,watch", "apps", "statefulsets"),
            r("update", "apps", "statefulsets/status"),
            r("update", "apps", "statefulsets/finalizers"),
            r("get,create,delete,update,patch", "", "pods"),
            r("get,create,delete,update,patch,list,watch", "apps", "controllerrevisions"),
            r("get,create,list,watch", "", "persistentvolumeclaims"),
            r("update,delete", "", "persistentvolumeclaims"),
            r("update", "", "pods/finalizers"),
            EVENTS,
        ]),

        # -- daemonset --
        _role(c + "daemon-set-controller", [
            r("get,list,watch", "apps,extensions", "daemonsets"),
            r("update", "apps,extensions", "daemonsets/status"),
            r("update", "apps,extensions", "daemonsets/finalizers"),
            r("list,watch", "", "nodes"),
            r("create,delete,list,patch,watch", "", "pods"),
            r("create", "", "pods/binding"),
            r("create,delete,get,list,patch,update,watch", "apps", "controllerrevisions"),
            EVENTS,
        ]),

        # -- endpoints --
        _role(c + "endpoint-controller", [
            r(READ, "", "services,pods"),
            r("create,delete,get,list,update,watch", "", "endpoints"),
            r("create", "", "endpoints/restricted"),
            EVENTS,
        ]),
        _role(c + "endpointslice-controller", [
            r(READ, "", "services,pods,nodes"),
            r("update", "", "services/finalizers"),
            r("create,delete,get,list,update,watch", "discovery.k8s.io", "endpointslices"),
            r("create", "discovery.k8s.io", "endpointslices/restricted"),
            EVENTS,
        ]),

        # -- hpa --
        _role(c + "horizontal-pod-autoscaler", [
            r("get,list,watch", "autoscaling", "horizontalpodautoscalers"),
            r("update", "autoscaling", "horizontalpodautoscalers/status"),
            r("get,update", "*", "*/scale"),
            r("list,watch", "", "pods"),
            r("list,watch", "metrics.k8s.io", "pods"),
            r("get,list,watch", "custom.metrics.k8s.io", "*"),
            r("get,list,watch", "external.metrics.k8s.io", "*"),
            EVENTS,
        ]),

        # -- maintenance --
        _role(c + "pod-garbage-collector", [
            r("delete,list,watch", "", "pods"),
            r(READ, "", "nodes"),
            r("patch", "", "pods/status"),
        ]),

        # -- quota --
        _role(c + "resourcequota-controller", [
            r("list,watch", "*", "*"),
            r("update", "", "resourcequotas/status"),
            EVENTS,
        ]),

    ]


#: kubeplane's controller manager runs every control loop with its own
#: credentials (upstream's --use-service-account-credentials=false), which
#: upstream says must then be granted the roles of its controllers: these
#: bindings grant them, and this role what kubeplane's local volume
#: provisioner does (an external provisioner upstream, with its own role).
KUBEPLANE_PROVISIONER_ROLE = "kubeplane:local-provisioner"


def kubeplane_roles() -> list[Obj]:
    return [_role(KUBEPLANE_PROVISIONER_ROLE, [
        r("create,delete,get,list,watch", "", "persistentvolumes"),
        r("get,list,update,watch", "", "persistentvolumeclaims"),
        r(READ, "storage.k8s.io", "storageclasses"),
        r("create,delete,get,list,patch,update,watch", "storage.k8s.io", "csistoragecapacities"),
        EVENTS,
    ]), _role(KUBEPLANE_NODE_PROXIER_ROLE, [
        # what the Service proxy reads beyond what the Node authorizer grants a node (Services,
        # its own Node, events): system:node-proxier's would also open every Node to every node
        r("list,watch", "discovery.k8s.io", "endpointslices"),
    ]), _role(KUBEPLANE_NODE_NETWORK_ROLE, [
        # the pod routes between nodes need every Node's pod CIDR and InternalIP, as flannel
        # and k3s's network controller read them: list and watch, not get (a node still
        # cannot get another's Node by name, as the Node authorizer says)
        r("list,watch", "", "nodes"),
    ]), _role(KUBEPLANE_NODE_NETWORK_POLICY_ROLE, [
        r("list,watch", "", "pods,namespaces"),
        r("list,watch", "networking.k8s.io", "networkpolicies"),
    ])]


#: a node runs the Service proxy inside its agent, under its own identity (kubeadm gives
#: kube-proxy a ServiceAccount of its own instead)
KUBEPLANE_NODE_PROXIER_ROLE = "kubeplane:node-proxier"
#: the node's pod routes (node/routes.py), kept by its agent under its own identity
KUBEPLANE_NODE_NETWORK_ROLE = "kubeplane:node-network"
#: what a node's NetworkPolicy enforcement reads (kubeplane/node/netpol.py):
#: every pod (the peers' addresses and named ports), namespace (their labels)
#: and policy. A node's own identity may not list every pod (the Node
#: authorizer), so, as upstream's policy agents (Calico's, kube-router) read
#: them with a ServiceAccount of theirs, the role is bound to the kube-system
#: ServiceAccount below; a node enforces policies with a kubeconfig of it
#: (``kubeplane node --network-policy-kubeconfig``).
KUBEPLANE_NODE_NETWORK_POLICY_ROLE = "kubeplane:node-network-policy"
KUBEPLANE_NETWORK_POLICY_ACCOUNT = "kubeplane-network-policy"


#: the kube-system ServiceAccount the local volume provisioner acts as
KUBEPLANE_PROVISIONER_ACCOUNT = "kubeplane-local-provisioner"


def _controller_manager_bindings() -> list[Obj]:
    roles = [role["metadata"]["name"] for role in controller_roles()] + [KUBEPLANE_PROVISIONER_ROLE]
    subject = [user("system:kube-controller-manager")]
    return [_binding(f"kubeplane:controller-manager:{name.rsplit(':', 1)[-1]}", name, subject) for name in roles] + [
        _binding(KUBEPLANE_PROVISIONER_ROLE, KUBEPLANE_PROVISIONER_ROLE,
                 [service_account("kube-system", KUBEPLANE_PROVISIONER_ACCOUNT)])]


def cluster_role_bindings() -> list[Obj]:
    out = [
        _binding("cluster-admin", "cluster-admin", [group("system:masters")]),
        _binding("system:basic-user", "system:basic-user", [group("system:authenticated")]),
        _binding("system:discovery", "system:discovery", [group("system:authenticated")]),
        _binding("system:kube-controller-manager", "system:kube-controller-manager",
                 [user("system:kube-controller-manager")]),
        _binding("system:kube-dns", "system:kube-dns", [service_account("kube-system", "kube-dns")]),
        _binding("system:kube-scheduler", "system:kube-scheduler", [user("system:kube-scheduler")]),
        _binding("system:monitoring", "system:monitoring", [group("system:monitoring")]),
        # upstream binds no one: nodes are authorized by the Node authorizer
        _binding("system:node", "system:node", []),
        _binding("system:node-proxier", "system:node-proxier", [user("system:kube-proxy")]),
        _binding("system:public-info-viewer", "system:public-info-viewer",
                 [group("system:authenticated"), group("system:unauthenticated")]),
        _binding("system:service-account-issuer-discovery", "system:service-account-issuer-discovery",
                 [group("system:serviceaccounts")]),
        _binding("system:volume-scheduler", "system:volume-scheduler", [user("system:kube-scheduler")]),
    ]
    prefix = "system:controller:"
    for role in controller_roles():
        name = role["metadata"]["name"]
        out.append(_binding(name, name, [service_account("kube-system", name[len(prefix):])]))
    return out + _controller_manager_bindings() + node_bootstrap_bindings()


#: the group of the bootstrap tokens ``kubeplane token create`` makes (kubeadm's
#: system:bootstrappers:kubeadm:default-node-token)
DEFAULT_NODE_TOKEN_GROUP = "system:bootstrappers:kubeplane:default-node-token"


def node_bootstrap_bindings() -> list[Obj]:
    """What kubeadm binds for joining nodes: its bootstrap tokens may ask for a
    kubelet client certificate (and have it approved), and nodes may renew their own."""
    return [
        _binding("kubeplane:kubelet-bootstrap", "system:node-bootstrapper", [group(DEFAULT_NODE_TOKEN_GROUP)]),
        _binding("kubeplane:node-autoapprove-bootstrap",
                 "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                 [group(DEFAULT_NODE_TOKEN_GROUP)]),
        _binding("kubeplane:node-autoapprove-certificate-rotation",
                 "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", [group("system:nodes")]),
        _binding(KUBEPLANE_NODE_PROXIER_ROLE, KUBEPLANE_NODE_PROXIER_ROLE, [group("system:nodes")]),
        _binding(KUBEPLANE_NODE_NETWORK_ROLE, KUBEPLANE_NODE_NETWORK_ROLE, [group("system:nodes")]),
        _binding(KUBEPLANE_NODE_NETWORK_POLICY_ROLE, KUBEPLANE_NODE_NETWORK_POLICY_ROLE,
                 [service_account("kube-system", KUBEPLANE_NETWORK_POLICY_ACCOUNT)]),
    ]


_POLICY: tuple[list[Obj], list[Obj]] | None = None


def node_rules() -> list[Obj]:
    """The static rules the Node authorizer grants every node (upstream's
    NodeRules: the ``system:node`` ClusterRole's)."""
    return next(r["rules"] for r in cluster_roles() if r["metadata"]["name"] == "system:node")


def policy() -> tuple[list[Obj], list[Obj]]:
    """(ClusterRoles, ClusterRoleBindings) of the bootstrap policy: built once
    per process and shared, so read-only (the registry copies what it stores)."""
    global _POLICY
    if _POLICY is None:
        _POLICY = (cluster_roles() + controller_roles() + kubeplane_roles(), cluster_role_bindings())
    return _POLICY


# -- reconciliation ----------------------------------------------------------------


def _merged_meta(existing: Obj, expected: Obj) -> tuple[Obj, bool]:
    md = dict(existing.get("metadata") or {})
    changed = False
    for field in ("labels", "annotations"):
        have = dict(md.get(field) or {})
        for k, v in (expected["metadata"].get(field) or {}).items():
            if k not in have:
                have[k] = v
                changed = True
        if have:
            md[field] = have
    return md, changed


def reconcile_role(existing: Obj, expected: Obj) -> Obj | None:
    """The role ``existing`` should become (None: it needs no change)."""
    md, changed = _merged_meta(existing, expected)
    out = {**existing, "metadata": md}
    have_rules = [x for x in existing.get("rules") or [] if isinstance(x, dict)]
    if "aggregationRule" in expected:
        agg = existing.get("aggregationRule") if isinstance(existing.get("aggregationRule"), dict) else {}
        selectors = list(agg.get("clusterRoleSelectors") or [])
        for sel in expected["aggregationRule"]["clusterRoleSelectors"]:
            if sel not in selectors:
                selectors.append(sel)
                changed = True
        out["aggregationRule"] = {**agg, "clusterRoleSelectors": selectors}
    else:
        missing = uncovered(have_rules, expected["rules"])
        if missing:
            out["rules"] = have_rules + missing
            changed = True
    return out if changed else None


def reconcile_binding(existing: Obj, expected: Obj) -> Obj | None:
    md, changed = _merged_meta(existing, expected)
    subjects = list(existing.get("subjects") or [])
    for s in expected.get("subjects") or []:
        if s not in subjects:
            subjects.append(s)
            changed = True
    out = {**existing, "metadata": md}
    if subjects:
        out["subjects"] = subjects
    return out if changed else None


async def _reconcile_one(registry: Any, res: Any, expected: Obj, merge: Any, absent: bool = False) -> str:
    """``absent``: the object was not there a moment ago (a first start), so
    the first attempt creates it without reading it first."""
    name = expected["metadata"]["name"]
    for attempt in range(5):
        existing = None
        if not (absent and attempt == 0):
            try:
                existing = await registry.get(res, name)
            except StatusError as err:
                if err.code != 404:
                    raise
        if existing is None:
            try:
                await registry.create(res, expected)
                return "created"
            except StatusError as err2:
                if err2.code == 409:
                    continue
                raise
        if (existing.get("metadata") or {}).get("annotations", {}).get(AUTOUPDATE) == "false":
            return "skipped"
        if "roleRef" in expected and existing.get("roleRef") != expected["roleRef"]:
            # roleRef is immutable: replace the binding
            await registry.delete(res, name)
            continue
        wanted = merge(existing, expected)
        if wanted is None:
            return "unchanged"
        try:
            await registry.update(res, wanted, name=name)
            return "updated"
        except StatusError as err:
            if err.code in (404, 409):
                continue
            raise
    return "conflict"


async def _names(registry: Any, res: Any) -> set[str]:
    out = await registry.list(res)
    return {(o.get("metadata") or {}).get("name") for o in out.get("items") or []}


async def reconcile(registry: Any) -> dict[str, int]:
    """Makes the bootstrap policy present (see the module's docstring); the counts of what it did."""
    roles_res = resource("clusterroles", GROUP)
    bindings_res = resource("clusterrolebindings", GROUP)
    roles, bindings = policy()
    counts: dict[str, int] = {}
    # Which are there already: one list each instead of a read per object
    # (on a first start none is, and every object is simply created).
    have_roles = await _names(registry, roles_res)
    have_bindings = await _names(registry, bindings_res)
    # All at once: the writes of a first start share the store's group commits.
    outcomes = await asyncio.gather(
        *(_reconcile_one(registry, roles_res, obj, reconcile_role, obj["metadata"]["name"] not in have_roles)
          for obj in roles),
        *(_reconcile_one(registry, bindings_res, obj, reconcile_binding,
                         obj["metadata"]["name"] not in have_bindings) for obj in bindings))
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    if counts.get("created") or counts.get("updated"):
        log.info("RBAC bootstrap policy: %s", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return counts
