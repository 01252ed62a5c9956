"""The authentication and impersonation filters of build_app, and the review endpoints."""

from __future__ import annotations

from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.auth.authenticator import RequestAuthenticator, TokenFileAuthenticator
from kubeplane.auth.authorizer import Decision
from kubeplane.auth.user import UserInfo
from kubeplane.registry.registry import Registry
from kubeplane.storage import MemoryStore

SSR = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
BODY = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


class Recorder:
    """Allows impersonating anything but the group "forbidden"; records what it was asked."""

    def __init__(self) -> None:
        self.asked = []

    def authorize(self, attrs):
        self.asked.append((attrs.user.name, attrs.verb, attrs.api_group, attrs.resource, attrs.subresource,
                           attrs.namespace, attrs.name))
        if attrs.resource == "groups" and attrs.name == "forbidden":
            return Decision.NO_OPINION, ""
        return Decision.ALLOW, ""


@pytest.fixture
async def env() -> AsyncIterator[tuple[aiohttp.ClientSession, str, Recorder]]:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    authn = RequestAuthenticator(None, [TokenFileAuthenticator({"tok": UserInfo("alice", "u1", ("devs",))})])
    rec = Recorder()
    server = TestServer(build_app(registry, CATALOGUE, authenticator=authn, authorizer=rec), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer tok"}) as session:
        yield session, str(server.make_url("")).rstrip("/"), rec
    await server.close()
    await registry.close()
    await store.close()


async def whoami(env, headers=None) -> tuple[int, dict]:
    session, base, _ = env
    async with session.post(base + SSR, json=BODY, headers=headers or {}) as r:
        return r.status, await r.json()


async def test_the_request_user_is_the_authenticated_one(env):
    code, body = await whoami(env)
    assert code == 201
    assert body["status"]["userInfo"] == {"username": "alice", "uid": "u1", "groups": ["devs", "system:authenticated"]}
    session, base, _ = env
    async with session.get(base + "/api/v1/namespaces", headers={"Authorization": "Bearer other"}) as r:
        assert r.status == 401 and (await r.json())["reason"] == "Unauthorized"
    # create-only: no list
    async with session.get(base + SSR) as r:
        assert r.status == 405


async def test_impersonation_checks_each_value(env):
    code, body = await whoami(env, {"Impersonate-User": "bob", "Impersonate-Group": "qa",
                                    "Impersonate-Uid": "u-bob", "Impersonate-Extra-Scopes%2Fx": "view"})
    assert code == 201
    assert body["status"]["userInfo"] == {"username": "bob", "uid": "u-bob", "groups": ["qa", "system:authenticated"],
                                          "extra": {"scopes/x": ["view"]}}
    asked = env[2].asked
    assert ("alice", "impersonate", "", "users", "", "", "bob") in asked
    assert ("alice", "impersonate", "", "groups", "", "", "qa") in asked
    assert ("alice", "impersonate", "authentication.k8s.io", "uids", "", "", "u-bob") in asked
    assert ("alice", "impersonate", "authentication.k8s.io", "userextras", "scopes/x", "", "view") in asked


async def test_impersonating_a_service_account_checks_serviceaccounts(env):
    code, body = await whoami(env, {"Impersonate-User": "system:serviceaccount:team:robot"})
    assert code == 201
    assert body["status"]["userInfo"]["groups"] == ["system:serviceaccounts", "system:serviceaccounts:team",
                                                    "system:authenticated"]
    assert ("alice", "impersonate", "", "serviceaccounts", "", "team", "robot") in env[2].asked


async def test_refused_impersonation_is_forbidden_as_upstream(env):
    code, body = await whoami(env, {"Impersonate-User": "bob", "Impersonate-Group": "forbidden"})
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('groups "forbidden" is forbidden: User "alice" cannot impersonate resource "groups" '
                               'in API group "" at the cluster scope')
    assert body["details"] == {"name": "forbidden", "kind": "groups"}


async def test_groups_without_a_user_is_an_error(env):
    code, body = await whoami(env, {"Impersonate-Group": "qa"})
    assert code == 500
    assert "requested [Impersonate-Group=qa] without impersonating a user" in body["message"]


async def test_token_review_answers_without_storing(env):
    session, base, _ = env
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "tok"}}
    async with session.post(base + "/apis/authentication.k8s.io/v1/tokenreviews", json=review) as r:
        assert r.status == 201
        status = (await r.json())["status"]
    assert status["authenticated"] is True and status["user"]["username"] == "alice"
    review["spec"]["token"] = "nope"
    async with session.post(base + "/apis/authentication.k8s.io/v1/tokenreviews", json=review) as r:
        status = (await r.json())["status"]
    assert status["authenticated"] is False and status["error"]
