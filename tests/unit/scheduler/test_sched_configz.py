"""/configz: the effective KubeSchedulerConfiguration."""

from __future__ import annotations

import aiohttp

from kubeplane.cluster import components_metrics_server
from kubeplane.scheduler.config import componentconfig, parse_config
from kubeplane.scheduler.plugins.registry import in_tree_registry


def test_componentconfig_shows_defaults_and_profiles():
    cfg = parse_config({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                        "leaderElection": {"leaseDuration": "30s"},
                        "profiles": [{"schedulerName": "default-scheduler"},
                                     {"schedulerName": "other", "plugins": {"score": {"disabled": [{"name": "*"}]}}}]},
                       in_tree_registry())
    doc = componentconfig(cfg)
    # As kube-scheduler's /configz: the internal type, whose Go fields have no JSON names.
    assert doc["Parallelism"] == 16 and doc["PodInitialBackoffSeconds"] == 1 and doc["PodMaxBackoffSeconds"] == 10
    assert doc["LeaderElection"]["LeaseDuration"] == "30s" and doc["LeaderElection"]["RenewDeadline"] == "10s"
    assert doc["LeaderElection"]["ResourceName"] == "kube-scheduler"
    assert doc["ClientConnection"]["QPS"] == 50 and doc["EnableProfiling"] is True
    assert [p["SchedulerName"] for p in doc["Profiles"]] == ["default-scheduler", "other"]
    score = {p["Name"]: p["Weight"] for p in doc["Profiles"][0]["Plugins"]["Score"]["Enabled"]}
    assert score["NodeResourcesFit"] == 1 and score["TaintToleration"] == 3
    assert doc["Profiles"][1]["Plugins"]["Score"]["Enabled"] == []
    assert {"Name": "DefaultPreemption", "Weight": 0} in doc["Profiles"][0]["Plugins"]["PostFilter"]["Enabled"]


async def test_metrics_server_serves_configz_metrics_and_healthz():
    server, metrics = components_metrics_server("127.0.0.1:0", None)
    await server.start()
    try:
        metrics.observe_attempt("scheduled", "default-scheduler", 0.01)
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + "/configz") as r:
                assert r.status == 200 and r.headers["Content-Type"] == "application/json"
                doc = await r.json()
            async with s.get(server.url + "/metrics") as r:
                text = await r.text()
            async with s.get(server.url + "/healthz") as r:
                assert r.status == 200
        assert list(doc) == ["componentconfig"]
        assert doc["componentconfig"]["Profiles"][0]["SchedulerName"] == "default-scheduler"
        assert 'scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 1.0' in text
        assert "# TYPE workqueue_depth gauge" in text
    finally:
        await server.stop()
