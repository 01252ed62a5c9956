"""Built-in scheduler plugins, one module per plugin (the in-tree registry is ``registry``)."""
