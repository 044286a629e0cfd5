"""`toolpolicy eval` checks only what evaluation uses: an environment with no built-in
demonstrator evaluates under a config whose demonstrator section names none or holds
another environment's options (evaluation calls no demonstrator); `toolpolicy sft`, which
does, still refuses it."""

from pathlib import Path

import pytest
import yaml

import toolpolicy.api
from toolpolicy import cli
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


class Validated(Exception):
    """Raised where evaluation starts, once the config has loaded."""


@pytest.mark.parametrize("env", ["agentdojo", "adder.adder:AdderEnv"])
def test_eval_loads_a_config_whose_demonstrator_section_its_environment_cannot_use(env, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"run": {"dir": str(tmp_path / "run")}, "env": {"name": env}, "demonstrator": {"tool_on_hard": 0.3}}))

    def scored_model(cfg):
        raise Validated(cfg.env.name)

    monkeypatch.setattr(toolpolicy.api, "scored_model", scored_model)
    with pytest.raises(Validated, match=env):
        cli.main(["eval", str(config)])
    with pytest.raises(ConfigError, match="field 'demonstrator.name'"):
        load_config(config)  # what sft loads: there the demonstrator is used, and checked
