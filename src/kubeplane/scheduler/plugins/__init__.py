"""Built-in scheduler plugins, one module per plugin (see ``framework.registry``)."""
