"""``ETSCallback`` for Trainers from the ``pytorch_lightning`` package (the older import name).

The same callback as ``ets_hook.integrations.lightning.ETSCallback``, subclassing
``pytorch_lightning.Callback`` instead: use this one when your Trainer is
``pytorch_lightning.Trainer`` and the ``lightning`` package is installed as well (with only
``pytorch_lightning`` installed, both names give this class). Importing this module imports
``pytorch_lightning`` and never ``lightning``.
"""

from __future__ import annotations

from .lightning import BaseETSCallback, callback_class

ETSCallback: type[BaseETSCallback] = callback_class("pytorch_lightning")

__all__ = ["ETSCallback"]
