"""What the CEL environments of kubeplane share (ValidatingAdmissionPolicy
in :mod:`kubeplane.admission.cel`, CRD ``x-kubernetes-validations`` in
:mod:`kubeplane.apiextensions.celrules`): Kubernetes' CEL libraries and the
cleaning of the runtime's error texts into cel-go's words."""
