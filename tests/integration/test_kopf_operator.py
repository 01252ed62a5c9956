"""A kopf operator end to end against a real kubeplane API server.

kopf (PyPI) runs in a thread with its own event loop, logs in with the admin
kubeconfig's certificate, verifying the server's CA, and runs with peering on
(ClusterKopfPeering) and validating and mutating admission webhooks served by
kopf's own WebhookServer, whose webhook configurations kopf manages itself.
The tests watch the effects of create/update/field/timer/delete handlers.

kopf generates its own self-signed certificate only with the optional
``certbuilder``/``oscrypto`` packages; the test makes the equivalent
self-signed CA certificate with ``cryptography`` and hands it to the
WebhookServer, which puts it into the configurations' caBundle itself.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import threading
import time

import kopf
import kubernetes
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import Kubectl, start_server

GROUP = "kopf-e2e.example.com"
NS = "kopf-e2e"
WEBHOOK_CONFIG = "kopf-e2e.example.com"
IDENTITY = "kopf-e2e-operator"

WIDGET_CRD = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{GROUP}
spec:
  group: {GROUP}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {{type: integer}}
              color: {{type: string}}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"""

# kopf's peering resources, as kopf's documentation defines them.
PEERING_CRDS = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusterkopfpeerings.kopf.dev
spec:
  scope: Cluster
  group: kopf.dev
  names: {kind: ClusterKopfPeering, plural: clusterkopfpeerings, singular: clusterkopfpeering}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: kopfpeerings.kopf.dev
spec:
  scope: Namespaced
  group: kopf.dev
  names: {kind: KopfPeering, plural: kopfpeerings, singular: kopfpeering}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed(tmp) -> tuple[str, str]:
    """A self-signed CA certificate for 127.0.0.1 that also serves."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = tmp / "webhook.crt", tmp / "webhook.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return str(certfile), str(keyfile)


def wait_for(what: str, fn, timeout: float = 15.0, errors: list | None = None):
    """Poll ``fn`` until it returns a truthy value (returned) or time out."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            got = fn()
            if got:
                return got
            last = got
        except kubernetes.client.ApiException as e:
            last = f"{e.status} {e.reason}"
        if errors:
            raise AssertionError(f"operator failed while waiting for {what}: {errors}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
        time.sleep(0.05)


def build_registry(server, certfile: str, keyfile: str, webhook_port: int, api_factory) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    res = (GROUP, "v1", "widgets")

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.peering.name = "default"
        settings.peering.mandatory = True
        settings.peering.clusterwide = True
        settings.admission.server = kopf.WebhookServer(
            addr="127.0.0.1", port=webhook_port, certfile=certfile, pkeyfile=keyfile, cafile=certfile)
        settings.admission.managed = WEBHOOK_CONFIG
        settings.watching.server_timeout = 30

    @kopf.on.login(registry=registry)
    def login(**_):
        return kopf.ConnectionInfo(
            server=server.url, ca_path=server.ca_file,
            certificate_path=server.cert[0], private_key_path=server.cert[1],
            default_namespace="default",
        )

    @kopf.on.validate(*res, id="check_size", registry=registry)
    def check_size(spec, **_):
        if (spec.get("size") or 0) > 10:
            raise kopf.AdmissionError("size must be at most 10")

    @kopf.on.mutate(*res, id="add_label", registry=registry)
    def add_label(patch, **_):
        patch.metadata.labels["mutated-by"] = "kopf"

    @kopf.on.create(*res, id="on_create", registry=registry)
    def on_create(body, name, namespace, spec, **_):
        core = kubernetes.client.CoreV1Api(api_factory())
        core.create_namespaced_config_map(namespace, {
            "metadata": {"name": f"{name}-cm"}, "data": {"size": str(spec.get("size"))}})
        kopf.info(body, reason="ConfigMapCreated", message=f"created {name}-cm")
        return {"configmap": f"{name}-cm"}

    @kopf.on.update(*res, id="on_update", registry=registry)
    def on_update(spec, **_):
        return {"size": spec.get("size")}

    @kopf.on.field(*res, id="on_color", field="spec.color", registry=registry)
    def on_color(old, new, patch, **_):
        patch.status["color"] = {"old": old, "new": new}

    @kopf.timer(*res, id="tick", interval=0.3, registry=registry)
    def tick(status, patch, **_):
        patch.status["ticks"] = (status.get("ticks") or 0) + 1

    @kopf.on.delete(*res, id="on_delete", registry=registry)
    def on_delete(name, namespace, **_):
        core = kubernetes.client.CoreV1Api(api_factory())
        core.delete_namespaced_config_map(f"{name}-cm", namespace)

    return registry


@pytest.fixture
def cluster(tmp_path):
    srv = start_server(tmp_path / "apiserver")
    try:
        yield srv, Kubectl(srv.kubeconfig, tmp_path / "kubectl-home")
    finally:
        srv.stop()


def test_kopf_operator_end_to_end(cluster, tmp_path):
    server, kubectl = cluster
    api = kubernetes.config.new_client_from_config(config_file=str(server.kubeconfig))
    clients: list = [api]

    def api_factory():
        c = kubernetes.config.new_client_from_config(config_file=str(server.kubeconfig))
        clients.append(c)
        return c

    custom = kubernetes.client.CustomObjectsApi(api)
    core = kubernetes.client.CoreV1Api(api)
    admission = kubernetes.client.AdmissionregistrationV1Api(api)

    kubectl("apply", "-f", "-", stdin=WIDGET_CRD + "---" + PEERING_CRDS)
    kubectl("wait", "--for=condition=Established", "--timeout=10s", f"crd/widgets.{GROUP}",
            "crd/clusterkopfpeerings.kopf.dev", "crd/kopfpeerings.kopf.dev")
    kubectl("create", "namespace", NS)
    kubectl("apply", "-f", "-", stdin="apiVersion: kopf.dev/v1\nkind: ClusterKopfPeering\nmetadata: {name: default}\n")

    certfile, keyfile = _self_signed(tmp_path)
    registry = build_registry(server, certfile, keyfile, _free_port(), api_factory)
    stop_flag, ready_flag = threading.Event(), threading.Event()
    errors: list = []

    def run_operator():
        try:
            kopf.run(registry=registry, clusterwide=True, identity=IDENTITY, stop_flag=stop_flag, ready_flag=ready_flag,
                     peering_name="default", standalone=False)
        except BaseException as e:  # surfaced to the waits
            errors.append(repr(e))

    thread = threading.Thread(target=run_operator, name="kopf-operator", daemon=True)
    thread.start()
    try:
        wait_for("the operator to be ready", ready_flag.is_set, errors=errors)

        # Peering: kopf announces itself in the ClusterKopfPeering's status (a merge patch).
        def peers():
            return custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", "default").get(
                "status") or {}

        assert wait_for("kopf's peering record", lambda: peers().get(IDENTITY), errors=errors)["priority"] == 0

        # kopf writes its own webhook configurations (url + caBundle).
        vwc = wait_for("the managed validating webhook configuration", lambda: (
            c := admission.read_validating_webhook_configuration(WEBHOOK_CONFIG)).webhooks and c, errors=errors)
        mwc = wait_for("the managed mutating webhook configuration", lambda: (
            c := admission.read_mutating_webhook_configuration(WEBHOOK_CONFIG)).webhooks and c, errors=errors)
        for hook in (vwc.webhooks[0], mwc.webhooks[0]):
            assert hook.client_config.url.startswith("https://127.0.0.1:")
            assert hook.client_config.ca_bundle

        # Create: the handler creates a ConfigMap, kopf records the result in status and adds its finalizer.
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
            "apiVersion": f"{GROUP}/v1", "kind": "Widget",
            "metadata": {"name": "w1", "namespace": NS}, "spec": {"size": 1, "color": "red"}}))
        wait_for("the create handler's ConfigMap", lambda: core.read_namespaced_config_map("w1-cm", NS), errors=errors)

        def get_w1():
            return custom.get_namespaced_custom_object(GROUP, "v1", NS, "widgets", "w1")

        obj = wait_for("the create handler's status", lambda: (
            w := get_w1()).get("status", {}).get("on_create") and w, errors=errors)
        assert obj["status"]["on_create"] == {"configmap": "w1-cm"}
        assert obj["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
        # kopf's mutating webhook answered with a JSON patch.
        assert obj["metadata"]["labels"] == {"mutated-by": "kopf"}

        # Update and field handlers.
        kubectl("patch", "widget", "w1", "-n", NS, "--type=merge", "-p", '{"spec": {"size": 3, "color": "blue"}}')
        wait_for("the update handler's status", lambda: get_w1().get("status", {}).get("on_update") == {"size": 3},
                 errors=errors)
        wait_for("the field handler's status", lambda: get_w1().get("status", {}).get("color") == {
            "old": "red", "new": "blue"}, errors=errors)

        # The timer keeps ticking.
        wait_for("two timer ticks", lambda: (get_w1().get("status", {}).get("ticks") or 0) >= 2, errors=errors)

        # kopf posted core/v1 Events about the handlers.
        wait_for("kopf's events", lambda: any(
            e.reason == "ConfigMapCreated" and e.message == "created w1-cm" and e.type == "Normal"
            for e in core.list_namespaced_event(
                NS, field_selector="involvedObject.name=w1").items), errors=errors)

        # The validating webhook served by kopf denies an invalid object.
        bad = kubectl("apply", "-f", "-", check=False, stdin=yaml.safe_dump({
            "apiVersion": f"{GROUP}/v1", "kind": "Widget",
            "metadata": {"name": "w2", "namespace": NS}, "spec": {"size": 20}}))
        assert bad.rc != 0
        assert "size must be at most 10" in bad.err, bad.err
        assert "denied the request" in bad.err, bad.err

        # Delete: the delete handler runs, then kopf removes its finalizer and the object goes.
        kubectl("delete", "widget", "w1", "-n", NS, "--wait=false")

        def gone(read):
            try:
                read()
            except kubernetes.client.ApiException as e:
                if e.status == 404:
                    return True
                raise
            return False

        wait_for("the Widget to be deleted", lambda: gone(get_w1), errors=errors)
        assert gone(lambda: core.read_namespaced_config_map("w1-cm", NS))
        assert not errors, errors
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- server log tail ---\n{server.log()[-4000:]}") from None
    finally:
        stop_flag.set()
        thread.join(20)
    try:
        assert not thread.is_alive(), "kopf did not stop"
        assert not errors, errors
        # On exit kopf removed its peering record (a merge patch with null).
        assert IDENTITY not in peers()
    finally:
        for c in clients:
            c.close()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_kopf_namespaced_operator_streaming_late_crd(cluster, tmp_path):
    """A namespaced operator (namespace glob, KopfPeering) with watch-list initial
    streaming (sendInitialEvents) and one-second watch timeouts, started before
    its CRD exists: kopf finds the CRD through its CRD watch and serves it, sees
    a namespace created later through its namespace watch, and handles objects
    there."""
    server, kubectl = cluster
    api = kubernetes.config.new_client_from_config(config_file=str(server.kubeconfig))
    custom = kubernetes.client.CustomObjectsApi(api)
    kubectl("apply", "-f", "-", stdin=PEERING_CRDS)
    kubectl("wait", "--for=condition=Established", "--timeout=10s", "crd/kopfpeerings.kopf.dev")
    peering = "apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata: {name: default, namespace: %s}\n"
    kubectl("create", "namespace", "kopf-a")
    kubectl("apply", "-f", "-", stdin=peering % "kopf-a")

    registry = kopf.OperatorRegistry()
    seen: list = []

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.peering.mandatory = True
        settings.watching.initial_streaming = True
        settings.watching.server_timeout = 1

    @kopf.on.login(registry=registry)
    def login(**_):
        return kopf.ConnectionInfo(server=server.url, ca_path=server.ca_file,
                                   certificate_path=server.cert[0], private_key_path=server.cert[1])

    @kopf.on.create(GROUP, "v1", "widgets", id="created", registry=registry)
    def created(name, namespace, **_):
        seen.append(("created", namespace, name))
        return "done"

    @kopf.on.delete(GROUP, "v1", "widgets", id="deleted", registry=registry)
    def deleted(name, namespace, **_):
        seen.append(("deleted", namespace, name))

    @kopf.on.event("v1", "configmaps", id="cm_events", registry=registry)
    def cm_events(type, name, namespace, **_):
        seen.append((type, namespace, name))

    records = _Records()
    kopf_logger = logging.getLogger("kopf")
    old_level = kopf_logger.level
    kopf_logger.setLevel(logging.DEBUG)
    kopf_logger.addHandler(records)
    stop_flag, ready_flag = threading.Event(), threading.Event()
    errors: list = []

    def run_operator():
        try:
            kopf.run(registry=registry, namespaces=["kopf-*"], stop_flag=stop_flag, ready_flag=ready_flag,
                     standalone=False)
        except BaseException as e:
            errors.append(repr(e))

    thread = threading.Thread(target=run_operator, name="kopf-namespaced-operator", daemon=True)
    thread.start()
    try:
        wait_for("the operator to be ready", ready_flag.is_set, errors=errors)
        # kopf has looked for the widgets resource and not found it yet.
        wait_for("kopf to miss the CRD", lambda: any(
            "Unresolved resources cannot be served" in m for m in records.messages), errors=errors)
        # The initial stream of the existing namespace's ConfigMaps (sendInitialEvents) is handled
        # (kube-root-ca.crt is published in every namespace).
        kubectl("create", "configmap", "early", "-n", "kopf-a")
        wait_for("the ConfigMap event", lambda: ("ADDED", "kopf-a", "early") in seen, errors=errors)

        kubectl("apply", "-f", "-", stdin=WIDGET_CRD)
        kubectl("create", "namespace", "kopf-b")
        kubectl("apply", "-f", "-", stdin=peering % "kopf-b")
        for ns in ("kopf-a", "kopf-b"):
            kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
                "apiVersion": f"{GROUP}/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": ns}, "spec": {"size": 1}}))
        for ns in ("kopf-a", "kopf-b"):
            wait_for(f"the create handler in {ns}", lambda: ("created", ns, "w") in seen, errors=errors)
            wait_for(f"the create handler's status in {ns}", lambda: custom.get_namespaced_custom_object(
                GROUP, "v1", ns, "widgets", "w").get("status", {}).get("created") == "done", errors=errors)
        kubectl("create", "configmap", "late", "-n", "kopf-b")
        wait_for("the late ConfigMap event", lambda: ("ADDED", "kopf-b", "late") in seen, errors=errors)

        kubectl("delete", "widget", "w", "-n", "kopf-b", "--timeout=15s")
        assert ("deleted", "kopf-b", "w") in seen
        # A namespace outside the glob is not served.
        kubectl("create", "namespace", "other")
        kubectl("create", "configmap", "ignored", "-n", "other")
        kubectl("create", "configmap", "marker", "-n", "kopf-a")
        wait_for("the marker ConfigMap event", lambda: ("ADDED", "kopf-a", "marker") in seen, errors=errors)
        assert not [s for s in seen if s[1] == "other"]

        # Peering: a live rival of higher priority in a served namespace's KopfPeering pauses
        # the operator (kopf sees the peering object's MODIFIED event); its removal with a merge
        # patch of null resumes it, and what happened meanwhile is then handled.
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        custom.patch_namespaced_custom_object("kopf.dev", "v1", "kopf-a", "kopfpeerings", "default", {
            "status": {"rival": {"priority": 100, "lifetime": 60, "lastseen": now}}})
        wait_for("kopf to pause", lambda: any("Pausing operations in favour of" in m for m in records.messages),
                 errors=errors)
        kubectl("create", "configmap", "while-paused", "-n", "kopf-a")
        custom.patch_namespaced_custom_object("kopf.dev", "v1", "kopf-a", "kopfpeerings", "default", {
            "status": {"rival": None}})
        wait_for("kopf to resume", lambda: any("Resuming operations after the pause" in m
                                               for m in records.messages), errors=errors)
        # (kopf lists again on resuming: listed objects come as events of type None)
        handled = {("ADDED", "kopf-a", "while-paused"), (None, "kopf-a", "while-paused")}
        wait_for("the ConfigMap created while paused", lambda: handled & set(seen),
                 errors=errors)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- server log tail ---\n{server.log()[-4000:]}") from None
    finally:
        stop_flag.set()
        thread.join(20)
        kopf_logger.removeHandler(records)
        kopf_logger.setLevel(old_level)
        api.close()
    assert not thread.is_alive(), "kopf did not stop"
    assert not errors, errors
    assert not [m for m in records.messages if "Error in the watch-stream" in m or "Unsupported" in m]
