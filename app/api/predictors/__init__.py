from .router import router

__all__ = ["router"]
