"""The ``kube-public/cluster-info`` ConfigMap token discovery reads (kubeadm's
bootstrap-token phase, done here by the API server at start).

It holds a kubeconfig with the cluster's URL and CA certificate and nothing
secret, readable by anyone (a Role and RoleBinding in ``kube-public`` for
``system:anonymous``, as kubeadm's ``kubeadm:bootstrap-signer-clusterinfo``).
A joining node reads it before it trusts the server and checks it with the
detached signatures the bootstrap signer controller adds per token (see
:mod:`kubeplane.auth.bootstraptoken`).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.auth.bootstraptoken import CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, KUBECONFIG_KEY

log = logging.getLogger("kubeplane.apiserver")

RBAC = "rbac.authorization.k8s.io"
#: the Role and RoleBinding letting anonymous users read cluster-info
CLUSTER_INFO_ROLE = "kubeplane:bootstrap-signer-clusterinfo"


def cluster_info_kubeconfig(url: str, ca_pem: bytes) -> str:
    """The kubeconfig of cluster-info: one cluster, no user (kubeadm's layout),
    written as JSON (which is YAML too: no YAML library at start-up)."""
    doc = {"apiVersion": "v1", "kind": "Config", "preferences": {},
           "clusters": [{"name": "", "cluster": {"server": url,
                                                 "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
           "contexts": [], "current-context": "", "users": []}
    return json.dumps(doc, indent=2) + "\n"


async def publish_cluster_info(registry: Any, url: str, ca_pem: bytes) -> None:
    """Creates or refreshes cluster-info (keeping the signatures in it when the
    kubeconfig is unchanged) and the Role letting anonymous users read it."""
    configmaps = resource("configmaps")
    kubeconfig = cluster_info_kubeconfig(url, ca_pem)
    for _ in range(5):
        try:
            current = await registry.get(configmaps, CLUSTER_INFO, CLUSTER_INFO_NAMESPACE)
        except StatusError as err:
            if err.code != 404:
                raise
            try:
                await registry.create(configmaps, {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": CLUSTER_INFO, "namespace": CLUSTER_INFO_NAMESPACE},
                    "data": {KUBECONFIG_KEY: kubeconfig}}, CLUSTER_INFO_NAMESPACE)
                break
            except StatusError as err2:
                if err2.code == 409:
                    continue
                raise
        data = dict(current.get("data") or {})
        if data.get(KUBECONFIG_KEY) == kubeconfig:
            break
        data[KUBECONFIG_KEY] = kubeconfig  # the signer signs it again
        try:
            await registry.update(configmaps, {**current, "data": data}, name=CLUSTER_INFO,
                                  namespace=CLUSTER_INFO_NAMESPACE)
            break
        except StatusError as err:
            if err.code not in (404, 409):
                raise
    await _ensure(registry, resource("roles", RBAC), {
        "apiVersion": f"{RBAC}/v1", "kind": "Role",
        "metadata": {"name": CLUSTER_INFO_ROLE, "namespace": CLUSTER_INFO_NAMESPACE},
        "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"],
                   "resourceNames": [CLUSTER_INFO]}]})
    await _ensure(registry, resource("rolebindings", RBAC), {
        "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding",
        "metadata": {"name": CLUSTER_INFO_ROLE, "namespace": CLUSTER_INFO_NAMESPACE},
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": CLUSTER_INFO_ROLE},
        "subjects": [{"apiGroup": RBAC, "kind": "User", "name": "system:anonymous"}]})
    await ensure_bootstrap_controller_roles(registry)


def _rule(verbs: str, resources: str, names: str = "", group: str = "") -> dict:
    rule = {"verbs": verbs.split(","), "apiGroups": [group], "resources": resources.split(",")}
    if names:
        rule["resourceNames"] = names.split(",")
    return rule


_EVENTS = _rule("create,patch,update", "events")
_EVENTS_K8S = _rule("create,patch,update", "events", group="events.k8s.io")


def bootstrap_controller_roles() -> list[tuple[str, str, list[dict]]]:
    """(namespace, account, rules) of upstream's namespaced roles for the
    bootstrap signer and token cleaner (bootstrappolicy's namespace policy)."""
    return [
        ("kube-system", "bootstrap-signer", [_rule("get,list,watch", "secrets")]),
        ("kube-public", "bootstrap-signer", [_rule("get,list,watch", "configmaps"),
                                             _rule("update", "configmaps", CLUSTER_INFO), _EVENTS, _EVENTS_K8S]),
        ("kube-system", "token-cleaner", [_rule("delete,get,list,watch", "secrets"), _EVENTS, _EVENTS_K8S]),
    ]


async def ensure_bootstrap_controller_roles(registry: Any) -> None:
    for namespace, account, rules in bootstrap_controller_roles():
        name = f"system:controller:{account}"
        meta = {"name": name, "namespace": namespace, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}
        await _ensure(registry, resource("roles", RBAC), {
            "apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta, "rules": rules}, namespace)
        await _ensure(registry, resource("rolebindings", RBAC), {
            "apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}]}, namespace)


async def _ensure(registry: Any, res: Any, obj: dict, namespace: str = CLUSTER_INFO_NAMESPACE) -> None:
    try:
        await registry.create(res, obj, namespace)
    except StatusError as err:
        if err.code != 409:
            raise
