"""Run the whole test suite as a few pytest processes side by side.

    python scripts/test_suite.py [PYTEST OPTIONS]

The suite is split into groups of about equal length (the unit tests with the
OpenAPI fuzzing, the rest of the integration tests, the node tests that run
real containers); each group is one pytest process and they run at the same
time, each writing its own output, which is printed whole when the group ends.
Pytest arguments that name tests (paths or node ids) run one pytest instead.
A group that collects no test fails the run, as does any failed group. The last
line adds up the groups' results.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

GROUPS = {
    "unit+fuzz": ["tests/unit", "tests/integration/test_openapi_fuzz.py"],
    "integration": ["tests/integration", "--ignore=tests/integration/test_openapi_fuzz.py",
                    "--ignore=tests/integration/node"],
    "node": ["tests/integration/node"],
}
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")


def _names_tests(args: list[str]) -> bool:
    return any(not a.startswith("-") and os.path.exists(a.split("::", 1)[0]) for a in args)


def _summary(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        found = COUNT.findall(ln)
        if found and (" in " in ln):
            for n, kind in found:
                kind = "errors" if kind.startswith("error") else kind
                counts[kind] = counts.get(kind, 0) + int(n)
            break
    return counts


def main(argv: list[str]) -> int:
    py = sys.executable
    if _names_tests(argv):
        rc = subprocess.call([py, "-m", "pytest", *argv])
        if rc == 5:
            print("error: pytest collected no tests", file=sys.stderr)
            return 1
        return rc
    procs = []
    for name, paths in GROUPS.items():
        out = tempfile.TemporaryFile(mode="w+", prefix=f"suite-{name}-")
        p = subprocess.Popen([py, "-m", "pytest", *paths, *argv], stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append((name, p, out, time.monotonic()))
    rc = 0
    total: dict[str, int] = {}
    pending = list(procs)
    while pending:
        for item in list(pending):
            name, p, out, started = item
            code = p.poll()
            if code is None:
                continue
            pending.remove(item)
            out.seek(0)
            text = out.read()
            out.close()
            print(f"===== {name}: exit {code} after {time.monotonic() - started:.0f} s =====", flush=True)
            sys.stdout.write(text)
            sys.stdout.flush()
            for k, v in _summary(text).items():
                total[k] = total.get(k, 0) + v
            if code == 5:
                print(f"error: group {name} collected no tests", file=sys.stderr)
                code = 1
            rc = rc or code
        time.sleep(0.2)
    failed = total.get("failed", 0) + total.get("errors", 0)
    line = f"total: {total.get('passed', 0)} passed, {failed} failed"
    if total.get("skipped"):
        line += f", {total['skipped']} skipped"
    print(line)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
