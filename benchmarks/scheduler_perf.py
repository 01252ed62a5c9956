"""scheduler_perf workloads in embedded mode.

    python benchmarks/scheduler_perf.py SchedulingBasic --nodes 500 --pods 1000 --json
    python -m benchmarks.scheduler_perf Unschedulable
"""

from __future__ import annotations

import sys

from kubeplane.bench.scheduler import main

if __name__ == "__main__":
    sys.exit(main())
