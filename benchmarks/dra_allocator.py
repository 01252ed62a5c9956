"""Micro benchmark of the structured allocator: 100 nodes x 8 devices.

Run on demand: ``python benchmarks/dra_allocator.py``. Prints medians of
several rounds for: a fresh allocator over all nodes (cold CEL), the same
allocator over all nodes again (memoized CEL), and a CEL evaluation alone.
"""

from __future__ import annotations

import statistics
import time

from kubeplane.dra.allocator import Allocator, DeviceMatchCache
from kubeplane.dra.cel import DeviceEnv, compile_selector
from kubeplane.dra.pools import DeviceID

DRIVER = "gpu.example.com"
NODES = 100
DEVICES = 8
ROUNDS = 7


def make_slices() -> list[dict]:
    out = []
    for n in range(NODES):
        devices = [{"name": f"gpu-{i}", "attributes": {"model": {"string": "a100"}, "index": {"int": i}},
                    "capacity": {"memory": {"value": "80Gi"}}} for i in range(DEVICES)]
        out.append({"metadata": {"name": f"node-{n}-slice", "uid": f"uid-{n}", "resourceVersion": "1"},
                    "spec": {"driver": DRIVER, "nodeName": f"node-{n}",
                             "pool": {"name": f"node-{n}", "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
    return out


CLASSES = {"gpu": {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}}
CLAIM = {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": {"requests": [{"name": "r", "exactly": {
    "deviceClassName": "gpu", "count": 2, "selectors": [
        {"cel": {"expression": f'device.attributes["{DRIVER}"].model == "a100"'}},
        {"cel": {"expression": f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'}}]}}]}}}


def median_ms(fn) -> float:
    samples = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples)


def main() -> None:
    slices = make_slices()
    nodes = [{"metadata": {"name": f"node-{n}"}} for n in range(NODES)]
    # Half of every node's devices are taken already.
    allocated = {DeviceID(DRIVER, f"node-{n}", f"gpu-{i}") for n in range(NODES) for i in range(DEVICES // 2)}

    def all_nodes(alloc: Allocator) -> None:
        for node in nodes:
            assert alloc.allocate(node) is not None

    def cold() -> None:
        all_nodes(Allocator([CLAIM], allocated, CLASSES, slices))

    warm_alloc = Allocator([CLAIM], allocated, CLASSES, slices)
    all_nodes(warm_alloc)
    shared = DeviceMatchCache()
    all_nodes(Allocator([CLAIM], allocated, CLASSES, slices, match_cache=shared))

    sel = compile_selector(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0')
    env = DeviceEnv(DRIVER, slices[0]["spec"]["devices"][0])

    def evals() -> None:
        for _ in range(1000):
            sel.matches(env)

    print(f"{NODES} nodes x {DEVICES} devices, claim of 2 devices with 3 selectors; medians of {ROUNDS} rounds")
    print(f"  new allocator, all nodes (cold CEL):        {median_ms(cold):8.2f} ms")
    print(f"  same allocator, all nodes (memoized CEL):   {median_ms(lambda: all_nodes(warm_alloc)):8.2f} ms")
    print(f"  new allocator + shared DeviceMatchCache:    "
          f"{median_ms(lambda: all_nodes(Allocator([CLAIM], allocated, CLASSES, slices, match_cache=shared))):8.2f} ms")
    print(f"  one CEL evaluation (quantity compareTo):    {median_ms(evals):8.2f} us")


if __name__ == "__main__":
    main()
