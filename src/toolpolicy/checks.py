"""Every rule across config fields and every name a config gives, checked in one place.

`toolpolicy.config` types each section on its own; `checked` then resolves what the config
names (environment, user simulator, reward functions; the demonstrator for the commands
that generate demonstrations) and checks each named component's options against what it
declares (`declared_options`), applies the algorithm preset, types the algorithm variants'
constants and writes each one's value, and the lengths that default to the episode budget,
into the config, and checks the rules that tie sections together, the backend's
capabilities among them. `toolpolicy.build.load_config`
runs both, so every command stops on a bad config before it starts work, with one message
that lists every problem by `section.field`.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, NamedTuple, get_args

from pydantic import TypeAdapter, ValidationError

from toolpolicy.algorithms import AGGREGATIONS, ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from toolpolicy.algorithms.correction import CORRECTIONS
from toolpolicy.algorithms.distill import DIVERGENCES
from toolpolicy.algorithms.presets import apply_preset
from toolpolicy.config import AlgorithmSection, Config, ConfigError, DemonstratorSection, EnvSection, RewardsSection, type_name
from toolpolicy.envs import DEMONSTRATORS, ENVS, Demonstrator, Env, env_factory, options_class, takes_user, user_factory
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
    cfg = _with_algorithm_options(cfg, problems)
    cfg = _with_lengths(cfg)
    problems += [
        *_env_problems(cfg), *(_demonstrator_problems(cfg) if demonstrations else []), *_reward_problems(cfg),
        *_algorithm_problems(cfg), *_rule_problems(cfg),
    ]
    if problems:
        raise ConfigError("\n".join([f"{source}: invalid config", *(f"  {line}" for line in problems)]))
    return cfg


class Option(NamedTuple):
    """One option a component declares."""

    annotation: Any
    """Its type, which a config's value is validated by."""
    default: Any
    """Its value when the config sets none."""
    doc: str
    """What it does, on one line."""


def declared_options(factory: Callable, passed: tuple[str, ...] = ()) -> tuple[dict[str, Option], bool]:
    """The options `factory` declares, and whether it takes any other keyword too (`**kwargs`).
    A frozen dataclass declares its fields, each documented by the docstring under it: an
    algorithm variant (its constants) or the options class of a built-in environment (the type
    of its constructor's `options` parameter). Any other callable declares its keyword
    parameters but the `passed` ones, documented in the `Args:` section of its docstring (a
    class: of the class): a plug-in environment, a demonstrator."""
    holder = factory if is_dataclass(factory) else options_class(factory)
    if holder is not None:
        hints, docs = typing.get_type_hints(holder, include_extras=True), attribute_docs(holder)
        defaults = {field.name: field.default if field.default is not MISSING else field.default_factory() for field in fields(holder)}
        return {name: Option(hints[name], default, docs.get(name, "")) for name, default in defaults.items()}, False
    parameters, hints = _parameters(factory)
    _, described = parse_docstring(factory.__doc__ or "")
    keywords = {
        name: Option(hints.get(name, Any), p.default, described.get(name, "")) for name, p in parameters.items()
        if name not in passed and p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    return keywords, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated attribute of `cls` and of its bases (the nearest one
    wins), on one line: how pydantic's use_attribute_docstrings reads a section's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        except (OSError, TypeError, IndexError, AttributeError):  # no source to read (a built-in, a class made at run time)
            continue
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def options_of(factory: Callable, given: dict[str, Any], section: str, passed: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """`given` checked against the options `factory` declares (`declared_options`), other than
    the `passed` ones the caller supplies: each value typed by its annotation. The typed
    options, and a problem line per unknown or mistyped one."""
    declared, open_ended = declared_options(factory, passed)
    typed: dict[str, Any] = {}
    problems = []
    for name, value in given.items():
        if name not in declared and not open_ended:
            takes = f"its options: {', '.join(declared)}" if declared else "it takes no options"
            problems.append(f"field '{section}.{name}': {_shown(factory)} takes no option {name!r} ({takes})")
            continue
        _typed_into(typed, section, name, declared[name].annotation if name in declared else Any, value, problems)
    return typed, problems


def _typed_into(typed: dict[str, Any], section: str, name: str, annotation: Any, value: Any, problems: list[str]) -> None:
    """typed[name] = `value` validated by `annotation`, else a problem line naming `section.name`."""
    try:
        typed[name] = TypeAdapter(annotation).validate_python(value)
    except ValidationError as error:
        problems.append(f"field '{section}.{name}': {error.errors()[0]['msg']} (got {value!r})")


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
    """The options of each built-in environment and demonstrator, and the functions the
    algorithm's fields name with their variants' constants, for `toolpolicy config`."""
    lines = ["[env] options of the built-in environments (beside env.name, as env.OPTION):"]
    lines += _option_lines(ENVS, ENV_ARGUMENTS)
    lines += ["", "[demonstrator] options of the built-in demonstrators (beside demonstrator.name):"]
    lines += _option_lines(DEMONSTRATORS, DEMONSTRATOR_ARGUMENTS)
    lines += ["", "[algorithm] the functions its fields name, and their constants (as algorithm.OPTION):"]
    for field, table in ALGORITHM_TABLES.items():
        lines.append(f"  algorithm.{field}: {' | '.join(table)}")
        lines += [
            f"    algorithm.{option}: {type_name(spec.annotation)} = {spec.default!r}  (of {', '.join(takers)})\n        {spec.doc}"
            for option, (spec, takers) in variant_options(table).items()
        ]
    return "\n".join(lines)


def option_docs(factory: Callable, passed: tuple[str, ...]) -> dict[str, str]:
    """Each option `factory` declares (`declared_options`) and what it does; "" where nothing says."""
    return {name: option.doc for name, option in declared_options(factory, passed)[0].items()}


def variant_options(table: dict[str, Any]) -> dict[str, tuple[Option, list[str]]]:
    """The constants the variants of an algorithm table declare (the dataclass rows' fields),
    each with the names of the variants that declare it (which share its declaration)."""
    found: dict[str, tuple[Option, list[str]]] = {}
    for variant, row in table.items():
        for name, option in (declared_options(row)[0] if is_dataclass(row) else {}).items():
            found.setdefault(name, (option, []))[1].append(variant)
    return found


def algorithm_options() -> dict[str, Option]:
    """Every constant a variant of ALGORITHM_TABLES declares, by its name: the options the
    `algorithm` section takes beside its own fields."""
    return {name: option for table in ALGORITHM_TABLES.values() for name, (option, _) in variant_options(table).items()}


def _option_lines(table: dict[str, Callable], passed: tuple[str, ...]) -> list[str]:
    lines = []
    for name, factory in table.items():
        declared, _ = declared_options(factory, passed)
        lines.append(f"  {name}:{'' if declared else ' no options'}")
        lines += [
            f"    {option}: {type_name(spec.annotation)} = {_default_shown(spec.default)}\n        {spec.doc}"
            for option, spec in declared.items()
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


def _with_algorithm_options(cfg: Config, problems: list[str]) -> Config:
    """The `algorithm` section with every variant's constant typed, its default written in
    where the config sets none, so the resolved config holds the value of each."""
    declared = algorithm_options()
    typed = {name: option.default for name, option in declared.items()}
    for name, value in cfg.algorithm.options.items():
        if name in declared:
            _typed_into(typed, "algorithm", name, declared[name].annotation, value, problems)
            continue
        close = difflib.get_close_matches(name, [*AlgorithmSection.model_fields, *declared], n=3)
        hint = f"; did you mean {' or '.join(repr(f'algorithm.{c}') for c in close)}?" if close else " (see `toolpolicy config` for the list)"
        problems.append(f"field 'algorithm.{name}': unknown field{hint}")
    return cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update=typed)})


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
    "correction": CORRECTIONS,
}
"""The algorithm fields that name a variant, and the table each is looked up in (adding a
variant, with the constants it declares, to its table is all a new one needs)."""


def _algorithm_problems(cfg: Config) -> list[str]:
    problems = []
    for field, table in ALGORITHM_TABLES.items():
        name = getattr(cfg.algorithm, field)
        if name not in table and (field, name) != ("correction", "auto"):  # auto: the backend's capabilities pick one
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
