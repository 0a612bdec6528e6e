"""Only here to hook the cffi build into `pip install .`; metadata is in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["native/build.py:ffibuilder"])
