"""Loading ``MODULE:HANDLER`` for ``bucketq worker``, with the current directory importable (like uvicorn)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from bucketq.cli.errors import CliError


def load_handler(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"handler {spec!r} must look like MODULE:HANDLER, e.g. myapp.tasks:handle")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself failed: say so in one line (the user's bug, not ours)
        raise CliError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise CliError(f"{spec} is a {type(target).__name__}, not a function")
    return target
