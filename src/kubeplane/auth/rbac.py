"""The RBAC authorizer (upstream's plugin/pkg/auth/authorizer/rbac).

A request is allowed when a rule of a role bound to its user allows it:
ClusterRoleBindings apply everywhere, RoleBindings in their namespace only.
Members of ``system:masters`` are allowed everything before RBAC is asked
(upstream's privileged-group authorizer). Nodes are not special here: the
Node authorizer (:mod:`kubeplane.auth.node`) in front of RBAC decides their
requests, as upstream's ``--authorization-mode=Node,RBAC``.

The policy comes from a :class:`PolicyCache`: the RBAC objects listed once and
kept current by a watch of the store, as an informer keeps its indexer. No
request reads the store. Per user and namespace the applicable rules are
resolved once (cached until the policy changes), and decisions are cached
too, so the cost of authorizing a request is a dictionary lookup in the
common case.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Iterable

from kubeplane.auth.authorizer import Attributes, Decision
from kubeplane.auth.user import SERVICE_ACCOUNT_PREFIX, SYSTEM_MASTERS, UserInfo

log = logging.getLogger("kubeplane.auth.rbac")

GROUP = "rbac.authorization.k8s.io"
PREFIX = f"/registry/{GROUP}/"
Obj = dict[str, Any]

#: upstream's fullAuthority: what an aggregated ClusterRole may come to hold
FULL_AUTHORITY: tuple[Obj, ...] = (
    {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
    {"verbs": ["*"], "nonResourceURLs": ["*"]},
)


def _strs(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, str))


class Rule:
    """A PolicyRule compiled for matching (upstream's rbac/v1 helpers' RuleAllows)."""

    __slots__ = ("raw", "verbs", "groups", "resources", "names", "urls", "url_prefixes",
                 "any_verb", "any_group", "any_resource", "any_url", "sub_wildcards")

    def __init__(self, raw: Obj) -> None:
        self.raw = raw
        self.verbs = frozenset(_strs(raw.get("verbs")))
        self.groups = frozenset(_strs(raw.get("apiGroups")))
        resources = _strs(raw.get("resources"))
        self.resources = frozenset(resources)
        self.names = frozenset(_strs(raw.get("resourceNames")))
        urls = _strs(raw.get("nonResourceURLs"))
        self.urls = frozenset(urls)
        self.url_prefixes = tuple(u.rstrip("*") for u in urls if u.endswith("*"))
        self.any_verb = "*" in self.verbs
        self.any_group = "*" in self.groups
        self.any_resource = "*" in self.resources
        self.any_url = "*" in self.urls
        # "*/scale" matches the scale subresource of every resource
        self.sub_wildcards = frozenset(r[2:] for r in resources if r.startswith("*/") and len(r) > 2)

    def allows(self, attrs: Attributes) -> bool:
        if not (self.any_verb or attrs.verb in self.verbs):
            return False
        if not attrs.resource_request:
            path = attrs.path
            if self.any_url or path in self.urls:
                return True
            return any(path.startswith(p) for p in self.url_prefixes)
        if not (self.any_group or attrs.api_group in self.groups):
            return False
        if not self.any_resource:
            sub = attrs.subresource
            combined = f"{attrs.resource}/{sub}" if sub else attrs.resource
            if combined not in self.resources and not (sub and sub in self.sub_wildcards):
                return False
        return not self.names or attrs.name in self.names


@dataclass(frozen=True, slots=True)
class Grant:
    """One rule a user holds and where it comes from (for review reasons)."""

    rule: Rule
    #: upstream's description of the binding
    source: str | None


def service_account_username(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def _describe_subject(subject: Obj, binding_namespace: str) -> str:
    kind = subject.get("kind", "")
    name = subject.get("name", "")
    if kind == "ServiceAccount":
        return f'{kind} "{name}/{subject.get("namespace") or binding_namespace}"'
    return f'{kind} "{name}"'


class _Binding:
    """A binding reduced to what matching needs."""

    __slots__ = ("name", "namespace", "ref_kind", "ref_name", "users", "groups", "subjects")

    def __init__(self, obj: Obj, namespace: str) -> None:
        md = obj.get("metadata") or {}
        ref = obj.get("roleRef") if isinstance(obj.get("roleRef"), dict) else {}
        self.name = md.get("name", "")
        self.namespace = namespace
        self.ref_kind = ref.get("kind", "")
        self.ref_name = ref.get("name", "")
        #: user name -> the subject naming it; group -> the subject naming it
        self.users: dict[str, Obj] = {}
        self.groups: dict[str, Obj] = {}
        subjects = obj.get("subjects")
        for s in subjects if isinstance(subjects, list) else ():
            if not isinstance(s, dict) or not isinstance(s.get("name"), str):
                continue
            kind = s.get("kind")
            if kind == "User":
                self.users.setdefault(s["name"], s)
            elif kind == "Group":
                self.groups.setdefault(s["name"], s)
            elif kind == "ServiceAccount":
                ns = s.get("namespace") or namespace
                if ns:  # a ServiceAccount named without a namespace in a cluster binding matches no one
                    self.users.setdefault(service_account_username(ns, s["name"]), s)

    def subject_for(self, user: UserInfo) -> Obj | None:
        s = self.users.get(user.name)
        if s is not None:
            return s
        for g in user.groups:
            s = self.groups.get(g)
            if s is not None:
                return s
        return None

    def describe(self, subject: Obj) -> str:
        if self.namespace:
            return (f'RoleBinding "{self.name}/{self.namespace}" of {self.ref_kind} "{self.ref_name}" '
                    f"to {_describe_subject(subject, self.namespace)}")
        return (f'ClusterRoleBinding "{self.name}" of {self.ref_kind} "{self.ref_name}" '
                f"to {_describe_subject(subject, '')}")


def _not_found(kind: str, name: str) -> str:
    return f'{kind}.{GROUP} "{name}" not found'


def aggregate_errors(errs: Iterable[str]) -> str:
    """Upstream's utilerrors.NewAggregate(...).Error(): one message alone, several in brackets."""
    seen: list[str] = []
    for e in errs:
        if e not in seen:
            seen.append(e)
    if len(seen) == 1:
        return seen[0]
    return "[" + ", ".join(seen) + "]"


class PolicyCache:
    """Every Role, ClusterRole, RoleBinding and ClusterRoleBinding, kept
    current by one watch of the store (list, then watch from the list's
    revision; relist when the watch falls behind)."""

    _MAX_RESOLVED = 4096

    def __init__(self, store: Any) -> None:
        self.store = store
        self.cluster_roles: dict[str, Obj] = {}
        self.roles: dict[tuple[str, str], Obj] = {}
        self.cluster_bindings: dict[str, Obj] = {}
        self.bindings: dict[tuple[str, str], Obj] = {}
        #: the store revision this cache reflects
        self.revision = 0
        #: bumped on every change; derived caches compare it
        self.generation = 0
        self._compiled: dict[tuple[str, str, str], tuple[Rule, ...]] = {}
        self._cluster_index: list[_Binding] | None = None
        self._ns_index: dict[str, list[_Binding]] | None = None
        self._resolved: dict[tuple[str, tuple[str, ...], str], tuple[tuple[Grant, ...], tuple[str, ...]]] = {}
        self._task: asyncio.Task | None = None
        self._watch: Any = None
        self._synced = asyncio.Event()
        self._progress: asyncio.Condition | None = None
        #: called (synchronously) after each batch of changes is applied
        self.listeners: list[Any] = []

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._relist()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    async def _relist(self) -> None:
        from kubeplane.storage.interface import CompactedError

        while True:
            result = await self.store.list(PREFIX)
            try:
                watch = self.store.watch(PREFIX, result.revision)
            except CompactedError:
                continue
            break
        if self._watch is not None:
            self._watch.close()
        self._watch = watch
        self.cluster_roles.clear()
        self.roles.clear()
        self.cluster_bindings.clear()
        self.bindings.clear()
        for kv in result.items:
            self._put(kv.key, kv.value)
        self.revision = result.revision
        self._changed()
        self._synced.set()

    async def _run(self) -> None:
        from kubeplane.storage.interface import StorageError

        while True:
            try:
                events = await self._watch.next_batch()
            except StorageError as exc:
                log.info("RBAC policy watch fell behind (%s): relisting", exc)
                events = None
                await self._relist_retrying()
                continue
            if events is None:  # the store is closing
                return
            if not events:
                continue
            for ev in events:
                if ev.type == "DELETED":
                    self._drop(ev.key)
                else:
                    self._put(ev.key, ev.value)
            self.revision = events[-1].revision
            self._changed()

    async def _relist_retrying(self) -> None:
        while True:
            try:
                await self._relist()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the cache alive; try again
                log.warning("relisting the RBAC policy failed: %s", exc)
                await asyncio.sleep(0.5)

    async def wait_for_revision(self, revision: int, timeout: float = 5.0) -> bool:
        """Until the cache reflects ``revision`` (a test's and a writer's sync point)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.revision < revision:
            # Nothing under the prefix may have changed since: then the store's
            # own revision moved on without us and the cache is current.
            if self._watch is not None and hasattr(self._watch, "progress_revision"):
                if self._watch.progress_revision() >= revision:
                    return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    # -- contents ------------------------------------------------------------

    @staticmethod
    def _parse_key(key: str) -> tuple[str, str, str] | None:
        rest = key[len(PREFIX):].split("/")
        if len(rest) == 2:
            return rest[0], "", rest[1]
        if len(rest) == 3:
            return rest[0], rest[1], rest[2]
        return None

    def _put(self, key: str, obj: Obj) -> None:
        parsed = self._parse_key(key)
        if parsed is None:
            return
        plural, ns, name = parsed
        if plural == "clusterroles":
            self.cluster_roles[name] = obj
        elif plural == "roles":
            self.roles[(ns, name)] = obj
        elif plural == "clusterrolebindings":
            self.cluster_bindings[name] = obj
            self._cluster_index = None
        elif plural == "rolebindings":
            self.bindings[(ns, name)] = obj
            self._ns_index = None
        self._compiled.pop((plural, ns, name), None)

    def _drop(self, key: str) -> None:
        parsed = self._parse_key(key)
        if parsed is None:
            return
        plural, ns, name = parsed
        if plural == "clusterroles":
            self.cluster_roles.pop(name, None)
        elif plural == "roles":
            self.roles.pop((ns, name), None)
        elif plural == "clusterrolebindings":
            self.cluster_bindings.pop(name, None)
            self._cluster_index = None
        elif plural == "rolebindings":
            self.bindings.pop((ns, name), None)
            self._ns_index = None
        self._compiled.pop((plural, ns, name), None)

    def _changed(self) -> None:
        self.generation += 1
        self._resolved.clear()
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001 - one listener must not stop the cache
                log.exception("RBAC policy listener failed")

    # -- resolution ----------------------------------------------------------

    def role_rules(self, kind: str, name: str, namespace: str) -> tuple[Rule, ...] | None:
        """The compiled rules of a roleRef (None: the role does not exist)."""
        if kind == "ClusterRole":
            key = ("clusterroles", "", name)
            obj = self.cluster_roles.get(name)
        elif kind == "Role" and namespace:
            key = ("roles", namespace, name)
            obj = self.roles.get((namespace, name))
        else:
            return None
        if obj is None:
            return None
        rules = self._compiled.get(key)
        if rules is None:
            raw = obj.get("rules")
            rules = tuple(Rule(r) for r in raw if isinstance(r, dict)) if isinstance(raw, list) else ()
            self._compiled[key] = rules
        return rules

    def _cluster(self) -> list[_Binding]:
        if self._cluster_index is None:
            self._cluster_index = [_Binding(b, "") for _, b in sorted(self.cluster_bindings.items())]
        return self._cluster_index

    def _namespaced(self, namespace: str) -> list[_Binding]:
        if self._ns_index is None:
            index: dict[str, list[_Binding]] = {}
            for (ns, _name), b in sorted(self.bindings.items()):
                index.setdefault(ns, []).append(_Binding(b, ns))
            self._ns_index = index
        return self._ns_index.get(namespace, [])

    def grants(self, user: UserInfo, namespace: str) -> tuple[tuple[Grant, ...], tuple[str, ...]]:
        """Every rule ``user`` holds in ``namespace`` ("" : cluster-wide only)
        and the errors met resolving them (roles that do not exist), in
        upstream's order: cluster bindings first, then the namespace's."""
        key = (user.name, tuple(user.groups), namespace)
        found = self._resolved.get(key)
        if found is not None:
            return found
        grants: list[Grant] = []
        errs: list[str] = []
        for scope in (self._cluster(), self._namespaced(namespace) if namespace else ()):
            for b in scope:
                subject = b.subject_for(user)
                if subject is None:
                    continue
                rules = self.role_rules(b.ref_kind, b.ref_name, b.namespace)
                if rules is None:
                    errs.append(_not_found(b.ref_kind.lower(), b.ref_name))
                    continue
                source = b.describe(subject)
                grants.extend(Grant(r, source) for r in rules)
        found = (tuple(grants), tuple(errs))
        if len(self._resolved) >= self._MAX_RESOLVED:
            self._resolved.clear()
        self._resolved[key] = found
        return found

    def rules_for(self, user: UserInfo, namespace: str) -> tuple[list[Obj], list[str]]:
        """The raw rules ``user`` holds in ``namespace`` and the resolution errors."""
        grants, errs = self.grants(user, namespace)
        return [g.rule.raw for g in grants], list(errs)


class RBACAuthorizer:
    """``kubeplane.auth.authorizer.Authorizer`` over a :class:`PolicyCache`."""

    _MAX_DECISIONS = 8192

    def __init__(self, cache: PolicyCache) -> None:
        self.cache = cache
        self._decisions: dict[tuple, tuple[Decision, str]] = {}
        self._generation = -1

    @classmethod
    def for_store(cls, store: Any) -> "RBACAuthorizer":
        return cls(PolicyCache(store))

    async def start(self) -> None:
        await self.cache.start()

    async def stop(self) -> None:
        await self.cache.stop()

    def authorize(self, attrs: Attributes) -> tuple[Decision, str]:
        user = attrs.user
        if SYSTEM_MASTERS in user.groups:
            return Decision.ALLOW, ""
        cache = self.cache
        if self._generation != cache.generation:
            self._decisions.clear()
            self._generation = cache.generation
        key = (user.name, user.groups, attrs.verb, attrs.resource_request, attrs.namespace, attrs.api_group,
               attrs.resource, attrs.subresource, attrs.name, attrs.path)
        found = self._decisions.get(key)
        if found is not None:
            return found
        grants, errs = cache.grants(user, attrs.namespace)
        result: tuple[Decision, str] | None = None
        for g in grants:
            if g.rule.allows(attrs):
                result = (Decision.ALLOW, f"RBAC: allowed by {g.source}" if g.source else "")
                break
        if result is None:
            result = (Decision.NO_OPINION, f"RBAC: {aggregate_errors(errs)}" if errs else "")
        if len(self._decisions) >= self._MAX_DECISIONS:
            self._decisions.clear()
        self._decisions[key] = result
        return result

    def decide(self, user: UserInfo, info: Any) -> tuple[Decision, str]:
        """:meth:`authorize` for a request's info (``kubeplane.auth.requestinfo.RequestInfo``),
        answered from a cache of such decisions without building the attributes."""
        if SYSTEM_MASTERS in user.groups:
            return Decision.ALLOW, ""
        if self._generation != self.cache.generation:
            self._decisions.clear()
            self._generation = self.cache.generation
        key = (user.name, user.groups, info)
        found = self._decisions.get(key)
        if found is None:
            from kubeplane.auth.requestinfo import to_attributes

            found = self.authorize(to_attributes(user, info))
            self._decisions[key] = found
        return found

    def rules_for(self, user: UserInfo, namespace: str) -> tuple[list[Obj], list[str]]:
        return self.cache.rules_for(user, namespace)


# -- escalation checks (upstream's registry/rbac/validation) -----------------------


def _has_all(have: Iterable[str], want: Iterable[str]) -> bool:
    have = set(have)
    return all(w in have for w in want)


def _resource_covers_all(owned: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    if "*" in owned or _has_all(owned, wanted):
        return True
    for path in wanted:
        if path in owned:
            continue
        if "/" not in path:
            return False
        if "*/" + path.split("/", 1)[1] not in owned:
            return False
    return True


def _url_covers(owner: str, path: str) -> bool:
    return owner == path or (owner.endswith("*") and path.startswith(owner.rstrip("*")))


def _rule_covers(owner: Obj, sub: Obj) -> bool:
    o_verbs, s_verbs = _strs(owner.get("verbs")), _strs(sub.get("verbs"))
    o_groups, s_groups = _strs(owner.get("apiGroups")), _strs(sub.get("apiGroups"))
    o_names, s_names = _strs(owner.get("resourceNames")), _strs(sub.get("resourceNames"))
    o_urls, s_urls = _strs(owner.get("nonResourceURLs")), _strs(sub.get("nonResourceURLs"))
    if not ("*" in o_verbs or _has_all(o_verbs, s_verbs)):
        return False
    if not ("*" in o_groups or _has_all(o_groups, s_groups)):
        return False
    if not _resource_covers_all(_strs(owner.get("resources")), _strs(sub.get("resources"))):
        return False
    if not all(any(_url_covers(o, u) for o in o_urls) for u in s_urls):
        return False
    if not s_names:
        return not o_names
    return not o_names or _has_all(o_names, s_names)


def breakdown_rule(rule: Obj) -> list[Obj]:
    """One rule per (group, resource, verb[, name]) and per (URL, verb), as upstream's BreakdownRule."""
    out: list[Obj] = []
    verbs = _strs(rule.get("verbs"))
    names = _strs(rule.get("resourceNames"))
    for group in _strs(rule.get("apiGroups")):
        for res in _strs(rule.get("resources")):
            for verb in verbs:
                if names:
                    out.extend({"apiGroups": [group], "resources": [res], "verbs": [verb], "resourceNames": [n]}
                               for n in names)
                else:
                    out.append({"apiGroups": [group], "resources": [res], "verbs": [verb]})
    for url in _strs(rule.get("nonResourceURLs")):
        out.extend({"nonResourceURLs": [url], "verbs": [verb]} for verb in verbs)
    return out


def uncovered(owner_rules: list[Obj], requested: Iterable[Obj]) -> list[Obj]:
    """The parts of ``requested`` no owner rule covers (upstream's Covers)."""
    missing: list[Obj] = []
    for rule in requested:
        if not isinstance(rule, dict):
            continue
        for sub in breakdown_rule(rule):
            if not any(_rule_covers(o, sub) for o in owner_rules):
                missing.append(sub)
    return missing


def _go_quoted_list(values: Iterable[str]) -> str:
    """Go's ``%q`` of a []string: ``["a" "b"]``."""
    import json

    return "[" + " ".join(json.dumps(v, ensure_ascii=False) for v in values) + "]"


def compact_rule(rule: Obj) -> str:
    """Upstream's rbacv1helpers.CompactString."""
    parts = []
    for label, field in (("APIGroups", "apiGroups"), ("Resources", "resources"),
                         ("NonResourceURLs", "nonResourceURLs"), ("ResourceNames", "resourceNames"),
                         ("Verbs", "verbs")):
        values = _strs(rule.get(field))
        if values:
            parts.append(f"{label}:{_go_quoted_list(values)}")
    return "{" + ", ".join(parts) + "}"


def escalation_message(user: UserInfo, missing: list[Obj], errs: list[str]) -> str:
    """Upstream's ConfirmNoEscalation error text."""
    msg = (f"user {_go_string(user.name)} (groups={_go_quoted_list(user.groups)}) is attempting to grant RBAC "
           "permissions not currently held:\n" + "\n".join(compact_rule(r) for r in missing))
    if errs:
        msg += f"; resolution errors: [{' '.join(errs)}]"
    return msg


def _go_string(s: str) -> str:
    import json

    return json.dumps(s, ensure_ascii=False)
