"""The wheel holds every data file the package reads at run time (policy files, configs,
the viewer's script and style), built offline from a copy of the source."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "toolpolicy"


def data_files() -> set[str]:
    """The package's files other than Python sources, as paths inside the wheel."""
    return {
        path.relative_to(ROOT / "src").as_posix() for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout (the build writes its own folders beside the sources)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(work), str(source)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    (built,) = work.glob("toolpolicy-*.whl")
    return built


def test_the_wheel_holds_every_data_file_of_the_package(wheel: Path):
    assert data_files() >= {"toolpolicy/envs/bfcl/policy.yaml", "toolpolicy/envs/zoom/policy.yaml", "toolpolicy/report/viewer.js"}
    with zipfile.ZipFile(wheel) as archive:
        held = set(archive.namelist())
    assert sorted(data_files() - held) == []


def test_every_built_in_environments_policy_file_is_package_data():
    from toolpolicy.envs.catalog import BUILT_IN

    policies = {row.policy_file.relative_to(ROOT / "src").as_posix() for row in BUILT_IN.values() if row.policy_file}
    assert policies and policies <= data_files()


INSTALLED_RUN = """
import json, sys
from pathlib import Path
import toolpolicy
from toolpolicy.cli import main
from toolpolicy.envs.catalog import BUILT_IN
from toolpolicy.gate import Policy

site = Path(sys.argv[1])
assert Path(toolpolicy.__file__).is_relative_to(site), toolpolicy.__file__  # the wheel's copy, not the checkout
for name, row in BUILT_IN.items():
    if row.policy_file is not None:
        assert row.policy_file.is_relative_to(site), (name, row.policy_file)
        Policy.load(row.policy_file)
env, checkpoint, config, run_dir = sys.argv[2:6]
code = main([
    "eval", str(site / "toolpolicy" / "configs" / config), "--set", f"env.name={env}", "--set", f"eval.checkpoint={checkpoint}",
    "--set", "eval.tasks=2", "--set", "eval.samples=1", "--set", f"run.dir={run_dir}", "--set", "run.threads=1",
])
assert code == 0, code
(summary,) = [json.loads(p.read_text()) for p in (Path(run_dir) / "eval").glob("*.json") if not p.name.endswith(".config.json")]
print(json.dumps({"policy": summary["policy"]}))
"""
"""Run in a fresh interpreter with only the installed wheel's toolpolicy on its path: every
policy file of the table loads from the wheel, and one evaluation runs from its shipped config."""


@pytest.mark.parametrize("env, checkpoint, config", [("calc", "calc-sft", "demo.yaml"), ("hotel", "hotel-sft", "hotel.yaml")])
def test_the_installed_wheel_evaluates_an_environment_from_its_own_files(wheel: Path, env, checkpoint, config, tmp_path):
    """Installed with --no-deps into a folder of its own (its dependencies are the test
    interpreter's), run from a folder outside the checkout; the environments that need no
    download and have a shipped checkpoint (bfcl and agentdojo read their packages' data,
    zoom has no shipped checkpoint)."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True)
    env_vars = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", INSTALLED_RUN, str(site), env, str(ROOT / "checkpoints" / checkpoint), config, str(tmp_path / "run")]
    done = subprocess.run(command, cwd=tmp_path, env=env_vars, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if env == "hotel":
        assert Path(result["policy"]).is_relative_to(site)  # its own policy.yaml, from the wheel
