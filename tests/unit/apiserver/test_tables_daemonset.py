"""Table columns of DaemonSets (upstream printers.go)."""

import datetime as dt

from kubeplane.api.resources import resource
from kubeplane.apiserver.tables import build_table, column_definitions

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


def test_daemonset_columns_and_cells() -> None:
    cols = column_definitions(resource("daemonsets"))
    assert [(c["name"], c["type"], c["priority"]) for c in cols] == [
        ("Name", "string", 0), ("Desired", "integer", 0), ("Current", "integer", 0), ("Ready", "integer", 0),
        ("Up-to-date", "integer", 0), ("Available", "integer", 0), ("Node Selector", "string", 0),
        ("Age", "string", 0), ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)]
    ds = {
        "metadata": {"name": "agent", "namespace": "default", "uid": "u", "resourceVersion": "1",
                     "creationTimestamp": (NOW - dt.timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent"}},
                              "spec": {"nodeSelector": {"role": "edge", "disk": "ssd"},
                                       "containers": [{"name": "a", "image": "agent:1"},
                                                      {"name": "b", "image": "side:2"}]}}},
        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                   "updatedNumberScheduled": 1, "numberAvailable": 2, "numberMisscheduled": 0},
    }
    row = build_table(resource("daemonsets"), [ds], now=NOW)["rows"][0]["cells"]
    assert row == ["agent", 3, 3, 2, 1, 2, "disk=ssd,role=edge", "3h", "a,b", "agent:1,side:2", "app=agent"]
    # no node selector, a fresh (zero) status
    del ds["spec"]["template"]["spec"]["nodeSelector"]
    ds["status"] = {"desiredNumberScheduled": 0, "currentNumberScheduled": 0, "numberReady": 0,
                    "numberMisscheduled": 0}
    row = build_table(resource("daemonsets"), [ds], now=NOW)["rows"][0]["cells"]
    assert row[1:7] == [0, 0, 0, 0, 0, "<none>"]
