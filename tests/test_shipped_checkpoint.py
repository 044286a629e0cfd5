"""The shipped SFT checkpoint the demo starts from loads and speaks the project's format."""

from __future__ import annotations

import inspect
from pathlib import Path

import yaml

from toolpolicy.envs import CalcEnv
from toolpolicy.model import load_policy, make_template
from toolpolicy.demo import default_config_path
from toolpolicy.build import load_config
from toolpolicy.config import replaced
from toolpolicy.checks import demonstrator_for

ROOT = Path(__file__).resolve().parents[1]


def test_demo_config_points_at_the_shipped_checkpoint():
    config = yaml.safe_load(default_config_path().read_text())
    shipped = ROOT / config["sft"]["cold_start"]
    assert (shipped / "model.safetensors").is_file(), f"{shipped} is missing: run the sft command in README.md"
    model, tokenizer = load_policy(shipped)
    shape = config["embedded"]
    assert model.config.hidden_size == shape["hidden_size"] and model.config.num_hidden_layers == shape["layers"]
    env = CalcEnv()
    messages = env.initial_messages(env.tasks("eval", 1, seed=0)[0])
    rendered = tokenizer.apply_chat_template(
        [m.to_dict() for m in messages], tools=[s.to_openai() for s in env.tools.specs()], tokenize=False, add_generation_prompt=True
    )
    expected = make_template(compact=True).render_prompt(messages, env.tools.specs())
    assert rendered == expected


def demonstrated_by(cfg) -> dict[str, object]:
    """Every option of the config's demonstrator, the ones it leaves unset at their defaults."""
    demonstrate = demonstrator_for(cfg.demonstrator, cfg.env)
    defaults = {name: p.default for name, p in inspect.signature(demonstrate).parameters.items() if p.kind is p.KEYWORD_ONLY}
    return {**defaults, **cfg.demonstrator.options}


SFT_SECTIONS = ("sft", "demonstrator", "env", "embedded", "rollout")
"""What SFT's result depends on (besides run.seed): its data, schedule, demonstrator, tasks and the model's shape."""


def assert_made_by(shipped: Path, config: Path, env: str, changes: dict[str, object] | None = None) -> None:
    """The shipped checkpoint's recorded config has every SFT field of `config` (with
    `changes`, {"section.field": value}), so `toolpolicy sft CONFIG --set FIELD=VALUE ...` remakes it."""
    made_by = load_config(shipped / "toolpolicy-config.yaml")
    source = replaced(load_config(config), changes or {})
    assert made_by.env.name == env and made_by.run.seed == source.run.seed
    recorded, expected = made_by.model_dump(), source.model_dump()
    differ = {s: (recorded[s], expected[s]) for s in SFT_SECTIONS if recorded[s] != expected[s] and s not in ("sft", "demonstrator")}
    assert not differ, differ
    assert demonstrated_by(made_by) == demonstrated_by(source)
    keys = ("data", "examples", "steps", "batch_size", "lr", "warmup_steps")  # sft.cold_start is where a run finds it, not how it was made
    assert {k: recorded["sft"][k] for k in keys} == {k: expected["sft"][k] for k in keys}


def test_demo_config_remakes_the_shipped_checkpoint():
    assert_made_by(ROOT / "checkpoints" / "calc-sft", default_config_path(), env="calc")


def test_hotel_configs_point_at_the_shipped_hotel_checkpoints():
    from toolpolicy.envs import HotelEnv

    configs = ROOT / "src" / "toolpolicy" / "configs"
    hotel, ablation = load_config(configs / "hotel.yaml"), load_config(configs / "ablation_hotel.yaml")
    shipped = ROOT / "checkpoints" / "hotel-sft"
    assert (shipped / "model.safetensors").is_file(), f"{shipped} is missing: run the hotel sft command in docs/experiments/hotel.md"
    assert_made_by(shipped, configs / "hotel.yaml", env="hotel")
    violation = ablation.demonstrator.options["violation"]
    assert violation != hotel.demonstrator.options["violation"]  # the ablation's is the earlier cold start
    assert_made_by(ROOT / ablation.rl.init_from, configs / "hotel.yaml", env="hotel", changes={"demonstrator.violation": violation})
    model, tokenizer = load_policy(shipped)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (hotel.embedded.hidden_size, hotel.embedded.layers)
    env = HotelEnv()
    task = env.tasks("eval", 1, seed=0)[0]
    ids = tokenizer(f"{task.info['last_name']}, born {task.info['birth_year']}")["input_ids"]
    assert tokenizer.decode(ids) == f"{task.info['last_name']}, born {task.info['birth_year']}"
