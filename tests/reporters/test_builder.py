"""reporters.builder: argument validation and which reporters are built."""

from __future__ import annotations

import pytest

from ets_hook.reporters.builder import build_reporters
from ets_hook.reporters.deadline import (
    DeadlineGuard,
)
from ets_hook.reporters.log import LogReporter


def test_build_reporters_validates() -> None:
    with pytest.raises(ValueError, match="on_prediction must be callable"):
        build_reporters(on_prediction=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_deadline must be"):
        build_reporters(deadline=False, on_deadline="shout")
    kinds = [type(r) for r in build_reporters(deadline=60.0, environ={})]
    assert kinds == [LogReporter, DeadlineGuard]
