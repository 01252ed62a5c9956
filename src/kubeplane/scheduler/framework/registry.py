"""Plugin registry: plugin name -> plugin class, with the registry's default MultiPoint list.

The framework knows no plugin: the in-tree registry (every built-in plugin
and upstream's default profile) is built by
:mod:`kubeplane.scheduler.plugins.registry` and handed to the framework
runtime, as upstream's ``plugins/registry.go`` does. Out-of-tree plugins are
added to a copy of it (``register`` / ``merge``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from kubeplane.scheduler.framework.plugin import Plugin


class Registry(dict[str, type[Plugin]]):
    """Plugin name -> class, and ``default_plugins``: the default MultiPoint
    ``(name, weight)`` list in order (weight 0 for plugins that do not score)."""

    def __init__(self, plugins: Iterable[type[Plugin]] = (), default_plugins: Iterable[tuple[str, int]] = ()) -> None:
        super().__init__()
        self.default_plugins: list[tuple[str, int]] = list(default_plugins)
        for cls in plugins:
            self.register(cls)

    def register(self, cls: type[Plugin], name: str | None = None) -> None:
        """Add a plugin; a name already registered is an error, as upstream's ``Registry.Register``."""
        name = name or cls.name
        if name in self:
            raise ValueError(f"a plugin named {name} already exists")
        self[name] = cls

    def merge(self, other: Mapping[str, type[Plugin]]) -> None:
        """Add every plugin of ``other`` (``Registry.Merge``)."""
        for name, cls in other.items():
            self.register(cls, name)

    def copy(self) -> "Registry":
        out = Registry(default_plugins=self.default_plugins)
        out.update(self)
        return out


def default_multi_point(registry: Mapping[str, type[Plugin]]) -> list[dict]:
    """The default MultiPoint ``enabled`` list of ``registry`` (a plain mapping has none),
    restricted to the plugins it holds."""
    out: list[dict] = []
    for name, weight in getattr(registry, "default_plugins", ()):
        if name in registry:
            out.append({"name": name, "weight": weight} if weight else {"name": name})
    return out
