"""Policy-based admission: ValidatingAdmissionPolicy and its CEL environment.

:mod:`.policy_api` holds the kinds' defaults and validation, :mod:`.cel` the
admission CEL environment (with :mod:`.ast` and :mod:`.cost`, which bound an
evaluation's cost before it runs), :mod:`.policy` the admission plugin the
registry's chain runs and :mod:`.typecheck` the policies' type checking.
"""
