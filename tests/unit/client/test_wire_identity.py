"""Identities on the local wire: the connection's token, and requests made as a component."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.auth.authorizer import Decision
from kubeplane.auth.user import SYSTEM_MASTERS, UserInfo, acting_as, current_user
from kubeplane.client.wire import WireClient
from kubeplane.client.wireserver import WireServer
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CMS = resource("configmaps")
HOST = UserInfo("system:kubeplane-components", groups=(SYSTEM_MASTERS,))
SCHEDULER = UserInfo("system:kube-scheduler", groups=("system:authenticated",))


@pytest.fixture
async def registry():
    store = MemoryStore(history=1000)
    reg = Registry(store, CATALOGUE)
    await ensure_default_namespaces(reg)
    seen: list[UserInfo] = []
    get = reg.get

    async def recording_get(*args, **kwargs):
        seen.append(current_user())
        return await get(*args, **kwargs)

    reg.get = recording_get  # the user each request is served as
    reg.seen = seen
    yield reg
    await reg.close()
    await store.close()


async def test_a_connection_without_the_token_is_refused(registry, tmp_path):
    srv = WireServer(registry, str(tmp_path / "s"), tokens={"secret": HOST})
    await srv.start()
    try:
        for token in (None, "wrong"):
            c = WireClient(srv.path, token=token)
            with pytest.raises(StatusError) as exc:
                await c.get(resource("namespaces"), "default")
            assert exc.value.code == 401 and exc.value.reason == "Unauthorized"
            await c.close()
        assert registry.seen == []
    finally:
        await srv.stop()


async def test_requests_are_served_as_the_connection_or_the_component_it_names(registry, tmp_path):
    srv = WireServer(registry, str(tmp_path / "s"), tokens={"secret": HOST})
    await srv.start()
    c = WireClient(srv.path, token="secret")
    try:
        await c.get(resource("namespaces"), "default")
        with acting_as(SCHEDULER):
            await c.get(resource("namespaces"), "default")
            w = c.watch(CMS, "default")
            await w.close()
        assert [u.name for u in registry.seen] == ["system:kubeplane-components", "system:kube-scheduler"]
    finally:
        await c.close()
        await srv.stop()


async def test_acting_as_needs_the_impersonate_verb(registry, tmp_path):
    class OnlyUsers:
        def authorize(self, attrs):
            allowed = attrs.verb == "impersonate" and attrs.resource == "users"
            return (Decision.ALLOW if allowed else Decision.NO_OPINION), ""

    srv = WireServer(registry, str(tmp_path / "s"), tokens={"secret": HOST}, authorizer=OnlyUsers())
    await srv.start()
    c = WireClient(srv.path, token="secret")
    try:
        with acting_as(SCHEDULER):  # its group system:authenticated may not be impersonated
            with pytest.raises(StatusError) as exc:
                await c.get(resource("namespaces"), "default")
        assert exc.value.code == 403
        assert exc.value.message == ('groups "system:authenticated" is forbidden: User "system:kubeplane-components" '
                                     'cannot impersonate resource "groups" in API group "" at the cluster scope')
        with acting_as(UserInfo("bob")):
            await c.get(resource("namespaces"), "default")
        assert [u.name for u in registry.seen] == ["bob"]
    finally:
        await c.close()
        await srv.stop()


class _RBACLike:
    """Allows everything to system:masters, and to others only reading namespaces."""

    def authorize(self, attrs):
        if SYSTEM_MASTERS in attrs.user.groups:
            return Decision.ALLOW, ""
        if attrs.verb == "get" and attrs.resource == "namespaces":
            return Decision.ALLOW, ""
        return Decision.NO_OPINION, ""


async def test_without_an_authorizer_impersonation_is_checked_by_the_registrys(tmp_path):
    store = MemoryStore(history=1000)
    reg = Registry(store, CATALOGUE)
    await ensure_default_namespaces(reg)
    reg.authorizer = _RBACLike()
    srv = WireServer(reg, str(tmp_path / "s"), tokens={"secret": UserInfo("carol", groups=("system:authenticated",))})
    await srv.start()
    c = WireClient(srv.path, token="secret")
    try:
        await c.get(resource("namespaces"), "default")  # carol's own rights
        with acting_as(UserInfo("admin", groups=(SYSTEM_MASTERS,))):  # not carol's to claim
            with pytest.raises(StatusError) as exc:
                await c.list(resource("secrets"), "default")
        assert exc.value.code == 403
        assert exc.value.message == ('users "admin" is forbidden: User "carol" cannot impersonate resource "users" '
                                     'in API group "" at the cluster scope')
        with pytest.raises(StatusError) as exc:
            await c.list(resource("secrets"), "default")
        assert exc.value.code == 403 and exc.value.reason == "Forbidden"
    finally:
        await c.close()
        await srv.stop()
        await reg.close()
        await store.close()


async def test_an_impersonated_service_account_is_checked_as_over_http(registry, tmp_path):
    asked = []

    class Recording:
        def authorize(self, attrs):
            asked.append((attrs.verb, attrs.resource, attrs.namespace, attrs.name))
            return Decision.ALLOW, ""

    srv = WireServer(registry, str(tmp_path / "s"), tokens={"secret": HOST}, authorizer=Recording())
    await srv.start()
    c = WireClient(srv.path, token="secret")
    try:
        with acting_as(UserInfo("system:serviceaccount:team:builder", groups=("g1",))):
            await c.get(resource("namespaces"), "default")
        assert asked == [("impersonate", "serviceaccounts", "team", "builder"), ("impersonate", "groups", "", "g1")]
        assert registry.seen[-1].name == "system:serviceaccount:team:builder"
        assert "system:authenticated" in registry.seen[-1].groups  # added, as upstream's filter does
    finally:
        await c.close()
        await srv.stop()
