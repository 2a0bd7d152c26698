"""The HTTP server: create_app(app) -> an ASGI application (FastAPI)."""

from .api import create_app

__all__ = ["create_app"]
