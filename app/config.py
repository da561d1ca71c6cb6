"""Settings, read from environment variables with the prefix CALIBD_."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CALIBD_", extra="ignore")

    #: SQLAlchemy URL; PostgreSQL is ``postgresql+psycopg://user@host/db``.
    database_url: str = "sqlite:///./calibd.db"
    #: Largest request body accepted, in bytes; larger ones get 413 before they are read.
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    #: How often each process checks the database for promotions made by other processes.
    version_poll_seconds: float = Field(default=0.5, gt=0)
    #: Memory budget of the in-process cache of loaded calibrators, in bytes.
    calibrator_cache_bytes: int = Field(default=256 * 1024 * 1024, gt=0)


@lru_cache
def get_settings() -> Settings:
    return Settings()
