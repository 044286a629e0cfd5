"""The shipped SFT checkpoint the demo starts from loads and speaks the project's format."""

from __future__ import annotations

from pathlib import Path

import yaml

from toolpolicy.envs import CalcEnv
from toolpolicy.model import load_policy, make_template
from toolpolicy.demo import default_config_path
from toolpolicy.config import load_config

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


def assert_made_by(shipped: Path, config: Path, env: str, **changes: object) -> None:
    """The shipped checkpoint's recorded config has every SFT field of `config` (with
    `changes`), so `toolpolicy sft CONFIG --set FIELD=VALUE ...` remakes it."""
    made_by = load_config(shipped / "toolpolicy-config.yaml")
    source = load_config(config).model_copy(update=changes)
    sft_fields = [name for name in type(source).model_fields
                  if name.startswith(("sft_", "expert_", "max_")) or name in ("env", "seed", "vocab_size", "tokenizer_texts")]
    assert made_by.env == env
    assert {f: getattr(made_by, f) for f in sft_fields} == {f: getattr(source, f) for f in sft_fields}


def test_demo_config_remakes_the_shipped_checkpoint():
    assert_made_by(ROOT / "checkpoints" / "calc-sft", default_config_path(), env="calc")


def test_hotel_configs_point_at_the_shipped_hotel_checkpoints():
    from toolpolicy.envs import HotelEnv

    configs = ROOT / "src" / "toolpolicy" / "configs"
    hotel, ablation = load_config(configs / "hotel.yaml"), load_config(configs / "ablation_hotel.yaml")
    shipped = ROOT / "checkpoints" / "hotel-sft"
    assert (shipped / "model.safetensors").is_file(), f"{shipped} is missing: run the hotel sft command in README.md"
    assert_made_by(shipped, configs / "hotel.yaml", env="hotel")
    assert ablation.expert_violation != hotel.expert_violation  # the ablation's is the earlier cold start
    assert_made_by(ROOT / ablation.init_from, configs / "hotel.yaml", env="hotel", expert_violation=ablation.expert_violation)
    model, tokenizer = load_policy(shipped)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (hotel.hidden_size, hotel.layers)
    env = HotelEnv()
    task = env.tasks("eval", 1, seed=0)[0]
    ids = tokenizer(f"{task.info['last_name']}, born {task.info['birth_year']}")["input_ids"]
    assert tokenizer.decode(ids) == f"{task.info['last_name']}, born {task.info['birth_year']}"
