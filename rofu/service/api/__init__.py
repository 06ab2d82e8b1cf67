"""The HTTP layer: the app factory, routes, dependencies, middleware, API keys and bodies."""
