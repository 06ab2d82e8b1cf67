"""HTTP routes, one module per resource; each router owns its prefix."""
