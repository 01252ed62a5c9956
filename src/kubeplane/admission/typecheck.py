"""Type checking of a ValidatingAdmissionPolicy against the kinds it matches,
for ``status.typeChecking.expressionWarnings`` (upstream's type checker).

Upstream compiles each expression once more with ``object`` and
``oldObject`` typed by the OpenAPI schema of every kind the policy's
resourceRules name, and reports the type errors as warnings. Here the
expressions are checked against the same schemas (the API server's OpenAPI
components) for what matters most in practice: every field an expression
reads from ``object``/``oldObject`` through a chain of selections must exist
in the schema. Rules with wildcards are skipped, as upstream skips them.
"""

from __future__ import annotations

import asyncio
import logging
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import orjson

from kubeplane.admission import ast
from kubeplane.api.resources import Catalogue, ResourceInfo

if TYPE_CHECKING:
    from kubeplane.admission.policy import CompiledPolicy

log = logging.getLogger("kubeplane.admission.typecheck")

#: upstream's limit of kinds type-checked per policy
MAX_KINDS = 10


@lru_cache(maxsize=1)
def _schemas() -> dict[str, Any]:
    # package data of the API server's OpenAPI documents (data only: no code of that layer)
    from importlib import resources as importlib_resources

    raw = importlib_resources.files("kubeplane.apiserver").joinpath("schemas/components.json").read_bytes()
    return orjson.loads(raw)["schemas"]


@lru_cache(maxsize=1)
def _by_gvk() -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for name, schema in _schemas().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or ():
            out.setdefault((gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", "")), name)
    return out


def _resolve(schema: dict | None) -> dict | None:
    seen = 0
    while isinstance(schema, dict) and seen < 16:
        ref = schema.get("$ref")
        if ref is None and len(schema.get("allOf") or ()) == 1:
            ref = schema["allOf"][0].get("$ref")
        if ref is None:
            return schema
        schema = _schemas().get(ref.rsplit("/", 1)[-1])
        seen += 1
    return schema if isinstance(schema, dict) else None


def _kinds(cp: "CompiledPolicy", catalogue: Catalogue) -> list[ResourceInfo]:
    out: list[ResourceInfo] = []
    mc = cp.match_constraints if isinstance(cp.match_constraints, dict) else {}
    for rule in mc.get("resourceRules") or []:
        if not isinstance(rule, dict):
            continue
        groups, versions, plurals = (rule.get(k) or [] for k in ("apiGroups", "apiVersions", "resources"))
        if "*" in groups or "*" in versions:
            continue
        for g in groups:
            for v in versions:
                for p in plurals:
                    if "*" in p or "/" in p:
                        continue
                    res = catalogue.by_gvr(g, v, p)
                    if res is not None and res not in out:
                        out.append(res)
    return out[:MAX_KINDS]


def _chains(tree: ast.Tree) -> list[tuple[ast.Node, list[str], ast.Node]]:
    """(root ident, field names, last select node) of every maximal select
    chain rooted at ``object`` or ``oldObject``."""
    out = []
    inner: set[int] = set()
    for n in ast.walk(tree.root):
        if n[0] != "select" or id(n) in inner:
            continue
        names, cur = [], n
        while cur[0] == "select":
            inner.add(id(cur))
            names.append(cur[2])
            cur = cur[1]
        if cur[0] == "ident" and cur[1] in ("object", "oldObject"):
            out.append((cur, names[::-1], n))
    return out


def _missing(schema: dict, names: list[str]) -> int | None:
    """The index of the first name the schema lacks, or None."""
    s = _resolve(schema)
    for i, name in enumerate(names):
        if s is None or s.get("x-kubernetes-preserve-unknown-fields") or s.get("type") not in (None, "object"):
            return None
        props = s.get("properties")
        if props is None or s.get("additionalProperties") is not None:
            return None
        if name not in props:
            return i
        s = _resolve(props[name])
    return None


def check_policy(cp: "CompiledPolicy", catalogue: Catalogue) -> list[dict[str, str]]:
    if cp.error:
        return []
    kinds = _kinds(cp, catalogue)
    if not kinds:
        return []
    exprs: list[tuple[str, Any]] = []
    for v in cp.validations:
        exprs.append((f"spec.validations[{v.index}].expression", v.expression))
        if v.message_expression is not None:
            exprs.append((f"spec.validations[{v.index}].messageExpression", v.message_expression))
    for i, (_, compiled) in enumerate(cp.audit_annotations):
        exprs.append((f"spec.auditAnnotations[{i}].valueExpression", compiled))
    warnings: list[dict[str, str]] = []
    for ref, compiled in exprs:
        texts = []
        for res in kinds:
            schema_name = _by_gvk().get((res.group, res.version, res.kind))
            if schema_name is None:
                continue
            schema = _schemas().get(schema_name)
            for _root, names, last in _chains(compiled.tree):
                at = _missing(schema, names)
                if at is None:
                    continue
                # the position of the select of the missing field
                node = last
                for _ in range(len(names) - 1 - at):
                    node = node[1]
                line, col = compiled.tree.location(node)
                src = compiled.expression.split("\n")[line - 1] if compiled.expression else ""
                gv = res.api_version
                texts.append(f"{gv}, Kind={res.kind}: ERROR: <input>:{line}:{col}: undefined field "
                             f"'{names[at]}'\n | {src}\n | {'.' * (col - 1)}^")
                break
        if texts:
            warnings.append({"fieldRef": ref, "warning": "\n".join(texts)})
    return warnings


class PolicyStatusController:
    """Writes each ValidatingAdmissionPolicy's ``status.observedGeneration``
    and ``status.typeChecking`` once per generation (upstream's type checking
    controller, which runs in the API server). Follows the policies through a
    store watch; ``registry`` is the API server's registry."""

    def __init__(self, registry: Any, *, retry_seconds: float = 1.0) -> None:
        self.registry = registry
        self.retry_seconds = retry_seconds
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        from kubeplane.admission.policy import POLICIES
        from kubeplane.storage.interface import CompactedError

        store = self.registry.store
        prefix = POLICIES.storage_prefix()
        while True:
            try:
                result = await store.list(prefix)
                for kv in result.items:
                    await self.check(kv.value)
                watch = store.watch(prefix, result.revision)
                try:
                    while True:
                        batch = await watch.next_batch()
                        if batch is None:
                            break
                        for ev in batch:
                            if ev.type != "DELETED":
                                await self.check(ev.value)
                finally:
                    watch.close()
            except CompactedError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep checking; the next pass retries
                log.exception("type checking the validating admission policies failed")
                await asyncio.sleep(self.retry_seconds)

    async def check(self, policy: dict) -> None:
        """Type-checks one policy and writes its status, unless its generation is checked already."""
        from kubeplane.admission.policy import POLICIES, compile_policy
        from kubeplane.api.errors import StatusError

        md = policy.get("metadata") or {}
        status = policy.get("status") if isinstance(policy.get("status"), dict) else {}
        generation = md.get("generation")
        if status.get("observedGeneration") == generation:
            return
        warnings = check_policy(compile_policy(policy), self.registry.catalogue)
        patch = {"status": {
            "observedGeneration": generation, "typeChecking": {"expressionWarnings": warnings} if warnings else {}}}
        try:
            await self.registry.patch(POLICIES, md.get("name", ""), patch, subresource="status",
                                      field_manager="kubeplane-apiserver")
        except StatusError as err:
            if err.code not in (404, 409):  # gone or replaced meanwhile: its own events follow
                raise
