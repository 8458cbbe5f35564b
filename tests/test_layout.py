"""The package's imports point down the pipeline: cli -> hook -> capture, forecast, reporters ->
ets -> trace, with errors at the bottom. Imports inside functions count; imports under
``if TYPE_CHECKING:`` do not (they cost nothing at run time)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ets_hook"

# What each part of the package may import from the package (dotted prefixes, "ets_hook."
# left out). A part may always import its own modules.
ALLOWED: dict[str, tuple[str, ...]] = {
    "errors": (),
    # closes the live hooks on every exit path; knows nothing of what they are
    "exits": (),
    # what the launcher's environment variables say (rank, world size); reads os.environ only
    "launcher": (),
    "trace": ("errors",),
    "ets": ("trace", "errors"),
    "forecast": ("ets", "trace", "errors"),
    # reporters know the Prediction (its phases, its text), never the forecaster or the capture
    "reporters": (
        "forecast.prediction",
        "forecast.job",
        "forecast.text",
        "trace",
        "errors",
        "launcher",
    ),
    "capture": ("trace", "errors", "_C", "launcher"),
    # the ranks' exchange of forecasts; knows forecasts and traces, never the capture
    "distributed": ("forecast", "trace", "errors"),
    # the checks of ETSHook's arguments, shared with the framework callbacks
    "hook_arguments": ("forecast.text",),
    "hook": (
        "hook_arguments",
        "exits",
        "launcher",
        "distributed",
        "capture",
        "forecast",
        "reporters",
        "ets",
        "trace",
        "errors",
        "__version__",
    ),
    # above the hook: they check its options with the code it checks them with
    "integrations": (
        "hook",
        "hook_arguments",
        "exits",
        "capture",
        "forecast",
        "reporters",
        "distributed.coordinator",
        "ets",
        "trace",
        "errors",
    ),
    "cli": ("hook", "capture", "forecast", "reporters", "ets", "trace", "errors", "__version__"),
}


def _part(module: str) -> str:
    """``ets_hook.capture.ops`` -> ``capture``; ``ets_hook.hook`` -> ``hook``."""
    return module.split(".")[1]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(("ets_hook", *path.relative_to(PACKAGE).with_suffix("").parts))
        found[dotted.removesuffix(".__init__")] = path
    return found


def _runtime_imports(module: str, path: Path) -> list[str]:
    """Package-internal import targets of a module ("ets_hook" left out), lazy ones included."""
    tree = ast.parse(path.read_text(), str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    targets = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "ets_hook":  # from . import _C / __version__
                targets += [alias.name for alias in node.names]
            elif target.startswith("ets_hook."):
                targets.append(target.removeprefix("ets_hook."))
        elif isinstance(node, ast.Import):
            targets += [
                a.name.removeprefix("ets_hook.")
                for a in node.names
                if a.name.startswith("ets_hook.")
            ]
    return targets


MODULES = _modules()


@pytest.mark.parametrize(
    "module", [m for m in MODULES if m != "ets_hook"], ids=lambda m: m.removeprefix("ets_hook.")
)
def test_imports_point_down_the_pipeline(module: str) -> None:
    part = _part(module)
    allowed = (part, *ALLOWED[part])
    climbing = [
        target
        for target in _runtime_imports(module, MODULES[module])
        if not any(target == a or target.startswith(a + ".") for a in allowed)
    ]
    assert not climbing, f"{module} imports {climbing}; {part} may import only {allowed}"


def test_only_capture_cupti_imports_the_native_module() -> None:
    importers = [m for m, path in MODULES.items() if "_C" in _runtime_imports(m, path)]
    assert importers == ["ets_hook.capture.cupti"]


def test_errors_imports_nothing_from_the_package_at_run_time() -> None:
    assert _runtime_imports("ets_hook.errors", MODULES["ets_hook.errors"]) == []


def test_every_stage_is_a_subpackage_and_the_root_stays_small() -> None:
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= 8, root_modules
    for stage in ("capture", "trace", "ets", "forecast", "reporters", "integrations", "cli"):
        assert (PACKAGE / stage / "__init__.py").is_file(), stage


def test_the_rule_catches_a_climbing_import(tmp_path: Path) -> None:
    """The checker itself: a lazy import of the capture stage inside ets/ is reported."""
    module = tmp_path / "features.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..hook import ETSHook\n"
        "def f():\n    from ..capture.cupti import name_table\n    return name_table\n"
    )
    assert _runtime_imports("ets_hook.ets.features", module) == ["capture.cupti"]


def test_import_ets_hook_imports_neither_torch_nor_any_integration() -> None:
    code = (
        "import sys, ets_hook\n"
        "heavy = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', 'tqdm')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_package_code_never_mentions_the_native_testing_module() -> None:
    mentions = [
        str(path.relative_to(PACKAGE))
        for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyi")]
        if "_testing" in path.read_text()
    ]
    assert mentions == []


def test_every_public_name_resolves_and_the_annotations_evaluate() -> None:
    """What a type checker, an IDE or a configuration tool (LightningCLI) reads: each exported
    name, and the hook's and the prediction's annotations evaluated (no name that only a type
    checker sees); string options are their choices (``Literal``), not any ``str``."""
    import typing

    import ets_hook

    for name in ets_hook.__all__:
        assert getattr(ets_hook, name) is not None, name
    hints = typing.get_type_hints(ets_hook.ETSHook.__init__)
    assert typing.get_args(hints["record_shapes"]) == ("first", "all", "none")
    assert typing.get_args(hints["op_capture"]) == ("auto", "native", "profiler")
    assert typing.get_args(hints["deadline_policy"]) == ("confident", "likely", "point")
    assert "warn" in typing.get_args(typing.get_args(hints["on_deadline"])[0])
    prediction_hints = typing.get_type_hints(ets_hook.Prediction)
    assert prediction_hints["phases"] == tuple[ets_hook.PhaseForecast, ...]
