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
    python benchmarks/testing_startup.py --runs 11 --against /path/to/other/src

``--against SRC`` compares with another tree (its ``src`` directory, put on
``PYTHONPATH``): each run of this tree is paired with one of that tree,
alternating which goes first, so that both see the same machine (on a
shared one the load moves by the minute); it reports both medians and the
ratio of this tree's to the other's (start, CPU), and the median of the
pairs' ratios.
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


def one_run(opts: dict, env: dict, new_pki: bool = False, src: str | None = None) -> dict:
    if new_pki:
        import tempfile

        from kubeplane.testing._cluster import PKI_DIR_ENV

        env = {**env, PKI_DIR_ENV: tempfile.mkdtemp(prefix="kubeplane-bench-pki-")}
    if src is not None:
        env = {**env, "PYTHONPATH": src}
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
    ap.add_argument("--against", metavar="SRC", help="alternate with the kubeplane of this source directory")
    args = ap.parse_args()
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.against:
        compare(args, env)
        return
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


def compare(args: argparse.Namespace, env: dict) -> None:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trees = {"this": here, "other": os.path.abspath(args.against)}
    results: dict[str, dict] = {}
    for name in args.config or list(CONFIGS):
        opts = CONFIGS[name]
        for src in trees.values():
            one_run(opts, env, src=src)  # the bytecode caches, not counted
        runs: dict[str, list[dict]] = {t: [] for t in trees}
        for i in range(args.runs):
            for t in (("this", "other") if i % 2 else ("other", "this")):
                runs[t].append(one_run(opts, env, name in NEW_PKI, src=trees[t]))
        med = {t: {k: statistics.median(r[k] for r in rs) for k in ("start_s", "start_cpu_s", "warm_start_s")}
               for t, rs in runs.items()}
        pairs = statistics.median(a["start_s"] / b["start_s"] for a, b in zip(runs["this"], runs["other"]))
        results[name] = {
            "options": opts, "runs": args.runs,
            **{f"{t}_{k}": round(v, 4) for t, m in med.items() for k, v in m.items()},
            "start_ratio": round(med["this"]["start_s"] / med["other"]["start_s"], 3),
            "start_cpu_ratio": round(med["this"]["start_cpu_s"] / med["other"]["start_cpu_s"], 3),
            "paired_start_ratio": round(pairs, 3),
        }
        if not args.json:
            r = results[name]
            print(f"{name:18} this: start {r['this_start_s']:.3f}s cpu {r['this_start_cpu_s']:.3f}s"
                  f" warm {r['this_warm_start_s']:.3f}s | other: start {r['other_start_s']:.3f}s"
                  f" cpu {r['other_start_cpu_s']:.3f}s warm {r['other_warm_start_s']:.3f}s | ratio start"
                  f" {r['start_ratio']:.3f} cpu {r['start_cpu_ratio']:.3f} paired {r['paired_start_ratio']:.3f}"
                  f"  [median of {args.runs} each]", flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
