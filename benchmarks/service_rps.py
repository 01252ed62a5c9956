"""Requests per second through a Service's ClusterIP between two hosts, against
the same server reached by its pod IP, in the same run (as root).

Two hosts (network namespaces on one link, each with its own ``kubeplane node``
and containerd, the control plane in this process's namespace: the node tests'
multi-host set-up), a busybox HTTP server in a pod on host 2 behind a
ClusterIP Service, and a load generator in a pod on host 1 (a process in that
pod's network namespace: a new TCP connection per request, so that each one
goes through the Service's DNAT, with ``--concurrency`` requests in flight,
each closed with a reset once answered so that no TIME_WAIT builds up between
runs). Runs alternate
between the pod IP and the ClusterIP (``--runs`` each, ``--seconds`` long);
the medians and their ratio are reported.

    python benchmarks/service_rps.py --runs 5 --seconds 5 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_TESTS = os.path.join(HERE, "..", "tests", "integration", "node")

LOAD = textwrap.dedent("""
    import asyncio, socket, struct, sys, time

    LINGER = struct.pack("ii", 1, 0)

    async def one(host):
        r, w = await asyncio.open_connection(host, 80)
        w.write(b"GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
        await w.drain()
        data = await r.read()
        # closed with a reset once the answer is in: no TIME_WAIT on either side, whose
        # four-tuples a later connection's port would run into
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER)
        w.close()
        return data.startswith(b"HTTP/1.") and b" 200 " in data.split(b"\\r\\n", 1)[0]

    async def main(host, seconds, concurrency):
        ok = failed = 0
        deadline = time.monotonic() + seconds
        async def worker():
            nonlocal ok, failed
            while time.monotonic() < deadline:
                try:
                    if await asyncio.wait_for(one(host), 5):
                        ok += 1
                    else:
                        failed += 1
                except (OSError, asyncio.TimeoutError):
                    failed += 1
        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        print(ok / (time.monotonic() - start), failed)

    asyncio.run(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
""")


def _container_pid(host, pod: dict) -> int:
    """The process of the pod's container, from the host's containerd (CRI verbose status)."""
    import asyncio

    from kubeplane.node.cri.client import CRIClient, pb

    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    socket = os.path.join(host.data_dir, "containerd", "containerd.sock")

    async def ask() -> int:
        async with CRIClient("unix://" + socket) as cri:
            st = await cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid, verbose=True))
            return int(json.loads(st.info["info"])["pid"])
    return asyncio.run(ask())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("service_rps needs root (network namespaces, containerd)", file=sys.stderr)
        return 2
    sys.path.insert(0, NODE_TESTS)
    from multihost import Hosts, until  # noqa: E402 - the node tests' multi-host set-up
    from nodetest import BUSYBOX, PAUSE  # noqa: E402

    from kubeplane.node.images import build_busybox_image, build_pause_image

    with tempfile.TemporaryDirectory(prefix="service-rps-") as base:
        images = os.path.join(base, "images")
        os.makedirs(images)
        build_busybox_image(os.path.join(images, "busybox.tar"), BUSYBOX)
        build_pause_image(os.path.join(images, "pause.tar"), PAUSE)
        hosts = Hosts(os.path.join(base, "hosts"), images)
        os.makedirs(hosts.base)
        try:
            hosts.start()
            h1, h2 = hosts.hosts
            script = "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 80 -h /www"
            hosts.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rps", "labels": {"app": "rps"}},
                         "spec": {"nodeName": h2.name, "terminationGracePeriodSeconds": 1, "containers": [{
                             "name": "web", "image": BUSYBOX, "imagePullPolicy": "Never",
                             "command": ["sh", "-c", script], "ports": [{"containerPort": 80}],
                             "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1}}]}},
                        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rps"},
                         "spec": {"selector": {"app": "rps"}, "ports": [{"port": 80}]}})
            hosts.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rps-client"},
                         "spec": {"nodeName": h1.name, "terminationGracePeriodSeconds": 1, "containers": [{
                             "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                             "command": ["sleep", "3600"]}]}})
            pod_ip = hosts.wait_pod_ready("rps")["status"]["podIP"]
            client = hosts.wait_pod_ready("rps-client")
            cluster_ip = hosts.get("service", "rps")["spec"]["clusterIP"]
            netns = f"/proc/{_container_pid(h1, client)}/ns/net"

            def rate(target: str) -> tuple[float, int]:
                out = subprocess.run(["nsenter", f"--net={netns}", sys.executable, "-c", LOAD, target,
                                      str(args.seconds), str(args.concurrency)], capture_output=True, text=True,
                                     timeout=args.seconds + 60, check=True).stdout.split()
                return float(out[0]), int(out[1])

            until("the ClusterIP answering", lambda: rate(cluster_ip)[0] > 0, 30)
            direct, service, failures = [], [], 0
            for i in range(args.runs):
                for name, target, into in (("pod IP", pod_ip, direct), ("ClusterIP", cluster_ip, service))[::(
                        1 if i % 2 == 0 else -1)]:
                    r, f = rate(target)
                    into.append(r)
                    failures += f
            result = {
                "workload": "service_rps", "runs": args.runs, "seconds": args.seconds,
                "concurrency": args.concurrency,
                "pod_ip_rps": [round(x, 1) for x in direct], "cluster_ip_rps": [round(x, 1) for x in service],
                "pod_ip_rps_median": round(statistics.median(direct), 1),
                "cluster_ip_rps_median": round(statistics.median(service), 1),
                "ratio_cluster_ip_to_pod_ip": round(statistics.median(service) / statistics.median(direct), 3),
                "failed_requests": failures,
            }
        finally:
            hosts.stop()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"pod IP     {result['pod_ip_rps_median']:8.1f} req/s  (runs: {result['pod_ip_rps']})")
        print(f"ClusterIP  {result['cluster_ip_rps_median']:8.1f} req/s  (runs: {result['cluster_ip_rps']})")
        print(f"ratio ClusterIP / pod IP: {result['ratio_cluster_ip_to_pod_ip']}  "
              f"(failed requests: {result['failed_requests']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
