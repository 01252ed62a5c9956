"""README's "Served resources" paragraph names every built-in resource of the
catalogue, with its group and subresources."""

from __future__ import annotations

import re
from pathlib import Path

from kubeplane.api.resources import RESOURCES

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_lists_every_served_resource() -> None:
    text = README.read_text()
    start = text.index("Served resources:")
    paragraph = " ".join(text[start:text.index("A resource is one entry in", start)].split())
    for res in RESOURCES:
        group = res.group or "core"
        assert f"{group}/{res.version}" in paragraph, group
        assert re.search(rf"\b{res.plural}\b", paragraph), res.plural
        for sub in res.subresources:
            assert re.search(rf"\b{sub}\b", paragraph), (res.plural, sub)
