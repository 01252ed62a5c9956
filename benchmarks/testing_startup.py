"""Start-up time of kubeplane.testing.Cluster, each run in a fresh process.

For every configuration it reports the median over ``--runs`` processes of

- ``start_s``: from ``Cluster(...)`` entry to the ``with`` block being entered
  (the server listening, the components started), imports done on the way
  included, since a fresh process makes them then;
- ``total_s``: the same plus ``import kubeplane.testing``;
- ``warm_start_s``: a second cluster started in the same process, afterwards
  (what each further cluster of a test session costs);

and the minimum and maximum of ``start_s``, and ``start_cpu_s`` and
``total_cpu_s``, the CPU time the process spent over the same spans (less
disturbed than wall time on a busy machine). Python's bytecode cache is used
as an installed package has it: one discarded run first writes it (even
where PYTHONDONTWRITEBYTECODE is set).

Throw-away clusters share a PKI (kubeplane.testing.testing_pki_dir), made by
the first start of all: ``memory_new_pki`` gives every run a new directory,
so that each makes its certificates, as a user's very first start does.

    python benchmarks/testing_startup.py --runs 11
    python benchmarks/testing_startup.py --runs 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CONFIGS = {
    "apiserver_memory": {},
    "apiserver_sqlite": {"storage": "sqlite"},
    "full_3_nodes": {"scheduler": True, "controllers": True, "nodes": 3},
    # every run in a PKI directory of its own: the certificates are made at start
    "memory_new_pki": {},
}
#: configurations whose every run makes its PKI (a first start for its user)
NEW_PKI = {"memory_new_pki"}

CHILD = r"""
import json, sys, time
c0 = time.process_time()
t0 = time.perf_counter()
import kubeplane.testing
t1 = time.perf_counter()
c1 = time.process_time()
opts = json.loads(sys.argv[1])
with kubeplane.testing.Cluster(**opts) as c:
    t2 = time.perf_counter()
    c2 = time.process_time()
t3 = time.perf_counter()
with kubeplane.testing.Cluster(**opts) as c:
    t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "start_s": t2 - t1, "total_s": t2 - t0, "warm_start_s": t4 - t3,
                  "start_cpu_s": c2 - c1, "total_cpu_s": c2 - c0}))
"""


def one_run(opts: dict, env: dict, new_pki: bool = False) -> dict:
    if new_pki:
        import tempfile

        from kubeplane.testing._cluster import PKI_DIR_ENV

        env = {**env, PKI_DIR_ENV: tempfile.mkdtemp(prefix="kubeplane-bench-pki-")}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(opts)], env=env, capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"run failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=11, help="fresh processes per configuration (default 11)")
    ap.add_argument("--config", choices=sorted(CONFIGS), action="append", help="only these configurations")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    results: dict[str, dict] = {}
    for name in args.config or list(CONFIGS):
        opts = CONFIGS[name]
        one_run(opts, env)  # writes the bytecode cache (and the shared testing PKI); not counted
        runs = [one_run(opts, env, name in NEW_PKI) for _ in range(args.runs)]
        starts = [r["start_s"] for r in runs]
        results[name] = {
            "options": opts,
            "runs": args.runs,
            "start_s": round(statistics.median(starts), 4),
            "start_min_s": round(min(starts), 4),
            "start_max_s": round(max(starts), 4),
            "import_s": round(statistics.median(r["import_s"] for r in runs), 4),
            "total_s": round(statistics.median(r["total_s"] for r in runs), 4),
            "warm_start_s": round(statistics.median(r["warm_start_s"] for r in runs), 4),
            "start_cpu_s": round(statistics.median(r["start_cpu_s"] for r in runs), 4),
            "total_cpu_s": round(statistics.median(r["total_cpu_s"] for r in runs), 4),
        }
        if not args.json:
            r = results[name]
            print(f"{name:18} start {r['start_s']:.3f}s (min {r['start_min_s']:.3f}, max {r['start_max_s']:.3f})"
                  f"  import {r['import_s']:.3f}s  total {r['total_s']:.3f}s  warm start {r['warm_start_s']:.3f}s"
                  f"  cpu: start {r['start_cpu_s']:.3f}s total {r['total_cpu_s']:.3f}s  [median of {args.runs}]",
                  flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
