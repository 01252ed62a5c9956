"""``kubeplane token create|list|delete``: bootstrap tokens, as kubeadm's
``token`` commands manage them (Secrets ``kube-system/bootstrap-token-<id>``)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.auth import bootstraptoken as bt

SECRETS = resource("secrets")


def join_command(server: str, token: str, ca_pem: bytes | None) -> str:
    """The command a new node joins with (kubeadm's ``--print-join-command``)."""
    cmd = f"kubeplane node --server {server} --token {token}"
    if ca_pem:
        cmd += f" --ca-cert-hash {bt.ca_cert_hash(ca_pem)}"
    return cmd


def _ca_pem(config: Any) -> bytes | None:
    if config.ca_data:
        return config.ca_data
    if config.ca_file:
        with open(config.ca_file, "rb") as f:
            return f.read()
    return None


async def create(client: Any, token: str | None, *, ttl_seconds: float, description: str, usages: tuple[str, ...],
                 groups: tuple[str, ...], print_join_command: bool) -> str:
    """Creates the token's Secret; the line to print. ValueError: a bad argument."""
    token = token or bt.generate_token()
    secret = bt.token_secret(token, ttl=_dt.timedelta(seconds=ttl_seconds), description=description,
                             usages=usages, groups=groups)
    try:
        await client.create(SECRETS, secret, bt.NAMESPACE)
    except StatusError as err:
        if err.code == 409:
            raise ValueError(f'a token with id "{token.split(".")[0]}" already exists') from None
        raise
    if print_join_command:
        return join_command(client.config.server, token, _ca_pem(client.config))
    return token


def _human(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 86400 * 2:
        return f"{seconds // 86400}d"
    if seconds >= 3600:
        return f"{seconds // 3600}h"
    if seconds >= 60:
        return f"{seconds // 60}m"
    return f"{seconds}s"


async def list_tokens(client: Any, now: _dt.datetime | None = None) -> list[list[str]]:
    """kubeadm's table: TOKEN TTL EXPIRES USAGES DESCRIPTION EXTRA GROUPS (with its header row)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    out = await client.list(SECRETS, bt.NAMESPACE)
    rows = [["TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION", "EXTRA GROUPS"]]
    for secret in sorted(out.get("items") or [], key=lambda s: s["metadata"]["name"]):
        token = bt.secret_token(secret) if secret.get("type") == bt.SECRET_TYPE else None
        if token is None:
            continue
        text = bt.secret_data(secret, "expiration")
        exp = bt.expiration(secret)
        ttl = "<forever>" if exp is None else ("<invalid>" if exp <= now else _human((exp - now).total_seconds()))
        usages = ",".join(u for u in ("authentication", "signing") if bt.allows(secret, u)) or "<none>"
        rows.append([token, ttl, text or "<never>", usages, bt.secret_data(secret, "description") or "<none>",
                     bt.secret_data(secret, "auth-extra-groups") or "<none>"])
    return rows


async def delete(client: Any, token_or_id: str) -> str:
    tid = token_or_id.split(".")[0]
    if not bt.TOKEN_ID_RE.match(tid):
        raise ValueError(f'given token didn\'t match pattern "{bt.TOKEN_ID_RE.pattern[2:-2]}" or '
                         f'"{bt.TOKEN_RE.pattern[2:-2]}"')
    try:
        await client.delete(SECRETS, bt.SECRET_PREFIX + tid, bt.NAMESPACE)
    except StatusError as err:
        if err.code == 404:
            raise ValueError(f'bootstrap token "{tid}" not found') from None
        raise
    return f'bootstrap token "{tid}" deleted'
