"""Built-in plugins, one per module (filters here; score policies live in ``core.policies``)."""
