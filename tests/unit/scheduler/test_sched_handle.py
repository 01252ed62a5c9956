"""The framework Handle: declared fields only, filled by the Scheduler for every profile."""

from __future__ import annotations

import pytest

from kubeplane.scheduler.config import parse_config
from kubeplane.scheduler.framework.plugin import DEFAULT_PARALLELISM, Handle
from kubeplane.scheduler.plugins.registry import in_tree_registry
from kubeplane.scheduler.plugins.dynamicresources import DynamicResources
from kubeplane.scheduler.plugins.volumebinding import VolumeBinding
from kubeplane.scheduler.scheduler import Scheduler

TWO_PROFILES = [{"schedulerName": "default-scheduler"}, {"schedulerName": "second"}]


def test_handle_has_no_undeclared_fields() -> None:
    h = Handle()
    assert h.parallelism == DEFAULT_PARALLELISM
    assert h.dra_manager is None and h.volume_binder is None and h.list_objects is None
    with pytest.raises(AttributeError):
        h.some_service = object()  # type: ignore[attr-defined]


def test_profiles_share_one_dra_manager_and_the_volume_caches() -> None:
    sched = Scheduler(None, profiles=TWO_PROFILES)
    dra = [fw.plugins[DynamicResources.name] for fw in sched.frameworks.values()]
    vb = [fw.plugins[VolumeBinding.name] for fw in sched.frameworks.values()]
    handles = [fw.handle for fw in sched.frameworks.values()]
    assert len(dra) == 2 and dra[0].manager is not None
    assert dra[0].manager is dra[1].manager is sched.dra_manager
    assert all(h.dra_manager is sched.dra_manager for h in handles)
    # kept on the scheduler and its handles, not attached to the informer factory
    assert not hasattr(sched.informer_factory, "dra_manager")
    assert vb[0].binder is not vb[1].binder  # one binder per profile (its own bindTimeoutSeconds)
    assert vb[0].binder.pv_cache is vb[1].binder.pv_cache is handles[0].pv_assume_cache
    assert vb[0].binder.pvc_cache is vb[1].binder.pvc_cache is handles[1].pvc_assume_cache
    assert all(h.volume_binder is p.binder for h, p in zip(handles, vb))
    for name in ("namespace_labels", "pdb_lister", "list_objects"):
        assert callable(getattr(handles[0], name))
        assert getattr(handles[0], name) is getattr(handles[1], name)


def test_profiles_without_dynamic_resources_build_no_dra_manager() -> None:
    profile = {"schedulerName": "default-scheduler",
               "plugins": {"multiPoint": {"disabled": [{"name": DynamicResources.name}]}}}
    sched = Scheduler(None, profiles=[profile])
    assert DynamicResources.name not in sched.frameworks["default-scheduler"].plugins
    assert sched.dra_manager is None
    assert sched.frameworks["default-scheduler"].handle.dra_manager is None


def test_parallelism_reaches_every_handle_from_the_configuration() -> None:
    cfg = parse_config("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                       "parallelism: 4\nprofiles:\n- schedulerName: default-scheduler\n- schedulerName: b\n",
                       in_tree_registry())
    sched = Scheduler.from_config(None, cfg)
    assert [fw.handle.parallelism for fw in sched.frameworks.values()] == [4, 4]
    assert Scheduler(None).frameworks["default-scheduler"].handle.parallelism == DEFAULT_PARALLELISM
