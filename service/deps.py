"""Dependencies of the route handlers, as `Annotated` aliases.

They are `async def` because they never block: FastAPI would run a plain `def` dependency
in the thread pool, a needless hop on every request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.runtime import Runtime
from service.security import authorise


async def get_runtime(request: Request) -> Runtime:
    """The process's runtime, created by the app's lifespan."""
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def require_client(request: Request, runtime: RuntimeDep) -> None:
    """A client (or admin) API key, unless the service runs without keys."""
    authorise(runtime.keys, request, admin=False)


async def require_admin(request: Request, runtime: RuntimeDep) -> None:
    """An admin API key, unless the service runs without keys."""
    authorise(runtime.keys, request, admin=True)


ClientAuth = Depends(require_client)
AdminAuth = Depends(require_admin)
