"""The subresources the registry serves besides status: ``pods/binding`` and
``scale`` (status updates are the update verb with ``subresource="status"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from kubeplane.api import errors
from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.registry.admission import CREATE, Attributes, operation_options
from kubeplane.registry.retries import Retries
from kubeplane.storage.interface import KeyNotFoundError, RevisionConflictError

if TYPE_CHECKING:
    from kubeplane.registry.admission import AdmissionChain
    from kubeplane.runtime import KeyedTurns
    from kubeplane.storage.interface import Store

Obj = dict[str, Any]


class SubresourcesMixin:
    """Binding and scale for :class:`~kubeplane.registry.registry.Registry`
    (which provides the store, the per-key turns and the update loop)."""

    store: "Store"
    admission: "AdmissionChain"
    _turns: "KeyedTurns"
    _retry_seconds: float

    async def bind(self, name: str, namespace: str, binding: Obj, *, dry_run: bool = False) -> Obj:
        """``pods/binding``: set spec.nodeName once and mark the pod scheduled.

        Success means the write is stored: a race lost to another writer is
        retried against the state that won, so a pod bound meanwhile gets the
        409 of upstream's BindingREST, never a second Success.
        """
        pods = resource("pods")
        if not isinstance(binding, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        target = binding.get("target") or {}
        node = target.get("name") if isinstance(target, dict) else None
        if not node:
            raise errors.invalid("Binding", name, [errors.required("target.name")])
        bmd = binding.get("metadata") or {}
        if not isinstance(bmd, dict):
            raise errors.bad_request("metadata must be an object")
        if bmd.get("name") and bmd["name"] != name:
            raise errors.bad_request("the name of the binding does not match the name on the URL")
        key = self._key(pods, name, namespace)
        # pods/binding is a CREATE of a Binding, as upstream admits it
        adm_binding = deep_copy(binding)
        adm_binding.setdefault("apiVersion", "v1")
        adm_binding.setdefault("kind", "Binding")
        attrs = Attributes(CREATE, pods, name, namespace, adm_binding, None, "binding", dry_run=dry_run,
                           options=operation_options("CreateOptions", dry_run=dry_run))
        await self.admission.admit(attrs)
        if attrs.obj is not None:
            target = attrs.obj.get("target") or {}
            node = target.get("name") if isinstance(target, dict) else None
            if not node:
                raise errors.invalid("Binding", name, [errors.required("target.name")])
            bmd = attrs.obj.get("metadata") if isinstance(attrs.obj.get("metadata"), dict) else {}
        await self.admission.validate(attrs)
        await self._turns.acquire(key)
        try:
            await self._bind_locked(key, name, node, bmd, dry_run)
        finally:
            self._turns.release(key)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    async def _bind_locked(self, key: str, name: str, node: str, bmd: Obj, dry_run: bool) -> None:
        retries = Retries(self._retry_seconds)
        want_uid = bmd.get("uid")
        want_rv = bmd.get("resourceVersion")
        kv = await self.store.get(key)
        while True:
            if kv is None:
                raise errors.not_found("pods", name)
            pod = kv.value
            md = pod.get("metadata") or {}
            if want_uid and want_uid != md.get("uid"):
                raise errors.conflict("pods", name, detail=(
                    f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: {md.get('uid')}"))
            if want_rv and str(want_rv) != str(kv.mod_revision):
                raise errors.conflict("pods", name, detail=(
                    f"Precondition failed: ResourceVersion in precondition: {want_rv}, "
                    f"ResourceVersion in object meta: {kv.mod_revision}"))
            spec = pod.get("spec") or {}
            # upstream names the subresource in these conflicts
            if md.get("deletionTimestamp"):
                raise errors.conflict("pods/binding", name, detail=(
                    f"pod {name} is being deleted, cannot be assigned to a host"))
            current_node = spec.get("nodeName")
            if current_node:
                raise errors.conflict("pods/binding", name, detail=(
                    f'pod {name} is already assigned to node "{current_node}"'))
            if spec.get("schedulingGates"):
                raise errors.conflict("pods/binding", name, detail=(
                    f"pod {name} has non-empty .spec.schedulingGates"))
            if dry_run:
                return
            # Copies of the levels that change; the rest is shared with the
            # stored version, which is never modified in place.
            new_md = {k: v for k, v in md.items() if k != "resourceVersion"}
            new = {**pod, "metadata": new_md, "spec": {**spec, "nodeName": node},
                   "status": dict(pod.get("status") or {})}
            ann = bmd.get("annotations")
            if isinstance(ann, dict) and ann:
                new_md["annotations"] = {**(md.get("annotations") or {}), **ann}
            status = new["status"]
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": self._now()})
            status["conditions"] = conds
            try:
                await self.store.update(key, new, expected_revision=kv.mod_revision)
                return
            except RevisionConflictError as exc:
                kv = exc.current  # decide again on the state that won the race
            except KeyNotFoundError:
                raise errors.not_found("pods", name) from None
            await retries.again()

    def to_scale(self, res: ResourceInfo, obj: Obj) -> Obj:
        if res.custom is not None:
            from kubeplane.registry.customresource import scale_of

            return scale_of(res, obj)
        md = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        sel = spec.get("selector")
        if res.key == ("", "replicationcontrollers"):
            # a ReplicationController's selector is a plain label set
            selector = ",".join(f"{k}={sel[k]}" for k in sorted(sel)) if isinstance(sel, dict) else ""
        else:
            selector = str(label_selector_from_dict(sel)) if isinstance(sel, dict) else ""
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in md},
            "spec": {"replicas": spec.get("replicas", 0)},
            "status": {"replicas": status.get("replicas", 0), "selector": selector},
        }

    async def get_scale(self, res: ResourceInfo, name: str, namespace: str) -> Obj:
        return self.to_scale(res, await self.get(res, name, namespace))

    async def update_scale(
        self, res: ResourceInfo, name: str, namespace: str, scale_of: Callable[[Obj], Obj], *, dry_run: bool = False
    ) -> Obj:
        """``scale_of(current_scale) -> new_scale``; writes spec.replicas."""
        key = self._key(res, name, namespace)
        pinned: list[str] = []

        def mutate(current: Obj) -> Obj:
            scale = scale_of(self.to_scale(res, current))
            if not isinstance(scale, dict):
                raise errors.bad_request("the body of the request must be a Scale object")
            smd = scale.get("metadata") if isinstance(scale.get("metadata"), dict) else {}
            if smd.get("resourceVersion") and smd["resourceVersion"] != (current.get("metadata") or {}).get(
                "resourceVersion"
            ):
                raise errors.conflict(res.plural, name, res.group)
            replicas = (scale.get("spec") or {}).get("replicas", 0)
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise errors.invalid("Scale", name, [errors.invalid_value(
                    "spec.replicas", replicas, "must be greater than or equal to 0")], group="autoscaling")
            new = deep_copy(current)
            new["metadata"].pop("resourceVersion", None)
            if res.custom is not None:
                from kubeplane.registry.customresource import with_replicas

                return with_replicas(res, new, replicas)
            new.setdefault("spec", {})["replicas"] = replicas
            return new

        def admitted(scale: Obj, obj: Obj) -> Obj:
            """What an admission webhook's patch of the Scale changes: spec.replicas."""
            replicas = (scale.get("spec") or {}).get("replicas", 0) if isinstance(scale, dict) else 0
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
                raise errors.invalid("Scale", name, [errors.invalid_value(
                    "spec.replicas", replicas, "must be greater than or equal to 0")], group="autoscaling")
            obj.setdefault("spec", {})["replicas"] = replicas
            return obj

        obj = await self._update_loop(res, key, name, mutate, dry_run=dry_run, subresource="scale",
                                      view=(lambda o: self.to_scale(res, o), admitted))
        del pinned
        return self.to_scale(res, obj)
