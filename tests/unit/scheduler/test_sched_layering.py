"""The scheduler framework imports no plugin (plugins build on the framework,
``plugins.registry`` hands the in-tree plugins to it), and no module of the
scheduler hides an import cycle in a function body."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kubeplane.scheduler

SCHEDULER = Path(kubeplane.scheduler.__file__).parent
FRAMEWORK = SCHEDULER / "framework"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level) for every import of ``path`` (``if TYPE_CHECKING:``
    blocks at module level count as module level: they never run)."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    for n in tree.body:
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING":
            top.update(id(c) for c in n.body)
    out: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, id(node) in top) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, id(node) in top))
    return out


def test_no_framework_module_imports_a_plugin() -> None:
    bad = [(p.name, m) for p in FRAMEWORK.glob("*.py") for m, _ in _imports(p)
           if m == "kubeplane.scheduler.plugins" or m.startswith("kubeplane.scheduler.plugins.")]
    assert bad == []


def test_importing_the_framework_loads_no_plugin() -> None:
    modules = sorted(f"kubeplane.scheduler.framework.{p.stem}" for p in FRAMEWORK.glob("*.py") if p.stem != "__init__")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m.startswith('kubeplane.scheduler.plugins')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_function_level_imports_of_the_scheduler_in_framework_plugins_or_preemption() -> None:
    """Function-level imports of kubeplane.scheduler modules hide cycles (framework/fastpath
    and runtime; preemption and the DefaultPreemption plugin): there are none."""
    files = [*FRAMEWORK.glob("*.py"), *(SCHEDULER / "plugins").glob("*.py"), SCHEDULER / "preemption.py"]
    hidden = [(p.name, m) for p in files for m, top in _imports(p)
              if not top and m.startswith("kubeplane.scheduler")]
    assert hidden == []


def test_preemption_imports_no_plugin() -> None:
    mods = [m for m, _ in _imports(SCHEDULER / "preemption.py")]
    assert not [m for m in mods if m.startswith("kubeplane.scheduler.plugins")]
