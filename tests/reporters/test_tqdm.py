"""reporters.tqdm: postfix on a user's bar, a bar of our own, and tqdm missing."""

from __future__ import annotations

import sys

import pytest
from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.builder import build_reporters
from ets_hook.reporters.tqdm import TqdmReporter


def test_tqdm_on_a_user_bar() -> None:
    tqdm = pytest.importorskip("tqdm")
    bar = tqdm.tqdm(total=100, disable=True)
    f = Forecaster(
        JobModel(total_steps=100), start_s=0.0, reports=ReportDispatcher([TqdmReporter(bar)])
    )
    run_job(f, 10, 0.2)
    assert "s/step" in bar.postfix and "ETA" in bar.postfix
    f.close()
    bar.close()


def test_tqdm_postfix_on_an_ascii_stream_uses_substitutes() -> None:
    """A bar writing to an ASCII stream (``PYTHONIOENCODING=ascii``) gets ``+/-`` for ``±``
    and ``|`` for ``·``, not Python's ``\\xb1`` escapes."""
    import io

    tqdm = pytest.importorskip("tqdm")
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    bar = tqdm.tqdm(total=100, file=stream)
    f = Forecaster(
        JobModel(total_steps=100), start_s=0.0, reports=ReportDispatcher([TqdmReporter(bar)])
    )
    run_job(f, 10, 0.2)
    assert bar.postfix.isascii() and "+/-" in bar.postfix and "| ETA" in bar.postfix
    f.close()
    bar.close()


def test_a_users_bar_says_done_at_the_last_step_before_close() -> None:
    """A user's bar closes itself when its loop ends, before ``hook.close()``: the postfix it
    shows then is the last step's (``done``), not a stale ETA from an earlier offer."""
    tqdm = pytest.importorskip("tqdm")
    bar = tqdm.tqdm(total=100, disable=True)
    f = Forecaster(
        JobModel(total_steps=100), start_s=0.0, reports=ReportDispatcher([TqdmReporter(bar)])
    )
    run_job(f, 100, 0.2)
    assert bar.postfix.endswith("done")
    f.close()
    bar.close()


def test_tqdm_bar_of_our_own(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    reporter = TqdmReporter(file=sys.stderr, mininterval=0)
    f = Forecaster(JobModel(total_steps=50), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 50, 0.2)
    f.close()
    err = capsys.readouterr().err
    assert "50/50" in err and "ETA" in err
    assert reporter._bar is not None and reporter._bar.disable is True  # closed


def test_our_bar_is_tqdm_autos_the_widget_in_a_notebook() -> None:
    """``progress=True`` makes the bar ``tqdm.auto`` picks: the notebook widget in Jupyter (a
    text bar redrawn with ``\\r`` there follows a replaced hook into the next cell), the text
    bar in a terminal."""
    auto = pytest.importorskip("tqdm.auto")
    assert TqdmReporter()._factory is auto.tqdm


def test_our_bar_of_a_job_of_unknown_length_ends_full(capsys: pytest.CaptureFixture[str]) -> None:
    """No length until close (which learns it): the last frame reads 30/30, not 30/?."""
    pytest.importorskip("tqdm")
    reporter = TqdmReporter(file=sys.stderr, mininterval=0)
    f = Forecaster(JobModel(), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 30, 0.2, on_step=lambda step, now: f.prediction)
    f.close()
    err = capsys.readouterr().err
    assert "30/30" in err and "100%" in err


def test_missing_tqdm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # as if never installed
    with pytest.raises(ImportError, match=r"pip install 'ets-hook\[tqdm\]'"):
        build_reporters(progress=True)
    with pytest.raises(ValueError, match="progress must be True, False, None or a tqdm bar"):
        TqdmReporter(bar=object())
