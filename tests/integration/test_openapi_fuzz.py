"""Property-based HTTP fuzzing of every served operation, generated from /openapi/v3.

A real API server (memory storage) is started in a subprocess; the test reads the
``/openapi/v3`` index, loads every group-version document it lists with schemathesis,
and sends a fixed number of generated requests per operation and generation mode
(schema-conforming and schema-violating data). Generation is derandomised, so every
run sends the same requests for the same documents.

What must hold for every request: no 5xx answer (schemathesis's ``not_a_server_error``)
and no dropped or hung connection; afterwards the server is still healthy (``/healthz``,
a create and a get succeed) and its log holds no traceback.

Half of the examples are anchored (see :func:`_anchor`) so that they reach storage and
the write paths rather than stopping at "namespace not found". A watch gets
``timeoutSeconds=1`` so it ends by itself; generated bodies are bounded by Hypothesis
(checked against ``MAX_BODY``).

Response-conformance checks (status codes, content types, response schemas) are not
used: the documents follow upstream's, which list only the success codes and describe
objects loosely on purpose, so such checks would flag upstream-compatible answers.

``KUBEPLANE_FUZZ_EXAMPLES`` raises the number of examples per operation and mode for
longer local runs; ``KUBEPLANE_FUZZ_OPERATIONS`` restricts the run to operations whose
``METHOD /path`` label contains the given text.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup

from conftest import ServerProcess, start_server

# Examples per operation and generation mode in the suite: 209 operations x 2 modes x 3,
# about 50 s on an idle 2-core machine, nearly all of it spent generating (Hypothesis),
# not waiting for answers.
EXAMPLES = int(os.environ.get("KUBEPLANE_FUZZ_EXAMPLES", "3"))
OPERATIONS = os.environ.get("KUBEPLANE_FUZZ_OPERATIONS", "")
# Generated request bodies stay far below this (the largest seen is about 75 KB).
MAX_BODY = 256 * 1024
# A namespace that exists, so that generated requests get past the namespace lookup.
FUZZ_NAMESPACE = "fuzz"
# Object names of anchored examples: creates store them, the other verbs find them.
NAMES = ("fuzz-a", "fuzz-b")
# (connect, read) seconds: a watch is bounded by timeoutSeconds=1, everything else is quick.
CLIENT_TIMEOUT = (5, 30)
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


@dataclass
class Report:
    requests: int = 0
    operations: int = 0
    http_seconds: float = 0.0  # of the total, the time spent waiting for answers
    codes: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # (group-version path, resource, x-kubernetes-action) of every operation fuzzed.
    covered: set[tuple[str, str, str]] = field(default_factory=set)
    # Digest of every request sent (port left out): equal in every run of the same documents.
    digest: Any = field(default_factory=hashlib.sha256)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    # A server of its own: the fuzz deletes and replaces whatever it reaches.
    srv = start_server(tmp_path_factory.mktemp("fuzz-apiserver"))
    yield srv
    srv.stop()


def _truthy(value: Any) -> bool:
    return value not in (None, False, "", "false", "False", "0", 0)


def _anchor(case: Any, gvk: dict[str, str] | None, name: str) -> None:
    """Makes a generated request plausible enough to reach the code behind the checks.

    Purely random namespaces, kinds and names only ever reach the 404 and 400/422
    answers; an anchored example targets the existing namespace, and for a create or
    replace its body carries the operation's apiVersion and kind and a valid name, so it
    reaches admission, storage and the write paths. ``name`` comes from a small fixed set,
    so reads, replaces, patches and deletes meet objects earlier creates stored. ``gvk``
    is the body's kind, or None when the body is not an object of the operation's kind
    (patches, DeleteOptions).
    """
    params = case.path_parameters or {}
    if "namespace" in params:
        params["namespace"] = FUZZ_NAMESPACE
    if "name" in params:
        params["name"] = name
    query = case.query
    if isinstance(query, dict):
        if query.get("fieldValidation") not in (None, "Ignore", "Strict", "Warn"):
            del query["fieldValidation"]
        if query.get("dryRun") not in (None, "All"):
            del query["dryRun"]
    body = case.body
    if gvk is None or not isinstance(body, dict):
        return
    body["apiVersion"] = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
    body["kind"] = gvk["kind"]
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        meta = body["metadata"] = {}
    if "namespace" in meta or "namespace" in params:
        meta["namespace"] = FUZZ_NAMESPACE
    meta.pop("generateName", None)
    meta["name"] = name


def _bound_watch(case: Any) -> None:
    """A generated watch must end by itself: the server closes it after timeoutSeconds."""
    query = case.query
    if isinstance(query, dict) and _truthy(query.get("watch")):
        query["timeoutSeconds"] = 1


def _body_size(kwargs: dict[str, Any]) -> int:
    data = kwargs.get("data")
    if data is None and "json" in kwargs:
        data = json.dumps(kwargs["json"])  # as requests serialises it
    return len(data) if isinstance(data, (bytes, str)) else 0


def _ensure_namespace(session: requests.Session, url: str) -> None:
    """(Re)creates the anchor namespace: earlier operations may have deleted it."""
    deadline = time.monotonic() + 30
    while True:
        r = session.get(f"{url}/api/v1/namespaces/{FUZZ_NAMESPACE}", timeout=CLIENT_TIMEOUT)
        if r.status_code == 404:
            break
        assert r.status_code == 200, r.text
        if not r.json()["metadata"].get("deletionTimestamp"):
            return
        # Terminating: the server empties and removes it; wait for that.
        assert time.monotonic() < deadline, f"namespace {FUZZ_NAMESPACE} stays terminating: {r.text}"
        time.sleep(0.05)
    r = session.post(f"{url}/api/v1/namespaces", timeout=CLIENT_TIMEOUT,
                     json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": FUZZ_NAMESPACE}})
    assert r.status_code == 201, r.text


def _body_kind(doc: dict[str, Any], op: Any) -> dict[str, str] | None:
    """The kind of a create or replace body (None for patches, deletes and reads)."""
    definition = doc["paths"][op.path][op.method]
    if definition.get("x-kubernetes-action") not in ("post", "put"):
        return None
    return definition["x-kubernetes-group-version-kind"]


def _fuzz_operation(op: Any, gvk: dict[str, str] | None, url: str, session: requests.Session,
                    report: Report) -> None:
    label = f"{op.method.upper()} {op.path}"
    for mode in MODES:
        strategy = st.tuples(op.as_strategy(generation_mode=mode), st.booleans(), st.sampled_from(NAMES))

        @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(strategy)
        def send(drawn: tuple[Any, bool, str]) -> None:
            case, anchored, name = drawn
            if anchored:
                _anchor(case, gvk, name)
            _bound_watch(case)
            kwargs = case.as_transport_kwargs(base_url=url)
            size = _body_size(kwargs)
            assert size <= MAX_BODY, f"{label}: generated body of {size} bytes"
            report.requests += 1
            report.digest.update(repr((kwargs["method"], kwargs["url"].removeprefix(url),
                                       kwargs.get("params"), kwargs.get("headers", {}).get("Content-Type"),
                                       kwargs.get("json", kwargs.get("data")))).encode())
            try:
                # Sent directly, not through case.call: its transport resends a request whose
                # connection was dropped, which would hide exactly what is looked for here.
                sent = time.monotonic()
                response = session.request(**kwargs, timeout=CLIENT_TIMEOUT)
                report.http_seconds += time.monotonic() - sent
            except requests.RequestException as exc:
                report.failures.append(f"{label} [{mode.value}]: {type(exc).__name__}: {exc}\n"
                                       f"    {case.as_curl_command()}")
                return
            report.codes[response.status_code] = report.codes.get(response.status_code, 0) + 1
            try:
                case.validate_response(response, checks=[not_a_server_error])
            except FailureGroup:
                text = (f"{label} [{mode.value}]: {response.status_code} {response.text[:300]}\n"
                        f"    {case.as_curl_command()}")
                report.failures.append(text)

        send()


def _resource_action(key: str, path: str, definition: dict[str, Any]) -> tuple[str, str, str] | None:
    """(``api/v1``, ``pods``, ``post``) for an operation on a resource itself, else None."""
    rest = path.removeprefix(f"/{key}/")
    if rest.startswith("namespaces/{namespace}/"):
        rest = rest.removeprefix("namespaces/{namespace}/")
    parts = rest.split("/")
    if len(parts) > 2:  # a subresource
        return None
    return key, parts[0], definition["x-kubernetes-action"]


# Discovery verbs and the operation action that serves each of them.
VERB_ACTIONS = {"get": "get", "list": "list", "watch": "list", "create": "post", "update": "put",
                "patch": "patch", "delete": "delete", "deletecollection": "deletecollection"}


def _fuzz(srv: ServerProcess) -> Report:
    url = srv.url
    report = Report()
    with requests.Session() as session:
        session.verify, session.cert = srv.ca_file, srv.cert  # HTTPS, as the admin
        session.trust_env = False  # else REQUESTS_CA_BUNDLE would replace session.verify
        index = session.get(f"{url}/openapi/v3", timeout=CLIENT_TIMEOUT).json()
        documents = sorted(index["paths"].items())
        # One document per served group-version, as discovery lists them.
        served = {f"api/{v}" for v in session.get(f"{url}/api", timeout=CLIENT_TIMEOUT).json()["versions"]}
        for group in session.get(f"{url}/apis", timeout=CLIENT_TIMEOUT).json()["groups"]:
            served |= {f"apis/{v['groupVersion']}" for v in group["versions"]}
        assert {key for key, _ in documents} == served, (documents, served)
        for key, entry in documents:
            doc = session.get(url + entry["serverRelativeURL"], timeout=CLIENT_TIMEOUT).json()
            schema = schemathesis.openapi.from_dict(doc)
            schema.config.base_url = url
            operations = [result.ok() for result in schema.get_all_operations()]
            assert operations, key
            for op in sorted(operations, key=lambda o: (o.path, o.method)):
                if OPERATIONS and OPERATIONS not in f"{op.method.upper()} {op.path}":
                    continue
                _ensure_namespace(session, url)
                report.operations += 1
                covered = _resource_action(key, op.path, doc["paths"][op.path][op.method])
                if covered:
                    report.covered.add(covered)
                _fuzz_operation(op, _body_kind(doc, op), url, session, report)
    return report


@pytest.mark.timeout(max(600, 150 * EXAMPLES))
def test_openapi_fuzz_no_server_errors(fuzz_server):
    started = time.monotonic()
    report = _fuzz(fuzz_server)
    elapsed = time.monotonic() - started
    print(f"fuzz: {report.operations} operations, {report.requests} requests in {elapsed:.1f}s "
          f"({report.http_seconds:.1f}s waiting for answers), "
          f"status codes {dict(sorted(report.codes.items()))}, "
          f"requests digest {report.digest.hexdigest()[:16]}")
    assert report.requests >= report.operations * len(MODES)
    if not OPERATIONS:
        # Every verb discovery advertises for every served resource was fuzzed.
        missing = []
        for key in {gv for gv, _, _ in report.covered}:
            listing = requests.get(f"{fuzz_server.url}/{key}", timeout=CLIENT_TIMEOUT, verify=fuzz_server.ca_file, cert=fuzz_server.cert).json()
            for res in listing["resources"]:
                if "/" in res["name"]:
                    continue
                missing += [(key, res["name"], verb) for verb in res["verbs"]
                            if (key, res["name"], VERB_ACTIONS[verb]) not in report.covered]
        assert not missing, missing
        assert len(report.covered) > 100, sorted(report.covered)
    assert not report.failures, (f"{len(report.failures)} of {report.requests} requests failed:\n"
                                 + "\n".join(report.failures))

    # Still healthy: probes answer and an ordinary create and read work.
    url = fuzz_server.url
    assert fuzz_server.proc.poll() is None, fuzz_server.log()
    for probe in ("/healthz", "/livez", "/readyz"):
        r = requests.get(url + probe, timeout=CLIENT_TIMEOUT, verify=fuzz_server.ca_file, cert=fuzz_server.cert)
        assert r.status_code == 200, (probe, r.text)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "after-fuzz"}}
    r = requests.post(f"{url}/api/v1/namespaces", json=ns, timeout=CLIENT_TIMEOUT, verify=fuzz_server.ca_file, cert=fuzz_server.cert)
    assert r.status_code == 201, r.text
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "still-works"}, "data": {"k": "v"}}
    r = requests.post(f"{url}/api/v1/namespaces/after-fuzz/configmaps", json=cm, timeout=CLIENT_TIMEOUT, verify=fuzz_server.ca_file, cert=fuzz_server.cert)
    assert r.status_code == 201, r.text
    r = requests.get(f"{url}/api/v1/namespaces/after-fuzz/configmaps/still-works", timeout=CLIENT_TIMEOUT, verify=fuzz_server.ca_file, cert=fuzz_server.cert)
    assert r.status_code == 200 and r.json()["data"] == {"k": "v"}, r.text
    # Each 5xx logs one traceback: there may be none.
    log = fuzz_server.log()
    assert "Traceback (most recent call last)" not in log, log[-5000:]
