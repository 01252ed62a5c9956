from kubeplane.api import errors


def test_not_found_is_group_qualified_like_upstream():
    err = errors.not_found("deployments", "web", group="apps")
    status = err.to_status()
    assert status["code"] == 404
    assert status["reason"] == "NotFound"
    assert status["message"] == 'deployments.apps "web" not found'
    assert status["details"] == {"name": "web", "group": "apps", "kind": "deployments"}


def test_invalid_carries_field_causes_and_round_trips():
    err = errors.invalid("Pod", "p", [errors.required("spec.containers")])
    status = err.to_status()
    assert status["code"] == 422
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"}
    ]
    back = errors.StatusError.from_status(status)
    assert back.code == 422 and back.causes == err.causes and back.message == err.message


def test_gone_and_conflict_codes():
    assert errors.gone("too old resource version: 1 (5)").to_status()["reason"] == "Expired"
    c = errors.conflict("pods", "p")
    assert c.code == 409 and c.reason == "Conflict"
    assert errors.already_exists("pods", "p").reason == "AlreadyExists"
