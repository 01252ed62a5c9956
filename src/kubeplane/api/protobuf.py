"""Decode Kubernetes protobuf request bodies into JSON-style dicts.

kubectl's imperative generators (``kubectl create namespace|configmap|secret|
deployment|service|job|...``) POST ``application/vnd.kubernetes.protobuf`` and
never fall back to JSON, so the API server has to read them.

Wire format: the 4-byte magic ``k8s\\x00`` followed by a ``runtime.Unknown``
message (``typeMeta`` = 1 {apiVersion = 1, kind = 2}, ``raw`` = 2,
``contentEncoding`` = 3, ``contentType`` = 4). ``raw`` is the object encoded
with the field numbers of the public ``generated.proto`` files.

The decoder is generic (varint, 64-bit, length-delimited, 32-bit wire types);
each supported type is described by a declarative table mapping field numbers
to JSON names and value types. The output follows the JSON serialization of
the same object: camelCase names, ``omitempty`` zero values dropped, bytes as
base64, ``Time`` as RFC 3339, ``Quantity`` as a string and ``IntOrString`` as
an int or a string. Unknown field numbers are skipped, as protobuf readers do.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import struct
from dataclasses import dataclass
from typing import Any, Union

from kubeplane.api import errors

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"

# Wire types.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# Value types used in tables.
STRING, BYTES, INT32, INT64, UINT32, BOOL, DOUBLE = "string", "bytes", "int32", "int64", "uint32", "bool", "double"
TIME, MICROTIME, QUANTITY, INTORSTR, RAWJSON = "time", "microtime", "quantity", "intorstr", "rawjson"
MESSAGE, INLINE, MAP = "message", "inline", "map"

_SCALAR_WIRE = {STRING: _LEN, BYTES: _LEN, INT32: _VARINT, INT64: _VARINT, UINT32: _VARINT,
                BOOL: _VARINT, DOUBLE: _I64}


@dataclass(frozen=True)
class Field:
    """How one protobuf field maps to a JSON key.

    ``keep`` keeps zero values: set it for pointer fields (only encoded when
    set) and for fields whose JSON tag has no ``omitempty``.
    """

    name: str
    type: str
    table: "Table | None" = None  # MESSAGE / INLINE, or the map value table
    repeated: bool = False
    keep: bool = False
    value: str = STRING  # map value type


Table = dict[int, Field]
_Value = Union[int, bytes]


# --------------------------------------------------------------------------------------------
# Table helpers


def s(name: str, keep: bool = False) -> Field:
    return Field(name, STRING, keep=keep)


def i32(name: str, keep: bool = False) -> Field:
    return Field(name, INT32, keep=keep)


def i64(name: str, keep: bool = False) -> Field:
    return Field(name, INT64, keep=keep)


def b(name: str, keep: bool = False) -> Field:
    return Field(name, BOOL, keep=keep)


def t(name: str) -> Field:
    return Field(name, TIME)


def q(name: str) -> Field:
    return Field(name, QUANTITY)


def ios(name: str) -> Field:
    return Field(name, INTORSTR)


def m(name: str, table: Table) -> Field:
    return Field(name, MESSAGE, table)


def inline(table: Table) -> Field:
    return Field("", INLINE, table)


def rs(name: str) -> Field:
    return Field(name, STRING, repeated=True)


def ri64(name: str) -> Field:
    return Field(name, INT64, repeated=True)


def ri32(name: str) -> Field:
    return Field(name, INT32, repeated=True)


def rm(name: str, table: Table) -> Field:
    return Field(name, MESSAGE, table, repeated=True)


def mp(name: str, value: str = STRING, table: Table | None = None) -> Field:
    return Field(name, MAP, table, value=value)


# --------------------------------------------------------------------------------------------
# apimachinery meta/v1

OWNER_REFERENCE: Table = {
    1: s("kind", keep=True), 3: s("name", keep=True), 4: s("uid", keep=True),
    5: s("apiVersion", keep=True), 6: b("controller", keep=True), 7: b("blockOwnerDeletion", keep=True),
}
MANAGED_FIELDS_ENTRY: Table = {
    1: s("manager"), 2: s("operation"), 3: s("apiVersion"), 4: t("time"), 6: s("fieldsType"),
    7: Field("fieldsV1", RAWJSON), 8: s("subresource"),
}
OBJECT_META: Table = {
    1: s("name"), 2: s("generateName"), 3: s("namespace"), 4: s("selfLink"), 5: s("uid"),
    6: s("resourceVersion"), 7: i64("generation"), 8: t("creationTimestamp"), 9: t("deletionTimestamp"),
    10: i64("deletionGracePeriodSeconds", keep=True), 11: mp("labels"), 12: mp("annotations"),
    13: rm("ownerReferences", OWNER_REFERENCE), 14: rs("finalizers"), 17: rm("managedFields", MANAGED_FIELDS_ENTRY),
}
LABEL_SELECTOR_REQUIREMENT: Table = {1: s("key", keep=True), 2: s("operator", keep=True), 3: rs("values")}
LABEL_SELECTOR: Table = {1: mp("matchLabels"), 2: rm("matchExpressions", LABEL_SELECTOR_REQUIREMENT)}
CONDITION: Table = {
    1: s("type", keep=True), 2: s("status", keep=True), 3: i64("observedGeneration"),
    4: t("lastTransitionTime"), 5: s("reason", keep=True), 6: s("message", keep=True),
}

# --------------------------------------------------------------------------------------------
# core/v1: references, env, resources

LOCAL_OBJECT_REFERENCE: Table = {1: s("name")}
OBJECT_REFERENCE: Table = {
    1: s("kind"), 2: s("namespace"), 3: s("name"), 4: s("uid"), 5: s("apiVersion"),
    6: s("resourceVersion"), 7: s("fieldPath"),
}
OBJECT_FIELD_SELECTOR: Table = {1: s("apiVersion"), 2: s("fieldPath", keep=True)}
RESOURCE_FIELD_SELECTOR: Table = {1: s("containerName"), 2: s("resource", keep=True), 3: q("divisor")}
KEY_SELECTOR: Table = {1: inline(LOCAL_OBJECT_REFERENCE), 2: s("key", keep=True), 3: b("optional", keep=True)}
ENV_VAR_SOURCE: Table = {
    1: m("fieldRef", OBJECT_FIELD_SELECTOR), 2: m("resourceFieldRef", RESOURCE_FIELD_SELECTOR),
    3: m("configMapKeyRef", KEY_SELECTOR), 4: m("secretKeyRef", KEY_SELECTOR),
}
ENV_VAR: Table = {1: s("name", keep=True), 2: s("value"), 3: m("valueFrom", ENV_VAR_SOURCE)}
ENV_FROM_REF: Table = {1: inline(LOCAL_OBJECT_REFERENCE), 2: b("optional", keep=True)}
ENV_FROM_SOURCE: Table = {1: s("prefix"), 2: m("configMapRef", ENV_FROM_REF), 3: m("secretRef", ENV_FROM_REF)}
RESOURCE_CLAIM: Table = {1: s("name", keep=True), 2: s("request")}
RESOURCE_REQUIREMENTS: Table = {
    1: mp("limits", QUANTITY), 2: mp("requests", QUANTITY), 3: rm("claims", RESOURCE_CLAIM),
}
CONTAINER_PORT: Table = {
    1: s("name"), 2: i32("hostPort"), 3: i32("containerPort", keep=True), 4: s("protocol"), 5: s("hostIP"),
}
VOLUME_MOUNT: Table = {
    1: s("name", keep=True), 2: b("readOnly"), 3: s("mountPath", keep=True), 4: s("subPath"),
    5: s("mountPropagation", keep=True), 6: s("subPathExpr"), 7: s("recursiveReadOnly", keep=True),
}
VOLUME_DEVICE: Table = {1: s("name", keep=True), 2: s("devicePath", keep=True)}

# probes and lifecycle
HTTP_HEADER: Table = {1: s("name", keep=True), 2: s("value", keep=True)}
EXEC_ACTION: Table = {1: rs("command")}
HTTP_GET_ACTION: Table = {
    1: s("path"), 2: ios("port"), 3: s("host"), 4: s("scheme"), 5: rm("httpHeaders", HTTP_HEADER),
}
TCP_SOCKET_ACTION: Table = {1: ios("port"), 2: s("host")}
GRPC_ACTION: Table = {1: i32("port", keep=True), 2: s("service", keep=True)}
SLEEP_ACTION: Table = {1: i64("seconds", keep=True)}
PROBE_HANDLER: Table = {
    1: m("exec", EXEC_ACTION), 2: m("httpGet", HTTP_GET_ACTION), 3: m("tcpSocket", TCP_SOCKET_ACTION),
    4: m("grpc", GRPC_ACTION),
}
PROBE: Table = {
    1: inline(PROBE_HANDLER), 2: i32("initialDelaySeconds"), 3: i32("timeoutSeconds"), 4: i32("periodSeconds"),
    5: i32("successThreshold"), 6: i32("failureThreshold"), 7: i64("terminationGracePeriodSeconds", keep=True),
}
LIFECYCLE_HANDLER: Table = {
    1: m("exec", EXEC_ACTION), 2: m("httpGet", HTTP_GET_ACTION), 3: m("tcpSocket", TCP_SOCKET_ACTION),
    4: m("sleep", SLEEP_ACTION),
}
LIFECYCLE: Table = {
    1: m("postStart", LIFECYCLE_HANDLER), 2: m("preStop", LIFECYCLE_HANDLER), 3: s("stopSignal", keep=True),
}

# security contexts
CAPABILITIES: Table = {1: rs("add"), 2: rs("drop")}
SE_LINUX_OPTIONS: Table = {1: s("user"), 2: s("role"), 3: s("type"), 4: s("level")}
WINDOWS_OPTIONS: Table = {
    1: s("gmsaCredentialSpecName", keep=True), 2: s("gmsaCredentialSpec", keep=True),
    3: s("runAsUserName", keep=True), 4: b("hostProcess", keep=True),
}
PROFILE: Table = {1: s("type", keep=True), 2: s("localhostProfile", keep=True)}
SECURITY_CONTEXT: Table = {
    1: m("capabilities", CAPABILITIES), 2: b("privileged", keep=True), 3: m("seLinuxOptions", SE_LINUX_OPTIONS),
    4: i64("runAsUser", keep=True), 5: b("runAsNonRoot", keep=True), 6: b("readOnlyRootFilesystem", keep=True),
    7: b("allowPrivilegeEscalation", keep=True), 8: i64("runAsGroup", keep=True), 9: s("procMount", keep=True),
    10: m("windowsOptions", WINDOWS_OPTIONS), 11: m("seccompProfile", PROFILE), 12: m("appArmorProfile", PROFILE),
}
SYSCTL: Table = {1: s("name", keep=True), 2: s("value", keep=True)}
POD_SECURITY_CONTEXT: Table = {
    1: m("seLinuxOptions", SE_LINUX_OPTIONS), 2: i64("runAsUser", keep=True), 3: b("runAsNonRoot", keep=True),
    4: ri64("supplementalGroups"), 5: i64("fsGroup", keep=True), 6: i64("runAsGroup", keep=True),
    7: rm("sysctls", SYSCTL), 8: m("windowsOptions", WINDOWS_OPTIONS), 9: s("fsGroupChangePolicy", keep=True),
    10: m("seccompProfile", PROFILE), 11: m("appArmorProfile", PROFILE),
    12: s("supplementalGroupsPolicy", keep=True), 13: s("seLinuxChangePolicy", keep=True),
}

CONTAINER: Table = {
    1: s("name", keep=True), 2: s("image"), 3: rs("command"), 4: rs("args"), 5: s("workingDir"),
    6: rm("ports", CONTAINER_PORT), 7: rm("env", ENV_VAR), 8: m("resources", RESOURCE_REQUIREMENTS),
    9: rm("volumeMounts", VOLUME_MOUNT), 10: m("livenessProbe", PROBE), 11: m("readinessProbe", PROBE),
    12: m("lifecycle", LIFECYCLE), 13: s("terminationMessagePath"), 14: s("imagePullPolicy"),
    15: m("securityContext", SECURITY_CONTEXT), 16: b("stdin"), 17: b("stdinOnce"), 18: b("tty"),
    19: rm("envFrom", ENV_FROM_SOURCE), 20: s("terminationMessagePolicy"), 21: rm("volumeDevices", VOLUME_DEVICE),
    22: m("startupProbe", PROBE), 24: s("restartPolicy", keep=True),
}

# volumes
KEY_TO_PATH: Table = {1: s("key", keep=True), 2: s("path", keep=True), 3: i32("mode", keep=True)}
DOWNWARD_API_FILE: Table = {
    1: s("path", keep=True), 2: m("fieldRef", OBJECT_FIELD_SELECTOR),
    3: m("resourceFieldRef", RESOURCE_FIELD_SELECTOR), 4: i32("mode", keep=True),
}
HOST_PATH_SOURCE: Table = {1: s("path", keep=True), 2: s("type", keep=True)}
EMPTY_DIR_SOURCE: Table = {1: s("medium"), 2: q("sizeLimit")}
SECRET_VOLUME_SOURCE: Table = {
    1: s("secretName"), 2: rm("items", KEY_TO_PATH), 3: i32("defaultMode", keep=True), 4: b("optional", keep=True),
}
CONFIG_MAP_VOLUME_SOURCE: Table = {
    1: inline(LOCAL_OBJECT_REFERENCE), 2: rm("items", KEY_TO_PATH), 3: i32("defaultMode", keep=True),
    4: b("optional", keep=True),
}
PVC_SOURCE: Table = {1: s("claimName", keep=True), 2: b("readOnly")}
NFS_SOURCE: Table = {1: s("server", keep=True), 2: s("path", keep=True), 3: b("readOnly")}
DOWNWARD_API_SOURCE: Table = {1: rm("items", DOWNWARD_API_FILE), 2: i32("defaultMode", keep=True)}
CSI_SOURCE: Table = {
    1: s("driver", keep=True), 2: b("readOnly", keep=True), 3: s("fsType", keep=True),
    4: mp("volumeAttributes"), 5: m("nodePublishSecretRef", LOCAL_OBJECT_REFERENCE),
}
PROJECTION_REF: Table = {1: inline(LOCAL_OBJECT_REFERENCE), 2: rm("items", KEY_TO_PATH), 4: b("optional", keep=True)}
SA_TOKEN_PROJECTION: Table = {1: s("audience"), 2: i64("expirationSeconds", keep=True), 3: s("path", keep=True)}
VOLUME_PROJECTION: Table = {
    1: m("secret", PROJECTION_REF), 2: m("downwardAPI", {1: rm("items", DOWNWARD_API_FILE)}),
    3: m("configMap", PROJECTION_REF), 4: m("serviceAccountToken", SA_TOKEN_PROJECTION),
}
PROJECTED_SOURCE: Table = {1: rm("sources", VOLUME_PROJECTION), 2: i32("defaultMode", keep=True)}
IMAGE_SOURCE: Table = {1: s("reference"), 2: s("pullPolicy")}
VOLUME_SOURCE: Table = {
    1: m("hostPath", HOST_PATH_SOURCE), 2: m("emptyDir", EMPTY_DIR_SOURCE), 6: m("secret", SECRET_VOLUME_SOURCE),
    7: m("nfs", NFS_SOURCE), 10: m("persistentVolumeClaim", PVC_SOURCE), 16: m("downwardAPI", DOWNWARD_API_SOURCE),
    19: m("configMap", CONFIG_MAP_VOLUME_SOURCE), 26: m("projected", PROJECTED_SOURCE), 28: m("csi", CSI_SOURCE),
    30: m("image", IMAGE_SOURCE),
}
VOLUME: Table = {1: s("name", keep=True), 2: inline(VOLUME_SOURCE)}

# scheduling-related pod fields
TOLERATION: Table = {
    1: s("key"), 2: s("operator"), 3: s("value"), 4: s("effect"), 5: i64("tolerationSeconds", keep=True),
}
NODE_SELECTOR_REQUIREMENT: Table = {1: s("key", keep=True), 2: s("operator", keep=True), 3: rs("values")}
NODE_SELECTOR_TERM: Table = {
    1: rm("matchExpressions", NODE_SELECTOR_REQUIREMENT), 2: rm("matchFields", NODE_SELECTOR_REQUIREMENT),
}
NODE_SELECTOR: Table = {1: rm("nodeSelectorTerms", NODE_SELECTOR_TERM)}
PREFERRED_SCHEDULING_TERM: Table = {1: i32("weight", keep=True), 2: m("preference", NODE_SELECTOR_TERM)}
NODE_AFFINITY: Table = {
    1: m("requiredDuringSchedulingIgnoredDuringExecution", NODE_SELECTOR),
    2: rm("preferredDuringSchedulingIgnoredDuringExecution", PREFERRED_SCHEDULING_TERM),
}
POD_AFFINITY_TERM: Table = {
    1: m("labelSelector", LABEL_SELECTOR), 2: rs("namespaces"), 3: s("topologyKey", keep=True),
    4: m("namespaceSelector", LABEL_SELECTOR), 5: rs("matchLabelKeys"), 6: rs("mismatchLabelKeys"),
}
WEIGHTED_POD_AFFINITY_TERM: Table = {1: i32("weight", keep=True), 2: m("podAffinityTerm", POD_AFFINITY_TERM)}
POD_AFFINITY: Table = {
    1: rm("requiredDuringSchedulingIgnoredDuringExecution", POD_AFFINITY_TERM),
    2: rm("preferredDuringSchedulingIgnoredDuringExecution", WEIGHTED_POD_AFFINITY_TERM),
}
AFFINITY: Table = {
    1: m("nodeAffinity", NODE_AFFINITY), 2: m("podAffinity", POD_AFFINITY), 3: m("podAntiAffinity", POD_AFFINITY),
}
TOPOLOGY_SPREAD_CONSTRAINT: Table = {
    1: i32("maxSkew", keep=True), 2: s("topologyKey", keep=True), 3: s("whenUnsatisfiable", keep=True),
    4: m("labelSelector", LABEL_SELECTOR), 5: i32("minDomains", keep=True), 6: s("nodeAffinityPolicy", keep=True),
    7: s("nodeTaintsPolicy", keep=True), 8: rs("matchLabelKeys"),
}
HOST_ALIAS: Table = {1: s("ip", keep=True), 2: rs("hostnames")}
POD_DNS_CONFIG_OPTION: Table = {1: s("name"), 2: s("value", keep=True)}
POD_DNS_CONFIG: Table = {1: rs("nameservers"), 2: rs("searches"), 3: rm("options", POD_DNS_CONFIG_OPTION)}
POD_READINESS_GATE: Table = {1: s("conditionType", keep=True)}
POD_OS: Table = {1: s("name", keep=True)}
POD_SCHEDULING_GATE: Table = {1: s("name", keep=True)}

POD_SPEC: Table = {
    1: rm("volumes", VOLUME), 2: rm("containers", CONTAINER), 3: s("restartPolicy"),
    4: i64("terminationGracePeriodSeconds", keep=True), 5: i64("activeDeadlineSeconds", keep=True),
    6: s("dnsPolicy"), 7: mp("nodeSelector"), 8: s("serviceAccountName"), 9: s("serviceAccount"),
    10: s("nodeName"), 11: b("hostNetwork"), 12: b("hostPID"), 13: b("hostIPC"),
    14: m("securityContext", POD_SECURITY_CONTEXT), 15: rm("imagePullSecrets", LOCAL_OBJECT_REFERENCE),
    16: s("hostname"), 17: s("subdomain"), 18: m("affinity", AFFINITY), 19: s("schedulerName"),
    20: rm("initContainers", CONTAINER), 21: b("automountServiceAccountToken", keep=True),
    22: rm("tolerations", TOLERATION), 23: rm("hostAliases", HOST_ALIAS), 24: s("priorityClassName"),
    25: i32("priority", keep=True), 26: m("dnsConfig", POD_DNS_CONFIG), 27: b("shareProcessNamespace", keep=True),
    28: rm("readinessGates", POD_READINESS_GATE), 29: s("runtimeClassName", keep=True),
    30: b("enableServiceLinks", keep=True), 31: s("preemptionPolicy", keep=True), 32: mp("overhead", QUANTITY),
    33: rm("topologySpreadConstraints", TOPOLOGY_SPREAD_CONSTRAINT), 35: b("setHostnameAsFQDN", keep=True),
    36: m("os", POD_OS), 37: b("hostUsers", keep=True), 38: rm("schedulingGates", POD_SCHEDULING_GATE),
    40: m("resources", RESOURCE_REQUIREMENTS),
}

# pod status
POD_CONDITION: Table = {
    1: s("type", keep=True), 2: s("status", keep=True), 3: t("lastProbeTime"), 4: t("lastTransitionTime"),
    5: s("reason"), 6: s("message"), 7: i64("observedGeneration"),
}
CONTAINER_STATE: Table = {
    1: m("waiting", {1: s("reason"), 2: s("message")}),
    2: m("running", {1: t("startedAt")}),
    3: m("terminated", {
        1: i32("exitCode", keep=True), 2: i32("signal"), 3: s("reason"), 4: s("message"),
        5: t("startedAt"), 6: t("finishedAt"), 7: s("containerID"),
    }),
}
CONTAINER_STATUS: Table = {
    1: s("name", keep=True), 2: m("state", CONTAINER_STATE), 3: m("lastState", CONTAINER_STATE),
    4: b("ready", keep=True), 5: i32("restartCount", keep=True), 6: s("image", keep=True),
    7: s("imageID", keep=True), 8: s("containerID"), 9: b("started", keep=True),
    10: mp("allocatedResources", QUANTITY), 11: m("resources", RESOURCE_REQUIREMENTS),
    15: s("stopSignal", keep=True),
}
IP_ENTRY: Table = {1: s("ip", keep=True)}
POD_STATUS: Table = {
    1: s("phase"), 2: rm("conditions", POD_CONDITION), 3: s("message"), 4: s("reason"), 5: s("hostIP"),
    6: s("podIP"), 7: t("startTime"), 8: rm("containerStatuses", CONTAINER_STATUS), 9: s("qosClass"),
    10: rm("initContainerStatuses", CONTAINER_STATUS), 11: s("nominatedNodeName"), 12: rm("podIPs", IP_ENTRY),
    13: rm("ephemeralContainerStatuses", CONTAINER_STATUS), 14: rm("hostIPs", IP_ENTRY),
    15: s("resize"), 17: i64("observedGeneration"),
}
POD: Table = {1: m("metadata", OBJECT_META), 2: m("spec", POD_SPEC), 3: m("status", POD_STATUS)}
POD_TEMPLATE_SPEC: Table = {1: m("metadata", OBJECT_META), 2: m("spec", POD_SPEC)}

# --------------------------------------------------------------------------------------------
# core/v1 kinds

NAMESPACE_CONDITION: Table = {
    1: s("type", keep=True), 2: s("status", keep=True), 4: t("lastTransitionTime"), 5: s("reason"), 6: s("message"),
}
NAMESPACE: Table = {
    1: m("metadata", OBJECT_META), 2: m("spec", {1: rs("finalizers")}),
    3: m("status", {1: s("phase"), 2: rm("conditions", NAMESPACE_CONDITION)}),
}
CONFIG_MAP: Table = {
    1: m("metadata", OBJECT_META), 2: mp("data"), 3: mp("binaryData", BYTES), 4: b("immutable", keep=True),
}
SECRET: Table = {
    1: m("metadata", OBJECT_META), 2: mp("data", BYTES), 3: s("type"), 4: mp("stringData"),
    5: b("immutable", keep=True),
}
SERVICE_ACCOUNT: Table = {
    1: m("metadata", OBJECT_META), 2: rm("secrets", OBJECT_REFERENCE),
    3: rm("imagePullSecrets", LOCAL_OBJECT_REFERENCE), 4: b("automountServiceAccountToken", keep=True),
}
SCOPED_RESOURCE_SELECTOR_REQUIREMENT: Table = {
    1: s("scopeName", keep=True), 2: s("operator", keep=True), 3: rs("values"),
}
RESOURCE_QUOTA: Table = {
    1: m("metadata", OBJECT_META),
    2: m("spec", {
        1: mp("hard", QUANTITY), 2: rs("scopes"),
        3: m("scopeSelector", {1: rm("matchExpressions", SCOPED_RESOURCE_SELECTOR_REQUIREMENT)}),
    }),
    3: m("status", {1: mp("hard", QUANTITY), 2: mp("used", QUANTITY)}),
}
SERVICE_PORT: Table = {
    1: s("name"), 2: s("protocol"), 3: i32("port", keep=True), 4: ios("targetPort"), 5: i32("nodePort"),
    6: s("appProtocol", keep=True),
}
PORT_STATUS: Table = {1: i32("port", keep=True), 2: s("protocol", keep=True), 3: s("error", keep=True)}
LOAD_BALANCER_INGRESS: Table = {
    1: s("ip"), 2: s("hostname"), 3: s("ipMode", keep=True), 4: rm("ports", PORT_STATUS),
}
LOAD_BALANCER_STATUS: Table = {1: rm("ingress", LOAD_BALANCER_INGRESS)}
SERVICE_SPEC: Table = {
    1: rm("ports", SERVICE_PORT), 2: mp("selector"), 3: s("clusterIP"), 4: s("type"), 5: rs("externalIPs"),
    7: s("sessionAffinity"), 8: s("loadBalancerIP"), 9: rs("loadBalancerSourceRanges"), 10: s("externalName"),
    11: s("externalTrafficPolicy"), 12: i32("healthCheckNodePort"), 13: b("publishNotReadyAddresses"),
    14: m("sessionAffinityConfig", {1: m("clientIP", {1: i32("timeoutSeconds", keep=True)})}),
    17: s("ipFamilyPolicy", keep=True), 18: rs("clusterIPs"), 19: rs("ipFamilies"),
    20: b("allocateLoadBalancerNodePorts", keep=True), 21: s("loadBalancerClass", keep=True),
    22: s("internalTrafficPolicy", keep=True), 23: s("trafficDistribution", keep=True),
}
SERVICE: Table = {
    1: m("metadata", OBJECT_META), 2: m("spec", SERVICE_SPEC),
    3: m("status", {1: m("loadBalancer", LOAD_BALANCER_STATUS), 2: rm("conditions", CONDITION)}),
}

# --------------------------------------------------------------------------------------------
# apps/v1

DEPLOYMENT_CONDITION: Table = {
    1: s("type", keep=True), 2: s("status", keep=True), 4: s("reason"), 5: s("message"),
    6: t("lastUpdateTime"), 7: t("lastTransitionTime"),
}
DEPLOYMENT: Table = {
    1: m("metadata", OBJECT_META),
    2: m("spec", {
        1: i32("replicas", keep=True), 2: m("selector", LABEL_SELECTOR), 3: m("template", POD_TEMPLATE_SPEC),
        4: m("strategy", {1: s("type"), 2: m("rollingUpdate", {1: ios("maxUnavailable"), 2: ios("maxSurge")})}),
        5: i32("minReadySeconds"), 6: i32("revisionHistoryLimit", keep=True), 7: b("paused"),
        9: i32("progressDeadlineSeconds", keep=True),
    }),
    3: m("status", {
        1: i64("observedGeneration"), 2: i32("replicas"), 3: i32("updatedReplicas"), 4: i32("availableReplicas"),
        5: i32("unavailableReplicas"), 6: rm("conditions", DEPLOYMENT_CONDITION), 7: i32("readyReplicas"),
        8: i32("collisionCount", keep=True), 9: i32("terminatingReplicas", keep=True),
    }),
}

# --------------------------------------------------------------------------------------------
# batch/v1

JOB_CONDITION: Table = {
    1: s("type", keep=True), 2: s("status", keep=True), 3: t("lastProbeTime"), 4: t("lastTransitionTime"),
    5: s("reason"), 6: s("message"),
}
JOB_SPEC: Table = {
    1: i32("parallelism", keep=True), 2: i32("completions", keep=True), 3: i64("activeDeadlineSeconds", keep=True),
    4: m("selector", LABEL_SELECTOR), 5: b("manualSelector", keep=True), 6: m("template", POD_TEMPLATE_SPEC),
    7: i32("backoffLimit", keep=True), 8: i32("ttlSecondsAfterFinished", keep=True),
    9: s("completionMode", keep=True), 10: b("suspend", keep=True), 12: i32("backoffLimitPerIndex", keep=True),
    13: i32("maxFailedIndexes", keep=True), 14: s("podReplacementPolicy", keep=True), 16: s("managedBy", keep=True),
}
JOB_STATUS: Table = {
    1: rm("conditions", JOB_CONDITION), 2: t("startTime"), 3: t("completionTime"), 4: i32("active"),
    5: i32("succeeded"), 6: i32("failed"), 7: s("completedIndexes"),
    8: m("uncountedTerminatedPods", {1: rs("succeeded"), 2: rs("failed")}), 9: i32("ready", keep=True),
    10: s("failedIndexes", keep=True), 11: i32("terminating", keep=True),
}
JOB: Table = {1: m("metadata", OBJECT_META), 2: m("spec", JOB_SPEC), 3: m("status", JOB_STATUS)}
CRON_JOB: Table = {
    1: m("metadata", OBJECT_META),
    2: m("spec", {
        1: s("schedule", keep=True), 2: i64("startingDeadlineSeconds", keep=True), 3: s("concurrencyPolicy"),
        4: b("suspend", keep=True), 5: m("jobTemplate", {1: m("metadata", OBJECT_META), 2: m("spec", JOB_SPEC)}),
        6: i32("successfulJobsHistoryLimit", keep=True), 7: i32("failedJobsHistoryLimit", keep=True),
        8: s("timeZone", keep=True),
    }),
    3: m("status", {1: rm("active", OBJECT_REFERENCE), 4: t("lastScheduleTime"), 5: t("lastSuccessfulTime")}),
}

# --------------------------------------------------------------------------------------------
# policy/v1, scheduling.k8s.io/v1

POD_DISRUPTION_BUDGET: Table = {
    1: m("metadata", OBJECT_META),
    2: m("spec", {
        1: ios("minAvailable"), 2: m("selector", LABEL_SELECTOR), 3: ios("maxUnavailable"),
        4: s("unhealthyPodEvictionPolicy", keep=True),
    }),
    3: m("status", {
        1: i64("observedGeneration"), 2: mp("disruptedPods", TIME), 3: i32("disruptionsAllowed", keep=True),
        4: i32("currentHealthy", keep=True), 5: i32("desiredHealthy", keep=True), 6: i32("expectedPods", keep=True),
        7: rm("conditions", CONDITION),
    }),
}
PRIORITY_CLASS: Table = {
    1: m("metadata", OBJECT_META), 2: i32("value", keep=True), 3: b("globalDefault"), 4: s("description"),
    5: s("preemptionPolicy", keep=True),
}

# --------------------------------------------------------------------------------------------
# rbac.authorization.k8s.io/v1

POLICY_RULE: Table = {
    1: rs("verbs"), 2: rs("apiGroups"), 3: rs("resources"), 4: rs("resourceNames"), 5: rs("nonResourceURLs"),
}
SUBJECT: Table = {1: s("kind", keep=True), 2: s("apiGroup"), 3: s("name", keep=True), 4: s("namespace")}
ROLE_REF: Table = {1: s("apiGroup", keep=True), 2: s("kind", keep=True), 3: s("name", keep=True)}
ROLE: Table = {1: m("metadata", OBJECT_META), 2: rm("rules", POLICY_RULE)}
CLUSTER_ROLE: Table = {
    1: m("metadata", OBJECT_META), 2: rm("rules", POLICY_RULE),
    3: m("aggregationRule", {1: rm("clusterRoleSelectors", LABEL_SELECTOR)}),
}
ROLE_BINDING: Table = {1: m("metadata", OBJECT_META), 2: rm("subjects", SUBJECT), 3: m("roleRef", ROLE_REF)}

# --------------------------------------------------------------------------------------------
# networking.k8s.io/v1

INGRESS_BACKEND: Table = {
    1: m("resource", {1: s("apiGroup", keep=True), 2: s("kind", keep=True), 3: s("name", keep=True)}),
    4: m("service", {1: s("name", keep=True), 2: m("port", {1: s("name"), 2: i32("number")})}),
}
HTTP_INGRESS_PATH: Table = {1: s("path"), 2: m("backend", INGRESS_BACKEND), 3: s("pathType", keep=True)}
INGRESS_RULE: Table = {
    1: s("host"), 2: inline({1: m("http", {1: rm("paths", HTTP_INGRESS_PATH)})}),
}
INGRESS: Table = {
    1: m("metadata", OBJECT_META),
    2: m("spec", {
        1: m("defaultBackend", INGRESS_BACKEND), 2: rm("tls", {1: rs("hosts"), 2: s("secretName")}),
        3: rm("rules", INGRESS_RULE), 4: s("ingressClassName", keep=True),
    }),
    3: m("status", {1: m("loadBalancer", {1: rm("ingress", LOAD_BALANCER_INGRESS)})}),
}

# --------------------------------------------------------------------------------------------
# Registry: (apiVersion, kind) -> table

KINDS: dict[tuple[str, str], Table] = {
    ("v1", "Namespace"): NAMESPACE,
    ("v1", "ConfigMap"): CONFIG_MAP,
    ("v1", "Secret"): SECRET,
    ("v1", "Service"): SERVICE,
    ("v1", "ServiceAccount"): SERVICE_ACCOUNT,
    ("v1", "ResourceQuota"): RESOURCE_QUOTA,
    ("v1", "Pod"): POD,
    ("apps/v1", "Deployment"): DEPLOYMENT,
    ("batch/v1", "Job"): JOB,
    ("batch/v1", "CronJob"): CRON_JOB,
    ("policy/v1", "PodDisruptionBudget"): POD_DISRUPTION_BUDGET,
    ("scheduling.k8s.io/v1", "PriorityClass"): PRIORITY_CLASS,
    ("rbac.authorization.k8s.io/v1", "Role"): ROLE,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): CLUSTER_ROLE,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ROLE_BINDING,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ROLE_BINDING,
    ("networking.k8s.io/v1", "Ingress"): INGRESS,
}

# --------------------------------------------------------------------------------------------
# Wire reader


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Read a base-128 varint at ``pos``; return (value, next position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise errors.bad_request("protobuf: truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise errors.bad_request("protobuf: varint overflows 64 bits")


def iter_fields(buf: bytes) -> list[tuple[int, int, _Value]]:
    """Split a message into (field number, wire type, raw value) triples.

    Varints come back as unsigned ints, fixed-width values as raw bytes and
    length-delimited values as bytes.
    """
    out: list[tuple[int, int, _Value]] = []
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise errors.bad_request("protobuf: invalid field number 0")
        value: _Value
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _I64:
            if pos + 8 > end:
                raise errors.bad_request(f"protobuf: truncated 64-bit value in field {number}")
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == _LEN:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise errors.bad_request(f"protobuf: truncated length-delimited field {number}")
            value, pos = buf[pos:pos + length], pos + length
        elif wire == _I32:
            if pos + 4 > end:
                raise errors.bad_request(f"protobuf: truncated 32-bit value in field {number}")
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise errors.bad_request(f"protobuf: unsupported wire type {wire} in field {number}")
        out.append((number, wire, value))
    return out


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _text(raw: bytes, path: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.bad_request(f"protobuf: field {path} is not valid UTF-8") from None


def _expect(wire: int, want: int, path: str) -> None:
    if wire != want:
        raise errors.bad_request(f"protobuf: field {path} has wire type {wire}, expected {want}")


def _scalar(kind: str, wire: int, raw: _Value, path: str) -> Any:
    """Convert one non-packed scalar of ``kind``."""
    _expect(wire, _SCALAR_WIRE[kind], path)
    if kind == STRING:
        assert isinstance(raw, bytes)
        return _text(raw, path)
    if kind == BYTES:
        assert isinstance(raw, bytes)
        return base64.b64encode(raw).decode("ascii")
    if kind == DOUBLE:
        assert isinstance(raw, bytes)
        return struct.unpack("<d", raw)[0]
    assert isinstance(raw, int)
    if kind == INT32:
        return _signed(raw, 32)
    if kind == INT64:
        return _signed(raw, 64)
    if kind == UINT32:
        return raw & 0xFFFFFFFF
    return raw != 0  # BOOL


def _packed(kind: str, raw: bytes, path: str) -> list[Any]:
    """Decode a packed repeated varint field."""
    values: list[Any] = []
    pos = 0
    while pos < len(raw):
        value, pos = _varint(raw, pos)
        values.append(_scalar(kind, _VARINT, value, path))
    return values


def _format_time(seconds: int, nanos: int, micro: bool) -> str:
    moment = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(seconds=seconds)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos // 1000:06d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(raw: bytes, path: str, micro: bool) -> str | None:
    """meta/v1 Time / MicroTime (seconds = 1, nanos = 2); None when zero."""
    seconds = nanos = 0
    for number, wire, value in iter_fields(raw):
        if number in (1, 2):
            _expect(wire, _VARINT, path)
            assert isinstance(value, int)
            if number == 1:
                seconds = _signed(value, 64)
            else:
                nanos = _signed(value, 32)
    if seconds == 0 and nanos == 0:
        return None
    try:
        return _format_time(seconds, nanos, micro)
    except (OverflowError, ValueError):
        raise errors.bad_request(f"protobuf: field {path} holds an out-of-range time") from None


def _quantity(raw: bytes, path: str) -> str:
    """resource.Quantity: a message whose field 1 is the string form."""
    text = ""
    for number, wire, value in iter_fields(raw):
        if number == 1:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes)
            text = _text(value, path)
    return text


def _int_or_string(raw: bytes, path: str) -> int | str:
    """intstr.IntOrString: type = 1 (0 int, 1 string), intVal = 2, strVal = 3."""
    kind, int_val, str_val = 0, 0, ""
    for number, wire, value in iter_fields(raw):
        if number in (1, 2):
            _expect(wire, _VARINT, path)
            assert isinstance(value, int)
            if number == 1:
                kind = _signed(value, 64)
            else:
                int_val = _signed(value, 32)
        elif number == 3:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes)
            str_val = _text(value, path)
    return str_val if kind == 1 else int_val


def _raw_json(raw: bytes, path: str) -> Any:
    """FieldsV1-style message whose field 1 holds raw JSON."""
    for number, wire, value in iter_fields(raw):
        if number == 1:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes)
            try:
                return json.loads(value) if value else {}
            except ValueError:
                raise errors.bad_request(f"protobuf: field {path} does not hold valid JSON") from None
    return {}


def _single(kind: str, table: Table | None, wire: int, raw: _Value, path: str) -> Any:
    """Decode one value (a scalar, a well-known type or a nested message)."""
    if kind in _SCALAR_WIRE:
        return _scalar(kind, wire, raw, path)
    _expect(wire, _LEN, path)
    assert isinstance(raw, bytes)
    if kind == TIME or kind == MICROTIME:
        return _time(raw, path, micro=kind == MICROTIME)
    if kind == QUANTITY:
        return _quantity(raw, path)
    if kind == INTORSTR:
        return _int_or_string(raw, path)
    if kind == RAWJSON:
        return _raw_json(raw, path)
    assert table is not None, f"no table for message field {path}"
    return decode_message(raw, table, path)


def _zero(kind: str) -> Any:
    return {STRING: "", BYTES: "", BOOL: False, DOUBLE: 0.0}.get(kind, 0)


# Value of a map entry whose value field was not encoded (it is the zero value).
_MAP_DEFAULTS: dict[str, Any] = {STRING: "", BYTES: "", BOOL: False, DOUBLE: 0.0, QUANTITY: ""}


def _map_entry(f: Field, raw: bytes, path: str) -> tuple[str, Any]:
    key = ""
    value: Any = None
    for number, wire, item in iter_fields(raw):
        if number == 1:
            key = _scalar(STRING, wire, item, f"{path}.key")
        elif number == 2:
            value = _single(f.value, f.table, wire, item, f"{path}[{key}]")
    if value is None and f.value not in (TIME, MICROTIME):
        value = {} if f.value == MESSAGE else _MAP_DEFAULTS.get(f.value, 0)
    return key, value


def _is_zero(kind: str, value: Any) -> bool:
    return kind in _SCALAR_WIRE and value == _zero(kind)


def decode_message(buf: bytes, table: Table, path: str = "") -> dict[str, Any]:
    """Decode ``buf`` with ``table`` into a JSON-style dict."""
    out: dict[str, Any] = {}
    for number, wire, raw in iter_fields(buf):
        f = table.get(number)
        if f is None:
            continue
        here = f"{path}.{f.name}" if path and f.name else (f.name or path)
        if f.type == INLINE:
            _expect(wire, _LEN, here)
            assert isinstance(raw, bytes) and f.table is not None
            out.update(decode_message(raw, f.table, path))
        elif f.type == MAP:
            _expect(wire, _LEN, here)
            assert isinstance(raw, bytes)
            key, value = _map_entry(f, raw, here)
            entries = out.setdefault(f.name, {})
            if value is not None:
                entries[key] = value
        elif f.repeated:
            items = out.setdefault(f.name, [])
            if f.type in (INT32, INT64, UINT32, BOOL) and wire == _LEN:
                assert isinstance(raw, bytes)
                items.extend(_packed(f.type, raw, here))
            else:
                items.append(_single(f.type, f.table, wire, raw, f"{here}[{len(items)}]"))
        else:
            value = _single(f.type, f.table, wire, raw, here)
            if value is None or (not f.keep and _is_zero(f.type, value)):
                out.pop(f.name, None)
            else:
                out[f.name] = value
    return out


# --------------------------------------------------------------------------------------------
# Public API


def is_protobuf(content_type: str | None) -> bool:
    """True when a Content-Type names the Kubernetes protobuf encoding."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == MEDIA_TYPE


def _unsupported_kind(api_version: str, kind: str) -> errors.StatusError:
    what = f"{kind} ({api_version})" if api_version else kind or "an object without a kind"
    return errors.StatusError(
        415, "UnsupportedMediaType",
        f"the body of the request was in an unknown format - protobuf is not supported for {what}; "
        "send application/json instead (for example: kubectl create ... --dry-run=client -o yaml "
        "| kubectl apply -f -)",
    )


def decode(body: bytes) -> dict[str, Any]:
    """Decode a ``k8s\\x00``-prefixed protobuf body into a JSON-style object dict.

    Raises a 400 BadRequest ``StatusError`` for malformed bodies and a 415
    UnsupportedMediaType ``StatusError`` for kinds without a field table.
    """
    if not body.startswith(MAGIC):
        raise errors.bad_request(
            "protobuf: body does not start with the Kubernetes protobuf magic prefix 'k8s\\x00'"
        )
    api_version = kind = content_encoding = ""
    raw = b""
    for number, wire, value in iter_fields(body[len(MAGIC):]):
        if number == 1:
            _expect(wire, _LEN, "typeMeta")
            assert isinstance(value, bytes)
            for sub, sub_wire, sub_value in iter_fields(value):
                if sub == 1:
                    api_version = _scalar(STRING, sub_wire, sub_value, "typeMeta.apiVersion")
                elif sub == 2:
                    kind = _scalar(STRING, sub_wire, sub_value, "typeMeta.kind")
        elif number == 2:
            _expect(wire, _LEN, "raw")
            assert isinstance(value, bytes)
            raw = value
        elif number == 3:
            content_encoding = _scalar(STRING, wire, value, "contentEncoding")
    if content_encoding:
        raise errors.bad_request(f"protobuf: unsupported content encoding {content_encoding!r}")
    table = KINDS.get((api_version, kind))
    if table is None:
        raise _unsupported_kind(api_version, kind)
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind}
    obj.update(decode_message(raw, table))
    return obj


def register(api_version: str, kind: str, table: Table) -> None:
    """Add or replace the field table for ``(api_version, kind)``."""
    KINDS[(api_version, kind)] = table


__all__ = [
    "KINDS", "MAGIC", "MEDIA_TYPE", "Field", "Table", "decode", "decode_message", "is_protobuf",
    "iter_fields", "register",
]
