"""Which Lightning packages exist, and which one a Trainer or callback comes from.

Lightning has two import names, ``lightning.pytorch`` and ``pytorch_lightning``, whose classes
are distinct. Nothing here imports torch or Lightning (``is_a`` imports only the package an
object already comes from), so ``integrations.lightning`` can refuse to load, naming the extra
to install, before anything heavy is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

INSTALL_HINT = "pip install 'ets-hook[lightning]'"

#: The Lightning packages an ``ETSCallback`` class can be made for, preferred first, with the
#: module of ours that names that class ``ETSCallback`` (so instances pickle by reference).
PACKAGES = {
    "lightning.pytorch": "ets_hook.integrations.lightning",
    "pytorch_lightning": "ets_hook.integrations.pytorch_lightning",
}


def _installed(top_level: str) -> bool:
    """Whether a top-level package can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(top_level) is not None
    except (ImportError, ValueError):
        return False


def installed_packages() -> list[str]:
    """The Lightning packages installed, in ``PACKAGES`` order (nothing is imported).

    Returns:
        ``"lightning.pytorch"`` when ``lightning`` is installed, ``"pytorch_lightning"`` when
        that is.
    """
    return [name for name in PACKAGES if _installed(name.split(".")[0])]


def package_of(obj: Any) -> str | None:
    """The Lightning package (a ``PACKAGES`` key) an object's class comes from, or None."""
    module = type(obj).__module__
    return next((name for name in PACKAGES if module.startswith(name + ".")), None)


def is_a(obj: Any, callback_name: str) -> bool:
    """Whether ``obj`` is an instance of ``<package>.callbacks.<callback_name>`` for the package
    its class comes from (no package is imported here)."""
    package = package_of(obj)
    if package is None:
        return False
    callbacks = importlib.import_module(package + ".callbacks")
    cls = getattr(callbacks, callback_name, None)
    return isinstance(cls, type) and isinstance(obj, cls)
