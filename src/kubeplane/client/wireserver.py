"""Serves the registry on the local wire (see :mod:`kubeplane.client.wire`).

It lives with the clients rather than in the HTTP front end because it serves
the Client protocol itself: every request is the in-process client's call
(without its copies), so the two cannot drift apart. A request starts at
once, in the frame's callback; one that has to wait continues as a task, so
one slow request never holds up the others on the connection (most requests
to an in-memory registry never wait and cost no task). Code on a request's
path therefore must not need a current task before its first wait. Watch
bursts are encoded once per frame and sent with flow control. Any error,
including a malformed frame, becomes a Status or closes that one
connection: the server itself never stops on input.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from kubeplane.api import errors
from kubeplane.api.meta import without_managed_fields
from kubeplane.auth.authorizer import AlwaysAllow, Attributes
from kubeplane.auth.user import current_user
from kubeplane.client.inprocess import InProcessClient, typed_view
from kubeplane.auth.user import SYSTEM_ADMIN, UserInfo, reset_current_user, set_current_user
from kubeplane.client.wire import ACTING_AS, ENDED, EVENTS, FAILED, OK, OMIT_MANAGED_FIELDS, FrameProtocol
from kubeplane.registry.registry import Registry, WatchOptions
from kubeplane.storage.transformer import TransformError

log = logging.getLogger(__name__)

_REQUESTS = ("get", "list", "create", "update", "patch", "delete", "delete_collection")


class _Connection:
    def __init__(self, server: "WireServer") -> None:
        self.server = server
        self.proto = FrameProtocol(self._on_message, self._on_lost)
        self.tasks: dict[int, asyncio.Task] = {}
        self.watches: dict[int, asyncio.Task] = {}
        #: who the connection is: without tokens on the server, the process's
        #: own user (the socket is private to it); with them, set by the first frame
        self.user: UserInfo | None = None if server.tokens is not None else SYSTEM_ADMIN
        self._as_cache: dict[tuple, UserInfo] = {}

    def _on_message(self, message: Any) -> None:
        try:
            rid, op, group, version, plural, args = message
            if not isinstance(rid, int) or not isinstance(args, dict):
                raise ValueError
        except (TypeError, ValueError):
            self.proto._protocol_error("malformed request frame")
            return
        if op == "authenticate":
            self._authenticate(rid, args)
            return
        if self.user is None:
            self._send([rid, FAILED, errors.unauthorized().to_status()])
            self.proto.flush()
            if self.proto.transport is not None:
                self.proto.transport.close()
            return
        try:
            user = self._acting_as(args.pop(ACTING_AS, None))
        except errors.StatusError as err:
            if op == "watch":
                self._send([rid, EVENTS, [["ERROR", err.to_status()]]])
                self._send([rid, ENDED, None])
            elif op != "cancel":
                self._send([rid, FAILED, err.to_status()])
            return
        token = set_current_user(user)
        try:
            self._dispatch(rid, op, group, version, plural, args)
        finally:
            reset_current_user(token)

    def _authenticate(self, rid: int, args: dict) -> None:
        tokens = self.server.tokens or {}
        user = tokens.get(args.get("token")) if isinstance(args.get("token"), str) else None
        if user is None:
            self._send([rid, FAILED, errors.unauthorized().to_status()])
            self.proto.flush()
            if self.proto.transport is not None:
                self.proto.transport.close()
            return
        self.user = user
        self._send([rid, OK, user.to_api()])

    def _acting_as(self, value: Any) -> UserInfo:
        """The connection's user, or the user a request names if the
        connection's user may impersonate it (upstream's impersonation)."""
        assert self.user is not None
        if value is None:
            return self.user
        try:
            key = (value[0], tuple(value[1]))
        except (TypeError, IndexError, KeyError):
            key = None
        if key is not None and key in self._as_cache:
            return self._as_cache[key]
        user = self._check_acting_as(value)
        if key is not None and len(self._as_cache) < 1024:
            self._as_cache[key] = user
        return user

    def _check_acting_as(self, value: Any) -> UserInfo:
        assert self.user is not None
        try:
            name, groups = value
            if not isinstance(name, str) or not name or not all(isinstance(g, str) for g in groups):
                raise ValueError
        except (TypeError, ValueError):
            raise errors.bad_request(f"malformed {ACTING_AS!r} argument") from None
        from kubeplane.apiserver.authn import impersonated_user

        return impersonated_user(self.user, self.server.impersonation_authorizer(), name, list(groups))

    def _dispatch(self, rid: int, op: Any, group: Any, version: Any, plural: Any, args: dict) -> None:
        if op == "cancel":
            task = self.watches.pop(rid, None)
            if task is not None:
                task.cancel()
            return
        loop = asyncio.get_running_loop()
        if op == "watch":
            old = self.watches.pop(rid, None)
            if old is not None:  # a reused id: the old watch ends
                old.cancel()
            self.watches[rid] = loop.create_task(self._watch(rid, group, version, plural, args))
            return
        coro = self._request(rid, op, group, version, plural, args)
        try:
            pending = coro.send(None)
        except StopIteration:
            return  # answered without waiting
        self.tasks[rid] = loop.create_task(_finish(coro, pending))

    def _on_lost(self, exc: Exception | None) -> None:
        for task in list(self.tasks.values()) + list(self.watches.values()):
            task.cancel()
        self.server._connections.discard(self)

    def _send(self, message: Any) -> None:
        if not self.proto.closed:
            try:
                self.proto.send(message)
            except errors.StatusError as err:  # result too large to frame
                self.proto.send([message[0], FAILED, err.to_status()])
            except (TypeError, ValueError) as err:  # not encodable
                log.exception("wire reply could not be encoded")
                self.proto.send([message[0], FAILED, errors.internal(f"cannot encode the reply: {err}").to_status()])

    def _resource(self, group: Any, version: Any, plural: Any) -> Any:
        res = self.server.registry.catalogue.by_gvr(group, version, plural)
        if res is None:
            raise errors.not_found("resource", f"{plural}.{version}.{group}" if group else f"{plural}.{version}")
        return res

    async def _request(self, rid: int, op: str, group: Any, version: Any, plural: Any, args: dict) -> None:
        try:
            if op == "discovery":
                self._send([rid, OK, self.server.discovery()])
                return
            if op not in _REQUESTS:
                raise errors.bad_request(f"unknown operation {op!r}")
            res = self._resource(group, version, plural)
            self.server.authorize(op, res, args)
            omit = args.pop(OMIT_MANAGED_FIELDS, False)
            try:
                result = await getattr(self.server.client, op)(res, **args)
            except TypeError as err:
                raise errors.bad_request(f"bad arguments for {op}: {err}") from None
            if omit and isinstance(result, dict):
                items = result.get("items")
                if isinstance(items, list):
                    result = {**result, "items": [without_managed_fields(o) for o in items]}
                else:
                    result = without_managed_fields(result)
            reply = [rid, OK, result]
        except errors.StatusError as err:
            reply = [rid, FAILED, err.to_status()]
        except TransformError as err:  # a stored value that cannot be decrypted, as over HTTP
            reply = [rid, FAILED, errors.internal(f"Internal error occurred: {err}").to_status()]
        except asyncio.CancelledError:
            return
        except Exception as err:  # noqa: BLE001 - the server must survive any input
            log.exception("wire request %s failed", op)
            reply = [rid, FAILED, errors.internal(str(err)).to_status()]
        finally:
            self.tasks.pop(rid, None)
        self._send(reply)

    async def _watch(self, wid: int, group: Any, version: Any, plural: Any, args: dict) -> None:
        batches = None
        try:
            res = self._resource(group, version, plural)
            self.server.authorize("watch", res, args)
            send_initial = bool(args.get("send_initial_events"))
            timeout = args.get("timeout_seconds")
            opts = WatchOptions(
                resource_version=args.get("resource_version") or "",
                resource_version_match="NotOlderThan" if send_initial else "",
                label_selector=args.get("label_selector") or "",
                field_selector=args.get("field_selector") or "",
                allow_bookmarks=bool(args.get("allow_bookmarks", True)),
                send_initial_events=True if send_initial else None,
                timeout_seconds=float(timeout) if timeout else None,
            )
            batches = self.server.registry.watch_batches(res, args.get("namespace"), opts)
            view = _view_without_managed if args.get(OMIT_MANAGED_FIELDS) else typed_view
            async for batch in batches:
                self._send([wid, EVENTS, [[t, o if t == "ERROR" else view(res, o)] for t, o in batch]])
                await self.proto.drain()
                if any(t == "ERROR" for t, _ in batch):
                    break
        except errors.StatusError as err:
            self._send([wid, EVENTS, [["ERROR", err.to_status()]]])
        except (asyncio.CancelledError, ConnectionError):
            return
        except Exception as err:  # noqa: BLE001
            log.exception("wire watch failed")
            self._send([wid, EVENTS, [["ERROR", errors.internal(str(err)).to_status()]]])
        finally:
            if batches is not None:
                await batches.aclose()
            if self.watches.pop(wid, None) is not None:
                self._send([wid, ENDED, None])


def _name_of(args: dict) -> str:
    name = args.get("name")
    if isinstance(name, str):
        return name
    obj = args.get("obj")
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return md.get("name", "") if isinstance(md, dict) and isinstance(md.get("name"), str) else ""


def wire_attributes(user: Any, op: str, res: Any, args: dict) -> Attributes:
    """The authorizer attributes of a wire request (upstream's request info for the REST call it stands for)."""
    sub = args.get("subresource") if isinstance(args.get("subresource"), str) else ""
    namespace = args.get("namespace") if isinstance(args.get("namespace"), str) else ""
    if not namespace and res.namespaced and op in ("create", "update"):
        obj = args.get("obj")
        md = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(md, dict) and isinstance(md.get("namespace"), str):
            namespace = md["namespace"]
    name = ""
    selector = ""
    verb = "deletecollection" if op == "delete_collection" else op
    if op in ("get", "update", "patch", "delete"):
        name = _name_of(args)
    elif op == "create" and sub:
        name = _name_of(args)  # pods/binding names its pod
    elif op in ("list", "watch", "delete_collection"):
        from kubeplane.auth.requestinfo import _name_from_field_selector

        given = args.get("field_selector")
        selector = given if isinstance(given, str) else ""
        name = _name_from_field_selector(selector) if selector else ""
    if not res.namespaced:
        namespace = ""
    return Attributes(user, verb, True, namespace, res.group, res.version, res.plural, sub, name,
                      field_selector=selector)


def _view_without_managed(res: Any, obj: Any) -> Any:
    return without_managed_fields(typed_view(res, obj))


async def _finish(coro: Any, pending: Any) -> Any:
    """Run ``coro``, started outside a task and now waiting on ``pending``, to its end."""
    return await _Started(coro, pending)


class _Started:
    """Awaitable continuing a started coroutine: what it waits on goes up to the
    task, and the task's wake-ups (values and exceptions, cancellation
    included) go down to the coroutine."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Any, pending: Any) -> None:
        self.coro = coro
        self.pending = pending

    def __await__(self) -> Any:
        coro, pending = self.coro, self.pending
        while True:
            try:
                sent = yield pending
            except BaseException as exc:  # noqa: BLE001 - passed on, cancellation included
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class WireServer:
    """Listens on a Unix socket (created with mode 0600) and serves ``registry``."""

    def __init__(self, registry: Registry, path: str, *, tokens: dict[str, UserInfo] | None = None,
                 authorizer: Any = None) -> None:
        """``tokens``: the connections must authenticate with one of these
        (see :mod:`kubeplane.client.wire`); ``authorizer``: decides whether a
        connection's user may act as the user a request names (default: the
        registry's authorizer, the one every request is put to)."""
        self.registry = registry
        self.path = path
        self.tokens = tokens
        self.authorizer = authorizer
        self.client = InProcessClient(registry, copies=False)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()

    def impersonation_authorizer(self) -> Any:
        """Who decides the ``impersonate`` verb: the given authorizer, else the
        registry's (read at each check, as the registry's may be set after)."""
        return self.authorizer if self.authorizer is not None else self.registry.authorizer

    def authorize(self, op: str, res: Any, args: dict) -> None:
        """Puts a request to the registry's authorizer, as the HTTP front end
        does (the attributes a REST request for the same call would have);
        raises the same 403 when it is not allowed."""
        authorizer = self.registry.authorizer
        if isinstance(authorizer, AlwaysAllow):
            return
        from kubeplane.apiserver.authorization import check

        check(authorizer, wire_attributes(current_user(), op, res, args))

    def discovery(self) -> dict[str, Any]:
        """The answer to a ``discovery`` request: the aggregated discovery
        documents of ``/api`` and ``/apis``, authorized as those two GETs
        (non-resource URLs, as over HTTP)."""
        from kubeplane.apiserver import discovery

        authorizer = self.registry.authorizer
        if not isinstance(authorizer, AlwaysAllow):
            from kubeplane.apiserver.authorization import check

            for path in ("/api", "/apis"):
                check(authorizer, Attributes(current_user(), "get", False, path=path))
        catalogue = self.registry.catalogue
        return {"api": discovery.aggregated(catalogue, True), "apis": discovery.aggregated(catalogue, False)}

    async def start(self) -> None:
        """Listen. A stale socket file is replaced; a live one (another server
        answering on it) is an error."""
        if os.path.exists(self.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except OSError:
                os.unlink(self.path)
            else:
                raise OSError(f"another server is listening on {self.path}")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            # Private before anyone can connect (listening starts below).
            os.chmod(self.path, 0o600)
        except OSError:
            sock.close()
            raise
        self._server = await asyncio.get_running_loop().create_unix_server(self._accept, sock=sock)

    def _accept(self) -> FrameProtocol:
        conn = _Connection(self)
        self._connections.add(conn)
        return conn.proto

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self._connections):
                if conn.proto.transport is not None:
                    conn.proto.flush()
                    conn.proto.transport.close()
            await self._server.wait_closed()
            self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
