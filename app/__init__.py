"""calibd: a calibration microservice."""

#: The one source of calibd's version: the package metadata (pyproject.toml's dynamic version),
#: ``calibd --version`` and ``GET /healthz`` all read it.
__version__ = "0.1.0"
