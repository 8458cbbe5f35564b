"""The wheel: built non-editable from this checkout, installed into a fresh venv, imported there.

One build per module (``wheel`` fixture); the fresh venv sees the current venv's dependencies
(torch, numpy, ...) through a ``.pth`` file, and the wheel is unzipped into its site-packages.
The imports run from a temporary working directory in isolated mode, so neither the checkout
nor the editable install can stand in for the installed package.
"""

from __future__ import annotations

import ast
import configparser
import fnmatch
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import numpy
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "ets_hook"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Installed:
    python: Path
    venv: Path
    site_packages: Path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "MAX_JOBS": "2"}
    build = subprocess.run(
        [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--disable-pip-version-check", "-w", str(out), str(ROOT),
        ],
        cwd=out, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    wheels = list(out.glob("ets_hook-*.whl"))
    assert len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    site_packages = Path(purelib)
    assert site_packages.is_dir() and venv in site_packages.parents
    # the current venv's dependencies (the folder holding numpy and torch), not its ets_hook:
    # the editable install's own .pth hook is not run for a folder added by a .pth line
    import torch

    deps = sorted({str(Path(numpy.__file__).parents[1]), str(Path(torch.__file__).parents[1])})
    (site_packages / "current-venv-deps.pth").write_text("\n".join(deps) + "\n")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site_packages)
    return Installed(python, venv, site_packages)


def run_installed(
    installed: Installed, code: str, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with the fresh venv's python, isolated (-I: no PYTHONPATH, no cwd on the
    path), from an empty temporary directory."""
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        [str(installed.python), "-I", "-c", code, *args],
        cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# What the wheel holds


def test_wheel_holds_the_data_stub_marker_and_extension(wheel_names: list[str]) -> None:
    for name in (
        "ets_hook/py.typed", "ets_hook/_C.pyi", "ets_hook/_ops.pyi", "ets_hook/data/early_cpu.npz"
    ):  # fmt: skip
        assert name in wheel_names, name
    extensions = fnmatch.filter(wheel_names, "ets_hook/_C*.so")
    assert len(extensions) == 1, extensions


def test_wheel_holds_every_subpackage(wheel_names: list[str]) -> None:
    subpackages = sorted(p.relative_to(ROOT).as_posix() for p in SOURCE.glob("*/__init__.py"))
    assert subpackages, "no subpackage found in the source tree"
    missing = [name for name in subpackages if name not in wheel_names]
    assert missing == []
    assert "ets_hook/__init__.py" in wheel_names


def test_wheel_python_files_are_the_source_trees(wheel_names: list[str]) -> None:
    """No module missing, and nothing stale (e.g. left in build/lib by an older layout)."""
    source = sorted(p.relative_to(ROOT).as_posix() for p in SOURCE.rglob("*.py"))
    in_wheel = sorted(n for n in wheel_names if n.startswith("ets_hook/") and n.endswith(".py"))
    assert in_wheel == source


def test_stub_never_mentions_the_testing_helpers(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        stub = zf.read("ets_hook/_C.pyi").decode()
    assert "_testing" not in stub
    ast.parse(stub)  # a valid stub


def test_metadata_and_console_script(wheel: Path, wheel_names: list[str]) -> None:
    import ets_hook

    (meta_name,) = fnmatch.filter(wheel_names, "ets_hook-*.dist-info/METADATA")
    (entry_name,) = fnmatch.filter(wheel_names, "ets_hook-*.dist-info/entry_points.txt")
    with zipfile.ZipFile(wheel) as zf:
        meta = Parser().parsestr(zf.read(meta_name).decode())
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(entry_name).decode())
    assert meta["Name"] == "ets-hook"
    assert meta["Version"] == ets_hook.__version__
    # an SPDX license expression (PEP 639, setuptools>=77), not the deprecated table's free text
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License"] is None
    assert not [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    assert entry_points["console_scripts"]["ets-hook"] == "ets_hook.cli.main:main"


# ---------------------------------------------------------------------------------------------
# The installed package

#: The optional extras and the distributions each must bring (pyproject.toml
#: [project.optional-dependencies]): the integrations' and reporters' ImportErrors name them.
EXTRAS = {
    "transformers": {"transformers", "accelerate"},
    "lightning": {"lightning"},
    "tensorboard": {"tensorboardx"},
    "prometheus": {"prometheus-client"},
}

EXTRAS_REPORT = textwrap.dedent(
    """
    import json, pathlib
    from importlib import metadata
    dist = metadata.distribution("ets-hook")
    print(json.dumps({
        "location": str(pathlib.Path(dist.locate_file("")).resolve()),
        "provides_extra": dist.metadata.get_all("Provides-Extra") or [],
        "requires": dist.requires or [],
    }))
    """
)


def test_the_installed_metadata_declares_the_extras(installed: Installed, tmp_path: Path) -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    run = run_installed(installed, EXTRAS_REPORT, tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    # importlib.metadata found the wheel's own distribution, not the checkout's editable one.
    assert Path(report["location"]) == installed.site_packages.resolve(), report
    assert set(EXTRAS) <= set(report["provides_extra"]), report["provides_extra"]
    requirements = [Requirement(line) for line in report["requires"]]
    for extra, packages in EXTRAS.items():
        named = {
            canonicalize_name(r.name)
            for r in requirements
            if r.marker is not None and r.marker.evaluate({"extra": extra})
        }
        assert packages <= named, (extra, named)
    # Importing ets_hook needs none of them: they are not unconditional requirements.
    unconditional = {canonicalize_name(r.name) for r in requirements if r.marker is None}
    assert not set().union(*EXTRAS.values()) & unconditional, unconditional
    # Every extra an ImportError message of the package tells users to install is declared.
    advised = {
        name
        for path in SOURCE.rglob("*.py")
        for name in re.findall(r"pip install 'ets-hook\[(\w+)\]'", path.read_text())
    }
    assert set(EXTRAS) <= advised, advised
    assert advised <= set(report["provides_extra"]), advised


IMPORT_ALL = textwrap.dedent(
    """
    import ast, importlib, json, pathlib, sys, traceback
    import ets_hook
    package = pathlib.Path(ets_hook.__file__).parent
    modules, failures = [], {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        modules.append(name)
        try:
            importlib.import_module(name)
        except Exception:
            failures[name] = traceback.format_exc()
    from ets_hook import _C
    stub = ast.parse((package / "_C.pyi").read_text())
    declared = [
        node.name if not isinstance(node, ast.AnnAssign) else node.target.id
        for node in stub.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AnnAssign))
    ]
    print(json.dumps({
        "package": ets_hook.__file__,
        "extension": _C.__file__,
        "modules": modules,
        "failures": failures,
        "stub_missing": [n for n in declared if not hasattr(_C, n)],
        "stub_names": len(declared),
        "has_testing": hasattr(_C, "_testing"),
        "checkout_on_path": any(
            pathlib.Path(p or ".").resolve() == pathlib.Path(sys.argv[1]) for p in sys.path
        ),
    }))
    """
)


@pytest.fixture(scope="module")
def import_report(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> dict:
    run = run_installed(installed, IMPORT_ALL, tmp_path_factory.mktemp("import"), str(ROOT))
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_every_installed_module_imports(import_report: dict) -> None:
    assert import_report["failures"] == {}
    modules = set(import_report["modules"])
    assert {"ets_hook", "ets_hook.hook", "ets_hook.cli.main", "ets_hook.trace.io"} <= modules
    expected = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in SOURCE.rglob("*.py")
    }
    assert modules == expected


def test_the_package_imported_is_the_installed_one(
    import_report: dict, installed: Installed
) -> None:
    assert not import_report["checkout_on_path"]
    package = Path(import_report["package"])
    extension = Path(import_report["extension"])
    assert installed.site_packages in package.parents, package
    assert installed.site_packages in extension.parents, extension
    assert ROOT not in package.parents


def test_the_stub_declares_only_what_the_extension_has(import_report: dict) -> None:
    assert import_report["stub_names"] > 0
    assert import_report["stub_missing"] == []
    assert import_report["has_testing"]  # the helpers exist, they are just not in the stub


def test_the_installed_command_line_runs(installed: Installed, tmp_path: Path) -> None:
    import ets_hook

    code = "import sys; from ets_hook.cli.main import main; sys.exit(main(sys.argv[1:]))"
    run = run_installed(installed, code, tmp_path, "--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"ets-hook {ets_hook.__version__}"


def test_the_installed_package_builds_the_op_observer_from_its_own_sources(
    installed: Installed, tmp_path: Path
) -> None:
    code = textwrap.dedent(
        """
        import json
        from ets_hook.capture import native_ops
        module = native_ops.load(build_if_missing=True)
        print(json.dumps({
            "sources": str(native_ops.source_dir()),
            "module": getattr(module, "__file__", None),
            "torch": getattr(module, "TORCH_VERSION", None),
            "reason": native_ops.unavailable_reason(),
        }))
        """
    )
    work = tmp_path / "cwd"
    work.mkdir()
    run = subprocess.run(
        [str(installed.python), "-I", "-c", code],
        cwd=work, capture_output=True, text=True, timeout=600,
        env={**os.environ, "ETS_HOOK_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert installed.site_packages in Path(report["sources"]).parents, report
    assert report["module"] and Path(report["module"]).is_relative_to(tmp_path / "cache"), report
    import torch

    assert report["torch"] == torch.__version__
