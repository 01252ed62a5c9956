"""The admission CEL environment: variables, libraries, composited variables,
compile errors as upstream words them, and the cost bounds."""

from __future__ import annotations

import pytest

from kubeplane.admission import cel, cost
from kubeplane.admission.cel import ANY, BOOL, NULL, STRING, CELCompileError, EvalError, Evaluation, compile_expression
from kubeplane.auth.authorizer import Decision
from kubeplane.auth.user import SYSTEM_ADMIN, UserInfo

AUTHZ = {cel._MARK: "authorizer", "requestResource": {
    cel._MARK: "resource", "group": "apps", "resource": "deployments", "subresource": "", "namespace": "ns",
    "name": "d"}}


def _ev(obj=None, old=None, *, user=SYSTEM_ADMIN, authorizer=None, variables=None, params=None, **extra):
    data = {"object": obj, "oldObject": old, "request": extra.pop("request", {}), "namespaceObject": None,
            "authorizer": AUTHZ, **extra}
    if params is not None:
        data["params"] = params
    kw = {} if authorizer is None else {"authorizer": authorizer}
    return Evaluation(data, user, variable_programs=variables or {}, **kw)


def test_object_old_object_and_request() -> None:
    c = compile_expression("object.spec.replicas > oldObject.spec.replicas && request.operation == 'UPDATE'", (BOOL,))
    assert c.evaluate(_ev({"spec": {"replicas": 3}}, {"spec": {"replicas": 2}}, request={"operation": "UPDATE"}))
    assert compile_expression("oldObject == null", (BOOL,)).evaluate(_ev({"spec": {}}))


def test_params_only_when_the_policy_has_a_param_kind() -> None:
    with pytest.raises(CELCompileError, match="undeclared reference to 'params"):
        compile_expression("params.data.x == 'a'", (BOOL,))
    c = compile_expression("params.data.x == 'a'", (BOOL,), has_params=True)
    assert c.evaluate(_ev({}, params={"data": {"x": "a"}}))


def test_compile_errors_as_upstream_words_them() -> None:
    with pytest.raises(CELCompileError) as err:
        compile_expression("object.a ==", (BOOL,))
    assert err.value.message.startswith("compilation failed: ERROR: <input>:1:12: Syntax error: ")
    assert err.value.message.endswith("\n | object.a ==\n | ...........^")
    with pytest.raises(CELCompileError, match="^must evaluate to bool$"):
        compile_expression("object.a", (BOOL,))
    with pytest.raises(CELCompileError, match=r"^must evaluate to one of \[string null_type\]$"):
        compile_expression("1", (STRING, NULL))
    assert compile_expression("null", (STRING, NULL)).evaluate(_ev({})) is None
    with pytest.raises(CELCompileError, match="undeclared reference to 'authorizer'"):
        compile_expression("authorizer.path('/x').check('get').allowed() ? 'a' : 'b'", (STRING,),
                           has_authorizer=False)


def test_runtime_errors_in_cel_gos_words() -> None:
    c = compile_expression("object.spec.x == 1", (BOOL,))
    with pytest.raises(EvalError, match="^no such key: x$"):
        c.evaluate(_ev({"spec": {}}))
    with pytest.raises(EvalError, match="^division by zero$"):
        compile_expression("1 / object.z == 1", (BOOL,)).evaluate(_ev({"z": 0}))


def test_composited_variables_are_lazy_and_evaluated_once() -> None:
    calls = []

    class Counting:
        def authorize(self, attrs):
            calls.append(attrs.verb)
            return Decision.ALLOW, ""

    a = compile_expression("authorizer.group('').resource('pods').check('list').allowed()", variables=[])
    b = compile_expression("variables.allowed && true", variables=["allowed"])
    unused = compile_expression("authorizer.group('').resource('pods').check('watch').allowed()", variables=[])
    check = compile_expression("variables.both && variables.allowed", (BOOL,), variables=["allowed", "both",
                                                                                          "unused"])
    ev = _ev({}, authorizer=Counting(), variables={"allowed": a, "both": b, "unused": unused})
    assert check.evaluate(ev) is True
    assert calls == ["list"]  # once, and the unused variable never


def test_undefined_variable_is_a_compile_error() -> None:
    with pytest.raises(CELCompileError) as err:
        compile_expression("variables.later > 1", (BOOL,), variables=["first"])
    assert err.value.message == ("compilation failed: ERROR: <input>:1:10: undefined field 'later'\n"
                                 " | variables.later > 1\n | .........^")


def test_a_failing_variable_fails_the_expressions_that_read_it() -> None:
    v = compile_expression("object.missing", variables=[])
    c = compile_expression("variables.v == 1", (BOOL,), variables=["v"])
    with pytest.raises(EvalError, match='composited variable "v" fails to evaluate: no such key: missing'):
        c.evaluate(_ev({}, variables={"v": v}))


def test_authorizer_library() -> None:
    seen = []

    class OnlyGetDeployments:
        def authorize(self, attrs):
            seen.append(attrs)
            if attrs.resource == "deployments" and attrs.verb == "get":
                return Decision.ALLOW, ""
            return Decision.NO_OPINION, "no rule"

    alice = UserInfo("alice", groups=("devs",))
    ev = _ev({}, user=alice, authorizer=OnlyGetDeployments())
    expr = ("authorizer.group('apps').resource('deployments').namespace('ns').name('d').check('get').allowed()"
            " && !authorizer.group('').resource('secrets').check('list').allowed()"
            " && authorizer.group('').resource('secrets').check('list').reason() == 'no rule'"
            " && !authorizer.requestResource.check('delete').errored()"
            " && authorizer.requestResource.check('get').allowed()")
    assert compile_expression(expr, (BOOL,)).evaluate(ev) is True
    first = seen[0]
    assert (first.user, first.api_group, first.resource, first.namespace, first.name) == (
        alice, "apps", "deployments", "ns", "d")
    sa = compile_expression("authorizer.serviceAccount('kube-system', 'ctl').path('/healthz').check('get').allowed()",
                            (BOOL,))
    assert sa.evaluate(ev) is False
    assert seen[-1].user.name == "system:serviceaccount:kube-system:ctl" and seen[-1].path == "/healthz"
    assert not seen[-1].resource_request


def test_kubernetes_libraries() -> None:
    expr = ("[1, 2, 3].isSorted() && [3, 1].sum() == 4 && [3, 1].min() == 1 && [3, 1].max() == 3"
            " && quantity(object.q).isGreaterThan(quantity('1Mi')) && object.s.lowerAscii() == 'abc'"
            " && object.?nope.orValue(7) == 7 && math.greatest(1, 5) == 5"
            " && cel.bind(x, object.s, x + x) == 'ABCABC' && semver('1.2.3').major() == 1")
    assert compile_expression(expr, (BOOL,)).evaluate(_ev({"q": "1Gi", "s": "ABC"})) is True


def test_cost_per_call_limit() -> None:
    nested = compile_expression("object.l.all(a, object.l.all(b, object.l.all(c, a + b + c >= 0)))", (BOOL,))
    assert nested.evaluate(_ev({"l": list(range(20))})) is True
    with pytest.raises(EvalError) as err:
        nested.evaluate(_ev({"l": list(range(200))}))
    assert err.value.message == "operation cancelled: actual cost limit exceeded" and err.value.cost_exceeded


def test_cost_budget_of_one_evaluation() -> None:
    # each call stays under the per-call limit; the evaluation's budget runs out after a dozen
    one = compile_expression("object.l.all(a, !object.s.contains(a))", (BOOL,))
    ev = _ev({"l": [f"x{i}" for i in range(10)], "s": "a" * 900_000})
    calls = 0
    with pytest.raises(EvalError) as err:
        for _ in range(100):
            assert one.evaluate(ev) is True
            calls += 1
    assert err.value.message == ("validation failed due to running out of cost budget, no further validation "
                                 "rules will be run")
    assert 5 < calls < 15


def test_the_runtimes_iteration_bound_is_an_error() -> None:
    c = compile_expression("object.l.all(a, a >= 0)", (BOOL,))
    assert c.evaluate(_ev({"l": list(range(9000))})) is True
    with pytest.raises(EvalError, match="iteration budget exceeded"):
        c.evaluate(_ev({"l": list(range(20000))}))


def test_cost_follows_the_sizes_the_expression_reaches() -> None:
    # a large list the expression does not iterate costs nothing extra
    c = compile_expression("size(object.small) < 3 && object.small.all(x, x > 0)", (BOOL,))
    ev = _ev({"small": [1, 2], "big": list(range(100000))})
    assert c.evaluate(ev) is True
    assert cost.RUNTIME_BUDGET - ev.budget < 100


def test_string_functions_are_charged_by_length() -> None:
    c = compile_expression("object.s.contains('x')", (BOOL,))
    short, long = _ev({"s": "a"}), _ev({"s": "a" * 100000})
    c.evaluate(short)
    c.evaluate(long)
    assert (cost.RUNTIME_BUDGET - long.budget) - (cost.RUNTIME_BUDGET - short.budget) >= 9000


def test_any_return_type_for_variables() -> None:
    assert compile_expression("object.spec", (ANY,)).evaluate(_ev({"spec": {"a": [1]}})) == {"a": [1]}


def test_url_ip_and_cidr_libraries() -> None:
    expr = ("url(object.u).getScheme() == 'https' && url(object.u).getHost() == 'example.com:8443'"
            " && url(object.u).getHostname() == 'example.com' && url(object.u).getPort() == '8443'"
            " && url(object.u).getEscapedPath() == '/a/b' && url(object.u).getQuery()['x'] == ['1', '2']"
            " && !isURL('not a url') && isURL('/path')"
            " && ip(object.ip).family() == 4 && ip('::1').isLoopback() && !isIP('1.2.3') && !isIP('01.2.3.4')"
            " && ip.isCanonical('::1') && !ip.isCanonical('0:0::1')"
            " && cidr('10.0.0.0/8').containsIP(object.ip) && cidr('10.0.0.0/8').containsIP(ip('10.1.1.1'))"
            " && !cidr('10.0.0.0/8').containsCIDR('11.0.0.0/16') && cidr('10.0.0.0/8').containsCIDR('10.2.0.0/16')"
            " && cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8') && cidr('10.1.2.3/8').ip() == ip('10.1.2.3')"
            " && cidr('10.0.0.0/8').prefixLength() == 8 && ip('8.8.8.8').isGlobalUnicast()"
            " && !ip('127.0.0.1').isGlobalUnicast() && ip('224.0.0.1').isLinkLocalMulticast()"
            " && ip('fe80::1').isLinkLocalUnicast() && ip('0.0.0.0').isUnspecified()")
    ev = _ev({"u": "https://user@example.com:8443/a/b?x=1&x=2", "ip": "10.0.0.1"})
    assert compile_expression(expr, (BOOL,)).evaluate(ev) is True
    with pytest.raises(EvalError, match="IPv4-mapped IPv6 address is not allowed"):
        compile_expression("ip('::ffff:1.2.3.4').family() == 6", (BOOL,)).evaluate(ev)


def test_sets_library() -> None:
    expr = ("sets.contains(object.l, [1, 2]) && !sets.contains([1], [true]) && sets.equivalent([1, 2, 2], [2, 1])"
            " && sets.intersects(object.l, [9, 3]) && !sets.intersects([], object.l)")
    assert compile_expression(expr, (BOOL,)).evaluate(_ev({"l": [1, 2, 3]})) is True
