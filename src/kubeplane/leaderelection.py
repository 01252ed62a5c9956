"""Leader election over a coordination.k8s.io/v1 Lease, with client-go's semantics.

A candidate tries to acquire the lease every ``retry_period`` (with jitter).
It may take it when the lease does not exist, is released (empty
``holderIdentity``), is already its own, or has not changed for
``leaseDurationSeconds`` as observed locally: like client-go, expiry is
measured from the time this candidate last saw the record change, not from
the holder's ``renewTime``, so clock skew between replicas does not matter.
Writes use the lease's resourceVersion; a conflict means another candidate
won. The leader renews every ``retry_period``; when renewals keep failing
for ``renew_deadline`` it steps down. On cancellation the leader releases
the lease (``holderIdentity: ""``, ``leaseDurationSeconds: 1``) so another
candidate can take over at once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from datetime import datetime, timezone
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.client.interface import Client, Obj

LEASES = resource("leases")

#: client-go's jitter factor for the acquire loop
JITTER_FACTOR = 1.2

_MICRO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_RECORD_FIELDS = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")

log = logging.getLogger(__name__)

Callback = Callable[..., Any]


def format_micro_time(ts: float) -> str:
    """Seconds since the epoch as a MicroTime string (``2006-01-02T15:04:05.000000Z``)."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime(_MICRO_FORMAT)


def parse_micro_time(text: str) -> float:
    """Parse a MicroTime (or RFC 3339 seconds) string to seconds since the epoch."""
    fmt = _MICRO_FORMAT if "." in text else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()


def _record(lease: Obj) -> dict[str, Any]:
    spec = lease.get("spec") or {}
    return {k: spec.get(k) for k in _RECORD_FIELDS}


class LeaderElector:
    """One candidate in a Lease-based election. Run it with ``await elector.run()``.

    ``on_started_leading()`` is called when the lease is acquired; if it
    returns an awaitable, that runs as a task which is cancelled when
    leadership ends. ``on_stopped_leading()`` is called (and awaited if async)
    once leadership ends, whether lost or released. ``on_new_leader(identity)``
    is called whenever the observed holder changes. ``clock`` returns seconds
    since the epoch and is used for lease times and all expiry decisions.
    """

    def __init__(
        self,
        client: Client,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callback,
        on_stopped_leading: Callback,
        on_new_leader: Callback | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        release_on_cancel: bool = True,
    ) -> None:
        if not identity:
            raise ValueError("leader election requires a non-empty identity")
        if lease_duration <= renew_deadline:
            raise ValueError("leaseDuration must be greater than renewDeadline")
        if renew_deadline <= JITTER_FACTOR * retry_period:
            raise ValueError("renewDeadline must be greater than retryPeriod*JitterFactor")
        if retry_period <= 0:
            raise ValueError("retryPeriod must be greater than zero")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self.clock = clock
        self.rng = rng or random.Random()
        self.release_on_cancel = release_on_cancel
        self._observed: dict[str, Any] | None = None
        self._observed_time = 0.0
        self._observed_rv: str | None = None
        self._reported_leader: str | None = None
        self._leading = False
        self._lead_task: asyncio.Task[Any] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ state

    def is_leader(self) -> bool:
        """Whether the last observed record names this candidate."""
        return self._observed is not None and self._observed.get("holderIdentity") == self.identity

    def get_leader(self) -> str:
        """The holder identity last observed ("" when unknown or released)."""
        return (self._observed or {}).get("holderIdentity") or ""

    def _lease_duration_seconds(self) -> int:
        return max(1, int(round(self.lease_duration)))

    def _set_observed(self, record: dict[str, Any], rv: str | None, now: float) -> None:
        self._observed = dict(record)
        self._observed_rv = rv
        self._observed_time = now

    def _report_transition(self) -> None:
        holder = self.get_leader()
        if holder == self._reported_leader:
            return
        self._reported_leader = holder
        if self.on_new_leader is not None:
            self._fire(self.on_new_leader, holder)

    def _fire(self, fn: Callback, *args: Any) -> None:
        try:
            result = fn(*args)
        except Exception:  # noqa: BLE001 - a callback must not break the election
            log.exception("leader election callback failed")
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ one attempt

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take or renew the lease; True when this candidate holds it afterwards.
        Any failure to reach the API server (not only an error Status) is
        logged and counts as a failed attempt, as in client-go: the candidate
        keeps trying while the API server is away."""
        try:
            return await self._try_acquire_or_renew()
        except StatusError as e:
            log.error("error retrieving resource lock %s/%s: %s", self.namespace, self.name, e.message)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - connection refused, reset, TLS, invalid response...
            log.error("error retrieving resource lock %s/%s: %s", self.namespace, self.name, e or type(e).__name__)
        return False

    async def _try_acquire_or_renew(self) -> bool:
        now = self.clock()
        stamp = format_micro_time(now)
        desired: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._lease_duration_seconds(),
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        }
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except StatusError as e:
            if e.code != 404:
                log.warning("error retrieving lease %s/%s: %s", self.namespace, self.name, e.message)
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": desired,
            }
            try:
                created = await self.client.create(LEASES, body, self.namespace)
            except StatusError as ce:
                log.info("error initially creating lease %s/%s: %s", self.namespace, self.name, ce.message)
                return False
            self._set_observed(desired, created["metadata"].get("resourceVersion"), now)
            return True

        old = _record(lease)
        if old != self._observed:
            self._set_observed(old, lease["metadata"].get("resourceVersion"), now)
        self._report_transition()
        held_by_other = bool(old.get("holderIdentity")) and old.get("holderIdentity") != self.identity
        duration = old.get("leaseDurationSeconds") or 0
        if held_by_other and self._observed_time + duration > now:
            return False

        if old.get("holderIdentity") == self.identity:
            desired["acquireTime"] = old.get("acquireTime") or stamp
            desired["leaseTransitions"] = old.get("leaseTransitions") or 0
        else:
            desired["leaseTransitions"] = (old.get("leaseTransitions") or 0) + 1
        lease.setdefault("spec", {}).update(desired)
        try:
            updated = await self.client.update(LEASES, lease)
        except StatusError as e:
            if e.code == 409:
                log.info("lease %s/%s changed concurrently; another candidate won", self.namespace, self.name)
            else:
                log.warning("failed to update lease %s/%s: %s", self.namespace, self.name, e.message)
            return False
        self._set_observed(desired, updated["metadata"].get("resourceVersion"), now)
        self._report_transition()
        return True

    async def release(self) -> bool:
        """Give the lease up if held: empty holder, 1 s duration. True when released."""
        if not self.is_leader():
            return True
        now = format_micro_time(self.clock())
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
            if _record(lease).get("holderIdentity") != self.identity:
                return True
            lease["spec"] = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": (self._observed or {}).get("leaseTransitions") or 0,
            }
            updated = await self.client.update(LEASES, lease)
        except StatusError as e:
            log.warning("failed to release lease %s/%s: %s", self.namespace, self.name, e.message)
            return False
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the API server is away: the lease expires by itself
            log.warning("failed to release lease %s/%s: %s", self.namespace, self.name, e or type(e).__name__)
            return False
        self._set_observed(_record(updated), updated["metadata"].get("resourceVersion"), self.clock())
        return True

    # ------------------------------------------------------------------ loops

    async def _attempt(self, timeout: float) -> bool:
        # asyncio.timeout, unlike wait_for on 3.11, never swallows a cancellation
        try:
            async with asyncio.timeout(timeout):
                return await self.try_acquire_or_renew()
        except TimeoutError:
            return False

    async def _acquire(self) -> None:
        while True:
            if await self._attempt(self.renew_deadline):
                return
            jittered = self.retry_period * (1 + self.rng.random() * JITTER_FACTOR)
            await asyncio.sleep(jittered)

    async def _renew(self) -> None:
        """Renew every retry period; return when renewals failed for ``renew_deadline``."""
        while True:
            deadline = self.clock() + self.renew_deadline
            while True:
                remaining = deadline - self.clock()
                if remaining > 0 and await self._attempt(remaining):
                    break
                if self.clock() >= deadline:
                    log.info("failed to renew lease %s/%s within %.1fs", self.namespace, self.name,
                             self.renew_deadline)
                    return
                await asyncio.sleep(self.retry_period)
            await asyncio.sleep(self.retry_period)

    async def run(self) -> None:
        """Campaign, lead until the lease is lost, then return. Cancel to stop (releases the lease)."""
        try:
            await self._acquire()
            self._leading = True
            result = self.on_started_leading()
            if inspect.isawaitable(result):
                self._lead_task = asyncio.ensure_future(result)
            await self._renew()
        finally:
            await self._step_down()

    async def _step_down(self) -> None:
        if not self._leading:
            return
        self._leading = False
        task, self._lead_task = self._lead_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.release_on_cancel:
            await self.release()
        result = self.on_stopped_leading()
        if inspect.isawaitable(result):
            await result


__all__ = ["LEASES", "LeaderElector", "format_micro_time", "parse_micro_time"]
