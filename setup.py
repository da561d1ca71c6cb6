"""The optional compiled kernels (app/calibration/_kernels.c); everything else is in pyproject.toml.

``optional=True``: where no C compiler is found the build goes on without them, and calibd
takes its numpy path (app/calibration/kernels.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "calibd.calibration._kernels",
            ["app/calibration/_kernels.c"],
            extra_compile_args=["-O2", "-ffp-contract=off"],  # a * b + c rounded twice, as numpy does
            optional=True,
        )
    ]
)
