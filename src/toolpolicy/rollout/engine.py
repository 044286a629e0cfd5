"""The multi-turn rollout engine: generate, parse tool calls, run tools, append observations.

One loop serves RL, evaluation and SFT data (with a scripted backend). Per turn,
every live episode asks the backend to continue its token ids; the sampled ids
are appended as they are (loss_mask 1). The text of that turn is parsed for
tool calls; calls run through the environment's ToolSet; their results are
rendered with the chat template's observation framing and only that new
fragment is tokenized and appended (loss_mask 0). The conversation is never
re-rendered and re-tokenized (docs/architecture.md, contract 1). Malformed calls become error
observations and `invalid_call` events, never exceptions (contract 3).

Every decoded call goes through the policy gate before it runs. A denial
becomes the observation (naming the rule and the reason) and a `gate_deny`
event; the tool never runs. Tool output passes the policy's redaction before
the model sees it. Without a policy file the gate allows every call.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tqdm.auto import tqdm
from typing_extensions import Self

from toolpolicy.chat import ChatTemplate, ParsedTurn, cut_at_stop
from toolpolicy.chat.images import IMAGE_PAD, image_runs
from toolpolicy.envs.base import Env, Session, as_env, open_session
from toolpolicy.gate import AuditError, Gate, Ledger, Policy, admit, settle
from toolpolicy.gate.scope import task_gate
from toolpolicy.rollout.backends import Backend, Generation, GenRequest
from toolpolicy.rollout.branch import Branch, quiet, replay_prefix
from toolpolicy.rollout.dropped import tool_failure
from toolpolicy.rollout.trajectory import Trajectory
from toolpolicy.types import Episode, Event, Image, Message, Task

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]

MODEL_FAULTS = {"unknown_tool": "invalid_call", "invalid_arguments": "invalid_call", "tool_error": "tool_error"}
"""Tool failures that are the model's: each becomes an event. Any other failure is the machine's."""


def allow_all_policy() -> Policy:
    """The policy of an environment with no policy file: every well-formed call is allowed."""
    return Policy.from_dict({"default": "allow"}, "<allow-all>")


@dataclass(frozen=True)
class EpisodeLimits:
    """Budgets of one episode."""

    max_turns: int = 4
    """Assistant turns before the episode is cut (and marked truncated)."""
    max_tokens: int = 256
    """Tokens after the prompt (assistant turns and observations together)."""
    max_turn_tokens: int = 96
    """Tokens one assistant turn may sample."""
    max_call_chars: int = 2000
    """A tool call body longer than this is rejected without parsing."""


def observe(
    text: str, chat: ChatTemplate, session: Session, gate: Gate, ledger: Ledger, turn: int, max_call_chars: int
) -> tuple[Message, list[Message], list[Event], str | None]:
    """Parse one assistant turn, gate its calls and run the allowed ones.

    Returns the assistant message, the observation messages that follow it (one
    per call or malformed call; empty when the turn is a final answer), the
    events, and an infrastructure error if a tool (or the audit log) failed for
    reasons that are not the model's.
    """
    parsed = chat.parse(text, max_call_chars)
    shown = cut_at_stop(text, chat.stops).strip() if parsed.errors else parsed.content
    return act(parsed, shown, session, gate, ledger, turn)


def act(
    parsed: ParsedTurn, shown: str, session: Session, gate: Gate, ledger: Ledger, turn: int
) -> tuple[Message, list[Message], list[Event], str | None]:
    """Gate a decoded turn's calls and run the admitted ones in `session` (see `observe`).

    `shown` is the assistant text to record. Backends that return calls already
    decoded (chat-completions endpoints) start here.
    """
    assistant = Message("assistant", shown, parsed.tool_calls, reasoning=parsed.reasoning)
    observations: list[Message] = []
    events: list[Event] = []
    for error in parsed.errors:
        observations.append(Message("tool", error.message, name="error", tool_call_id=error.call_id))
        events.append(Event("invalid_call", turn, error.kind))
    for call in parsed.tool_calls:
        try:
            admission = admit(gate, ledger, call)
        except AuditError as error:
            return assistant, observations, events, f"audit log: {error}"
        rules = ",".join(admission.decision.rule_ids)
        if admission.fault:  # the gate failed closed: a machine fault, not the model's violation
            return assistant, observations, events, f"policy gate: {admission.decision.reason}"
        if not admission.runs:
            observations.append(Message("tool", admission.decision.observation(), name=call.name, tool_call_id=call.id))
            events.append(Event("invalid_call" if admission.malformed else "gate_deny", turn, rules))
            continue
        if not admission.decision.allowed:  # shadow mode: counted, then run as if there were no gate
            events.append(Event("violation", turn, rules))
        result = session.run_admitted(call, admission.decision)
        settle(ledger, call, result.ok, result.facts)
        observations.append(Message("tool", gate.redact(result.content), name=call.name, tool_call_id=call.id, images=result.images))
        if result.ok:
            events.append(Event("tool_call", turn, call.name))
        elif result.error in MODEL_FAULTS:
            events.append(Event(MODEL_FAULTS[result.error], turn, f"{call.name}: {result.error}"))
        else:
            return assistant, observations, events, tool_failure(call.name, result)
    return assistant, observations, events, None


def record_turn(
    episode: Episode,
    session: Session,
    assistant: Message,
    observations: list[Message],
    events: list[Event],
    infra_error: str | None,
) -> list[Message] | None:
    """Add an acted-on assistant turn (what `act` returns) to the episode; return the
    messages that follow it (tool observations, or the user's reply to an answer), or
    None when the episode ends there. A session of one turn (`single_turn`) ends after it,
    calls or not: they went through the gate, and their events count, but nothing follows."""
    episode.messages.append(assistant)
    episode.events.extend(events)
    if infra_error is not None:
        episode.infra_error = infra_error
        return None
    if session.single_turn:
        return None
    return observations or session.on_answer(episode.messages) or None


def with_sessions(env: Env, episodes: list[Episode], turns: Callable[[list[Session], Callable[[int], None]], None]) -> None:
    """Open a session per episode and run `turns(sessions, finish)` on them. `finish(i)`
    records session i's outcome on its episode as soon as the episode ends; every session
    not finished by then is finished afterwards, also when `turns` failed. A session that
    cannot finish marks its episode as an infrastructure error (the environment's fault,
    not the model's)."""
    sessions: list[Session] = []
    finished: set[int] = set()

    def finish(i: int) -> None:
        if i in finished:
            return
        finished.add(i)
        try:
            episodes[i].outcome = sessions[i].finish()
        except Exception as error:
            episodes[i].infra_error = episodes[i].infra_error or f"session finish: {type(error).__name__}: {error}"

    try:
        sessions.extend(open_session(env, episode.task) for episode in episodes)
        turns(sessions, finish)
    finally:
        for i in range(len(sessions)):
            finish(i)


def prompt_ids(env: Env, template: ChatTemplate, encode: Encode, task: Task, messages: list[Message] | None = None) -> list[int]:
    """The token ids an episode of `task` starts from: its opening messages (`messages`, else
    the environment's) and the tools it is shown, rendered by the template."""
    opening = env.initial_messages(task) if messages is None else messages
    return list(encode(template.render_prompt(opening, env.task_specs(task))))


def opening_ledger(task: Task) -> Ledger:
    """An episode's ledger, holding from the start the facts its environment knows before the
    model acts (`task.info["gate_facts"]`: AgentDojo's request and the user's own records)."""
    return Ledger(facts=dict(task.info.get("gate_facts", {})))


def episode_gate(gate: Gate, env: Env, task: Task) -> Gate:
    """The gate an episode of `task` runs under: `gate`, narrowed by the task's scope when its
    environment derived one before the episode (`task.info["gate_scope"]`: AgentDojo's
    `scope_rules`; gate/scope.py), so the policy stays the ceiling."""
    scope = task.info.get("gate_scope")
    return gate if scope is None else task_gate(gate, env.tools.specs(), scope)


def truncate(episode: Episode, turn: int, why: str) -> None:
    """Mark an episode cut by a budget (`why`: max_turns, max_tokens or max_turn_tokens)."""
    episode.truncated = True
    episode.events.append(Event("truncated", turn, why))


Figures = Callable[[list[Episode]], dict[str, str]]
"""(the episodes ended so far, outcomes recorded) -> what a progress bar shows beside its count."""

TakeTurn = Callable[[list[Session], list[int], int], list[bool]]
"""(every episode's session, indices of the live episodes, turn) -> for each live one,
whether it goes on after this turn."""


class GatedLoop:
    """The multi-turn loop every engine runs, with the environment and its gate.

    An engine supplies one function, `take_turn`: advance every live episode by one
    assistant turn (generate, act through the gate, append the observations) and say
    which go on. Sessions, the turn budget, truncation and progress are this loop's.
    """

    def __init__(self, env: Env, gate: Gate | None, limits: EpisodeLimits) -> None:
        self.env = as_env(env)
        self.gate = gate if gate is not None else Gate(allow_all_policy(), env.tools)
        self.limits = limits

    def loop(
        self, episodes: list[Episode], take_turn: TakeTurn, progress: str | None, figures: Figures | None = None,
        taken: list[int] | None = None,
    ) -> None:
        """Open a session per episode and run turns until every episode ended or
        max_turns is spent (those still calling tools are truncated). The bar counts
        ended episodes and shows `figures` of them (their sessions already finished).
        `taken`: turns each episode took before (a branch's prefix), which count toward
        max_turns; `take_turn`'s turn is the loop's round, the same for every episode."""
        taken = taken if taken is not None else [0] * len(episodes)

        def turns(sessions: list[Session], finish: Callable[[int], None]) -> None:
            live = list(range(len(episodes)))
            ended: list[Episode] = []
            bar = tqdm(total=len(episodes), desc=progress, leave=False, disable=progress is None)
            for turn in range(self.limits.max_turns):
                spent = [i for i in live if taken[i] + turn >= self.limits.max_turns]
                for i in spent:
                    truncate(episodes[i], self.limits.max_turns, "max_turns")
                    finish(i)
                bar.update(len(spent))
                live = [i for i in live if taken[i] + turn < self.limits.max_turns]
                if not live:
                    break
                going = take_turn(sessions, live, turn)
                for i in (i for i, goes in zip(live, going) if not goes):
                    finish(i)
                    ended.append(episodes[i])
                if figures is not None and ended and progress is not None:
                    bar.set_postfix(figures(ended), refresh=False)
                bar.update(going.count(False))
                live = [i for i, goes in zip(live, going) if goes]
            for i in live:
                truncate(episodes[i], self.limits.max_turns, "max_turns")
            bar.update(len(live))
            bar.close()

        with_sessions(self.env, episodes, turns)

    def close(self) -> None:
        """Close the gate's audit log, releasing its single-writer lock for the next engine."""
        if self.gate.audit is not None:
            self.gate.audit.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RolloutEngine(GatedLoop):
    """Runs batches of episodes of one environment with one backend, at token level."""

    def __init__(
        self,
        env: Env,
        template: ChatTemplate,
        encode: Encode,
        decode: Decode,
        backend: Backend,
        limits: EpisodeLimits,
        gate: Gate | None = None,
        tool_workers: int = 1,
    ) -> None:
        super().__init__(env, gate, limits)
        self.template = template
        self.encode = encode
        self.decode = decode
        self.backend = backend
        self.tool_workers = tool_workers
        """Episodes that act on their turn at once (tool calls through the gate, the simulated
        user's reply), each in a thread: tools that wait on I/O then overlap. Within an episode
        calls stay in order (a call's admission may depend on the one before)."""

    def close(self) -> None:
        """Close the gate's audit log and the backend."""
        super().close()
        self.backend.close()

    def start(self, task: Task) -> Trajectory:
        messages = self.env.initial_messages(task)
        ids = prompt_ids(self.env, self.template, self.encode, task, messages)
        return Trajectory(
            ids, [0] * len(ids), [0.0] * len(ids), len(ids), Episode(task, list(messages)), images=self._placed(ids, messages)
        )

    def _placed(self, ids: list[int], messages: list[Message]) -> list[tuple[int, Image]]:
        """The pictures of `messages`, each with the position of its placeholders in `ids`
        (their rendering, tokenized): the k-th run of image pads is the k-th picture. A codec
        without an image-pad token (the characters SFT's tokenizer is trained on) places none:
        such ids only ever become text, and a model's forward refuses pictures it cannot place."""
        images = [image for message in messages for image in message.images]
        pad = self.encode(IMAGE_PAD) if images else []
        if len(pad) != 1:
            return []
        runs = image_runs(ids, pad[0])
        if len(runs) != len(images):
            raise ValueError(f"{len(images)} picture(s) rendered as {len(runs)} runs of {IMAGE_PAD}: the template's image spans are broken")
        return [(start, image) for (start, _), image in zip(runs, images)]

    def run(
        self, tasks: list[Task], progress: str | None = None, seeds: list[int] | list[None] | None = None,
        figures: Figures | None = None, branches: list[Branch | None] | None = None,
    ) -> list[Trajectory]:
        """One episode per task (repeat a task in `tasks` to sample a group). With `seeds`,
        episode i samples from its own stream seeded with seeds[i], so its tokens do not
        depend on the other episodes of the batch (backends that support it: hf). With
        `branches`, episode i continues branches[i] (of its task) where it is not None: its
        session first replays the prefix (rollout/branch.py), then it samples from there."""
        branches = branches if branches is not None else [None] * len(tasks)
        trajectories = [self.start(task) if b is None else b.start() for task, b in zip(tasks, branches)]
        spent = [0 if b is None else b.spent for b in branches]  # tokens of the budget each prefix used
        ledgers = [opening_ledger(task) for task in tasks]
        seeds = seeds if seeds is not None else [None] * len(tasks)

        def take_turn(sessions: list[Session], live: list[int], turn: int) -> list[bool]:
            ready = [self._replay(branches[i], sessions[i], ledgers[i], trajectories[i]) if turn == 0 else True for i in live]
            acting = [i for i, ok in zip(live, ready) if ok]  # a branch whose prefix did not replay has ended
            budget = self.limits
            requests = [
                GenRequest(
                    i, trajectories[i].token_ids,
                    min(budget.max_turn_tokens, budget.max_tokens - spent[i] - trajectories[i].response_len), seeds[i],
                    tuple(trajectories[i].images),
                )
                for i in acting
            ]
            generations = self.backend.generate(requests) if requests else []
            texts = [self.decode(g.ids) for g in generations]

            def act_on(k: int) -> list[Message] | None:
                i = acting[k]
                return self._act(trajectories[i], ledgers[i], sessions[i], generations[k], texts[k], turn + taken[i])

            followed = list(pool.map(act_on, range(len(acting))) if pool else map(act_on, range(len(acting))))
            going = dict.fromkeys(live, False)
            going.update((i, self._append(trajectories[i], after, turn + taken[i], spent[i])) for i, after in zip(acting, followed))
            return [going[i] for i in live]

        taken = [0 if b is None else b.turns for b in branches]
        pool = ThreadPoolExecutor(self.tool_workers, thread_name_prefix="tools") if self.tool_workers > 1 else None
        try:
            self.loop([t.episode for t in trajectories], take_turn, progress, figures, taken)
        finally:
            self.backend.forget()  # the episodes ended; their keys are reused by the next batch
            if pool is not None:
                pool.shutdown()
        for t, used in zip(trajectories, spent):
            t.episode.response_tokens = used + t.response_len
        return trajectories

    def _replay(self, branch: Branch | None, session: Session, ledger: Ledger, trajectory: Trajectory) -> bool:
        """Bring a branch's fresh session and ledger to its prefix's end; False (the episode
        marked an infrastructure error) when that fails. True for an episode that is no branch."""
        if branch is None:
            return True
        try:
            gate = episode_gate(self.gate, self.env, trajectory.episode.task)
            problem = replay_prefix(session, quiet(gate), ledger, trajectory.episode.messages)
        except Exception as error:
            problem = f"branch: replaying the prefix failed: {type(error).__name__}: {error}"
        trajectory.episode.infra_error = problem
        return problem is None

    def _act(
        self, trajectory: Trajectory, ledger: Ledger, session: Session, generation: Generation, text: str, turn: int
    ) -> list[Message] | None:
        """Append one sampled turn (decoded: `text`) and act on it: its calls through the gate,
        or the user's reply to an answer. Returns the messages that follow it, or None when the
        episode ends. Touches only this episode's state, so episodes act in parallel."""
        episode = trajectory.episode
        trajectory.append(generation.ids, sampled=True, logprobs=generation.logprobs)
        if not generation.finished:
            episode.messages.append(Message("assistant", text.strip()))
            truncate(episode, turn, "max_turn_tokens" if generation.ids else "max_tokens")
            return None
        gate = episode_gate(self.gate, self.env, episode.task)
        return record_turn(episode, session, *observe(text, self.template, session, gate, ledger, turn, self.limits.max_call_chars))

    def _append(self, trajectory: Trajectory, observations: list[Message] | None, turn: int, spent: int = 0) -> bool:
        """Append the observation fragment that follows a turn; return whether the episode goes on.
        `spent`: tokens of the budget used before the trajectory's prompt ended (a branch's prefix)."""
        if observations is None:
            return False
        episode = trajectory.episode
        fragment = self.encode(self.template.render_observation(observations, after=episode.messages[-1]))
        episode.messages.extend(observations)
        if spent + trajectory.response_len + len(fragment) >= self.limits.max_tokens:
            truncate(episode, turn, "max_tokens")
            return False
        trajectory.append(fragment, sampled=False, images=self._placed(fragment, observations))
        return True
