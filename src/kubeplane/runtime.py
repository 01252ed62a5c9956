"""Process-wide runtime settings of the long-running kubeplane commands."""

from __future__ import annotations

import gc

#: allocations between two young-generation collections, and how many
#: collections of a generation make one of the next. CPython's defaults
#: (700, 10, 10) suit small programs; a control plane holds hundreds of
#: thousands of long-lived API objects, and its young collections keep
#: re-examining them. Reference counting still frees everything at once;
#: only reference cycles wait longer.
GC_THRESHOLDS = (50_000, 50, 100)


def configure_gc() -> None:
    """Apply :data:`GC_THRESHOLDS` (idempotent)."""
    gc.set_threshold(*GC_THRESHOLDS)
