from . import jobs
from .router import router

__all__ = ["jobs", "router"]
