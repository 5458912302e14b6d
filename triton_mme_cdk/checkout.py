"""The checkout's top-level folders under their own names.

In the repository, ``constructs/``, ``stacks/`` and ``model_build/`` are the subpackages
``triton_mme_cdk.constructs``, ``triton_mme_cdk.stacks`` and ``triton_mme_cdk.model_build`` (the
folder ``triton_mme_cdk/`` links to them; a wheel holds them in place). A module has one import
name, so one class object: imported as ``model_build.errors`` too, a ``ModelBuildError`` raised by
one copy would pass an ``except`` of the other.

So a folder's ``__init__.py``, run under the folder's own name, calls :func:`run_by_folder_name`:
``python -m model_build [args]`` (and ``python -m model_build.<module>``) in a checkout runs
``triton_mme_cdk.model_build[.<module>]`` as ``__main__``; any other import by the folder's name is
refused with one line. (``constructs/`` has no ``__init__.py``: the folder must not shadow the
``constructs`` library; ``tests/test_package.py`` holds every import in the tree to the package
names.)
"""

from __future__ import annotations

import runpy
import sys
from typing import NoReturn

PACKAGE = "triton_mme_cdk"


#: The interpreter's options that take the next argument as their value.
OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def main_module_argument(folder: str, orig_argv: list[str]) -> str | None:
    """The module ``python -m <module>`` was asked for, if it is ``folder`` or in it, else None."""
    args = iter(orig_argv[1:])
    for arg in args:
        if arg in OPTIONS_WITH_VALUE:
            next(args, None)
            continue
        if arg == "-m":
            module = next(args, "")
        elif arg.startswith("-m") and len(arg) > 2:
            module = arg[2:]
        elif arg.startswith("-c") or arg == "-" or not arg.startswith("-"):
            return None  # a command, standard input or a script: no module asked with -m
        else:
            continue
        return module if module == folder or module.startswith(folder + ".") else None
    return None


def run_by_folder_name(folder: str) -> NoReturn:
    """Run ``python -m <folder>[.<module>]`` as ``triton_mme_cdk.<folder>[.<module>]``; refuse
    any other import of ``<folder>`` by that name (:class:`ImportError`)."""
    # While Python locates the module of `python -m`, sys.argv[0] is "-m" (the docs of -m).
    module = main_module_argument(folder, sys.orig_argv) if sys.argv[:1] == ["-m"] else None
    if module is None:
        raise ImportError(
            f"{folder}: this folder is the package {PACKAGE}.{folder}; import it by that name "
            f"(from {PACKAGE}.{folder} import ...), so that each module has one name")
    runpy.run_module(f"{PACKAGE}.{module}", run_name="__main__", alter_sys=True)
    raise SystemExit(0)
