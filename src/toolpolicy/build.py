"""What every command builds from a config: the checked config itself, the run folder, the
environment, its gate, the Rubric, the policy and the engine.

Each function takes the sections it needs and returns one part, so the trainer, evaluation
and the demo assemble the same parts the same way; the parts themselves (envs/, gate/,
rollout/) know nothing of the config.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

from toolpolicy.checks import checked, env_options
from toolpolicy.config import (
    Config, ConfigError, EnvSection, GateSection, ModelSection, RewardsSection, RolloutSection, changed_fields, config_source, read_config,
    save_config,
)
from toolpolicy.envs import Env, as_env, make_env, user_factory
from toolpolicy.gate import AuditLog, Gate, Policy
from toolpolicy.model import ChatChoice, PolicyModel
from toolpolicy.model.adapters import LoraSettings, attach_lora, is_adapter, merged, store_frozen_in
from toolpolicy.model.gguf import local_checkpoint
from toolpolicy.model.vision import freeze_vision_tower
from toolpolicy.model.placement import DTYPES, Placement, linear_weights_in, resolve_device, resolve_dtype
from toolpolicy.rewards import Rubric, overlong
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, allow_all_policy
from toolpolicy.rollout.catalog import build_backend
from toolpolicy.rollout.chat_endpoint import ChatClient, Endpoint, EndpointUser
from toolpolicy.types import Task


def load_config(path: str | Path | None, overrides: list[str] = (), demonstrations: bool = True) -> Config:
    """The config of the YAML file `path` (None: the defaults) with `--set` overrides, typed
    (`read_config`) and checked (`toolpolicy.checks.checked`; the demonstrator section only
    with `demonstrations`, for a command that generates them): what every command runs on."""
    return checked(read_config(path, overrides), config_source(path, overrides), demonstrations)


def load_run_config(run_dir: str | Path, overrides: list[str] = (), override: bool = False, demonstrations: bool = True) -> Config:
    """The config of the run in `run_dir` (RUN_DIR/config.yaml, resolved when it started), for
    --resume, with `--set` overrides on top. An override that changes a saved value is refused,
    naming the field and both values, unless `override`: a resumed run goes on as it started
    and its config.yaml stays the record of that."""
    saved_file = Path(run_dir) / "config.yaml"
    if not saved_file.is_file():
        raise ConfigError(
            f"{run_dir}: no config.yaml, so not a run folder to resume (--resume takes the run.dir "
            "of an earlier `toolpolicy sft` or `toolpolicy train`)"
        )
    saved = load_config(saved_file, [f"run.dir={run_dir}"], demonstrations)
    resumed = load_config(saved_file, [*overrides, f"run.dir={run_dir}"], demonstrations)
    changed = changed_fields(saved, resumed)
    if changed and not override:
        raise ConfigError(
            f"--set would change {saved_file}: {'; '.join(changed)}. A resumed run goes on with the config it "
            "started with; add --override to change it anyway (config.yaml is rewritten)"
        )
    planned, replanned = planned_optimizer_steps(saved), planned_optimizer_steps(resumed)
    if resumed.rl.lr_schedule == "cosine" and replanned != planned:
        print(
            f"note: rl.lr_schedule cosine decays over {replanned} optimizer steps now where the run planned {planned}: "
            "the LR jumps at the resumed step to where the new plan has it",
            file=sys.stderr,
        )
    return resumed


def planned_optimizer_steps(cfg: Config) -> int:
    """The optimizer steps an RL run plans (each step's batch in algorithm.mini_batches, each
    passed over update_passes times), which rl.lr_schedule cosine decays over."""
    return cfg.rl.steps * cfg.algorithm.mini_batches * cfg.algorithm.update_passes


def prepare_run_dir(cfg: Config) -> Path:
    """Create the run folder, write the resolved config into it and set torch's threads."""
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    return run_dir


def episode_limits(rollout: RolloutSection) -> EpisodeLimits:
    return EpisodeLimits(max_turns=rollout.max_turns, max_tokens=rollout.max_tokens, max_turn_tokens=rollout.max_turn_tokens)


def build_env(env: EnvSection) -> Env:
    """The environment `env.name` with its own options, given the user simulator the section
    names: a served model at `env.user_url` playing the user from the scenario the
    environment gives (`Env.user_scenario`), or `env.user`; else the environment's own."""
    options = env_options(env)
    if env.user_url:
        endpoint = Endpoint(env.user_url, env.user_model, env.user_api_key_env, temperature=env.user_temperature)
        client = ChatClient(endpoint)

        def served_user(task: Task) -> EndpointUser:  # called per episode, once `built` exists
            return EndpointUser(client, built.user_scenario(task))

        built = make_env(env.name, user=served_user, **options)
        return built
    if env.user:
        return make_env(env.name, user=user_factory(env.user), **options)
    return make_env(env.name, **options)


def policy_path(gate: GateSection, env: Env) -> str:
    """The policy file the gate enforces: `gate.policy`, else the environment's own, else none ("")."""
    return gate.policy or str(as_env(env).policy_file)


def build_gate(gate: GateSection, env: Env, run_dir: Path, enforce: bool = True, audit_file: str = "audit.jsonl") -> Gate | None:
    """The gate of `gate.policy`, or of the environment's own policy file (`env.policy_file`,
    e.g. hotel's), or allow-all; logging to RUN_DIR/`audit_file` if `gate.audit`. None when
    there is neither a policy nor an audit log, for the engine's own allow-all gate.
    enforce=False is shadow mode: violations are counted, not prevented."""
    path = policy_path(gate, env)
    if not path and not gate.audit:
        return None
    policy = Policy.load(path) if path else allow_all_policy()
    audit = AuditLog(run_dir / audit_file, durable=False) if gate.audit else None
    return Gate(policy, env.tools, audit=audit, enforce=enforce)


def build_rubric(rewards: RewardsSection, default_rewards: dict[str, float]) -> Rubric:
    """The config's reward weights (or the environment's `default_rewards`), plus DAPO's
    overlong penalty as the term `overlong` when `rewards.overlong_penalty` is set: the one
    Rubric that training optimises and evaluation reports."""
    rubric = Rubric.from_weights(rewards.weights or default_rewards)
    if rewards.overlong_penalty == 0:
        return rubric
    length = rewards.overlong_length
    assert length is not None, "checks.checked writes overlong_length"
    return rubric.with_term("overlong", overlong(length, int(rewards.overlong_buffer * length)), rewards.overlong_penalty)


def chat_choice(model: ModelSection) -> ChatChoice:
    """How the policy's chat format is read: the model section's chat_* fields."""
    return ChatChoice(model.chat_format, model.chat_template, model.chat_template_kwargs, model.chat_tools)


def placement(model: ModelSection) -> Placement:
    """The model section's device, precision (`dtype: auto` decided for that device) and checkpointing."""
    return Placement(model.device, resolve_dtype(model.dtype, resolve_device(model.device)), model.gradient_checkpointing)


def load_policy_model(model: ModelSection, path: str | Path) -> PolicyModel:
    """The checkpoint at `path` in the chat format, on the device and in the precision the
    model section asks for (a device the machine lacks is DeviceUnavailable)."""
    return PolicyModel.load(path, chat_choice(model), placement(model))


def inference_policy(model: ModelSection, path: str | Path) -> PolicyModel:
    """The checkpoint at `path` for sampling only (evaluation): as `load_policy_model`, a LoRA
    adapter folded into its base (one product a projection instead of three; a vLLM engine
    then takes the folded weights), the linear weights stored in the compute dtype
    (`linear_weights_in`)."""
    policy = load_policy_model(model, path)
    policy.model = merged(policy.model)
    policy.model.requires_grad_(False)
    linear_weights_in(policy.model, DTYPES[placement(model).dtype])
    return policy


def trainable_policy(
    model: ModelSection,
    path: str | Path,
    phase_dir: Path,
    resuming: bool,
    seed: int = 0,
    main: bool = True,
    barrier: Callable[[], None] = lambda: None,
) -> PolicyModel:
    """The policy a training phase updates. Without LoRA: the checkpoint at `path`. With
    LoRA: a resumed adapter as saved; else a fresh adapter on `path`, where an adapter
    `path` (RL from LoRA SFT) is first merged into its base and saved as PHASE_DIR/base,
    the new adapter's base and its KL reference. The frozen base is kept in `dtype`, and
    PHASE_DIR/base is saved in it: the values the adapter trains against, half the disk in
    bfloat16 (269 MB for SmolLM2-135M instead of 538). A fresh
    adapter's random initial weights come from `seed` (the same in every process and run).
    Under torchrun the `main` process writes PHASE_DIR/base and every process loads it
    after `barrier`. A vision-language policy's vision tower is frozen unless
    `model.train_vision`."""
    policy = _with_adapter(model, path, phase_dir, resuming, seed, main, barrier)
    if not model.train_vision:
        freeze_vision_tower(policy.model)
    return policy


def _with_adapter(
    model: ModelSection, path: str | Path, phase_dir: Path, resuming: bool, seed: int, main: bool, barrier: Callable[[], None]
) -> PolicyModel:
    """The checkpoint at `path`, with a LoRA adapter when the model section asks for one (see trainable_policy)."""
    policy = load_policy_model(model, path)
    if not model.lora_rank or resuming:
        return policy
    base = local_checkpoint(path)  # the adapter names a folder, never a GGUF file
    frozen = DTYPES[placement(model).dtype]
    if is_adapter(path):
        base = phase_dir / "base"
        if main:
            merged(policy.model).to(frozen).save_pretrained(base)
            policy.tokenizer.save_pretrained(base)
        barrier()
        policy = load_policy_model(model, base)
    settings = LoraSettings(model.lora_rank, model.lora_alpha, model.lora_dropout, tuple(model.lora_target_modules))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy.model = attach_lora(policy.model, settings, base)
    store_frozen_in(policy.model, frozen)
    return policy


def build_engine(
    cfg: Config, policy: PolicyModel, generator: torch.Generator, temperature: float, enforce: bool = True,
    audit_file: str = "audit.jsonl",
) -> RolloutEngine:
    """The rollout engine of the config's environment sampling from `policy` at `temperature`
    (rl.temperature or eval.temperature), through the config's gate and backend (its audit log
    RUN_DIR/`audit_file`: one per process)."""
    env = build_env(cfg.env)
    backend = build_backend(cfg.backend, cfg.model, cfg.run.threads, policy, generator, temperature)
    gate = build_gate(cfg.gate, env, Path(cfg.run.dir), enforce, audit_file)
    return RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, episode_limits(cfg.rollout), gate, cfg.rollout.tool_workers)
