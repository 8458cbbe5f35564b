"""``ETSCallback`` for Trainers from the ``pytorch_lightning`` package (the older import name).

The same callback as ``ets_hook.integrations.lightning.ETSCallback``, subclassing
``pytorch_lightning.Callback`` instead: use this one when your Trainer is
``pytorch_lightning.Trainer`` and the ``lightning`` package is installed as well (with only
``pytorch_lightning`` installed, both names give this class). Importing this module imports
``pytorch_lightning`` and never ``lightning``; without ``pytorch_lightning`` installed it raises
an ImportError naming it (``pip install pytorch-lightning``): the ``ets-hook[lightning]`` extra
installs ``lightning``, whose Trainer takes ``ets_hook.integrations.lightning.ETSCallback``.
"""

from __future__ import annotations

from .lightning_packages import INSTALL_HINT, installed_packages

# Checked before ``.lightning`` (torch, the hook) is imported: without it, the error comes at once.
if "pytorch_lightning" not in installed_packages():
    raise ImportError(
        "ets_hook.integrations.pytorch_lightning needs the `pytorch_lightning` package: "
        f"pip install pytorch-lightning (`{INSTALL_HINT}` installs the `lightning` package "
        "instead, whose Trainer takes ets_hook.integrations.lightning.ETSCallback)"
    )

from typing import TYPE_CHECKING

from .lightning import BaseETSCallback, callback_class

if TYPE_CHECKING:  # what a type checker sees: a pytorch_lightning Callback
    from pytorch_lightning.callbacks import Callback as _LightningCallback

    class ETSCallback(BaseETSCallback, _LightningCallback):  # type: ignore[misc]
        """``BaseETSCallback`` as a ``pytorch_lightning.callbacks.Callback``."""

else:
    ETSCallback = callback_class("pytorch_lightning")

__all__ = ["ETSCallback"]
