"""Projected ServiceAccount tokens from a real API server's TokenRequest API, renewed at 80 % of
their life; contents refreshed by the volume manager's own resync."""

from __future__ import annotations

import os
import stat
import time

from helpers import eventually
from kubeplane.api.resources import resource
from kubeplane.auth import jwt
from kubeplane.client.events import EventRecorder
from kubeplane.client.http import HttpClient
from kubeplane.client.kubeconfig import load_kubeconfig
from kubeplane.node.volumes import VolumeManager, mounts_under
from kubeplane.testing import Cluster

CMS = resource("configmaps")
PODS = resource("pods")
SAS = resource("serviceaccounts")
REVIEWS = resource("tokenreviews")
EVENTS = resource("events")


def _read(path):
    with open(path) as f:
        return f.read()


async def test_service_account_token_volume_and_renewal(tmp_path):
    async with Cluster() as c:
        client = HttpClient(load_kubeconfig(c.kubeconfig))
        vm = recorder = None
        try:
            await client.create(SAS, {"metadata": {"name": "robot"}}, "default")
            # what the root CA publisher keeps in every namespace
            await client.create(CMS, {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "CA"}}, "default")
            pod = await client.create(PODS, {"metadata": {"name": "tok"}, "spec": {
                "serviceAccountName": "robot", "containers": [{"name": "c", "image": "busybox"}]}}, "default")
            vol = next(v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
            now = [time.time()]
            recorder = EventRecorder(client, "kubelet", host="n1")
            vm = VolumeManager(client, str(tmp_path / "pods"), node_name="n1", clock=lambda: now[0],
                               resync_seconds=3600, recorder=recorder)
            await vm.setup(pod)
            uid = pod["metadata"]["uid"]
            d = vm.volume_dir(uid, "kubernetes.io~projected", vol["name"])
            assert d in mounts_under(vm.pod_dir(uid))  # a tmpfs
            assert sorted(n for n in os.listdir(d) if not n.startswith("..")) == ["ca.crt", "namespace", "token"]
            assert _read(os.path.join(d, "ca.crt")) == "CA" and _read(os.path.join(d, "namespace")) == "default"
            assert stat.S_IMODE(os.stat(os.path.join(d, "token")).st_mode) == 0o644
            token = _read(os.path.join(d, "token"))
            claims = jwt.unverified(token)[1]
            assert claims["sub"] == "system:serviceaccount:default:robot"
            assert claims["kubernetes.io"]["pod"] == {"name": "tok", "uid": uid}
            assert claims["exp"] - claims["iat"] == 3607
            review = await client.create(REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                                   "spec": {"token": token}})
            assert review["status"]["authenticated"] is True
            [m] = vm.mounts(pod, pod["spec"]["containers"][0])
            assert (m.container_path, m.host_path, m.readonly) == (
                "/var/run/secrets/kubernetes.io/serviceaccount", d, True)

            # before 80 % of its life (less the jitter of up to 10 s) the token is kept ...
            now[0] = claims["iat"] + 3607 * 0.8 - 11
            await vm.refresh()
            assert _read(os.path.join(d, "token")) == token
            # ... after it, asked again
            now[0] = claims["iat"] + 3607 * 0.8 + 1
            await vm.refresh()
            renewed = _read(os.path.join(d, "token"))
            assert renewed != token and jwt.unverified(renewed)[1]["kubernetes.io"]["pod"]["uid"] == uid

            # the API server refuses: the cached token is served until it expires, then the error shows
            await client.delete(SAS, "robot", "default")
            now[0] = claims["iat"] + 3607 * 0.99
            await vm.refresh()
            assert _read(os.path.join(d, "token")) == renewed
            now[0] = jwt.unverified(renewed)[1]["exp"] + 1
            # the volume stays (upstream's remount failure): the event tells; a sync of the
            # unchanged pod leaves the ready volume to the resync
            await vm.setup(pod)
            await vm.refresh()
            assert _read(os.path.join(d, "token")) == renewed
            await recorder.flush()
            [event] = (await client.list(EVENTS, "default"))["items"]
            assert event["reason"] == "FailedMount" and event["involvedObject"]["name"] == "tok"
            assert event["message"].startswith(f'MountVolume.SetUp failed for volume "{vol["name"]}" : token ')
            assert "expired and refresh failed" in event["message"]
            assert 'serviceaccounts "robot" not found' in event["message"]
            await vm.teardown(uid)
            assert not os.path.exists(vm.pod_dir(uid))
        finally:
            if recorder is not None:
                await recorder.close()
            if vm is not None:
                await vm.close()
                for uid in vm.pod_uids_on_disk():
                    await vm.teardown(uid)
            await client.close()


async def test_resync_brings_contents_up_to_date(tmp_path):
    async with Cluster() as c:
        client = HttpClient(load_kubeconfig(c.kubeconfig))
        vm = VolumeManager(client, str(tmp_path / "pods"), node_name="n1", resync_seconds=0.2)
        try:
            await client.create(CMS, {"metadata": {"name": "cfg"}, "data": {"k": "v1"}}, "default")
            pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u-resync"}, "spec": {
                "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
                "containers": [{"name": "c", "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]}}
            await vm.setup(pod)
            path = os.path.join(vm.volume_dir("u-resync", "kubernetes.io~configmap", "cfg"), "k")
            assert _read(path) == "v1"
            await client.patch(CMS, "cfg", {"data": {"k": "v2"}}, "default")
            await eventually(lambda: _read(path) == "v2", timeout=5)
        finally:
            await vm.close()
            await vm.teardown("u-resync")
            await client.close()


async def test_the_resync_wakes_for_a_token_due(tmp_path):
    async with Cluster() as c:
        client = HttpClient(load_kubeconfig(c.kubeconfig))
        # this node's clock runs 475 s ahead: a token of 600 s is due (80 %) in 5 s, at the earliest in 10 s
        vm = VolumeManager(client, str(tmp_path / "pods"), node_name="n1", clock=lambda: time.time() + 475,
                           resync_seconds=3600)
        try:
            await client.create(SAS, {"metadata": {"name": "robot"}}, "default")
            pod = await client.create(PODS, {"metadata": {"name": "tok"}, "spec": {
                "serviceAccountName": "robot", "automountServiceAccountToken": False,
                "containers": [{"name": "c", "image": "busybox", "volumeMounts": [{"name": "t", "mountPath": "/t"}]}],
                "volumes": [{"name": "t", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 600, "audience": "vault"}}]}}]}},
                "default")
            await vm.setup(pod)
            path = os.path.join(vm.volume_dir(pod["metadata"]["uid"], "kubernetes.io~projected", "t"), "token")
            first = _read(path)
            assert jwt.unverified(first)[1]["aud"] == ["vault"]
            started = time.monotonic()
            await eventually(lambda: _read(path) != first, timeout=20, interval=0.2)
            assert 9 <= time.monotonic() - started < 20
        finally:
            await vm.close()
            for uid in vm.pod_uids_on_disk():
                await vm.teardown(uid)
            await client.close()
