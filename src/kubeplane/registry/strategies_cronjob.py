"""Strategies of batch/v1 CronJobs and of core/v1 ReplicationControllers and PodTemplates.

Imported by :mod:`kubeplane.registry.strategies` once its base class and
pod-template defaults exist (this module builds on them).
"""

from __future__ import annotations

from typing import Any

from kubeplane.registry.strategies import Strategy, _default_template, default_pod_spec

Obj = dict[str, Any]


class CronJobStrategy(Strategy):
    """upstream's SetObjectDefaults_CronJob; status starts empty."""

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        if not spec.get("concurrencyPolicy"):
            spec["concurrencyPolicy"] = "Allow"
        if spec.get("suspend") is None:
            spec["suspend"] = False
        if spec.get("successfulJobsHistoryLimit") is None:
            spec["successfulJobsHistoryLimit"] = 3
        if spec.get("failedJobsHistoryLimit") is None:
            spec["failedJobsHistoryLimit"] = 1
        template = spec.get("jobTemplate")
        if not isinstance(template, dict):
            return
        template.setdefault("metadata", {})
        job_spec = template.get("spec")
        if not isinstance(job_spec, dict):
            return
        policy = job_spec.get("podFailurePolicy")
        for rule in (policy.get("rules") or []) if isinstance(policy, dict) else []:
            for pattern in (rule.get("onPodConditions") or []) if isinstance(rule, dict) else []:
                if isinstance(pattern, dict) and not pattern.get("status"):
                    pattern["status"] = "True"
        _default_template(job_spec)

    def initial_status(self, obj: Obj) -> Obj:
        return {}


class ReplicationControllerStrategy(Strategy):
    """upstream's SetDefaults_ReplicationController: selector and labels from
    the template's labels when unset, one replica."""

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        template = spec.get("template")
        labels = ((template.get("metadata") or {}) if isinstance(template, dict) else {}).get("labels")
        if isinstance(labels, dict) and labels:
            if not spec.get("selector"):
                spec["selector"] = dict(labels)
            md = obj.get("metadata")
            if isinstance(md, dict) and not md.get("labels"):
                md["labels"] = dict(labels)
        if spec.get("replicas") is None:
            spec["replicas"] = 1
        _default_template(spec)

    def initial_status(self, obj: Obj) -> Obj:
        return {"replicas": 0}


class PodTemplateStrategy(Strategy):
    """Pod-template defaults; a change of ``template`` bumps the generation."""

    def default(self, obj: Obj) -> None:
        template = obj.get("template")
        if isinstance(template, dict):
            template.setdefault("metadata", {})
            default_pod_spec(template.get("spec"))
