"""Packaging metadata lives in pyproject.toml. This file only adds the mypyc-compiled modules, and only when
asked (``SIDECAR_NATIVE=1``, as ``tools/native.py`` does): a plain ``pip install`` stays pure Python and needs
no C compiler."""

import os
import runpy

from setuptools import setup

ext_modules = []
if os.environ.get("SIDECAR_NATIVE") == "1":
    from mypyc.build import mypycify

    native = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sidecar", "native.py"))
    ext_modules = mypycify(list(native["SOURCES"]), opt_level="3", group_name=native["GROUP"])

setup(ext_modules=ext_modules)
