"""Table columns of StatefulSets and ControllerRevisions (upstream printers.go)."""

import datetime as dt

from kubeplane.api.resources import resource
from kubeplane.apiserver.tables import build_table, column_definitions

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


def meta(name: str, **extra) -> dict:
    md = {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1",
          "creationTimestamp": (NOW - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    md.update(extra)
    return md


def cells(res: str, obj: dict) -> list:
    return build_table(resource(res), [obj], now=NOW)["rows"][0]["cells"]


def test_controller_revision_columns() -> None:
    cols = column_definitions(resource("controllerrevisions"))
    assert [(c["name"], c["type"], c["priority"]) for c in cols] == [
        ("Name", "string", 0), ("Controller", "string", 0), ("Revision", "string", 0), ("Age", "string", 0)]
    owned = {"metadata": meta("web-6b8d4", ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "u", "controller": True}]),
        "data": {}, "revision": 3}
    assert cells("controllerrevisions", owned) == ["web-6b8d4", "statefulset.apps/web", 3, "5m"]
    core = {"metadata": meta("x", ownerReferences=[
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}]), "data": {}, "revision": 1}
    assert cells("controllerrevisions", core)[1] == "pod/p"
    not_controller = {"metadata": meta("y", ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}]), "data": {}}
    assert cells("controllerrevisions", not_controller)[1:3] == ["<none>", 0]


def test_statefulset_columns() -> None:
    cols = column_definitions(resource("statefulsets"))
    assert [(c["name"], c["priority"]) for c in cols] == [
        ("Name", 0), ("Ready", 0), ("Age", 0), ("Containers", 1), ("Images", 1)]
    sts = {"metadata": meta("web"), "spec": {"replicas": 3, "template": {"spec": {"containers": [
        {"name": "nginx", "image": "nginx:1"}, {"name": "side", "image": "busybox"}]}}},
        "status": {"replicas": 3, "readyReplicas": 2}}
    assert cells("statefulsets", sts) == ["web", "2/3", "5m", "nginx,side", "nginx:1,busybox"]
    assert cells("statefulsets", {"metadata": meta("empty"), "spec": {}})[1] == "0/1"
