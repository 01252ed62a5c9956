"""Test harness (never shipped): ``kubeplane`` whose HTTP front end takes the
request's user from kubectl's ``--as``/``--as-group`` headers, with no check.

It stands in for authentication and impersonation so that RBAC can be driven
with the real kubectl as an ordinary user. The user is set just before the
authorization filter, so with real authentication and impersonation in front
of it the request reaches authorization as the same user.

Run as ``python rbac_as_user_server.py apiserver ...`` (the CLI's arguments).
"""

from __future__ import annotations

import sys

from aiohttp import web

import kubeplane.apiserver.app as app_module
from kubeplane.auth.user import AUTHENTICATED, UserInfo, acting_as
from kubeplane.cli.main import main

_build_app = app_module.build_app


@web.middleware
async def as_user(request: web.Request, handler):
    name = request.headers.get("Impersonate-User")
    if not name:
        return await handler(request)
    groups = tuple(request.headers.getall("Impersonate-Group", ())) + (AUTHENTICATED,)
    with acting_as(UserInfo(name, groups=groups)):
        return await handler(request)


def build_app(*args, **kwargs):
    app = _build_app(*args, **kwargs)
    names = [getattr(m, "__name__", "") for m in app.middlewares]
    app.middlewares.insert(names.index("authorize") if "authorize" in names else len(names) - 1, as_user)
    return app


app_module.build_app = build_app

if __name__ == "__main__":
    sys.argv[0] = "kubeplane"
    main()
