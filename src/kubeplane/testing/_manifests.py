"""Reading manifests as ``kubectl apply -f`` does: a YAML (or JSON) string,
a file, or a directory of ``.yaml``/``.yml``/``.json`` files, each holding any
number of documents; ``List`` documents are expanded into their items."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Union

Manifest = Union[str, "os.PathLike[str]", dict, Iterable[dict]]

#: the file names ``kubectl apply -f DIR`` reads
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(ValueError):
    """A manifest that cannot be read or does not describe objects."""


def load_documents(source: Manifest, *, recursive: bool = False) -> list[tuple[dict, str]]:
    """Every object in ``source`` as ``(object, origin)``, in order.

    ``source`` is a path (:class:`os.PathLike`, or a one-line string naming an
    existing file or directory), YAML or JSON text, one object (a dict) or an
    iterable of objects. ``origin`` names where the object came from, for
    error messages."""
    if isinstance(source, dict):
        return [(doc, "<object>") for doc in _expand([source], "<object>")]
    if isinstance(source, os.PathLike):
        return _load_path(Path(source), recursive)
    if isinstance(source, str):
        if "\n" not in source and source.strip() and os.path.exists(source):
            return _load_path(Path(source), recursive)
        return [(doc, "<string>") for doc in _parse(source, "<string>")]
    if isinstance(source, (bytes, bytearray)):
        raise ManifestError("manifests are text: decode the bytes first")
    try:
        items = list(source)
    except TypeError:
        raise ManifestError(f"cannot apply a {type(source).__name__}: give YAML text, a path or objects") from None
    for item in items:
        if not isinstance(item, dict):
            raise ManifestError(f"cannot apply a {type(item).__name__} among objects")
    return [(doc, "<object>") for doc in _expand(items, "<object>")]


def _load_path(path: Path, recursive: bool) -> list[tuple[dict, str]]:
    if path.is_dir():
        files = sorted(p for p in (path.rglob("*") if recursive else path.iterdir())
                       if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
        if not files:
            raise ManifestError(f"error reading {str(path)!r}: no {'/'.join(MANIFEST_SUFFIXES)} files in it")
    elif path.exists():
        files = [path]
    else:
        raise ManifestError(f"the path {str(path)!r} does not exist")
    out: list[tuple[dict, str]] = []
    for f in files:
        origin = str(f)
        out.extend((doc, origin) for doc in _parse(f.read_text(encoding="utf-8"), origin))
    return out


def _parse(text: str, origin: str) -> list[dict]:
    import yaml

    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        docs = [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except yaml.YAMLError as err:
        raise ManifestError(f"error parsing {origin}: {err}") from None
    if len(docs) == 1 and isinstance(docs[0], str) and "\n" not in text.strip():
        raise ManifestError(f"the path {text.strip()!r} does not exist")
    for doc in docs:
        if not isinstance(doc, dict):
            raise ManifestError(f"error parsing {origin}: a document is a {type(doc).__name__}, not an object")
    return _expand(docs, origin)


def _expand(docs: list[dict], origin: str) -> list[dict]:
    """``kind: List`` (and ``<Kind>List``) documents stand for their items."""
    out: list[dict] = []
    for doc in docs:
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            for item in doc["items"]:
                if not isinstance(item, dict):
                    raise ManifestError(f"error parsing {origin}: a List item is not an object")
                out.extend(_expand([item], origin))
            continue
        if not doc.get("apiVersion") or not kind:
            raise ManifestError(f"error validating {origin}: apiVersion and kind must be set in every object")
        out.append(doc)
    return out
