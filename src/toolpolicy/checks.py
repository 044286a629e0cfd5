"""Every rule across config fields and every name a config gives, checked in one place.

`toolpolicy.config` types each section on its own; `checked` then resolves what the config
names (environment, user simulator, reward functions; the demonstrator for the commands
that generate demonstrations) and checks each named
component's options against its signature, applies the algorithm preset, writes the
lengths that default to the episode budget into the config, and checks the rules that tie
sections together, the backend's capabilities among them. `toolpolicy.build.load_config`
runs both, so every command stops on a bad config before it starts work, with one message
that lists every problem by `section.field`.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, get_args

from pydantic import TypeAdapter, ValidationError

from toolpolicy.algorithms import AGGREGATIONS, ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from toolpolicy.algorithms.distill import DIVERGENCES
from toolpolicy.algorithms.presets import apply_preset
from toolpolicy.config import AlgorithmSection, Config, ConfigError, DemonstratorSection, EnvSection, RewardsSection, type_name
from toolpolicy.envs import DEMONSTRATORS, ENVS, Demonstrator, Env, env_factory, takes_user, user_factory
from toolpolicy.model.placement import resolve_device
from toolpolicy.registry import DEMONSTRATOR, ExtensionError, is_import_path, resolve_callable
from toolpolicy.rollout.catalog import capabilities_of
from toolpolicy.tools.decorator import parse_docstring
from toolpolicy.types import EventKind

DEMONSTRATOR_ARGUMENTS = ("task", "rng", "env")
"""What a demonstrator is called with besides its options."""
ENV_ARGUMENTS = ("user",)
"""What an environment is given besides its options (the user simulator, from env.user / env.user_url)."""


def checked(cfg: Config, source: str, demonstrations: bool = True) -> Config:
    """`cfg` with its algorithm preset applied and its default lengths written in, if every
    name resolves and every rule holds; else a ConfigError naming `source` and each problem.
    The `demonstrator` section is checked only for a command that generates demonstrations
    (`demonstrations`: sft and demo; evaluation and RL never call a demonstrator)."""
    problems: list[str] = []
    cfg = _with_preset(cfg, problems)
    cfg = _with_lengths(cfg)
    problems += [
        *_env_problems(cfg), *(_demonstrator_problems(cfg) if demonstrations else []), *_reward_problems(cfg),
        *_algorithm_problems(cfg), *_rule_problems(cfg),
    ]
    if problems:
        raise ConfigError("\n".join([f"{source}: invalid config", *(f"  {line}" for line in problems)]))
    return cfg


def options_of(factory: Callable, given: dict[str, Any], section: str, passed: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """`given` checked against the keyword parameters of `factory` (a class: its constructor),
    other than the `passed` ones the caller supplies: each value typed by its annotation. The
    typed options, and a problem line per unknown or mistyped one."""
    parameters, hints = _parameters(factory)
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    known = [name for name, p in parameters.items() if name not in passed and p.kind is not inspect.Parameter.VAR_KEYWORD]
    typed: dict[str, Any] = {}
    problems = []
    for name, value in given.items():
        if name not in known and not open_ended:
            takes = f"its options: {', '.join(known)}" if known else "it takes no options"
            problems.append(f"field '{section}.{name}': {_shown(factory)} takes no option {name!r} ({takes})")
            continue
        try:
            typed[name] = TypeAdapter(hints.get(name, Any)).validate_python(value)
        except ValidationError as error:
            problems.append(f"field '{section}.{name}': {error.errors()[0]['msg']} (got {value!r})")
    return typed, problems


def env_options(env: EnvSection) -> dict[str, Any]:
    """The environment's own options from the `env` section, typed (checked on load)."""
    typed, _ = options_of(env_factory(env.name), env.options, "env", ENV_ARGUMENTS)
    return typed


def demonstrator_options(demonstrator: DemonstratorSection, env: EnvSection) -> dict[str, Any]:
    """The demonstrator's own options from the `demonstrator` section, typed (checked on load)."""
    typed, _ = options_of(demonstrator_for(demonstrator, env), demonstrator.options, "demonstrator", DEMONSTRATOR_ARGUMENTS)
    return typed


def demonstrator_name(demonstrator: DemonstratorSection, env: EnvSection) -> str:
    """`demonstrator.name`, else the environment's registered name; ConfigError for an
    environment named by import path, which has no built-in to fall back on."""
    if demonstrator.name:
        return demonstrator.name
    if is_import_path(env.name):
        raise ConfigError(
            f"field 'demonstrator.name': environment {env.name!r} has no built-in demonstrator; name one "
            f"(e.g. {DEMONSTRATOR.example}) or train on a file with sft.data"
        )
    return env.name


def demonstrator_for(demonstrator: DemonstratorSection, env: EnvSection) -> Demonstrator:
    """The demonstrator SFT replays, without its options: any callable
    `(task, rng, env, **options) -> list[Message]`, the assistant messages of one dialogue in
    order, drawing its randomness from `rng`; `env` is the environment the dialogue runs in
    and `options` its own keyword arguments, given in the config's `demonstrator` section
    beside `name`. Tool results and user replies are not its business: the rollout engine
    produces them by running the calls, exactly as in RL. `demonstrator.name` names one by
    import path or entry point (group `toolpolicy.demonstrators`); empty uses the built-in of
    the environment's name (`toolpolicy.envs.catalog`)."""
    try:
        return resolve_callable(DEMONSTRATOR, demonstrator_name(demonstrator, env), DEMONSTRATORS)  # type: ignore[return-value]
    except ExtensionError as error:
        raise ConfigError(f"field 'demonstrator.name': {error}; or train on a file with sft.data") from None


def require_init_from(cfg: Config) -> Config:
    """`cfg`, if it names the checkpoint RL starts from."""
    if not cfg.rl.init_from:
        raise ConfigError("field 'rl.init_from' is empty: set it to the checkpoint RL starts from (for example RUN_DIR/sft/final)")
    return cfg


def check_processes(cfg: Config, processes: int, phase: str = "rl") -> None:
    """The rules of training `phase` (rl or sft) in `processes` torchrun processes."""
    if processes > 1 and cfg.model.shard_offload and resolve_device(cfg.model.device).type == "cpu":
        raise ConfigError(
            "model.shard_offload moves the shards between CPU memory and an accelerator; on the CPU they are in "
            "CPU memory already: leave it off"
        )
    if processes > 1 and phase == "rl" and (
        not capabilities_of(cfg.backend).request_seeds or cfg.rl.sampling_streams != "episode" or cfg.rl.ray_workers or cfg.rl.max_staleness
    ):
        raise ConfigError(
            f"{processes} processes need rl.sampling_streams: episode on a backend that takes a seed per request (hf; "
            "else each would draw its episodes from its own generator, so the run would depend on the process "
            "count), and no rl.ray_workers or rl.max_staleness"
        )


def describe_options() -> str:
    """The options of each built-in environment and demonstrator, for `toolpolicy config`."""
    lines = ["[env] options of the built-in environments (beside env.name, as env.OPTION):"]
    lines += _option_lines(ENVS, ENV_ARGUMENTS)
    lines += ["", "[demonstrator] options of the built-in demonstrators (beside demonstrator.name):"]
    lines += _option_lines(DEMONSTRATORS, DEMONSTRATOR_ARGUMENTS)
    lines += ["", "[algorithm] the functions its fields name:"]
    lines += [f"  algorithm.{field}: {' | '.join(table)}" for field, table in ALGORITHM_TABLES.items()]
    return "\n".join(lines)


def option_docs(factory: Callable, passed: tuple[str, ...]) -> dict[str, str]:
    """Each option of `factory` (its keyword parameters but the `passed` ones) and what it
    does, from the `Args:` section of its docstring (a class: of the class); "" where none says."""
    parameters, _ = _parameters(factory)
    _, described = parse_docstring(factory.__doc__ or "")
    return {
        option: described.get(option, "") for option, p in parameters.items()
        if option not in passed and p.kind is not inspect.Parameter.VAR_KEYWORD
    }


def _option_lines(table: dict[str, Callable], passed: tuple[str, ...]) -> list[str]:
    lines = []
    for name, factory in table.items():
        parameters, hints = _parameters(factory)
        docs = option_docs(factory, passed)
        lines.append(f"  {name}:{'' if docs else ' no options'}")
        lines += [
            f"    {option}: {type_name(hints.get(option, Any))} = {_default_shown(parameters[option].default)}\n        {doc}"
            for option, doc in docs.items()
        ]
    return lines


def _default_shown(default: Any) -> str:
    """A default as `toolpolicy config` lists it: a long tuple (every category) as its length."""
    if isinstance(default, tuple) and len(default) > 3:
        return f"all {len(default)}"
    return repr(default)


def _parameters(factory: Callable) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """The parameters of `factory` (a class: its constructor's, without self) and their resolved annotations."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        parameters = dict(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # no signature to read
        return {}, {}
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # an annotation that does not resolve: leave the values untyped
        hints = {}
    return parameters, hints


def _shown(factory: Callable) -> str:
    return getattr(factory, "__qualname__", repr(factory))


def tells_user_scenarios(factory: Callable) -> bool:
    """Whether an environment class overrides `Env.user_scenario`, which a served user
    (env.user_url) is told each task's scenario by; a class without the `Env` base cannot."""
    return inspect.isclass(factory) and issubclass(factory, Env) and factory.user_scenario is not Env.user_scenario


def _with_preset(cfg: Config, problems: list[str]) -> Config:
    """The preset's values under the `algorithm` and `rewards` fields the config does not set."""
    if not cfg.algorithm.preset:
        return cfg
    explicit = {
        section: {name: getattr(getattr(cfg, section), name) for name in getattr(cfg, section).model_fields_set}
        for section in ("algorithm", "rewards")
    }
    try:
        merged = apply_preset(cfg.algorithm.preset, explicit)
    except ValueError as error:
        problems.append(f"field 'algorithm.preset': {error}")
        return cfg
    return cfg.model_copy(update={
        "algorithm": AlgorithmSection.model_validate(merged["algorithm"]),
        "rewards": RewardsSection.model_validate(merged["rewards"]),
    })


def _with_lengths(cfg: Config) -> Config:
    """Dr.GRPO's length constant and DAPO's L_max written in as the episode budget where unset,
    so each field holds its own value in the resolved config."""
    budget = cfg.rollout.max_tokens
    return cfg.model_copy(update={
        "algorithm": cfg.algorithm.model_copy(update={"loss_norm_length": cfg.algorithm.loss_norm_length or budget}),
        "rewards": cfg.rewards.model_copy(update={"overlong_length": cfg.rewards.overlong_length or budget}),
    })


def _env_problems(cfg: Config) -> list[str]:
    env = cfg.env
    try:
        factory = env_factory(env.name)
    except ExtensionError as error:
        return [f"field 'env.name': {error}"]
    _, problems = options_of(factory, env.options, "env", ENV_ARGUMENTS)
    if env.user and env.user_url:
        problems.append("env.user and env.user_url both name a user simulator: keep one")
    if (env.user or env.user_url) and not takes_user(factory):
        field = "env.user" if env.user else "env.user_url"
        problems.append(f"field '{field}': environment {env.name!r} takes no user simulator (it has no `user` parameter)")
    elif env.user_url and not tells_user_scenarios(factory):
        problems.append(f"field 'env.user_url': environment {env.name!r} tells a served user no scenario (it has no `user_scenario`)")
    if env.user:
        try:
            user_factory(env.user)
        except ExtensionError as error:
            problems.append(f"field 'env.user': {error}")
    if env.user_url and not env.user_model:
        problems.append("field 'env.user_model' is empty: name the model served at env.user_url")
    return problems


def _demonstrator_problems(cfg: Config) -> list[str]:
    """The demonstrator resolves when one is named or given options (an environment without
    a built-in one needs neither, unless SFT runs on generated dialogues)."""
    section = cfg.demonstrator
    if not section.name and not section.options and cfg.env.name not in DEMONSTRATORS:
        return []
    try:
        factory = demonstrator_for(section, cfg.env)
    except ConfigError as error:
        return [str(error)]
    return options_of(factory, section.options, "demonstrator", DEMONSTRATOR_ARGUMENTS)[1]


ALGORITHM_TABLES: dict[str, dict[str, Any]] = {
    "advantage": ESTIMATORS, "ratio_level": POLICY_LOSSES, "kl_estimator": KL_ESTIMATORS, "aggregation": AGGREGATIONS,
}
"""The algorithm fields that name a function, and the table each is looked up in (adding a
function to its table is all a new variant needs)."""


def _algorithm_problems(cfg: Config) -> list[str]:
    problems = []
    for field, table in ALGORITHM_TABLES.items():
        name = getattr(cfg.algorithm, field)
        if name not in table:
            problems.append(f"field 'algorithm.{field}': unknown {name!r}; one of {', '.join(table)}")
    return problems


def _reward_problems(cfg: Config) -> list[str]:
    from toolpolicy.rewards import Rubric  # here: reward functions may import their own dependencies

    problems = []
    try:
        Rubric.from_weights(cfg.rewards.weights)  # every name resolves, and no two share a reported name
    except ValueError as error:
        problems.append(f"field 'rewards.weights': {error}")
    unknown = sorted(set(cfg.algorithm.turn_rewards) - set(get_args(EventKind)))
    if unknown:
        problems.append(f"field 'algorithm.turn_rewards': unknown event kind(s) {unknown}; known: {', '.join(get_args(EventKind))}")
    return problems


def _rule_problems(cfg: Config) -> list[str]:
    """The rules that tie sections together."""
    rl, backend, capabilities = cfg.rl, cfg.backend, capabilities_of(cfg.backend)
    problems = backend.problems()
    if rl.sampling_streams == "episode" and not capabilities.request_seeds:
        problems.append(f"rl.sampling_streams: episode needs a backend that takes a seed per request (hf); backend {backend.name} does not")
    if rl.max_staleness and (not capabilities.in_process or rl.ray_workers or cfg.algorithm.correction == "tis"):
        problems.append(
            "rl.max_staleness > 0 needs a backend that samples in this process (hf), no rl.ray_workers and "
            "algorithm.correction none or auto (pi_old must be the sampler's own log-probs)"
        )
    if rl.ray_workers and (rl.sampling_streams != "episode" or cfg.model.lora_rank):
        problems.append(
            "rl.ray_workers needs rl.sampling_streams: episode (each worker samples its share of the step's "
            "episodes) and no model.lora_rank (workers take whole weights)"
        )
    if cfg.algorithm.credit == "turn" and cfg.algorithm.advantage != "grpo":
        problems.append(
            f"algorithm.credit: turn normalises its own per-turn returns within the group; algorithm.advantage "
            f"{cfg.algorithm.advantage!r} would be ignored: leave it unset"
        )
    if cfg.algorithm.teacher_alone and not cfg.algorithm.teacher:
        problems.append("algorithm.teacher_alone needs algorithm.teacher: the checkpoint whose log-probs the student distils")
    if cfg.algorithm.teacher_loss in DIVERGENCES and not cfg.algorithm.teacher:
        problems.append(
            f"algorithm.teacher_loss {cfg.algorithm.teacher_loss} needs algorithm.teacher: "
            "the checkpoint whose distribution the student distils"
        )
    if cfg.model.shard_offload and cfg.model.sharing != "shard":
        problems.append("model.shard_offload keeps the shards of model.sharing: shard in CPU memory; set model.sharing: shard")
    if cfg.eval.served_url and not cfg.eval.served_model:
        problems.append("field 'eval.served_model' is empty: name the model served at eval.served_url")
    return problems
