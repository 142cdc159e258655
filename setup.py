"""The compiled core (kl/log/_core.c): built where a C compiler, Python's headers and zlib's
are found, else left out (optional) and kl runs its pure-Python twin (kl/log/pycore.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kl.log._core", ["kl/log/_core.c"], depends=["kl/log/_crc32c_arm.h", "kl/log/_crc32c_fold.h"], libraries=["z"], optional=True)])
