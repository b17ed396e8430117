"""Only the optional C packer of the tar sink; everything else is in pyproject.toml.

`optional=True`: without a C compiler the build warns and goes on, and the tar sink packs
in Python (bulkfetch.sinks.ustar.ACCELERATED says which one runs)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("bulkfetch.sinks._ustar", ["src/bulkfetch/sinks/_ustar.c"], optional=True),
])
