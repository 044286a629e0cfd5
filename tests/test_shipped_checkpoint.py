"""The shipped SFT checkpoint the demo starts from loads and speaks the project's format."""

from __future__ import annotations

from pathlib import Path

import yaml

from toolpolicy.envs import CalcEnv
from toolpolicy.model import load_policy, make_template
from toolpolicy.demo import default_config_path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_config_points_at_the_shipped_checkpoint():
    config = yaml.safe_load(default_config_path().read_text())
    shipped = ROOT / config["cold_start"]
    assert (shipped / "model.safetensors").is_file(), f"{shipped} is missing: run the sft command in README.md"
    model, tokenizer = load_policy(shipped)
    assert model.config.hidden_size == config["hidden_size"] and model.config.num_hidden_layers == config["layers"]
    env = CalcEnv()
    messages = env.initial_messages(env.tasks("eval", 1, seed=0)[0])
    rendered = tokenizer.apply_chat_template(
        [m.to_dict() for m in messages], tools=[s.to_openai() for s in env.tools.specs()], tokenize=False, add_generation_prompt=True
    )
    expected = make_template(compact=True).render_prompt(messages, env.tools.specs())
    assert rendered == expected
