"""apiextensions.k8s.io: CustomResourceDefinitions (schemas, serving)."""
