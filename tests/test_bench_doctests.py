"""The worked examples in the benchmarks' docstrings: the arithmetic their result files report
(a distillation's steps over GRPO's, a seed interval) is checked where it is written."""

from __future__ import annotations

import doctest
import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "bench"


@pytest.mark.parametrize("module", ["bfcl_pass_at_k", "distill_calc", "seed_interval"])
def test_bench_docstring_examples_hold(module, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # a benchmark imports its neighbours as a script run from bench/ does
    loaded = importlib.import_module(module)
    try:
        result = doctest.testmod(loaded)
    finally:
        sys.modules.pop(module, None)
    assert result.attempted > 0, f"bench/{module}.py has no examples to check"
    assert result.failed == 0
