"""The :class:`Cluster` of :mod:`kubeplane.testing`.

Everything heavy (aiohttp, the registry, the scheduler, the official client)
is imported when a cluster starts or a method needs it, so that importing
``kubeplane.testing`` (which the pytest plugin does only when a fixture is
used) stays cheap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING, Any, Coroutine, Literal, TypeVar

from kubeplane.testing._manifests import Manifest, ManifestError, load_documents

if TYPE_CHECKING:
    from kubeplane.testing._wait import Condition, Predicate

log = logging.getLogger("kubeplane.testing")

T = TypeVar("T")

#: the field manager of :meth:`Cluster.apply` unless one is given
FIELD_MANAGER = "kubeplane-testing"
#: what kubectl asks the server for on apply and create by default
_VALIDATE_MODES = ("Strict", "Warn", "Ignore")



#: where throw-away clusters keep the PKI they share (see :func:`testing_pki_dir`)
PKI_DIR_ENV = "KUBEPLANE_TESTING_PKI_DIR"


def testing_pki_dir() -> str:
    """The PKI the clusters of this user share when their data is thrown
    away with them: ``$KUBEPLANE_TESTING_PKI_DIR``, else
    ``$XDG_CACHE_HOME/kubeplane/testing-pki`` (``~/.cache/...``). A CA,
    the API server's certificate for 127.0.0.1 and the admin's, made on
    the first start, renewed as they near their end: a cluster that makes
    no certificate starts without importing the cryptography library."""
    explicit = os.environ.get(PKI_DIR_ENV)
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "kubeplane", "testing-pki")


def _prepare_pki(directory: str, *, durable: bool, shared: bool) -> bool:
    """Make (or check) the cluster's CA, serving and admin certificates
    and ServiceAccount key in ``directory`` while another thread imports
    the HTTP server: a first start in a process is mostly imports (aiohttp's
    default client TLS contexts read the system's CA bundle on first use,
    not at import: :mod:`kubeplane.httpstack`). A ``shared``
    directory is worked on under a file lock (clusters of other processes
    use it too). False when the directory cannot be used."""
    import sys

    importer = None
    if "aiohttp.web" not in sys.modules:
        def load() -> None:
            try:
                from kubeplane.httpstack import import_aiohttp_web

                import_aiohttp_web()
            except BaseException:  # noqa: BLE001 - the server's own import reports it
                pass

        importer = threading.Thread(target=load, name="kubeplane-testing-import", daemon=True)
        importer.start()
    try:
        from kubeplane.apiserver.security import ADMIN_CLIENT
        from kubeplane.auth import pki

        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            lock = open(os.path.join(directory, ".lock"), "a") if shared else None
        except OSError:
            return False
        try:
            if lock is not None:
                import fcntl

                fcntl.flock(lock, fcntl.LOCK_EX)
            own = pki.ensure_pki(directory, durable=durable)
            own.serving_pair(pki.serving_names("127.0.0.1"))
            own.client_pair(*ADMIN_CLIENT)
            own.service_account_signing_key_file()
        except (OSError, ValueError):
            if not shared:
                raise
            return False
        finally:
            if lock is not None:
                lock.close()
        return True
    finally:
        if importer is not None:
            importer.join()


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_resume = False


class _GCPause:
    """The cyclic garbage collector paused while a cluster starts (until its
    server and components run; the ``crds`` and ``manifests`` are installed
    with it on): a first start allocates a few hundred thousand objects that
    live as long as the process (modules, classes, the API catalogue), and
    the hundred or so collections they would set off find nothing to free.
    Process-wide, so counted across clusters starting at once; a collector
    its program disabled stays disabled."""

    def __init__(self) -> None:
        global _gc_pauses, _gc_resume
        import gc

        with _gc_lock:
            if _gc_pauses == 0:
                _gc_resume = gc.isenabled()
                gc.disable()
            _gc_pauses += 1
        self._paused = True

    def resume(self) -> None:
        global _gc_pauses
        import gc

        with _gc_lock:
            if not self._paused:
                return
            self._paused = False
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()


def _wait_module() -> Any:
    """:mod:`kubeplane.testing._wait`, imported when a cluster first waits
    (its classes are a few milliseconds of a first start)."""
    from kubeplane.testing import _wait

    return _wait


def __getattr__(name: str) -> Any:
    if name in ("WaitTimeout", "make_predicate"):
        return getattr(_wait_module(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Cluster:
    """A kubeplane API server on ``127.0.0.1`` (a free port, HTTPS: a CA,
    serving and admin certificates made in a temporary directory, which the
    kubeconfig carries) with,
    optionally, the scheduler, the controllers and simulated nodes, for tests.

    ``with Cluster() as c:`` runs it in a background thread on an event loop
    of its own (uvloop unless ``KUBEPLANE_EVENT_LOOP=asyncio``), so blocking
    clients (kubectl, the official ``kubernetes`` client) can be used from the
    test. ``async with Cluster() as c:`` runs it in the caller's event loop:
    use the ``*_async`` methods and asyncio clients then, since a blocking call
    from that loop would stop the server it waits for.

    Options: ``storage`` ``"memory"`` (default) or ``"sqlite"`` (in a
    temporary data directory removed at exit, or in ``data_dir``, which is
    kept); ``scheduler``, ``controllers`` (all of kubeplane's, with the
    Deployment and ReplicaSet controllers and the garbage collector); ``nodes``
    simulated nodes ``node-0``..``node-<n-1>`` of ``node_cpu``,
    ``node_memory`` and ``node_pods``, which run the pods bound to them;
    ``manifests``, applied (as :meth:`apply`) before the cluster is handed
    over, in the order given; ``crds``, a file or directory of
    CustomResourceDefinitions (or a list of them), applied before the
    manifests and waited for until each is Established, as envtest's
    CRDInstallOptions do (a directory's files, not its subdirectories).
    """

    def __init__(
        self,
        *,
        storage: Literal["memory", "sqlite"] = "memory",
        scheduler: bool = False,
        controllers: bool = False,
        nodes: int = 0,
        data_dir: str | os.PathLike[str] | None = None,
        manifests: Manifest | list[Manifest] | None = None,
        crds: str | os.PathLike[str] | list[str | os.PathLike[str]] | None = None,
        node_cpu: str = "4",
        node_memory: str = "32Gi",
        node_pods: int = 110,
        start_timeout: float = 60.0,
    ) -> None:
        if storage not in ("memory", "sqlite"):
            raise ValueError(f"storage must be 'memory' or 'sqlite', not {storage!r}")
        if data_dir is not None and storage != "sqlite":
            raise ValueError("data_dir applies to storage='sqlite' only")
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
            raise ValueError(f"nodes must be a count (0 or more), not {nodes!r}")
        self.storage = storage
        self.scheduler = bool(scheduler)
        self.controllers = bool(controllers)
        self.nodes = nodes
        self.node_cpu = node_cpu
        self.node_memory = node_memory
        self.node_pods = node_pods
        self.start_timeout = start_timeout
        self._data_dir_opt = os.fspath(data_dir) if data_dir is not None else None
        if manifests is None:
            self._manifests: list[Manifest] = []
        elif isinstance(manifests, list) and not all(isinstance(m, dict) for m in manifests):
            self._manifests = list(manifests)
        else:
            self._manifests = [manifests]
        if crds is None:
            self._crds: list[Any] = []
        elif isinstance(crds, (str, os.PathLike)):
            self._crds = [crds]
        else:
            self._crds = list(crds)
        #: ``https://127.0.0.1:PORT`` while running
        self.url = ""
        #: a kubeconfig file for this cluster (context ``kubeplane``, namespace ``default``) while running
        self.kubeconfig = ""
        #: the SQLite data directory (storage="sqlite") while running
        self.data_dir: str | None = None
        self._mode: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._thread: threading.Thread | None = None
        self._stop_event: asyncio.Event | None = None
        self._start_error: BaseException | None = None
        self._stop_error: BaseException | None = None
        self._tmpdir: str | None = None
        self._pki_dir: str | None = None
        self._server: Any = None
        self._comps: Any = None
        self._client: Any = None
        self._api_clients: list[Any] = []

    def __repr__(self) -> str:
        state = self.url or "stopped"
        return (f"<kubeplane.testing.Cluster {state} storage={self.storage} scheduler={self.scheduler} "
                f"controllers={self.controllers} nodes={self.nodes}>")

    @property
    def running(self) -> bool:
        return self._mode is not None and bool(self.url)

    # -- the synchronous form: a background thread --------------------------

    def __enter__(self) -> "Cluster":
        self._claim("sync")
        ready = threading.Event()
        self._start_error = None
        self._thread = threading.Thread(target=self._thread_main, args=(ready,), name="kubeplane-testing",
                                        daemon=True)
        self._thread.start()
        ready.wait()
        if self._start_error is not None:
            err = self._start_error
            self._thread.join()
            self._finish()
            raise err
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.stop()
        except Exception:
            if exc_type is None:
                raise
            # The block's own exception is the one to see.
            log.exception("stopping the kubeplane test cluster failed")

    def start(self) -> "Cluster":
        """``with Cluster() as c`` without the ``with``: call :meth:`stop` after."""
        return self.__enter__()

    def stop(self) -> None:
        """Stops a cluster started by ``with`` or :meth:`start` (idempotent)."""
        if self._mode != "sync":
            if self._mode == "async":
                raise RuntimeError("this cluster was started with 'async with': it stops when that block ends")
            return
        loop, stop_event, thread = self._loop, self._stop_event, self._thread
        if loop is not None and stop_event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop_event.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if thread is not None:
            thread.join()
        err, self._stop_error = self._stop_error, None
        self._finish()
        if err is not None:
            raise err

    def _thread_main(self, ready: threading.Event) -> None:
        from kubeplane import runtime

        try:
            with asyncio.Runner(loop_factory=runtime.loop_factory()) as runner:
                runner.run(self._serve(ready))
        except BaseException as err:  # noqa: BLE001 - handed to the starting thread
            if not ready.is_set():
                self._start_error = err
            else:
                self._stop_error = err
        finally:
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stop_event = asyncio.Event()
        try:
            await self._astart()
        except BaseException as err:  # noqa: BLE001 - handed to the starting thread
            self._start_error = err
            return
        finally:
            ready.set()
        try:
            await self._stop_event.wait()
        finally:
            try:
                await self._astop()
            except BaseException as err:  # noqa: BLE001 - raised by stop() in the starting thread
                self._stop_error = err

    # -- the asynchronous form: the caller's event loop ----------------------

    async def __aenter__(self) -> "Cluster":
        self._claim("async")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        try:
            await self._astart()
        except BaseException:
            self._finish()
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._astop()
        finally:
            self._finish()

    # -- start and stop, in the cluster's loop ---------------------------------

    def _claim(self, mode: str) -> None:
        if self._mode is not None:
            raise RuntimeError("this cluster is already running")
        self._mode = mode

    async def _astart(self) -> None:
        pause = _GCPause()
        try:
            await self._astart_paused(pause)
        finally:
            pause.resume()

    async def _astart_paused(self, pause: "_GCPause") -> None:
        self._tmpdir = tempfile.mkdtemp(prefix="kubeplane-testing-")
        if self.storage == "sqlite":
            self.data_dir = self._data_dir_opt or os.path.join(self._tmpdir, "data")
        kubeconfig = os.path.join(self._tmpdir, "kubeconfig")
        scratch = os.path.join(self._tmpdir, "data")
        data_dir = self.data_dir or scratch
        # a cluster whose data goes with it uses the PKI the user's throw-away
        # clusters share; one that keeps its data, its own (in the data directory)
        pki_dir = testing_pki_dir() if data_dir == scratch else os.path.join(data_dir, "pki")
        if not _prepare_pki(pki_dir, durable=True, shared=data_dir == scratch):
            pki_dir = os.path.join(scratch, "pki")
            _prepare_pki(pki_dir, durable=False, shared=False)
        self._pki_dir = pki_dir

        from kubeplane.apiserver.app import APIServer, APIServerConfig
        from kubeplane.client.inprocess import InProcessClient
        from kubeplane.cluster import namespace_controller, service_account_controller

        self._server = APIServer(APIServerConfig(
            data_dir=data_dir, listen="127.0.0.1:0",
            storage=self.storage, kubeconfig=kubeconfig, component_kubeconfigs=False, pki_dir=pki_dir,
            # the PKI of a directory removed with the cluster is not synced to disk
            durable_pki=pki_dir != os.path.join(scratch, "pki"),
            # nor its kubeconfig, in the cluster's temporary directory
            durable_kubeconfig=False),
            # namespaces finish deleting and pods get their ServiceAccount without the
            # controllers too; with them these are two of them
            in_process=[] if self.controllers else [namespace_controller, service_account_controller])
        try:
            async with asyncio.timeout(self.start_timeout):
                await self._server.start()
                self._client = InProcessClient(self._server.registry, field_manager=FIELD_MANAGER)
                if self.scheduler or self.controllers or self.nodes:
                    await self._start_components()
                self.url = self._server.url
                self.kubeconfig = kubeconfig
                pause.resume()
                await self._install()
        except TimeoutError:
            await self._astop()
            raise TimeoutError(f"the cluster did not start within {self.start_timeout:g}s") from None
        except BaseException:
            await self._astop()
            raise

    async def _start_components(self) -> None:
        from kubeplane.client.inprocess import InProcessClient
        from kubeplane.cluster import Components, ControllerOptions, cluster_ca_options, start_components

        self._comps = Components()
        client = InProcessClient(self._server.registry, field_manager="kubeplane")
        node_args = ((self.nodes, self.node_cpu, self.node_memory, self.node_pods, 0, "node", 0)
                     if self.nodes else None)
        # the cluster CA the API server keeps in its data directory, if it made one
        ca = cluster_ca_options(self._server.config.data_dir, pki_dir=self._pki_dir)
        await start_components(self._comps, client, node_args, {}, controllers=self.controllers,
                               scheduler=self.scheduler, controller_options=ControllerOptions(**ca))

    async def _install(self) -> None:
        """What the cluster holds before it is handed over: the ``crds``,
        applied and Established, then the ``manifests``."""
        await self._install_crds()
        for manifest in self._manifests:
            await self._apply(manifest, None, FIELD_MANAGER, True, "Strict", False)

    async def _install_crds(self) -> None:
        names = []
        for path in self._crds:
            if not os.path.exists(path):
                raise ManifestError(f"the CRD path {os.fspath(path)!r} does not exist")
            for doc, origin in load_documents(os.fspath(path) if not isinstance(path, os.PathLike) else path):
                if doc.get("kind") != "CustomResourceDefinition":
                    raise ManifestError(f"{origin}: {doc.get('kind')!r} is not a CustomResourceDefinition")
                applied = await self._apply(doc, None, FIELD_MANAGER, True, "Strict", False)
                names.extend(o["metadata"]["name"] for o in applied)
        for name in names:
            await self._wait("customresourcedefinitions", name, None, None, None,
                             _wait_module().make_predicate(for_=None, condition="Established", jsonpath=None,
                                                           delete=False),
                             self.start_timeout)

    async def _astop(self) -> None:
        for api in self._api_clients:
            try:
                api.close()
            except Exception:  # noqa: BLE001 - keep stopping
                log.exception("closing an ApiClient failed")
        self._api_clients.clear()
        comps, self._comps = self._comps, None
        server, self._server = self._server, None
        self._client = None
        if comps is not None:
            await comps.stop()
        if server is not None:
            await server.stop()

    def _finish(self) -> None:
        """Forget the run and remove its temporary files (in the starting thread)."""
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        self.url = ""
        self.kubeconfig = ""
        self.data_dir = None
        self._loop = None
        self._loop_thread = None
        self._stop_event = None
        self._thread = None
        self._mode = None

    # -- calling into the cluster's loop ---------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T], name: str) -> T:
        loop = self._loop
        if loop is None or not self.running:
            coro.close()
            raise RuntimeError("the cluster is not running")
        if threading.get_ident() == self._loop_thread:
            coro.close()
            raise RuntimeError(f"{name}() would block the event loop the cluster runs in: "
                               f"use 'await cluster.{name}_async(...)'")
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    async def _acall(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or not self.running:
            coro.close()
            raise RuntimeError("the cluster is not running")
        if asyncio.get_running_loop() is loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    # -- clients -----------------------------------------------------------------

    def api_client(self) -> Any:
        """A new official-client ``kubernetes.client.ApiClient`` for this
        cluster; closed when the cluster stops (a ``with`` block may close it
        earlier)."""
        if not self.running:
            raise RuntimeError("the cluster is not running")
        try:
            from kubernetes import client as k8s
        except ImportError as err:
            raise ImportError("api_client() needs the official client: pip install 'kubeplane[testing]' "
                              "(or kubernetes)") from err

        from kubernetes import config as k8s_config

        # From the kubeconfig: the server is verified with the cluster's CA and
        # the client authenticates with the admin certificate.
        api = k8s_config.new_client_from_config(config_file=self.kubeconfig)
        self._api_clients.append(api)
        return api

    # -- apply ---------------------------------------------------------------------

    def apply(self, manifest: Manifest, *, namespace: str | None = None, field_manager: str = FIELD_MANAGER,
              force: bool = True, validate: str = "Strict", recursive: bool = False,
              subresource: str | None = None) -> list[dict]:
        """``kubectl apply --server-side --force-conflicts -f MANIFEST``: every
        object of ``manifest`` (YAML or JSON text, a file, a directory of
        ``.yaml``/``.yml``/``.json`` files, subdirectories with ``recursive``,
        a dict or a list of dicts) is created, or updated to what the manifest
        says, by server-side apply; fields this field manager set before and
        the manifest no longer has are removed, fields others own are kept.

        Objects are applied in order; namespaced ones without a namespace go
        to ``namespace`` (default ``default``). Unknown fields are refused as
        kubectl's default ``--validate=strict`` does (``validate="Warn"``
        logs them, ``"Ignore"`` lets them through). Returns the applied
        objects as the server stored them. ``subresource="status"`` applies
        to the status subresource instead (``kubectl apply --subresource``),
        as a controller or kubelet would. Errors are
        :class:`kubeplane.api.errors.StatusError` (with ``code`` and
        ``reason``) or :class:`ManifestError`."""
        return self._call(self._apply(manifest, namespace, field_manager, force, validate, recursive,
                                      subresource), "apply")

    async def apply_async(self, manifest: Manifest, *, namespace: str | None = None,
                          field_manager: str = FIELD_MANAGER, force: bool = True, validate: str = "Strict",
                          recursive: bool = False, subresource: str | None = None) -> list[dict]:
        """:meth:`apply` for coroutines (from any event loop)."""
        return await self._acall(self._apply(manifest, namespace, field_manager, force, validate, recursive,
                                             subresource))

    async def _apply(self, manifest: Manifest, namespace: str | None, field_manager: str, force: bool,
                     validate: str, recursive: bool, subresource: str | None = None) -> list[dict]:
        from kubeplane.apiserver import openapi

        if validate not in _VALIDATE_MODES:
            raise ValueError(f"validate must be one of {', '.join(_VALIDATE_MODES)}, not {validate!r}")
        docs = load_documents(manifest, recursive=recursive)
        planned = []
        for doc, origin in docs:
            api_version, kind = str(doc["apiVersion"]), str(doc["kind"])
            md = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
            name = md.get("name")
            res = self._server.catalogue.by_api_version_kind(api_version, kind)
            if res is None:
                raise ManifestError(f'resource mapping not found for name: "{name or ""}" namespace: '
                                    f'"{md.get("namespace") or ""}" from "{origin}": no matches for kind '
                                    f'"{kind}" in version "{api_version}"')
            if not name:
                if md.get("generateName"):
                    raise ManifestError(f"from {origin}: cannot use generate name with apply")
                raise ManifestError(f"error validating {origin}: the {kind} has no metadata.name")
            ns = None
            if res.namespaced:
                own = md.get("namespace")
                if own and namespace and own != namespace:
                    raise ManifestError(f'the namespace from the provided object "{own}" does not match the '
                                        f'namespace "{namespace}". You must pass namespace="{own}" to apply it')
                ns = own or namespace or "default"
            planned.append((res, name, ns, doc))
        out = []
        for res, name, ns, doc in planned:
            if validate != "Ignore":
                if res.custom is not None:
                    from kubeplane.api.meta import deep_copy
                    from kubeplane.registry.customresource import prune

                    found = [f'unknown field "{p}"' for p in prune(res, deep_copy(doc))]
                else:
                    found = openapi.check_fields(doc, res.group, res.version, res.kind)
                problems = openapi.enforce(found, validate, kind=res.kind, version=res.version)
                for text in problems:
                    log.warning("%s %s: %s", res.kind, name, text)
            out.append(await self._client.patch(res, name, doc, ns, patch_type="apply", subresource=subresource,
                                                field_manager=field_manager, force=force))
        return out

    # -- get and delete -----------------------------------------------------------

    def get(self, resource: str, name: str | None = None, *, namespace: str | None = None) -> dict:
        """One object (``resource`` as :meth:`wait_for` takes it); a missing one
        raises :class:`kubeplane.api.errors.StatusError` with code 404."""
        return self._call(self._get(resource, name, namespace), "get")

    async def get_async(self, resource: str, name: str | None = None, *, namespace: str | None = None) -> dict:
        return await self._acall(self._get(resource, name, namespace))

    async def _get(self, resource: str, name: str | None, namespace: str | None) -> dict:
        res, name = resolve_resource(resource, name, self._server.catalogue)
        if not name:
            raise ValueError("get needs a name")
        return await self._client.get(res, name, (namespace or "default") if res.namespaced else None)

    def delete(self, resource: str, name: str | None = None, *, namespace: str | None = None,
               ignore_not_found: bool = True) -> dict | None:
        """Starts deleting an object (background propagation, as kubectl);
        returns what the server answered, None when it did not exist (unless
        ``ignore_not_found=False``). Use ``wait_for(..., delete=True)`` to
        wait until it is gone."""
        return self._call(self._delete(resource, name, namespace, ignore_not_found), "delete")

    async def delete_async(self, resource: str, name: str | None = None, *, namespace: str | None = None,
                           ignore_not_found: bool = True) -> dict | None:
        return await self._acall(self._delete(resource, name, namespace, ignore_not_found))

    async def _delete(self, resource: str, name: str | None, namespace: str | None,
                      ignore_not_found: bool) -> dict | None:
        from kubeplane.api.errors import StatusError

        res, name = resolve_resource(resource, name, self._server.catalogue)
        if not name:
            raise ValueError("delete needs a name")
        try:
            return await self._client.delete(res, name, (namespace or "default") if res.namespaced else None,
                                             propagation_policy="Background")
        except StatusError as err:
            if err.code == 404 and ignore_not_found:
                return None
            raise

    # -- wait_for ----------------------------------------------------------------

    def wait_for(self, resource: str, name: str | None = None, *, namespace: str | None = None,
                 condition: str | Condition | None = None, jsonpath: str | None = None, delete: bool = False,
                 for_: str | None = None, label_selector: str | None = None, field_selector: str | None = None,
                 timeout: float = 30.0) -> Any:
        """Waits, as ``kubectl wait`` does, until the object(s) reach a state,
        and returns them.

        ``resource`` is a resource name as kubectl takes it: ``pods``,
        ``pod``, ``po``, ``Pod``, ``deployments.apps``, optionally with
        ``/NAME`` (``deployment/web``). With a ``name`` it waits for that
        object and returns it; without one, for every object matching
        ``label_selector``/``field_selector`` (at least one must exist) and
        returns them sorted by name. What is waited for:

        - nothing given: the object exists (``--for=create``);
        - ``condition="Ready"``, ``"Available=False"``: a status condition of
          that type has that status (``True`` by default) and, where it says
          so, has observed the object's current generation;
        - ``condition=callable``: ``callable(obj)`` is true (a KeyError,
          IndexError, TypeError or AttributeError inside it means "not yet");
          it runs in the cluster's event loop, so it must be quick and must
          not call the cluster's methods;
        - ``jsonpath="{.status.phase}=Running"``: the path's single value,
          printed as kubectl prints it, equals the value;
          ``jsonpath="{.status.podIP}"``: the path finds a value;
        - ``delete=True``: the object (with its UID at the start) is gone,
          returns None;
        - ``for_``: any of these in kubectl's syntax (``"delete"``,
          ``"create"``, ``"condition=Ready"``, ``"jsonpath={.a}=b"``).

        Raises :class:`WaitTimeout` (a TimeoutError) after ``timeout``
        seconds, naming the objects and the state they were last seen in.
        It watches the objects (no polling)."""
        pred = _wait_module().make_predicate(for_=for_, condition=condition, jsonpath=jsonpath, delete=delete)
        return self._call(self._wait(resource, name, namespace, label_selector, field_selector, pred, timeout),
                          "wait_for")

    async def wait_for_async(self, resource: str, name: str | None = None, *, namespace: str | None = None,
                             condition: str | Condition | None = None, jsonpath: str | None = None,
                             delete: bool = False, for_: str | None = None, label_selector: str | None = None,
                             field_selector: str | None = None, timeout: float = 30.0) -> Any:
        """:meth:`wait_for` for coroutines (from any event loop)."""
        pred = _wait_module().make_predicate(for_=for_, condition=condition, jsonpath=jsonpath, delete=delete)
        return await self._acall(self._wait(resource, name, namespace, label_selector, field_selector, pred,
                                            timeout))

    async def _wait(self, resource: str, name: str | None, namespace: str | None, label_selector: str | None,
                    field_selector: str | None, pred: Predicate, timeout: float) -> Any:
        res, name = resolve_resource(resource, name, self._server.catalogue)
        ns = (namespace or "default") if res.namespaced else None
        selectors = [s for s in (field_selector, f"metadata.name={name}" if name else None) if s]
        fs = ",".join(selectors) or None
        where = f" in namespace {ns}" if ns else ""
        target = f"{res.qualified}/{name}" if name else f"{res.qualified} matching {label_selector or fs or 'all'}"
        state: dict[str, dict] = {}
        notes: list[str] = []
        test = _guarded(pred, notes)
        uids: dict[str, str] | None = None  # delete: the objects to see gone

        def done() -> tuple[bool, Any]:
            nonlocal uids
            if pred.delete:
                if uids is None:
                    uids = {k: (o.get("metadata") or {}).get("uid", "") for k, o in state.items()}
                left = [k for k, uid in uids.items()
                        if k in state and (state[k].get("metadata") or {}).get("uid", "") == uid]
                return not left, None
            if name is not None:
                obj = state.get(name)
                return (obj is not None and test(obj)), obj
            if not state:
                return False, None
            objs = [state[k] for k in sorted(state)]
            return all(test(o) for o in objs), objs

        client = self._client
        try:
            async with asyncio.timeout(timeout):
                while True:
                    listed = await client.list(res, ns, label_selector=label_selector, field_selector=fs)
                    state = {o["metadata"]["name"]: o for o in listed.get("items", [])}
                    ok, result = done()
                    if ok:
                        return result
                    watch = client.watch(res, ns, resource_version=listed["metadata"]["resourceVersion"],
                                         label_selector=label_selector, field_selector=fs)
                    try:
                        async for ev in watch:
                            if ev.type == "ERROR":
                                break  # e.g. 410 Gone: list again
                            if ev.type == "BOOKMARK":
                                continue
                            key = (ev.object.get("metadata") or {}).get("name", "")
                            if ev.type == "DELETED":
                                state.pop(key, None)
                            else:
                                state[key] = ev.object
                            ok, result = done()
                            if ok:
                                return result
                    finally:
                        await watch.close()
        except TimeoutError:
            last = [state[k] for k in sorted(state)]
            seen = "; ".join(f"{(o.get('metadata') or {}).get('name')}: {_summary(o)}" for o in last) or "none exist"
            extra = f" ({notes[-1]})" if notes else ""
            raise _wait_module().WaitTimeout(
                f"timed out after {timeout:g}s waiting for {pred.description} on {target}{where}; "
                f"last seen: {seen}{extra}", last) from None


def _guarded(pred: Predicate, notes: list[str]):
    def test(obj: dict) -> bool:
        try:
            return pred.met(obj)
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            if not pred.user:
                raise
            notes[:] = [f"the condition raised {type(err).__name__}: {err}"]
            return False
    return test


def _summary(obj: dict, limit: int = 300) -> str:
    import json

    status = obj.get("status")
    text = json.dumps(status, sort_keys=True, default=str) if status is not None else "no status"
    return text if len(text) <= limit else text[:limit] + "..."


def resolve_resource(resource: str, name: str | None = None, catalogue: Any = None) -> tuple[Any, str | None]:
    """``pods``, ``pod``, ``po``, ``Pod``, ``deployments.apps``, ``deploy/web``
    to the resource (and the name, which may come with it); with a
    ``catalogue``, its custom resources too (``crontabs.stable.example.com``)."""
    from kubeplane.api.resources import RESOURCES

    text, sep, inline = resource.partition("/")
    if sep:
        if not inline:
            raise ValueError(f"no name after '/' in {resource!r}")
        if name is not None and name != inline:
            raise ValueError(f"two names given: {resource!r} and {name!r}")
        name = inline
    word, _, group = text.partition(".")
    lowered = word.lower()
    for r in (catalogue.resources if catalogue is not None else RESOURCES):
        if group and r.group != group:
            continue
        if lowered in (r.plural, r.singular, r.kind.lower()) or lowered in r.short_names:
            return r, name
    raise ValueError(f'the server doesn\'t have a resource type "{text}"')


__all__ = ["Cluster", "ManifestError", "WaitTimeout", "resolve_resource"]
