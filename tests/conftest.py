"""Shared fixtures: one real smoke run of the whole job through the CLI, reused by the
tests that need a trained model (building it once keeps the suite fast)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolpolicy.cli import main
from toolpolicy.demo import default_config_path

SMOKE = default_config_path().with_name("smoke.yaml")


STARTING_THREADS: list[int] = []
"""torch's thread count when the session began (before any fixture could change it)."""


def pytest_configure(config: pytest.Config) -> None:
    import torch

    STARTING_THREADS.append(torch.get_num_threads())


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A command run in-process with `threads: N` sets torch's thread count for the whole
    process; set it back to the count the session started with after each test, so no test
    computes with another test's setting (sums over another thread count differ in the last
    bits). The count is the session's, not the one this test found: a module-scoped fixture
    runs outside every test's restore, and would otherwise hand its setting on for good."""
    import torch

    yield
    torch.set_num_threads(STARTING_THREADS[0])


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished `toolpolicy demo` run in the smoke configuration."""
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    code = main(["demo", "--config", str(SMOKE), "--set", f"run.dir={run_dir}"])
    assert code == 0
    return run_dir


@pytest.fixture(scope="session")
def untrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialised embedded model (SFT of 0 steps): it never answers correctly."""
    run_dir = tmp_path_factory.mktemp("untrained")
    tiny = ["--set", "sft.steps=0", "--set", "sft.examples=1", "--set", "embedded.tokenizer_texts=50"]
    assert main(["sft", str(SMOKE), *tiny, "--set", f"run.dir={run_dir}"]) == 0
    return run_dir / "sft" / "final"


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """`family -> Path`: a tiny random checkpoint of a real chat-model family (tests/families.py),
    built on first use and reused for the rest of the session."""
    from families import build_family_checkpoint

    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_family_checkpoint(family, tmp_path_factory.mktemp(f"family-{family}"))
        return built[family]

    return get


@pytest.fixture(scope="session")
def family_policy(family_checkpoint):
    """`family -> PolicyModel` of `family_checkpoint(family)`, loaded once for the session (a
    real vocabulary takes seconds to load). For tests that only read it: none may train it."""
    from toolpolicy.model import PolicyModel

    loaded: dict[str, PolicyModel] = {}

    def get(family: str) -> PolicyModel:
        if family not in loaded:
            loaded[family] = PolicyModel.load(family_checkpoint(family))
        return loaded[family]

    return get


def free_port() -> int:
    """A loopback TCP port nothing listens on at the moment of asking."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]



HEADER_CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")
"""The flags that decide which kernels torch runs on this CPU, and so the last bits of its floats."""


def this_machine() -> str:
    from toolpolicy.model.placement import this_cpu

    model, flags = this_cpu()
    present = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in HEADER_CPU_FLAGS)
    return f"cpu: {model or 'unknown'} ({present}); {os.cpu_count()} cores"


def pytest_sessionstart(session: pytest.Session) -> None:
    """The CPU the suite runs on, first in its output (even under -q), and again in the summary
    (`pytest_terminal_summary`): a float comparison that fails on one machine kind and not
    another says so in the log."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(this_machine())


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(this_machine())
