"""ETSCallback configured through LightningCLI (jsonargparse), in-process on CPU: the README's
YAML, the command-line form, ``--print_config`` read back, and a bad value as the CLI's error."""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("jsonargparse")
pytest.importorskip("yaml")

import lightning.pytorch as L
import yaml
from lightning.pytorch.cli import LightningCLI
from support import readme_python_blocks
from torch.utils.data import DataLoader, TensorDataset

from ets_hook.integrations.common import HOOK_ARGUMENTS
from ets_hook.integrations.lightning import ETSCallback

# Lightning's CLI calls jsonargparse APIs that warn of their own deprecation, and warns that
# args= is given while pytest has sys.argv: neither is ours.
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:LightningCLI's args parameter:UserWarning"),
]

CLASS_PATH = "ets_hook.integrations.lightning.ETSCallback"
BATCHES_PER_EPOCH = 8


class Regression(L.LightningModule):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.net = torch.nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class RandomData(L.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(BATCHES_PER_EPOCH * 4, 8, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def cli(*args: str) -> LightningCLI:
    """A LightningCLI as a user's ``main.py`` makes it, parsing ``args``, not running."""
    return LightningCLI(
        Regression,
        RandomData,
        args=[
            "--trainer.accelerator=cpu",
            "--trainer.max_epochs=2",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            *args,
        ],
        run=False,
        save_config_callback=None,
    )


def ets_callback(trainer: L.Trainer) -> Any:
    (callback,) = [c for c in trainer.callbacks if isinstance(c, ETSCallback)]
    return callback


def test_the_signature_names_every_hook_option() -> None:
    parameters = inspect.signature(ETSCallback).parameters
    assert set(parameters) == {"prog_bar"} | (HOOK_ARGUMENTS - {"model"})
    assert all(p.kind is p.KEYWORD_ONLY for p in parameters.values())
    assert parameters["status_path"].default is None and parameters["log_every"].default == 100
    assert parameters["grad_accum_steps"].default is None  # None: the Trainer's
    with pytest.raises(TypeError, match="statuspath"):
        ETSCallback(statuspath="eta.json")


def test_the_readme_config_runs_and_the_trainer_supplies_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    (config,) = readme_python_blocks("LightningCLI (YAML configs)", language="yaml")
    (tmp_path / "config.yaml").write_text(config)
    made = cli("--config", "config.yaml")
    callback = ets_callback(made.trainer)
    # Every option arrived (the CLI passes defaults too); only the two given are kept.
    assert callback.hook_options == {"status_path": "eta.json", "log_every": 0}
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        made.trainer.fit(made.model, datamodule=made.datamodule)
    steps = 2 * BATCHES_PER_EPOCH // 2  # two epochs, accumulate_grad_batches: 2
    assert made.trainer.global_step == steps
    assert callback.resolved_options["grad_accum_steps"] == 2  # the Trainer's, not the default 1
    assert callback.resolved_options["total_steps"] == steps
    assert callback.hook.total_steps == steps and callback.hook.closed
    assert not [r for r in caplog.records if "values given explicitly" in r.getMessage()]
    status = json.loads((tmp_path / "eta.json").read_text())
    assert status["state"] == "closed"
    assert status["prediction"]["step"] == status["prediction"]["total_steps"] == steps


def test_command_line_options_and_print_config_read_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = tmp_path / "eta.json"
    given = (f"--trainer.callbacks+={CLASS_PATH}", f"--trainer.callbacks.status_path={status}")
    with pytest.raises(SystemExit) as exit_info:
        cli(*given, "--trainer.callbacks.grad_accum_steps=3", "--print_config")
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    (entry,) = [c for c in printed["trainer"]["callbacks"] if c["class_path"] == CLASS_PATH]
    assert set(entry["init_args"]) == {"prog_bar"} | (HOOK_ARGUMENTS - {"model"})
    assert entry["init_args"]["status_path"] == str(status)
    assert entry["init_args"]["grad_accum_steps"] == 3
    (tmp_path / "printed.yaml").write_text(yaml.safe_dump(printed))
    made = cli("--config", str(tmp_path / "printed.yaml"))
    assert ets_callback(made.trainer).hook_options == {
        "status_path": str(status),
        "grad_accum_steps": 3,  # given: wins over the Trainer's 1
    }


def test_a_bad_value_is_the_cli_error_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def error(*args: str) -> str:
        """What the CLI says: jsonargparse raises the callback's ValueError inside its own
        (while it instantiates the classes) or exits with a parser error."""
        try:
            cli(f"--trainer.callbacks+={CLASS_PATH}", *args)
        except SystemExit as exc:
            assert exc.code not in (0, None)
            return capsys.readouterr().err
        except ValueError as exc:
            return str(exc)
        raise AssertionError(f"no error for {args}")

    assert "capture_steps must be an int >= 0, got -3" in error(
        "--trainer.callbacks.capture_steps=-3"
    )
    missing = tmp_path / "missing" / "eta.json"
    assert "status_path's directory does not exist" in error(
        f"--trainer.callbacks.status_path={missing}"
    )
