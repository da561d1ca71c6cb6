"""What the routers share: the services container of the app serving a request."""

from __future__ import annotations

from fastapi import Request

from ..services.container import Services

__all__ = ["Services", "services_of"]


def services_of(request: Request) -> Services:
    """The services container of the app serving ``request``."""
    return request.app.state.services
