"""The ``kubeplane`` command."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import NoReturn

import click

from kubeplane import __version__, runtime


log = logging.getLogger("kubeplane")


def _setup_logging(verbosity: int, verbose: bool = False) -> None:
    """klog's text format on stderr; ``--verbose`` is ``-v=4``."""
    from kubeplane import logs

    logs.setup(max(verbosity, logs.DEBUG_VERBOSITY if verbose else 0))


def _fail(message: str) -> "NoReturn":
    """One line on stderr and exit 1: what upstream components do when they cannot start."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _run(main_coro_factory) -> None:
    """Runs until SIGINT/SIGTERM, then shuts down cleanly. A
    :class:`~kubeplane.startup.StartupError` ends the process with one line and exit 1."""
    from kubeplane.startup import StartupError

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover
                pass
        await main_coro_factory(stop)

    try:
        runtime.run(runner())
    except KeyboardInterrupt:  # pragma: no cover
        pass
    except StartupError as exc:
        _fail(str(exc))


class _Verbosity(click.ParamType):
    """klog's ``-v``: ``-v=4``, ``-v 4``, ``--v=4``."""

    name = "N"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value)
        if text.startswith("="):  # -v=4 reaches click as the short option with value "=4"
            text = text[1:]
        try:
            n = int(text)
        except ValueError:
            self.fail(f"{value!r} is not a verbosity level (a non-negative integer)", param, ctx)
        if n < 0:
            self.fail(f"{value!r} is not a verbosity level (a non-negative integer)", param, ctx)
        return n


_verbosity_options = [
    click.option("-v", "--v", "verbosity", type=_Verbosity(), default=0, show_default=True,
                 help="Log verbosity, as upstream's -v: 4 and above add debug detail."),
    click.option("--verbose", is_flag=True, help="Debug logging (the same as -v=4)."),
]


def _check_listen(ctx, param, value):
    """Validates HOST:PORT at startup (usage error, exit 2); empty stays empty where allowed."""
    from kubeplane.apiserver.app import parse_listen

    if value is None or (value == "" and param.name == "metrics_listen"):
        return value
    try:
        parse_listen(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc).replace("--listen", param.opts[0])) from None
    return value


def _check_quantity(ctx, param, value):
    from kubeplane.api.quantity import parse_quantity

    try:
        q = parse_quantity(value)
    except (ValueError, TypeError):
        raise click.BadParameter(f"{value!r} is not a quantity (e.g. 4, 500m, 32Gi)") from None
    if q < 0:
        raise click.BadParameter(f"{value!r} must not be negative")
    return value


def _check_not_empty(ctx, param, value):
    if value is not None and not str(value).strip():
        raise click.BadParameter("must not be empty")
    return value


def _check_node_prefix(ctx, param, value):
    from kubeplane.api.strings import is_dns1123_subdomain

    errs = is_dns1123_subdomain(f"{value}-0")
    if errs or len(value) > 240:
        raise click.BadParameter(f"{value!r}: node names PREFIX-<i> must be DNS-1123 subdomains (lower case "
                                 "letters, digits, '-' and '.', starting and ending with a letter or digit)")
    return value


def _check_provisioner(ctx, param, value):
    """A StorageClass provisioner name, checked as upstream validates the field."""
    from kubeplane.api.strings import is_qualified_name

    errs = is_qualified_name(value.lower())
    if errs:
        raise click.BadParameter(f"{value!r} is not a provisioner name: {'; '.join(errs)}")
    return value


class _ByteSize(click.ParamType):
    """A byte count: an integer or a quantity such as ``256Mi``."""

    name = "bytes"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from kubeplane.api.quantity import int_value

        try:
            n = int_value(str(value))
        except (ValueError, TypeError, ArithmeticError):
            self.fail(f"{value!r} is not a byte count (e.g. 268435456 or 256Mi)", param, ctx)
        if n < 1:
            self.fail(f"{value!r} must be at least 1 byte", param, ctx)
        return n


class _Duration(click.ParamType):
    """A Go duration such as ``1h``, ``30m``, ``1h30m`` or ``90s``, in seconds (not negative)."""

    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        from kubeplane.api.duration import parse_duration

        text = str(value).strip()
        try:
            seconds = parse_duration(text)
        except ValueError as err:  # Go's wording: time: invalid duration "soon"
            self.fail(f"{err} (a duration such as 1h, 30m, 1h30m, 90s)", param, ctx)
        if seconds < 0:
            self.fail(f"must not be negative, got {text}", param, ctx)
        return seconds


_server_options = [
    click.option("--data-dir", default="data", show_default=True, callback=_check_not_empty,
                 help="Directory for the SQLite database (created 0700, locked while the server runs)."),
    click.option("--listen", default="127.0.0.1:6443", show_default=True, callback=_check_listen,
                 help="HOST:PORT to serve on; port 0 picks a free port. Loopback by default."),
    click.option("--kubeconfig", "kubeconfig", default=None,
                 help="Write a kubeconfig for this server here once it is ready."),
    click.option("--storage", type=click.Choice(["sqlite", "memory", "etcd"]), default="sqlite", show_default=True,
                 help="Where objects are kept: an SQLite file in --data-dir, memory, or etcd (--etcd-servers)."),
    click.option("--history-revisions", type=click.IntRange(min=1), default=10_000, show_default=True,
                 help="Revisions of history kept for watches and consistent lists (older ones answer 410 Gone)."),
    click.option("--history-bytes", type=_ByteSize(), default="256Mi", show_default=True,
                 help="Bytes of history (encoded object sizes) kept for watches and consistent lists."),
    click.option("--event-ttl", type=_Duration(), default="1h", show_default=True,
                 help="Events are deleted this long after their last write (0: never)."),
    *_verbosity_options,
]


def _limit_option(name: str, key: str, convert, **kw):
    """An option of the serving limits: kept in the context, not passed as a parameter."""

    def store(ctx: click.Context, param: click.Parameter, value):
        try:
            ctx.meta.setdefault("serving_limits", {})[key] = convert(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        return value

    return click.option(name, callback=store, expose_value=False, **kw)


def _seconds(value: str) -> float:
    from kubeplane.api.duration import parse_duration

    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError(f"must not be negative: {value!r}")
    return seconds


_server_options += [
    _limit_option("--max-requests-inflight", "max_requests_inflight", int, type=click.IntRange(min=0),
                  default=400, show_default=True,
                  help="Read-only requests served at once (0: no limit); more get 429. Watches are not counted."),
    _limit_option("--max-mutating-requests-inflight", "max_mutating_requests_inflight", int,
                  type=click.IntRange(min=0), default=200, show_default=True,
                  help="Mutating requests served at once (0: no limit); more get 429."),
    _limit_option("--request-timeout", "request_timeout", _seconds, default="1m0s", show_default=True,
                  help="Duration after which a request that is not long-running gets 504 Timeout (0: none)."),
    _limit_option("--min-request-timeout", "min_request_timeout", float, type=click.IntRange(min=0),
                  default=1800, show_default=True,
                  help="Seconds; a watch without timeoutSeconds ends after a random time in [this, 2*this]."),
    click.option("--authorization-mode", type=click.Choice(["Node,RBAC", "RBAC", "AlwaysAllow"]),
                 default="Node,RBAC",
                 show_default=True, expose_value=False,
                 callback=lambda ctx, _p, v: ctx.meta.__setitem__("authorization_mode", v),
                 help="How requests are authorized: Node,RBAC (kubelets by upstream's Node authorizer, "
                      "then RBAC), RBAC alone, or AlwaysAllow."),
    # Not upstream flags (its values are fixed); for tests.
    _limit_option("--header-timeout", "header_timeout", _seconds, default="32s", hidden=True),
    _limit_option("--idle-timeout", "idle_timeout", _seconds, default="1m30s", hidden=True),
    _limit_option("--max-header-bytes", "max_header_bytes", int, type=click.IntRange(min=1024),
                  default=1 << 20, hidden=True),
]


def _check_encryption_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Read and validate the EncryptionConfiguration before anything starts."""
    if value is not None:
        from kubeplane.apiserver.encryptionconfig import EncryptionConfigError, load

        try:
            load(value)
        except EncryptionConfigError as exc:
            raise click.BadParameter(str(exc)) from None
    ctx.meta["encryption_provider_config"] = value
    return value


_server_options += [
    click.option("--encryption-provider-config", callback=_check_encryption_config, expose_value=False,
                 default=None, metavar="FILE",
                 help="EncryptionConfiguration file (apiserver.config.k8s.io/v1): the resources encrypted at rest "
                      "and their providers (aesgcm, aescbc, secretbox, identity) and keys."),
]


def _encryption_provider_config() -> str | None:
    return click.get_current_context().meta.get("encryption_provider_config")


def _etcd_option(name: str, key: str, convert=None, **kw):
    """An option of the etcd storage: kept in the context, not passed as a parameter."""

    def store(ctx: click.Context, param: click.Parameter, value):
        if convert is not None and value is not None:
            try:
                value = convert(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        ctx.meta.setdefault("etcd", {})[key] = value
        return value

    return click.option(name, callback=store, expose_value=False, **kw)


def _parse_etcd_servers(value: str) -> list[str]:
    from kubeplane.storage.etcd import parse_servers

    return parse_servers(value)


_server_options += [
    _etcd_option("--etcd-servers", "servers", _parse_etcd_servers, default="http://127.0.0.1:2379",
                 show_default=True, metavar="URL[,URL...]",
                 help="etcd members to connect to (with --storage etcd); requests fail over between them."),
    _etcd_option("--etcd-prefix", "prefix", default="/registry", show_default=True,
                 help="The prefix of every key in etcd."),
    _etcd_option("--etcd-cafile", "cafile", default=None, metavar="FILE",
                 help="CA bundle the etcd members' serving certificates are verified against."),
    _etcd_option("--etcd-certfile", "certfile", default=None, metavar="FILE",
                 help="Client certificate presented to etcd."),
    _etcd_option("--etcd-keyfile", "keyfile", default=None, metavar="FILE",
                 help="Private key of --etcd-certfile."),
    _etcd_option("--etcd-compaction-interval", "compaction_interval", lambda v: _Duration().convert(v, None, None),
                 default="5m", show_default=True,
                 help="How often the API server compacts etcd's history (0: never)."),
]


def _etcd_config():
    from kubeplane.storage.etcd import EtcdConfig

    opts = dict(click.get_current_context().meta.get("etcd") or {})
    if not opts:
        return None
    return EtcdConfig(**{k: v for k, v in opts.items() if v is not None})


def _security_option(name: str, key: str, **kw):
    """An option of TLS and authentication: kept in the context, not passed as a parameter."""

    def store(ctx: click.Context, param: click.Parameter, value):
        ctx.meta.setdefault("security", {})[key] = value
        return value

    return click.option(name, callback=store, expose_value=False, **kw)


_server_options += [
    _security_option("--insecure-http", "insecure_http", is_flag=True,
                     help="Serve plain HTTP with neither TLS nor authentication (every client is cluster "
                          "admin); refused unless --listen is a loopback address."),
    _security_option("--tls-cert-file", "tls_cert_file", type=click.Path(exists=True, dir_okay=False),
                     help="Serving certificate (PEM, with its chain); default: one made in <data-dir>/pki."),
    _security_option("--tls-private-key-file", "tls_private_key_file", type=click.Path(exists=True, dir_okay=False),
                     help="The serving certificate's private key."),
    _security_option("--client-ca-file", "client_ca_file", type=click.Path(exists=True, dir_okay=False),
                     help="CA bundle verifying client certificates; default: <data-dir>/pki/ca.crt."),
    _security_option("--token-auth-file", "token_auth_file", type=click.Path(exists=True, dir_okay=False),
                     help='Static bearer tokens, CSV lines: token,user,uid,"group1,group2".'),
    _security_option("--service-account-key-file", "service_account_key_files", multiple=True,
                     type=click.Path(exists=True, dir_okay=False),
                     help="PEM keys verifying ServiceAccount tokens (repeatable); default: the signing key."),
    _security_option("--service-account-signing-key-file", "service_account_signing_key_file",
                     type=click.Path(exists=True, dir_okay=False),
                     help="Private key (RSA or ECDSA) signing ServiceAccount tokens; default: "
                          "<data-dir>/pki/sa.key, made on first start."),
    _security_option("--service-account-issuer", "service_account_issuers", multiple=True,
                     help="Issuer of ServiceAccount tokens (repeatable; the first issues). Default: "
                          "https://kubernetes.default.svc.cluster.local."),
    _security_option("--api-audiences", "api_audiences", default="",
                     help="Comma-separated audiences of the API (default: the issuer)."),
    _security_option("--anonymous-auth", "anonymous", type=bool, default=True, show_default=True,
                     help="Requests without credentials are system:anonymous (else 401)."),
    # -- security --
    _security_option("--enable-bootstrap-token-auth", "bootstrap_tokens", type=bool, default=True,
                     show_default=True,
                     help="Bootstrap tokens (kube-system Secrets of type bootstrap.kubernetes.io/token) "
                          "authenticate as system:bootstrap:<id> in system:bootstrappers."),
]


def _check_service_range(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from kubeplane.registry.servicealloc import parse_port_range, parse_service_cidr

    try:
        if param.name == "service_node_port_range":
            parse_port_range(value)
        else:
            parse_service_cidr(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    ctx.meta.setdefault("services", {})[param.name] = value
    return value


def _check_advertisable(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An address endpoints may list: an IP, not loopback, unspecified or link-local."""
    import ipaddress

    if value is not None:
        try:
            ip = ipaddress.ip_address(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not an IP address") from None
        if ip.is_loopback or ip.is_unspecified or ip.is_link_local:
            raise click.BadParameter(f"{value} cannot be advertised: it is a loopback, unspecified or link-local "
                                     "address")
    return value


def _check_advertise_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    value = _check_advertisable(ctx, param, value)
    ctx.meta.setdefault("services", {})["advertise_address"] = value
    return value


_server_options += [
    click.option("--service-cluster-ip-range", default="10.96.0.0/12", show_default=True, expose_value=False,
                 callback=_check_service_range,
                 help="CIDR Service ClusterIPs are allocated from (at most 20 host bits); its first address is "
                      "the kubernetes Service's."),
    click.option("--service-node-port-range", default="30000-32767", show_default=True, expose_value=False,
                 callback=_check_service_range,
                 help="Port range (inclusive) NodePort and LoadBalancer Services get node ports from."),
    click.option("--advertise-address", default=None, expose_value=False, callback=_check_advertise_address,
                 help="The IP the kubernetes Service's endpoints list (default: the --listen address, or the "
                      "host's when that is loopback)."),
]


def _services_config() -> dict:
    """APIServerConfig keyword arguments of the Service range options."""
    opts = click.get_current_context().meta.get("services", {})
    return {k: v for k, v in opts.items() if v is not None}


def _security_config() -> dict:
    """APIServerConfig keyword arguments of the TLS and authentication options."""
    from kubeplane.apiserver.app import AuthenticationConfig

    opts = dict(click.get_current_context().meta.get("security", {}))
    auds = tuple(a.strip() for a in (opts.pop("api_audiences", "") or "").split(",") if a.strip())
    authn = AuthenticationConfig(
        token_auth_file=opts.pop("token_auth_file", None),
        service_account_key_files=tuple(opts.pop("service_account_key_files", ()) or ()),
        service_account_signing_key_file=opts.pop("service_account_signing_key_file", None),
        service_account_issuers=tuple(opts.pop("service_account_issuers", ()) or ()),
        api_audiences=auds, anonymous=bool(opts.pop("anonymous", True)),
        bootstrap_tokens=bool(opts.pop("bootstrap_tokens", True)))
    return {"insecure_http": bool(opts.get("insecure_http")), "tls_cert_file": opts.get("tls_cert_file"),
            "tls_private_key_file": opts.get("tls_private_key_file"), "client_ca_file": opts.get("client_ca_file"),
            "authentication": authn}


def _serving_limits():
    from kubeplane.apiserver.serving import ServingLimits

    return ServingLimits(**click.get_current_context().meta.get("serving_limits", {}))


def _authorization_mode() -> str:
    return click.get_current_context().meta.get("authorization_mode", "Node,RBAC")


def server_options(f):
    for opt in reversed(_server_options):
        f = opt(f)
    return f


def _version_line() -> str:
    from kubeplane.apiserver.server import VERSION_INFO

    return f"kubeplane v{__version__} (Kubernetes {VERSION_INFO['gitVersion']})"


def _print_version(ctx, param, value) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_line())
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version and exit.")
def main() -> None:
    """kubeplane: a Kubernetes control plane in Python."""
    from kubeplane.runtime import configure_gc

    configure_gc()
    # -- startup --
    if click.get_current_context().invoked_subcommand not in (None, "version"):
        # every other command serves or calls over HTTP: aiohttp, whose default
        # client TLS contexts then read the CA bundle on first use, not at import
        from kubeplane.httpstack import import_aiohttp_web

        import_aiohttp_web()


def _check_controllers(ctx, param, value: str) -> tuple[str, ...]:
    from kubeplane.cluster import CONTROLLERS
    from kubeplane.controllers.manager import select_controllers

    items = tuple(v.strip() for v in value.split(",") if v.strip())
    try:
        select_controllers(CONTROLLERS, items)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return items


def _controllers_option(fn):
    """kube-controller-manager's --controllers."""
    return click.option(
        "--controllers", "controller_selection", default="*", show_default=True, callback=_check_controllers,
        help="A list of controllers to enable. '*' enables all on-by-default controllers, 'foo' enables the "
             "controller named 'foo', '-foo' disables the controller named 'foo'. Names as "
             "kube-controller-manager's (e.g. job-controller, or its alias job).")(fn)


@main.command()
@click.option("-o", "--output", type=click.Choice(["json", "yaml"]), default=None,
              help="Print the version information as JSON or YAML (the API server's /version).")
def version(output: str | None) -> None:
    """Print the version, as upstream components' --version does."""
    from kubeplane.apiserver.server import VERSION_INFO

    if output is None:
        click.echo(_version_line())
    elif output == "json":
        import json

        click.echo(json.dumps(VERSION_INFO, indent=2))
    else:
        import yaml

        click.echo(yaml.safe_dump(VERSION_INFO, sort_keys=False), nl=False)


@main.command()
@server_options
def apiserver(data_dir: str, listen: str, kubeconfig: str | None, storage: str, history_revisions: int,
              history_bytes: int, event_ttl: float, verbosity: int, verbose: bool) -> None:
    """Run the API server alone."""
    from kubeplane.apiserver.app import APIServer, APIServerConfig
    from kubeplane.cluster import namespace_controller, service_account_controller

    _setup_logging(verbosity, verbose)
    server = APIServer(APIServerConfig(data_dir=data_dir, listen=listen, storage=storage, kubeconfig=kubeconfig,
                                         history_revisions=history_revisions, history_bytes=history_bytes,
                                         event_ttl=event_ttl, limits=_serving_limits(),
                                         encryption_provider_config=_encryption_provider_config(),
                                         authorization_mode=_authorization_mode(), **_security_config(),
                                         **_services_config(), etcd=_etcd_config()),
                       # with the API server alone, pods still get their ServiceAccount
                       in_process=[namespace_controller, service_account_controller])

    async def go(stop: asyncio.Event) -> None:
        await server.start()
        log.info("kubeplane API server ready at %s", server.url)
        try:
            await stop.wait()
        finally:
            await server.stop()

    _run(go)


def _node_options(f):
    opts = [
        click.option("--nodes", "node_count", type=click.IntRange(min=0), default=3, show_default=True,
                     help="Simulated nodes to register."),
        click.option("--node-cpu", default="4", show_default=True, callback=_check_quantity,
                     help="CPU capacity of each simulated node (a quantity: 4, 500m)."),
        click.option("--node-memory", default="32Gi", show_default=True, callback=_check_quantity,
                     help="Memory of each simulated node (a quantity: 32Gi)."),
        click.option("--node-pods", type=click.IntRange(min=1), default=110, show_default=True,
                     help="Pod capacity of each simulated node."),
        click.option("--zones", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Spread simulated nodes over this many zones (topology.kubernetes.io/zone)."),
        click.option("--node-prefix", default="node", show_default=True, callback=_check_node_prefix,
                     help="Simulated node names: PREFIX-<i>."),
        click.option("--gpus-per-node", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Simulated DRA devices per node: publishes DeviceClass gpu.kubeplane.io and one "
                          "ResourceSlice per node."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _node_agent(client, factory, node_count, node_cpu, node_memory, node_pods, zones, node_prefix, gpus=0):
    from kubeplane.cluster import node_agent

    return node_agent(client, factory, node_count, node_cpu, node_memory, node_pods, zones, node_prefix, gpus)


#: kube-controller-manager's node lifecycle and pod GC flags: (flag, ControllerOptions field, type, default, help)
_CONTROLLER_FLAGS = (
    ("--node-monitor-grace-period", "node_monitor_grace_period", "duration", "50s",
     "How long a node may go unheard from (no Lease renewal, no status) before it is marked Unknown."),
    ("--node-startup-grace-period", "node_startup_grace_period", "duration", "1m",
     "How long a new node may go without posting status before it is marked Unknown."),
    ("--node-monitor-period", "node_monitor_period", "duration", "5s",
     "How often the node lifecycle controller checks the nodes' health."),
    ("--terminated-pod-gc-threshold", "terminated_pod_gc_threshold", "int", 12500,
     "Terminated pods kept before the pod garbage collector deletes the oldest (0: no limit)."),
    ("--horizontal-pod-autoscaler-sync-period", "hpa_sync_period", "duration", "15s",
     "The period for syncing the number of pods in horizontal pod autoscaler."),
    ("--horizontal-pod-autoscaler-tolerance", "hpa_tolerance", "float", 0.1,
     "The minimum change (from 1.0) in the desired-to-actual metrics ratio for the horizontal pod autoscaler "
     "to consider scaling."),
    ("--horizontal-pod-autoscaler-downscale-stabilization", "hpa_downscale_stabilization", "duration", "5m0s",
     "Period for which autoscaler will look backwards and not scale down below any recommendation it made "
     "during that period."),
    ("--horizontal-pod-autoscaler-cpu-initialization-period", "hpa_cpu_initialization_period", "duration", "5m0s",
     "The period after pod start when CPU samples might be skipped."),
    ("--horizontal-pod-autoscaler-initial-readiness-delay", "hpa_initial_readiness_delay", "duration", "30s",
     "The period after pod start during which readiness changes will be treated as initial readiness."),
    # -- security --
    ("--allocate-node-cidrs", "allocate_node_cidrs", "flag", False,
     "Should CIDRs for Pods be allocated and set on the nodes (from --cluster-cidr); "
     "--allocate-node-cidrs=false turns it off."),
    ("--cluster-cidr", "cluster_cidr", "cidrs", "",
     "CIDR Range for Pods in cluster (one, or an IPv4 and an IPv6 one comma-separated for dual stack). "
     "Requires --allocate-node-cidrs."),
    ("--node-cidr-mask-size", "node_cidr_mask_size", "int", 0,
     "Mask size for node cidr in cluster. Default is 24 for IPv4 and 64 for IPv6."),
    ("--node-cidr-mask-size-ipv4", "node_cidr_mask_size_ipv4", "int", 0,
     "Mask size for IPv4 node cidr in dual-stack cluster. Default is 24."),
    ("--node-cidr-mask-size-ipv6", "node_cidr_mask_size_ipv6", "int", 0,
     "Mask size for IPv6 node cidr in dual-stack cluster. Default is 64."),
)
#: the flags whose value must be above zero
_POSITIVE_CONTROLLER_FLAGS = frozenset({"node_monitor_period", "hpa_sync_period"})


#: ``kubeplane up`` allocates node pod CIDRs (upstream's kube-controller-manager
#: only with --allocate-node-cidrs): from 10.244.0.0/16, as kubeadm clusters with
#: flannel and kind do, a /24 for each node
_UP_CONTROLLER_DEFAULTS = {"allocate_node_cidrs": True, "cluster_cidr": "10.244.0.0/16"}


def _controller_flag_options(fn=None, *, defaults: dict | None = None):
    """The flags of :data:`_CONTROLLER_FLAGS`, kept in the context (see :func:`_controller_flag_values`);
    ``defaults``: other defaults than upstream's, by field."""
    if fn is None:
        return lambda f: _controller_flag_options(f, defaults=defaults)
    defaults = defaults or {}

    def store(field: str, kind: str = ""):
        def callback(ctx: click.Context, param: click.Parameter, value):
            if field in _POSITIVE_CONTROLLER_FLAGS and not value > 0:
                raise click.BadParameter("must be greater than 0")
            if kind == "cidrs" and value:
                from kubeplane.controllers.nodeipam import parse_cluster_cidrs

                try:
                    parse_cluster_cidrs(value)
                except ValueError as err:
                    raise click.BadParameter(str(err)) from None
            if kind == "int" and field.startswith("node_cidr_mask_size") and value > 128:
                raise click.BadParameter("must be at most 128")
            ctx.meta.setdefault("controller_flags", {})[field] = value
            return value
        return callback

    for flag, field, kind, default, text in reversed(_CONTROLLER_FLAGS):
        default = defaults.get(field, default)
        if kind == "flag":  # a Go bool flag: --flag, --flag=true, --flag=false
            fn = click.option(flag, type=bool, is_flag=False, flag_value=True, default=default, metavar="[=BOOL]",
                              callback=store(field), expose_value=False,
                              help=f"{text}  [default: {str(default).lower()}]")(fn)
        elif kind == "cidrs":
            fn = click.option(flag, default=default, show_default=bool(default), callback=store(field, kind),
                              expose_value=False, help=text)(fn)
        elif kind == "duration":
            fn = click.option(flag, type=_Duration(), default=default, show_default=True, callback=store(field),
                              expose_value=False, help=text)(fn)
        else:
            kind_type = click.IntRange(min=0) if kind == "int" else click.FloatRange(min=0)
            fn = click.option(flag, type=kind_type, default=default, show_default=True,
                              callback=store(field), expose_value=False, help=text)(fn)
    return fn


def _controller_flag_values() -> dict:
    """The ControllerOptions fields the command's controller flags set."""
    ctx = click.get_current_context(silent=True)
    return dict(ctx.meta.get("controller_flags", {})) if ctx is not None else {}


def _controller_flag_argv() -> list[str]:
    """The same flags for a child process (``up --split``)."""
    values = _controller_flag_values()
    out: list[str] = []
    for flag, field, kind, _default, _text in _CONTROLLER_FLAGS:
        if field in values:
            v = values[field]
            if kind == "flag":
                out.append(f"{flag}={'true' if v else 'false'}")
                continue
            out += [flag, f"{v:g}s" if kind == "duration" else f"{v:g}" if kind == "float" else str(v)]
    return out


_COMPONENTS_METRICS_HELP = ("HOST:PORT where the scheduler's and controllers' /metrics, /healthz and the "
                            "scheduler's /configz are served (as kube-scheduler's secure port); empty to disable.")


def _check_dns_addr(ctx, param, value):
    """``--dns-addr``: HOST:PORT, or empty (no DNS server)."""
    if not value:
        return ""
    return _check_listen(ctx, param, value)


def _check_cluster_domain(ctx, param, value):
    from kubeplane.api.strings import is_dns1123_subdomain

    value = (value or "").strip().rstrip(".").lower()
    problems = is_dns1123_subdomain(value) if value else ["must not be empty"]
    if problems:
        raise click.BadParameter(f"invalid cluster domain {value!r}: {'; '.join(problems)}")
    return value


_DNS_ADDR_HELP = ("HOST:PORT where the cluster DNS server listens (UDP and TCP); empty: no DNS server. Pods "
                  "reach it through the kube-dns Service (the tenth address of --service-cluster-ip-range), "
                  "whose endpoints list this address: it must be one pods can reach (a node's or the host's "
                  "address, or 0.0.0.0 to use the host's); on a loopback address the Service gets no endpoints.")


def _dns_options(default_addr: str):
    def deco(f):
        opts = [
            click.option("--dns-addr", default=default_addr, show_default=True, callback=_check_dns_addr,
                         help=_DNS_ADDR_HELP),
            click.option("--cluster-domain", default="cluster.local", show_default=True,
                         callback=_check_cluster_domain, help="The cluster's DNS domain."),
            click.option("--dns-resolv-conf", default="/etc/resolv.conf", show_default=True,
                         help="resolv.conf whose nameservers names outside the cluster domain are forwarded to."),
            click.option("--dns-pods", type=click.Choice(["insecure", "verified", "disabled"]), default="insecure",
                         show_default=True,
                         help="<a-b-c-d>.<ns>.pod records, as CoreDNS's pods option: any address (insecure), "
                              "only a pod's of that namespace (verified), or none."),
            click.option("--dns-advertise-address", default=None, callback=_check_advertisable,
                         help="The address the kube-dns endpoints list (default: the --dns-addr host, or the "
                              "host's when that is 0.0.0.0)."),
            click.option("--dns-metrics-addr", default="", callback=_check_dns_addr,
                         help="HOST:PORT of the DNS server's /metrics (CoreDNS's metric names) and /healthz; "
                              "empty: none. At the --dns-addr host (or 0.0.0.0) it is the kube-dns Service's "
                              "metrics port (9153)."),
        ]
        for opt in reversed(opts):
            f = opt(f)
        return f
    return deco


def _dns_config(dns_addr: str, cluster_domain: str, resolv_conf: str, pods: str, advertise: str | None,
                metrics_addr: str, service_cidr: str):
    from kubeplane.dns.component import DNSConfig
    from kubeplane.dns.kubedns import kube_dns_ip

    try:
        service_ip = kube_dns_ip(service_cidr)
    except ValueError as err:
        raise click.UsageError(f"{err}: give a larger --service-cluster-ip-range, or --dns-addr \"\"") from None
    return DNSConfig(listen=dns_addr, cluster_domain=cluster_domain, service_ip=service_ip,
                     resolv_conf=resolv_conf, pods=pods, advertise_address=advertise, metrics_listen=metrics_addr)


#: the HorizontalPodAutoscaler controller's flags (kube-controller-manager's) and
#: the ControllerOptions fields they set
@main.command()
@server_options
@_node_options
@click.option("--scheduler-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="KubeSchedulerConfiguration file for the built-in scheduler.")
@click.option("--split", is_flag=True,
              help="Run the scheduler, controllers and simulated nodes in a second process, joined to the "
                   "API server by a Unix socket, so that two cores do the work.")
@click.option("--metrics-listen", default="127.0.0.1:10259", show_default=True, callback=_check_listen,
              help=_COMPONENTS_METRICS_HELP + " With --split the second process serves them.")
@_controllers_option
@_controller_flag_options(defaults=_UP_CONTROLLER_DEFAULTS)
# -- agent --
@click.option("--real-node", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="Also run one real node (pods in containers, through its own containerd under "
                   "<data-dir>/node; its pod CIDR from the node IPAM controller, see --cluster-cidr): auto (when "
                   "this host can: root, containerd, runc, CNI plugins), on (fail if it cannot) or off.")
@click.option("--real-node-name", default=None, callback=lambda ctx, param, value: _check_node_name(ctx, param, value),
              help="Name of the real node; default: the hostname.")
@click.option("--real-node-kubelet-port", type=click.IntRange(min=0, max=65535), default=10250, show_default=True,
              help="Port of the real node's kubelet API (0: a free one).")
# -- end agent --
@_dns_options("127.0.0.1:10053")
def up(data_dir: str, listen: str, kubeconfig: str | None, storage: str, history_revisions: int,
       history_bytes: int, event_ttl: float, verbosity: int, verbose: bool, node_count: int, node_cpu: str,
       node_memory: str, node_pods: int, zones: int, node_prefix: str, gpus_per_node: int,
       scheduler_config: str | None, split: bool, metrics_listen: str,
       controller_selection: tuple[str, ...], real_node: str = "auto", real_node_name: str | None = None,
       real_node_kubelet_port: int = 10250, dns_addr: str = "", cluster_domain: str = "cluster.local",
       dns_resolv_conf: str = "/etc/resolv.conf", dns_pods: str = "insecure",
       dns_advertise_address: str | None = None, dns_metrics_addr: str = "") -> None:
    """Run a whole cluster: API server, scheduler, controllers, simulated nodes and cluster DNS
    (one process, or two with --split)."""
    import os

    from kubeplane.apiserver.app import APIServer, APIServerConfig
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.cluster import Components, cluster_ca_options, namespace_controller
    from kubeplane.startup import KubeconfigFile

    _setup_logging(verbosity, verbose)
    if kubeconfig is None:
        kubeconfig = os.path.join(data_dir, "kubeconfig")
    sched_cfg = _load_scheduler_config(scheduler_config)
    sched_kwargs = _scheduler_kwargs(scheduler_config, sched_cfg)
    # The data directory is locked with memory storage too: it holds the kubeconfig.
    server = APIServer(APIServerConfig(data_dir=data_dir, listen=listen, storage=storage, kubeconfig=None,
                                       history_revisions=history_revisions, history_bytes=history_bytes,
                                       event_ttl=event_ttl, limits=_serving_limits(), lock_data_dir=True,
                                       encryption_provider_config=_encryption_provider_config(),
                                       authorization_mode=_authorization_mode(), **_security_config(),
                                       **_services_config(), etcd=_etcd_config()),
                       # With --split the namespace controller stays in this process (the
                       # deletes it makes are served here anyway, and it keeps working while
                       # the second process restarts); otherwise it is one of the controllers.
                       in_process=[namespace_controller] if split else [])
    node_args = (node_count, node_cpu, node_memory, node_pods, zones, node_prefix, gpus_per_node)
    published = KubeconfigFile(kubeconfig)
    dns_config = None
    if dns_addr:
        from kubeplane.registry.servicealloc import DEFAULT_SERVICE_CIDR

        dns_config = _dns_config(dns_addr, cluster_domain, dns_resolv_conf, dns_pods, dns_advertise_address,
                                 dns_metrics_addr, server.config.service_cluster_ip_range or DEFAULT_SERVICE_CIDR)
    real = _up_real_node(server, data_dir, real_node, real_node_name, real_node_kubelet_port,  # -- agent --
                         controller_selection,
                         cluster_dns=[dns_config.service_ip] if dns_config and dns_config.service_ip else [],
                         cluster_domain=cluster_domain, resolv_conf=dns_resolv_conf)

    async def go(stop: asyncio.Event) -> None:
        await server.start()
        published.remove_stale()  # safe: the data directory's lock is ours
        comps = Components()
        try:
            # the cluster CA, once the API server has made it, publishes kube-root-ca.crt and signs CSRs
            ca_files = cluster_ca_options(data_dir)
            if split:
                await _start_split(comps, server.registry, data_dir, node_args, scheduler_config, verbosity,
                                   metrics_listen, ca_files, controller_selection)
            else:
                client = InProcessClient(server.registry, field_manager="kubeplane")
                await _start_components(comps, client, node_args, sched_kwargs, metrics_listen, sched_cfg,
                                        ca_files=ca_files, controller_selection=controller_selection)
            if dns_config is not None:
                from kubeplane.dns.component import ClusterDNS

                cluster_dns = ClusterDNS(InProcessClient(server.registry, field_manager="kubeplane-dns"), dns_config)
                await comps.start(cluster_dns)
                if real is not None and cluster_dns.keeper is not None and cluster_dns.keeper.address is None:
                    log.warning("cluster DNS listens on %s:%d, which the real node's pods cannot reach (the "
                                "kube-dns Service has no endpoints): give --dns-addr an address they reach, such "
                                "as 0.0.0.0:10053", cluster_dns.host, cluster_dns.port)
            if real is not None:  # -- agent --
                await real.start()
            # Written last and atomically: the kubeconfig appearing means the cluster is usable.
            published.publish(server.url, **server.admin_credentials())
            log.info("kubeplane is up: API server at %s, %d simulated node(s)%s; try: kubectl --kubeconfig %s "
                     "get nodes", server.url, node_count, f", real node {real.config.name}" if real else "",
                     kubeconfig)
            await stop.wait()
        finally:
            published.withdraw()  # first: nothing may look ready while stopping
            if real is not None:  # -- agent --
                await real.stop()
            await comps.stop()
            await server.stop()

    _run(go)


async def _start_components(comps, client, node_args: tuple, sched_kwargs: dict, metrics_listen: str = "",
                            sched_cfg=None, namespace_controller: bool = True, ca_files: dict | None = None,
                            controller_selection: tuple[str, ...] = ("*",)) -> None:
    """Controllers, simulated nodes and the scheduler on ``client``, sharing one informer factory;
    with ``metrics_listen``, their metrics server (scheduler metrics, work queues, /configz);
    ``ca_files``: the CA files of the root CA publisher and the CSR signer
    (:func:`kubeplane.cluster.cluster_ca_options`)."""
    from kubeplane.cluster import ControllerOptions, start_components

    await start_components(comps, client, node_args, sched_kwargs, metrics_listen=metrics_listen,
                           scheduler_config=sched_cfg, namespace_controller=namespace_controller,
                           controller_options=ControllerOptions(**(ca_files or {}), **_controller_flag_values()),
                           controller_selection=controller_selection)


async def _start_split(comps, registry, data_dir: str, node_args: tuple, scheduler_config: str | None,
                       verbosity: int, metrics_listen: str = "", ca_files: dict | None = None,
                       controller_selection: tuple[str, ...] = ("*",)) -> None:
    """``up --split``: serve the registry on a private Unix socket and run
    :func:`components` in a child process, restarted if it dies."""
    import os
    import tempfile

    from kubeplane.client.wireserver import WireServer
    from kubeplane.cluster import ComponentProcess, ServedSocket
    from kubeplane.startup import StartupError

    path = os.path.abspath(os.path.join(data_dir, "api.sock"))
    sock_dir = None
    if len(path.encode()) > 100:  # Unix socket paths are limited to about 100 bytes
        sock_dir = tempfile.mkdtemp(prefix="kubeplane-")
        path = os.path.join(sock_dir, "api.sock")
    # The child authenticates with a token made for this run (given in its
    # environment, never on its command line) and then acts as each of its
    # components (system:kube-scheduler, system:kube-controller-manager,
    # system:node:<name>), as the local wire allows (kubeplane.client.wire).
    import secrets

    from kubeplane.auth.user import AUTHENTICATED, SYSTEM_MASTERS, UserInfo

    token = secrets.token_urlsafe(32)
    wire = WireServer(registry, path, tokens={
        token: UserInfo("system:kubeplane-components", groups=(SYSTEM_MASTERS, AUTHENTICATED))},
        authorizer=registry.authorizer)  # the API server's: requests and impersonation are checked as over HTTP
    await wire.start()
    comps.items.append(ServedSocket(wire, sock_dir))
    count, cpu, memory, pods, zones, prefix, gpus = node_args
    argv = [sys.executable, "-m", "kubeplane.cli.main", "components", "--api-socket", wire.path,
            "--nodes", str(count), "--node-cpu", cpu, "--node-memory", memory, "--node-pods", str(pods),
            "--zones", str(zones), "--node-prefix", prefix, "--gpus-per-node", str(gpus),
            "--metrics-listen", metrics_listen, f"--v={verbosity}", *_controller_flag_argv(),
            "--controllers", ",".join(controller_selection)]
    for field, flag in _CA_FLAGS:
        if (ca_files or {}).get(field):
            argv += [flag, ca_files[field]]
    if scheduler_config:
        argv += ["--scheduler-config", os.path.abspath(scheduler_config)]
    child = ComponentProcess(argv, "components process", env={**os.environ, WIRE_TOKEN_ENV: token})
    try:
        await child.start()
    except RuntimeError as exc:  # the child logged why (e.g. its metrics address is in use)
        raise StartupError(f"{exc}; its error is logged above") from None
    comps.items.append(child)
    comps.run(child.supervise(), "components-supervisor")


#: ControllerOptions fields and the kube-controller-manager flags that set them
_CA_FLAGS = (("root_ca_file", "--root-ca-file"), ("signing_cert_file", "--cluster-signing-cert-file"),
             ("signing_key_file", "--cluster-signing-key-file"))


def _ca_options(fn):
    """kube-controller-manager's CA flags: the root CA publisher and the CSR signer run with them."""
    fn = click.option("--cluster-signing-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
                      help="PEM private key of the CA that signs approved CertificateSigningRequests.")(fn)
    fn = click.option("--cluster-signing-cert-file", type=click.Path(exists=True, dir_okay=False), default=None,
                      help="PEM certificate of the CA that signs approved CertificateSigningRequests "
                           "(with --cluster-signing-key-file).")(fn)
    return click.option("--root-ca-file", type=click.Path(exists=True, dir_okay=False), default=None,
                        help="CA bundle published as the kube-root-ca.crt ConfigMap in every namespace.")(fn)


def _ca_files(root_ca_file: str | None, cert_file: str | None, key_file: str | None) -> dict:
    if bool(cert_file) != bool(key_file):
        raise click.UsageError("--cluster-signing-cert-file and --cluster-signing-key-file go together")
    values = {"root_ca_file": root_ca_file, "signing_cert_file": cert_file, "signing_key_file": key_file}
    return {k: v for k, v in values.items() if v}


@main.command(hidden=True)
@click.option("--api-socket", required=True, help="The API server's local wire socket.")
@_node_options
@click.option("--scheduler-config", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--metrics-listen", default="", callback=_check_listen, help=_COMPONENTS_METRICS_HELP)
@_ca_options
@_controllers_option
@_controller_flag_options
@_verbosity_options[0]
@_verbosity_options[1]
def components(api_socket: str, node_count: int, node_cpu: str, node_memory: str, node_pods: int, zones: int,
               node_prefix: str, gpus_per_node: int, scheduler_config: str | None, metrics_listen: str,
               root_ca_file: str | None, cluster_signing_cert_file: str | None,
               cluster_signing_key_file: str | None, controller_selection: tuple[str, ...], verbosity: int,
               verbose: bool) -> None:
    """The second process of ``up --split``: scheduler, controllers and simulated
    nodes over the local wire. Stops at ``stop`` or when its input ends."""
    import os

    from kubeplane.client.wire import WireClient
    from kubeplane.cluster import Components, read_commands, say

    _setup_logging(verbosity, verbose)
    sched_cfg = _load_scheduler_config(scheduler_config)
    sched_kwargs = _scheduler_kwargs(scheduler_config, sched_cfg)
    node_args = (node_count, node_cpu, node_memory, node_pods, zones, node_prefix, gpus_per_node)

    async def go(stop: asyncio.Event) -> None:
        client = WireClient(api_socket, managed_fields=False, token=os.environ.pop(WIRE_TOKEN_ENV, None))
        comps = Components()

        async def command(words: list[str]) -> None:
            say(f"error unknown command {' '.join(words)!r}")

        try:
            await _start_components(comps, client, node_args, sched_kwargs, metrics_listen, sched_cfg,
                                    namespace_controller=False,  # the API server's process runs it
                                    ca_files=_ca_files(root_ca_file, cluster_signing_cert_file,
                                                       cluster_signing_key_file),
                                    controller_selection=controller_selection)
            say("ready")
            commands = asyncio.ensure_future(read_commands(command))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({commands, stopped}, return_when=asyncio.FIRST_COMPLETED)
            commands.cancel()
            stopped.cancel()
        finally:
            await comps.stop()
            await client.close()

    _run(go)


#: the environment variable the components process finds its wire token in
WIRE_TOKEN_ENV = "KUBEPLANE_WIRE_TOKEN"


def _load_scheduler_config(path: str | None):
    from kubeplane.scheduler.config import ConfigError, load_config
    from kubeplane.scheduler.plugins.registry import in_tree_registry

    try:
        return load_config(path, in_tree_registry())
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _scheduler_kwargs(path: str | None, cfg=None) -> dict:
    if path is None:
        return {}
    if cfg is None:
        cfg = _load_scheduler_config(path)
    return {
        "profiles": cfg.framework_profiles(),
        "percentage_of_nodes_to_score": cfg.percentage_of_nodes_to_score,
        "pod_initial_backoff": cfg.pod_initial_backoff_seconds,
        "pod_max_backoff": cfg.pod_max_backoff_seconds,
    }


def _http_client(kubeconfig: str | None, context: str | None):
    from kubeplane.client.http import HttpClient
    from kubeplane.client.kubeconfig import KubeconfigError

    try:
        return HttpClient.from_kubeconfig(kubeconfig, context)
    except (KubeconfigError, OSError) as exc:
        raise click.ClickException(f"cannot load kubeconfig: {exc}") from None


_client_options = [
    click.option("--kubeconfig", "kubeconfig", default=None,
                 help="Kubeconfig of the API server (default: $KUBECONFIG or ~/.kube/config)."),
    click.option("--context", default=None, help="Kubeconfig context to use."),
    *_verbosity_options,
]


def client_options(f):
    for opt in reversed(_client_options):
        f = opt(f)
    return f


def _describe_error(exc: BaseException, url: str) -> str:
    """A connection failure worded as client-go's (``dial tcp ...: connect: connection refused``)."""
    import errno as _errno
    import os

    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        reason = os.strerror(err.errno).lower() if getattr(err, "errno", None) and err.errno in _errno.errorcode \
            else str(err)
        return f'Get "{url}": dial tcp {exc.host}:{exc.port}: connect: {reason}'
    if isinstance(exc, asyncio.TimeoutError):
        return f'Get "{url}": context deadline exceeded'
    return f'Get "{url}": {exc}' if str(exc) else f'Get "{url}": {type(exc).__name__}'


async def _wait_for_api(client, stop: asyncio.Event, what: str) -> bool:
    """Until the API server answers ``/version``: log each failure and retry
    with a capped backoff, as upstream components do while the API server is
    away. False when stopped first."""
    from kubeplane.api.errors import StatusError

    delay = 0.5
    url = client.config.server + "/version"
    while not stop.is_set():
        try:
            await client.server_version()
            return True
        except StatusError as err:
            if err.code != 401 and err.code < 500:
                return True  # reachable; the API server has its reasons
            problem = f"{err.code} {err.reason}: {err.message}"
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is logged and retried
            problem = _describe_error(exc, url)
        log.error("%s: cannot reach the API server, retrying in %gs: %s", what, delay, problem)
        if await _stopped_within(stop, delay):
            return False
        delay = min(delay * 2, 30.0)
    return False


async def _stopped_within(stop: asyncio.Event, delay: float) -> bool:
    """Waits ``delay`` seconds of a retry backoff; True if ``stop`` was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), delay)
        return True
    except asyncio.TimeoutError:
        return False


async def _start_retrying(what: str, start, stop: asyncio.Event) -> bool:
    """``await start()`` until it succeeds; each failure (the API server went
    away, caches did not sync) is logged and retried after a capped backoff.
    ``start`` cleans up after itself when it fails. False when stopped first."""
    delay = 1.0
    while not stop.is_set():
        try:
            await start()
            return True
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001
            log.error("%s: start failed, retrying in %gs: %s", what, delay, exc)
        if await _stopped_within(stop, delay):
            return False
        delay = min(delay * 2, 30.0)
    return False


@main.command()
@client_options
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) file.")
@click.option("--leader-elect/--no-leader-elect", default=None,
              help="Coordinate replicas through a Lease (default: the config's leaderElection.leaderElect).")
@click.option("--metrics-listen", default="127.0.0.1:10259", show_default=True, callback=_check_listen,
              help="HOST:PORT for /metrics, /healthz and /configz; empty to disable.")
def scheduler(kubeconfig: str | None, context: str | None, verbosity: int, verbose: bool, config_path: str | None,
              leader_elect: bool | None, metrics_listen: str) -> None:
    """Run the scheduler against any Kubernetes API server."""
    import os
    import socket
    import uuid

    _setup_logging(verbosity, verbose)
    cfg = _load_scheduler_config(config_path)
    elect = cfg.leader_election.leader_elect if leader_elect is None else leader_elect
    client = _http_client(kubeconfig, context)

    async def go(stop: asyncio.Event) -> None:
        from kubeplane.cluster import Components, components_metrics_server
        from kubeplane.leaderelection import LeaderElector
        from kubeplane.scheduler.metrics import SchedulerMetrics
        from kubeplane.scheduler.scheduler import Scheduler

        comps = Components()
        metrics = SchedulerMetrics()
        if metrics_listen:
            server, metrics = components_metrics_server(metrics_listen, cfg, with_scheduler=True,
                                                        with_workqueues=False)
            await comps.start(server)
        identity = f"{socket.gethostname()}_{uuid.uuid4()}"
        sched = Scheduler.from_config(client, cfg, metrics=metrics, identity=identity)
        names = ", ".join(cfg.scheduler_names())
        failed = False
        try:
            if not await _wait_for_api(client, stop, "scheduler"):
                return
            if not elect:
                log.info("kubeplane scheduler running (profiles: %s)", names)
                run = asyncio.create_task(sched.run())
                await asyncio.wait({run, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
                if run.done() and not stop.is_set():
                    failed = True
                    exc = run.exception()
                    log.error("the scheduling loop ended: %r", exc, exc_info=exc)
            else:
                le = cfg.leader_election
                lost = asyncio.Event()

                async def lead() -> None:
                    log.info("became leader %s; scheduling (profiles: %s)", identity, names)
                    await sched.run()

                def stopped() -> None:
                    log.info("leader election lost")
                    lost.set()

                elector = LeaderElector(client, le.resource_namespace, le.resource_name, identity,
                                        lease_duration=le.lease_duration, renew_deadline=le.renew_deadline,
                                        retry_period=le.retry_period, on_started_leading=lead,
                                        on_stopped_leading=stopped)
                task = asyncio.create_task(elector.run())
                await asyncio.wait({task, asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                if task.done() and not task.cancelled() and task.exception() is not None and not stop.is_set():
                    failed = True
                    log.error("leader election ended: %r", task.exception(), exc_info=task.exception())
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                if lost.is_set():
                    os._exit(1)  # as upstream: a replica that lost the lease exits and restarts clean
        finally:
            await sched.stop()
            await comps.stop()
            await client.close()
        if failed:
            sys.exit(1)

    _run(go)


@main.command()
@client_options
@click.option("--provisioner-name", default="kubeplane.io/local", show_default=True, callback=_check_provisioner,
              help="Provisioner name served by the simulated storage provisioner.")
@click.option("--metrics-listen", default="127.0.0.1:10257", show_default=True, callback=_check_listen,
              help="HOST:PORT for the controllers' /metrics (work queues) and /healthz, as "
                   "kube-controller-manager's secure port; empty to disable.")
@_ca_options
@_controllers_option
@_controller_flag_options
@click.option("--use-service-account-credentials", is_flag=True,
              help="Each controller acts as its own ServiceAccount in kube-system (a token of it from the "
                   "TokenRequest API, renewed as it ages), authorized by the bootstrap policy's "
                   "system:controller:* roles, as kube-controller-manager's flag of that name.")
def controllers(kubeconfig: str | None, context: str | None, verbosity: int, verbose: bool, provisioner_name: str,
                metrics_listen: str, root_ca_file: str | None, cluster_signing_cert_file: str | None,
                cluster_signing_key_file: str | None, controller_selection: tuple[str, ...],
                use_service_account_credentials: bool) -> None:
    """Run the controllers against any Kubernetes API server."""
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.cluster import Components, ControllerOptions, start_controllers
    from kubeplane.controllers.manager import ServiceAccountClients

    _setup_logging(verbosity, verbose)
    client = _http_client(kubeconfig, context)
    flags = _controller_flag_values()

    async def go(stop: asyncio.Event) -> None:
        from kubeplane.cluster import components_metrics_server

        outer = Components()
        comps = Components()
        if metrics_listen:
            server, _ = components_metrics_server(metrics_listen, None, with_scheduler=False)
            await outer.start(server)

        async def start() -> None:
            nonlocal comps
            comps = Components()
            factory = SharedInformerFactory(client)
            clients = ServiceAccountClients(client) if use_service_account_credentials else None
            if clients is not None:
                comps.items.append(clients)  # closed after the controllers stop
            try:
                opts = ControllerOptions(provisioner_name=provisioner_name, **_ca_files(
                    root_ca_file, cluster_signing_cert_file, cluster_signing_key_file), **flags)
                await start_controllers(comps, client, factory, opts, controller_selection, clients=clients)
            except BaseException:
                await comps.stop()
                raise

        try:
            if not await _wait_for_api(client, stop, "controllers"):
                return
            if not await _start_retrying("controllers", start, stop):
                return
            log.info("kubeplane controllers running (%d)", sum(hasattr(c, "queue") for c in comps.items))
            await stop.wait()
        finally:
            await comps.stop()
            await outer.stop()
            await client.close()

    _run(go)


@main.command()
@client_options
@_node_options
@click.option("--impersonate-nodes", is_flag=True,
              help="Each simulated node acts as system:node:<name> (group system:nodes) by impersonation; "
                   "the kubeconfig's user needs the impersonate verb (the admin of kubeplane's kubeconfig has it).")
def nodes(kubeconfig: str | None, context: str | None, verbosity: int, verbose: bool, node_count: int,
          node_cpu: str, node_memory: str, node_pods: int, zones: int, node_prefix: str, gpus_per_node: int,
          impersonate_nodes: bool) -> None:
    """Run simulated nodes against any Kubernetes API server."""
    from kubeplane.client.informer import SharedInformerFactory

    _setup_logging(verbosity, verbose)
    client = _http_client(kubeconfig, context)
    client.impersonate_context = impersonate_nodes

    async def go(stop: asyncio.Event) -> None:
        agent = None

        async def start() -> None:
            nonlocal agent
            agent = _node_agent(client, SharedInformerFactory(client), node_count, node_cpu, node_memory,
                                node_pods, zones, node_prefix, gpus_per_node)
            try:
                await agent.start()
            except BaseException:
                await agent.stop()
                agent = None
                raise

        try:
            if not await _wait_for_api(client, stop, "nodes"):
                return
            if not await _start_retrying("nodes", start, stop):
                return
            log.info("%d simulated node(s) running", node_count)
            await stop.wait()
        finally:
            if agent is not None:
                await agent.stop()
            await client.close()

    _run(go)


@main.command("dns")
@client_options
@_dns_options("127.0.0.1:10053")
@click.option("--service-cluster-ip-range", default="10.96.0.0/12", show_default=True,
              callback=lambda ctx, param, value: _check_cidr_range(value),
              help="The cluster's Service range: the kube-dns Service gets its tenth address.")
def dns_command(kubeconfig: str | None, context: str | None, verbosity: int, verbose: bool, dns_addr: str,
                cluster_domain: str, dns_resolv_conf: str, dns_pods: str, dns_advertise_address: str | None,
                dns_metrics_addr: str, service_cluster_ip_range: str) -> None:
    """Run the cluster DNS server against any Kubernetes API server (and keep its kube-dns Service)."""
    from kubeplane.dns.component import ClusterDNS

    _setup_logging(verbosity, verbose)
    if not dns_addr:
        raise click.UsageError("--dns-addr must not be empty here")
    config = _dns_config(dns_addr, cluster_domain, dns_resolv_conf, dns_pods, dns_advertise_address,
                         dns_metrics_addr, service_cluster_ip_range)
    client = _http_client(kubeconfig, context)

    async def go(stop: asyncio.Event) -> None:
        component = ClusterDNS(client, config)
        started = False
        try:
            if not await _wait_for_api(client, stop, "dns"):
                return
            await component.start()
            started = True
            log.info("kubeplane DNS serving %s on %s:%d (kube-dns Service %s)", cluster_domain, component.host,
                     component.port, config.service_ip)
            await stop.wait()
        finally:
            if started:
                await component.stop()
            await client.close()

    _run(go)


def _check_cidr_range(value: str) -> str:
    from kubeplane.registry.servicealloc import parse_service_cidr

    try:
        parse_service_cidr(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@main.command()
@click.argument("workload")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results.")
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="Nodes (scheduler workloads).")
@click.option("--pods", type=click.IntRange(min=1), default=None, help="Measured pods (scheduler workloads).")
@click.option("--storage", type=click.Choice(["memory", "sqlite"]), default="memory", show_default=True,
              help="Storage of the embedded API (scheduler workloads).")
@click.option("--runs", type=click.IntRange(min=1), default=None,
              help="Repetitions. api: per measurement, medians reported (default 3). Scheduler "
                   "workloads: whole runs, the one with the median throughput_avg reported with every "
                   "run's throughput (default 1).")
@click.option("--split", is_flag=True,
              help="Run the scheduler and controllers in a second process (scheduler workloads).")
@click.option("--pv-interval-ms", type=click.FloatRange(min=0), default=None,
              help="SchedulingPVsChurn: milliseconds between two PV creations (default 10).")
@click.option("--profile", "profile_dir", type=click.Path(file_okay=False), default=None,
              help="Scheduler workloads: cProfile each process over the measured phase, write the "
                   "profiles to this directory and report where the time went (slows the run).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="JobChurn: Jobs to complete (default 200).")
@click.option("--in-flight", type=click.IntRange(min=1), default=None,
              help="JobChurn: Jobs running at a time (default 20).")
def bench(workload: str, as_json: bool, nodes: int | None, pods: int | None, storage: str, runs: int | None,
          split: bool, pv_interval_ms: float | None, profile_dir: str | None, jobs: int | None,
          in_flight: int | None) -> None:
    """Benchmarks, run on demand. WORKLOAD is `api` (API machinery) or a scheduler_perf
    workload: SchedulingBasic, SchedulingPodAntiAffinity, SchedulingPodAffinity,
    SchedulingNodeAffinity, TopologySpreading, PreemptionBasic, PreemptionAsync, Unschedulable,
    SchedulingInTreePVs, SchedulingCSIPVs, SchedulingPVsChurn,
    SchedulingWithResourceClaimTemplate, SteadyStateClusterResourceClaimTemplate[/half|/full];
    or JobChurn (Jobs of 10 pods on simulated nodes: completion throughput and latency);
    or node (pod start-up on one real node: 50 and 200 pods, or --pods)."""
    import json as _json

    # -- stats --
    if workload == "node":
        for given, hint in ((nodes, "--nodes"), (runs, "--runs"), (pv_interval_ms, "--pv-interval-ms"),
                            (profile_dir, "--profile"), (jobs, "--jobs"), (in_flight, "--in-flight")):
            if given is not None:
                raise click.BadParameter("does not apply to node", param_hint=hint)
        if split or storage != "memory":
            raise click.BadParameter("does not apply to node", param_hint="--split" if split else "--storage")
        from kubeplane.bench.node import DEFAULT_COUNTS, run_cli as run_node

        try:
            out = runtime.run(run_node(counts=(pods,) if pods else DEFAULT_COUNTS, as_json=as_json))
        except (RuntimeError, TimeoutError) as err:
            click.echo(f"Error: {err}", err=True)
            sys.exit(1)
        if any(b.get("timed_out") for b in out["batches"]):
            sys.exit(1)
        return
    # -- end stats --

    if workload == "JobChurn":
        for given, hint in ((pods, "--pods"), (runs, "--runs"), (pv_interval_ms, "--pv-interval-ms"),
                            (profile_dir, "--profile")):
            if given is not None:
                raise click.BadParameter("does not apply to JobChurn", param_hint=hint)
        if split:
            raise click.BadParameter("does not apply to JobChurn", param_hint="--split")
        from kubeplane.bench.jobs import run_cli as run_jobs

        out = runtime.run(run_jobs(jobs=jobs, in_flight=in_flight, nodes=nodes, storage=storage, as_json=as_json))
        if out.get("timed_out"):
            sys.exit(1)
        return
    if jobs is not None or in_flight is not None:
        raise click.BadParameter("applies to JobChurn only", param_hint="--jobs" if jobs is not None else "--in-flight")

    if workload == "api":
        from kubeplane.bench.api import run

        if profile_dir is not None:
            raise click.BadParameter("applies to scheduler workloads only", param_hint="--profile")

        def progress(msg: str) -> None:
            if not as_json:
                click.echo(msg, err=True)

        result = run(runs=3 if runs is None else runs, progress=progress)
        if as_json:
            click.echo(_json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="kubeplane bench api (medians)")
        table.add_column("measurement")
        table.add_column("value", justify="right")
        for k, v in result.items():
            table.add_row(k, str(v))
        Console().print(table)
        return
    from kubeplane.bench.scheduler import get_workload, run_cli

    try:
        get_workload(workload)
    except KeyError as err:
        raise click.BadParameter(str(err.args[0]), param_hint="WORKLOAD") from None
    out = runtime.run(run_cli(workload, nodes=nodes, pods=pods, storage=storage, as_json=as_json, split=split,
                              pv_interval_ms=pv_interval_ms, runs=1 if runs is None else runs,
                              profile_dir=profile_dir))
    if out.get("timed_out"):
        sys.exit(1)


# -- security --
@main.group()
def token() -> None:
    """Bootstrap tokens: what a new node joins the cluster with (as kubeadm's)."""


def _token_run(kubeconfig: str | None, context: str | None, work):
    client = _http_client(kubeconfig, context)

    async def go():
        try:
            return await work(client)
        finally:
            await client.close()

    from kubeplane.api.errors import StatusError

    try:
        return runtime.run(go())
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    except StatusError as err:
        raise click.ClickException(err.message) from None
    except OSError as err:
        raise click.ClickException(_describe_error(err, client.config.server)) from None


@token.command("create")
@click.argument("token_value", metavar="[TOKEN]", required=False)
@click.option("--ttl", type=_Duration(), default="24h", show_default=True,
              help="The duration before the token is automatically deleted (0: never expires).")
@click.option("--description", default="", help="A human friendly description of how this token is used.")
@click.option("--usages", default="signing,authentication", show_default=True,
              help="Describes the ways in which this token can be used.")
@click.option("--groups", default="system:bootstrappers:kubeplane:default-node-token", show_default=True,
              help="Extra groups that this token will authenticate as when used for authentication.")
@click.option("--print-join-command", is_flag=True,
              help="Instead of printing only the token, print the full 'kubeplane node' command that joins a "
                   "node with it.")
@client_options
def token_create(token_value: str | None, ttl: float, description: str, usages: str, groups: str,
                 print_join_command: bool, kubeconfig: str | None, context: str | None, verbosity: int,
                 verbose: bool) -> None:
    """Create a bootstrap token (generated unless TOKEN is given) and print it."""
    from kubeplane.cli import token as tokens

    _setup_logging(verbosity, verbose)
    line = _token_run(kubeconfig, context, lambda client: tokens.create(
        client, token_value, ttl_seconds=ttl, description=description,
        usages=tuple(u.strip() for u in usages.split(",") if u.strip()),
        groups=tuple(g.strip() for g in groups.split(",") if g.strip()), print_join_command=print_join_command))
    click.echo(line)


@token.command("list")
@client_options
def token_list(kubeconfig: str | None, context: str | None, verbosity: int, verbose: bool) -> None:
    """List the bootstrap tokens."""
    from kubeplane.cli import token as tokens

    _setup_logging(verbosity, verbose)
    rows = _token_run(kubeconfig, context, tokens.list_tokens)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


@token.command("delete")
@click.argument("tokens_given", metavar="TOKEN...", nargs=-1, required=True)
@client_options
def token_delete(tokens_given: tuple[str, ...], kubeconfig: str | None, context: str | None, verbosity: int,
                 verbose: bool) -> None:
    """Delete bootstrap tokens (by id or whole token)."""
    from kubeplane.cli import token as tokens

    _setup_logging(verbosity, verbose)
    for t in tokens_given:
        click.echo(_token_run(kubeconfig, context, lambda client, t=t: tokens.delete(client, t)))


# -- agent --


class _UpRealNode:
    """The real node of ``kubeplane up``: a ManagedNode reaching the API server
    over HTTPS as system:node:<name> (group system:nodes), with a client
    certificate of the cluster CA written to ``<data-dir>/node/kubelet.kubeconfig``."""

    def __init__(self, server, config) -> None:
        self.server = server
        self.config = config
        self.managed = None
        self.client = None

    def _kubeconfig(self) -> str:
        import os

        from kubeplane.auth import pki
        from kubeplane.client.kubeconfig import write_kubeconfig

        own = pki.PKI(os.path.join(self.server.config.data_dir, "pki"))
        cert, key = pki.issue(own.ca_cert, own.ca_key, f"system:node:{self.config.name}", orgs=("system:nodes",))
        path = os.path.join(self.config.data_dir, "kubelet.kubeconfig")
        os.makedirs(self.config.data_dir, mode=0o700, exist_ok=True)
        write_kubeconfig(path, self.server.url, ca_data=own.ca_pem, client_cert_data=pki.cert_pem(cert),
                         client_key_data=pki.key_pem(key))
        return path

    async def start(self) -> None:
        from kubeplane.client.http import HttpClient
        from kubeplane.node.agent import ManagedNode
        from kubeplane.startup import StartupError

        try:
            self.client = HttpClient.from_kubeconfig(await asyncio.to_thread(self._kubeconfig))
            self.managed = ManagedNode(self.client, self.config)
            await self.managed.start()
        except Exception as err:  # noqa: BLE001 - one line and exit 1, as any start-up failure
            self.managed = None
            if self.client is not None:
                await self.client.close()
                self.client = None
            raise StartupError(f"the real node {self.config.name} did not start: {err}") from err

    async def stop(self) -> None:
        if self.managed is not None:
            await self.managed.stop()
            self.managed = None
        if self.client is not None:
            await self.client.close()
            self.client = None


def _node_cidrs_unassigned(controller_selection: tuple[str, ...]) -> str | None:
    """Why the node IPAM controller of ``up`` assigns no pod CIDRs (None: it does)."""
    from kubeplane.cluster import CONTROLLERS
    from kubeplane.controllers.manager import select_controllers

    flags = _controller_flag_values()
    if not any(d.name == "node-ipam-controller" for d in select_controllers(CONTROLLERS, controller_selection)):
        return "no pod CIDR for it: the node-ipam-controller is not enabled (--controllers)"
    if not flags.get("allocate_node_cidrs") or not flags.get("cluster_cidr"):
        return "no pod CIDR for it: the node IPAM controller assigns none without --allocate-node-cidrs and " \
               "--cluster-cidr"
    return None


def _up_real_node(server, data_dir: str, mode: str, name: str | None, kubelet_port: int = 10250,
                  controller_selection: tuple[str, ...] = ("*",), **kubelet_dns):
    """The real node of ``up`` (None: none). Its pod CIDR is the one the node
    IPAM controller assigns. ``auto``: one when the host can run it, else one
    log line why not; ``on``: that reason is an error."""
    import os

    from kubeplane.node.agent import default_node_name

    if mode == "off":
        return None
    why = _real_node_available() or _node_cidrs_unassigned(controller_selection)
    if why:
        if mode == "on":
            _fail(f"--real-node on: {why}")
        log.info("no real node (--real-node auto): %s", why)
        return None
    # the API server on loopback (the default): the node's addresses and kubelet API stay there too
    import ipaddress

    host = server.config.listen.rpartition(":")[0].strip("[]")
    try:
        node_ip = "127.0.0.1" if ipaddress.ip_address(host).is_loopback else None
    except ValueError:
        node_ip = "127.0.0.1" if host == "localhost" else None
    config = _real_node_config(name or default_node_name(), os.path.join(data_dir, "node"), node_ip, 110, {},
                               kubelet_port, None, **kubelet_dns)
    return _UpRealNode(server, config)


def _check_log_size(ctx, param, value):
    from kubeplane.api.quantity import parse_quantity

    try:
        size = parse_quantity(value)
    except (ValueError, TypeError):
        raise click.BadParameter(f"invalid quantity {value!r}") from None
    if size <= 0:
        raise click.BadParameter(f"{value!r}: must be more than 0")
    return int(size)


def _check_reserved(ctx, param, value):
    from kubeplane.node.host import parse_reserved

    try:
        return parse_reserved(value or "")
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _check_node_labels(ctx, param, value):
    from kubeplane.api.strings import is_qualified_name, is_valid_label_value

    labels: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        key, sep, val = item.strip().partition("=")
        if not sep:
            raise click.BadParameter(f"invalid label {item.strip()!r}: the form is key=value[,key=value]")
        problems = is_qualified_name(key) + is_valid_label_value(val)
        if problems:
            raise click.BadParameter(f"invalid label {item.strip()!r}: {'; '.join(problems)}")
        labels[key] = val
    return labels


def _check_node_ip(ctx, param, value):
    if value is None:
        return None
    from kubeplane.node.host import HostError, validate_node_ip

    try:
        return validate_node_ip(value)
    except HostError as err:
        raise click.BadParameter(str(err)) from None


def _check_cidr(ctx, param, value):
    if not value:
        return None
    import ipaddress

    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise click.BadParameter(f"invalid CIDR address: {value}") from None


def _check_node_name(ctx, param, value):
    if value is None:
        return None
    from kubeplane.api.strings import is_dns1123_subdomain

    problems = is_dns1123_subdomain(value)
    if problems:
        raise click.BadParameter(f"invalid node name {value!r}: {'; '.join(problems)}")
    return value


_real_node_options = [
    click.option("--node-ip", default=None, callback=_check_node_ip,
                 help="IP address of the node (its InternalIP); default: the address of the default route."),
    click.option("--max-pods", type=click.IntRange(min=1), default=110, show_default=True,
                 help="Pods this node runs at most (its pods capacity)."),
    click.option("--system-reserved", default="", callback=_check_reserved,
                 help="Resources kept for the system, out of allocatable: cpu=500m,memory=1Gi,"
                      "ephemeral-storage=1Gi,pid=100."),
    click.option("--cri-socket", default=None,
                 help="CRI endpoint of a running container runtime (unix:///run/containerd/containerd.sock); "
                      "default: a containerd the node starts under <data-dir>/containerd."),
    click.option("--pod-infra-container-image", "sandbox_image", default=None,
                 help="The sandbox (pause) image of the node's own containerd; default: "
                      "kubeplane.local/pause:3.10, built from the host's busybox when missing. Another "
                      "(registry.k8s.io/pause:3.10) is pulled when missing."),
    click.option("--kubelet-port", type=click.IntRange(min=0, max=65535), default=10250, show_default=True,
                 help="Port of the node's kubelet API (logs, exec, port-forward)."),
    click.option("--pod-cidr", default=None, callback=_check_cidr,
                 help="The node's pod CIDR; default: spec.podCIDR, which the node IPAM controller assigns."),
    click.option("--cgroup-root", default="/", show_default=True,
                 help="The cgroup the pods' cgroups go under (kubepods/...); nodes sharing a host "
                      "need different ones."),
    click.option("--cgroups-per-qos/--no-cgroups-per-qos", default=True, show_default=True,
                 help="Give each pod a cgroup under the QoS hierarchy, its sandbox's cgroup parent."),
    click.option("--cluster-dns", default="", callback=lambda ctx, param, value: _check_cluster_dns(ctx, param, value),
                 help="Comma-separated IPs of the cluster DNS server (the kube-dns Service's ClusterIP, "
                      "10.96.0.10 by default); pods with dnsPolicy ClusterFirst get them as nameservers. "
                      "Without, they resolve as the node."),
    click.option("--cluster-domain", default="cluster.local", show_default=True,
                 callback=lambda ctx, param, value: _check_cluster_domain(ctx, param, value),
                 help="The cluster's DNS domain, searched by pods in addition to the host's search domains."),
    click.option("--resolv-conf", default="/etc/resolv.conf", show_default=True,
                 help="The resolver configuration pods with dnsPolicy Default get (\"\": none)."),
]


def _check_cluster_dns(ctx, param, value):
    import ipaddress

    out = []
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(str(ipaddress.ip_address(item)))
        except ValueError:
            raise click.BadParameter(f"{item!r} is not an IP address") from None
    return out


def _real_node_option_decorators(f):
    for opt in reversed(_real_node_options):
        f = opt(f)
    return f


def _verbosity_option_decorators(f):
    for opt in reversed(_verbosity_options):
        f = opt(f)
    return f


def _real_node_config(name: str, data_dir: str, node_ip, max_pods, system_reserved, kubelet_port, pod_cidr,
                      images_dir=None, labels=None, cgroup_root="/", cgroups_per_qos=True, cluster_dns=(),
                      cluster_domain="cluster.local", resolv_conf="/etc/resolv.conf"):
    import os

    from kubeplane.node.agent import AgentConfig

    return AgentConfig(name=name, data_dir=os.path.abspath(data_dir), node_ip=node_ip, max_pods=max_pods,
                       system_reserved=system_reserved, kubelet_port=kubelet_port, pod_cidr=pod_cidr,
                       images_dir=os.path.abspath(images_dir) if images_dir else None, labels=labels or {},
                       cgroup_root=cgroup_root, cgroups_per_qos=cgroups_per_qos, cluster_dns=list(cluster_dns),
                       cluster_domain=cluster_domain, resolv_conf=resolv_conf)


def _real_node_available() -> str | None:
    """Why this host cannot run a real node with its own containerd (None: it can)."""
    import os
    import shutil

    from kubeplane.node.containerd import find_cni_bin_dir

    if os.geteuid() != 0:
        return "a node's own containerd needs root"
    for binary in ("containerd", "containerd-shim-runc-v2", "runc", "ctr"):
        if shutil.which(binary) is None:
            return f"{binary} not found: install containerd and runc"
    try:
        find_cni_bin_dir()
    except FileNotFoundError as err:
        return str(err)
    return None


def _check_cidrs(ctx, param, value):
    import ipaddress

    out = []
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        if item == "primary" and param.name == "nodeport_addresses":
            out.append(item)
            continue
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise click.BadParameter(f"invalid CIDR address: {item}") from None
    if "primary" in out and len(out) > 1:
        raise click.BadParameter("'primary' cannot be combined with CIDRs")
    return out


def _proxy_families(value: str) -> tuple[str, ...]:
    return {"ipv4": ("ipv4",), "ipv6": ("ipv6",), "dual": ("ipv4", "ipv6")}[value]


_proxy_options = [
    click.option("--proxy-min-sync-period", "min_sync_period", type=click.FloatRange(min=0), default=1.0,
                 show_default=True, help="Seconds between two syncs of the Service rules at least."),
    click.option("--proxy-sync-period", "sync_period", type=click.FloatRange(min=0.1), default=30.0,
                 show_default=True, help="Seconds after which a failed sync is retried; a sync runs that often."),
    click.option("--cluster-cidr", "local_cidrs", default="", callback=_check_cidrs,
                 help="The pods' addresses (CIDR[,CIDR]): ClusterIP traffic from elsewhere is masqueraded; "
                      "default for a node: its pod CIDR."),
    click.option("--nodeport-addresses", default="", callback=_check_cidrs,
                 help="Where NodePorts answer: CIDRs whose local addresses do, or 'primary' (the node IPs); "
                      "default: every local address but loopback."),
    click.option("--ip-families", "ip_families", type=click.Choice(["ipv4", "ipv6", "dual"]), default="ipv4",
                 show_default=True, help="The nftables tables made: ip, ip6 or both."),
]


def _proxy_option_decorators(f):
    for opt in reversed(_proxy_options):
        f = opt(f)
    return f


@main.command("node")
@click.option("--kubeconfig", "kubeconfig", default=None,
              help="Kubeconfig of the node (its identity: system:node:<name>); default: "
                   "<data-dir>/kubelet.kubeconfig when a join wrote one.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("--server", default=None, help="Join this API server (https://HOST:PORT) with --token.")
@click.option("--token", default=None, help="A bootstrap token (abcdef.0123456789abcdef) to join with.")
@click.option("--ca-cert-hash", default=None,
              help="sha256:<hex> of the cluster CA's public key, checked when joining.")
@click.option("--discovery-timeout", type=_Duration(), default="5m0s", show_default=True,
              help="How long a join waits for the cluster-info ConfigMap signed for its token.")
@click.option("--name", "node_name", default=None, callback=_check_node_name,
              help="Node name; default: the hostname.")
@click.option("--data-dir", default="/var/lib/kubeplane/node", show_default=True, callback=_check_not_empty,
              help="The node's directory: pods, logs, images, its containerd.")
@click.option("--images-dir", default=None,
              help="Image archives imported at start and when they appear; default: <data-dir>/images.")
@click.option("--node-labels", default="", callback=_check_node_labels,
              help="Labels of the node: key=value[,key=value].")
@click.option("--container-log-max-size", default="10Mi", show_default=True, callback=_check_log_size,
              help="A container's log is rotated when it reaches this size (a quantity: 10Mi, 500Ki).")
@click.option("--container-log-max-files", type=click.IntRange(min=2), default=5, show_default=True,
              help="Log files kept per container, the current one included.")
@click.option("--streaming-connection-idle-timeout", "streaming_idle_timeout", type=_Duration(), default="4h0m0s",
              show_default=True, help="An exec, attach or port-forward with no data either way for this long is "
                                      "closed.")
@click.option("--pod-routes/--no-pod-routes", default=True, show_default=True,
              help="Route the other nodes' pod CIDRs through them (the nodes share a link) and masquerade what "
                   "the pods send outside the pods' networks.")
@click.option("--network-policy-kubeconfig", "network_policy", default=None,
              help="Enforce the NetworkPolicies on the node's pods (nftables rules of the node's own), reading "
                   "pods, namespaces and policies with this kubeconfig (the kube-system ServiceAccount "
                   "kubeplane-network-policy is bound to that; a node's own identity may not list every pod). "
                   "Default: no enforcement.")
@_real_node_option_decorators
@click.option("--proxy/--no-proxy", "run_proxy", default=True, show_default=True,
              help="Run the Service proxy (nftables rules for Services, as kube-proxy) in the node.")
@_proxy_option_decorators
@_verbosity_option_decorators
def node(kubeconfig, context, server, token, ca_cert_hash, discovery_timeout, node_name, data_dir, images_dir,
         node_labels, container_log_max_size, container_log_max_files, streaming_idle_timeout, pod_routes,
         network_policy, node_ip, max_pods, system_reserved, cri_socket, sandbox_image, kubelet_port, pod_cidr,
         cgroup_root, cgroups_per_qos, cluster_dns, cluster_domain, resolv_conf, run_proxy, min_sync_period, sync_period, local_cidrs,
         nodeport_addresses, ip_families, verbosity, verbose) -> None:
    """Run a node: a kubelet running the pods bound to it in containers, through the CRI."""
    import os
    import shutil

    from kubeplane.node.agent import DEFAULT_SANDBOX_IMAGE, ManagedNode, default_node_name

    _setup_logging(verbosity, verbose)
    name = node_name or default_node_name()
    if (server is None) != (token is None):
        raise click.UsageError("--server and --token go together (a join)")
    if kubeconfig and server:
        raise click.UsageError("--kubeconfig and --server/--token exclude each other")
    if cri_socket is None:
        why = _real_node_available()
        if why:
            _fail(f"cannot run the node's own containerd: {why} (or give --cri-socket)")
    elif sandbox_image is not None:
        raise click.UsageError("--pod-infra-container-image applies to the node's own containerd; "
                               "with --cri-socket the runtime's configuration names its sandbox image")
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    joined = os.path.join(data_dir, "kubelet.kubeconfig")
    config = _real_node_config(name, data_dir, node_ip, max_pods, system_reserved, kubelet_port, pod_cidr,
                               images_dir, node_labels, cgroup_root, cgroups_per_qos, cluster_dns=cluster_dns,
                               cluster_domain=cluster_domain, resolv_conf=resolv_conf)
    config.container_log_max_size = container_log_max_size
    config.container_log_max_files = container_log_max_files
    config.streaming_idle_timeout = streaming_idle_timeout
    config.pod_routes = pod_routes
    if network_policy is not None and not os.path.isfile(network_policy):
        raise click.BadParameter(f"{network_policy}: no such file", param_hint="--network-policy-kubeconfig")
    config.network_policy_kubeconfig = os.path.abspath(network_policy) if network_policy else None
    if run_proxy:
        from kubeplane.proxy import ProxyConfig

        if shutil.which("nft") is None:
            _fail("nft not found: install nftables (or give --no-proxy)")
        config.proxy = ProxyConfig(node_name=name, node_ips=[node_ip] if node_ip else [],
                                   families=_proxy_families(ip_families), min_sync_period=min_sync_period,
                                   sync_period=sync_period, local_cidrs=local_cidrs,
                                   nodeport_addresses=nodeport_addresses)

    async def go(stop: asyncio.Event) -> None:
        nonlocal kubeconfig
        if server is not None and not os.path.exists(joined):
            try:
                from kubeplane.client.bootstrap import JoinError, join
            except ImportError:
                _fail("this kubeplane cannot join with a bootstrap token: give --kubeconfig")
            try:
                await join(server, token, name, joined, ca_cert_hash=ca_cert_hash,
                           discovery_timeout=discovery_timeout)
            except JoinError as err:
                _fail(f"joining {server}: {err}")
            log.info("node %s joined %s: its kubeconfig is %s", name, server, joined)
        if kubeconfig is None:
            if not os.path.exists(joined):
                _fail("no kubeconfig: give --kubeconfig, or --server and --token to join")
            kubeconfig = joined
        client = _http_client(kubeconfig, context)
        managed = ManagedNode(client, config, cri_socket=cri_socket,
                              sandbox_image=sandbox_image or DEFAULT_SANDBOX_IMAGE)
        started = False

        async def start() -> None:
            await managed.start()

        try:
            if not await _wait_for_api(client, stop, "node"):
                return
            if not await _start_retrying("node", start, stop):
                return
            started = True
            log.info("node %s running (data directory %s)", name, config.data_dir)
            await stop.wait()
        finally:
            if started:
                await managed.stop()
            await client.close()

    _run(go)


@main.command("proxy")
@client_options
@click.option("--node-name", default=None, callback=_check_node_name,
              help="The node this proxy runs on (endpoints there are local); default: the hostname.")
@click.option("--node-ip", "node_ips", multiple=True, callback=lambda c, p, v: [_check_node_ip(c, p, x) for x in v],
              help="An address of the node (repeatable; for loadBalancerSourceRanges and 'primary').")
@click.option("--netns", default=None,
              help="Program this network namespace (ip netns exec NAME nft ...) instead of the process's own.")
@click.option("--keep-rules/--no-keep-rules", default=False, show_default=True,
              help="Leave the nftables tables in place when stopping.")
@_proxy_option_decorators
def proxy(kubeconfig, context, verbosity, verbose, node_name, node_ips, netns, keep_rules, min_sync_period,
          sync_period, local_cidrs, nodeport_addresses, ip_families) -> None:
    """Run the Service proxy: nftables rules for the cluster's Services on this node (kube-proxy)."""
    import shutil

    from kubeplane.node.agent import default_node_name
    from kubeplane.proxy import ProxyConfig, ServiceProxy

    _setup_logging(verbosity, verbose)
    if shutil.which("nft") is None:
        _fail("nft not found: install nftables")
    config = ProxyConfig(node_name=node_name or default_node_name(), node_ips=list(node_ips),
                         families=_proxy_families(ip_families), min_sync_period=min_sync_period,
                         sync_period=sync_period, local_cidrs=local_cidrs, nodeport_addresses=nodeport_addresses,
                         command_prefix=["ip", "netns", "exec", netns] if netns else [],
                         keep_rules_on_stop=keep_rules)

    async def go(stop: asyncio.Event) -> None:
        client = _http_client(kubeconfig, context)
        service_proxy = ServiceProxy(client, config)
        started = False
        try:
            if not await _wait_for_api(client, stop, "proxy"):
                return
            if not await _start_retrying("proxy", service_proxy.start, stop):
                return
            started = True
            log.info("proxy for node %s running", config.node_name)
            await stop.wait()
        finally:
            if started:
                await service_proxy.stop()
            await client.close()

    _run(go)


@main.group()
def images() -> None:
    """A node's images."""


@images.command("import")
@click.argument("archives", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--data-dir", default="/var/lib/kubeplane/node", show_default=True, callback=_check_not_empty,
              help="The node whose own containerd imports them.")
@click.option("--cri-socket", default=None,
              help="The containerd socket to import into instead (unix:///run/containerd/containerd.sock).")
def images_import(archives, data_dir, cri_socket) -> None:
    """Import image archives (OCI image layout or docker save tars) into a node's runtime."""
    import os

    from kubeplane.node.containerd import ContainerdPaths
    from kubeplane.node.images import ImageError, import_archive

    address = cri_socket.removeprefix("unix://") if cri_socket else \
        ContainerdPaths(os.path.abspath(os.path.join(data_dir, "containerd"))).socket
    for archive in archives:
        if not os.path.exists(archive):
            _fail(f"open {archive}: no such file or directory")
    if not os.path.exists(address):
        _fail(f"no containerd at {address}: is the node running? (or give --cri-socket)")
    for archive in archives:
        try:
            names = runtime.run(import_archive(address, os.path.abspath(archive)))
        except ImageError as err:
            _fail(str(err))
        for n in names:
            click.echo(f"imported {n}")
        if not names:
            click.echo(f"{archive}: no image names in the archive")


if __name__ == "__main__":  # pragma: no cover
    main()
