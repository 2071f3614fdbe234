"""The one list of opforge's operators, read from the built extension's schemas: a new op
is checked for its registrations on every backend without editing a list of names."""

import torch

import opforge_ops  # noqa: F401  (loading it registers the schemas)

OPS = tuple(
    sorted(
        schema.name.split("::", 1)[1]
        for schema in torch._C._jit_get_all_schemas()
        if schema.name.startswith("opforge::")
    )
)
FORWARD_OPS = tuple(op for op in OPS if not op.startswith("_"))
BACKWARD_OPS = tuple(op for op in OPS if op.startswith("_"))
