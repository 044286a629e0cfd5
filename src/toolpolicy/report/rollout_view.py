"""`toolpolicy rollouts show RUN --step N [--episode K]`: one stored episode in the terminal.

Every token is printed as the model saw it. Tokens the policy did not sample (prompt,
tool results, user turns) are dim; sampled tokens are shaded by their advantage, green
for positive and red for negative, stronger the larger it is against the step's
largest. After each assistant turn come the turn's events: tool calls, gate denials
with their rules, truncation. Without --episode, a table lists the step's episodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from toolpolicy.rollout.store import StoredEpisode

TOKENIZER_PLACES = ("rl/final", "sft/final", "model")


def run_tokenizer_file(run_dir: Path, init_from: str = "") -> Path:
    """The tokenizer.json of the run's model: its final RL model, else a checkpoint, else what RL started from."""
    places = [run_dir / p for p in TOKENIZER_PLACES] + sorted((run_dir / "rl" / "checkpoints").glob("step_*"), reverse=True)
    places += [Path(init_from)] if init_from else []
    for place in places:
        if (place / "tokenizer.json").is_file():
            return place / "tokenizer.json"
    raise FileNotFoundError(f"{run_dir}: no tokenizer.json in {', '.join(TOKENIZER_PLACES)}, rl/checkpoints or init_from")


def token_pieces(tokenizer_file: Path, ids: Sequence[int]) -> list[str]:
    """Each token's text on its own (a byte of a multi-byte character shows as U+FFFD)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def advantage_style(advantage: float, largest: float) -> str:
    """A background shade for a sampled token: green above zero, red below, by |advantage| / largest."""
    strength = min(1.0, abs(advantage) / largest) if largest > 0 else 0.0
    level = int(60 + 140 * strength)
    return f"on rgb(0,{level},0)" if advantage > 0 else f"on rgb({level},0,0)" if advantage < 0 else "on grey30"


def episode_text(episode: StoredEpisode, pieces: Sequence[str], largest: float) -> Text:
    """The episode's tokens, styled by mask and advantage, with each turn's events after it."""
    text = Text()
    events_by_turn: dict[int, list[dict]] = {}
    for event in episode.events:
        events_by_turn.setdefault(event["turn"], []).append(event)
    ends = {end: turn for turn, end in enumerate(episode.turn_ends)}
    sampled = iter(episode.advantages)
    for position, (piece, is_sampled) in enumerate(zip(pieces, episode.loss_mask)):
        if position in ends:
            text.append(turn_events(events_by_turn.pop(ends[position], [])))
        text.append(piece, style=advantage_style(next(sampled), largest) if is_sampled else "dim")
    for turn in sorted(events_by_turn):  # the last turn's, and any after it (truncation)
        text.append(turn_events(events_by_turn[turn]))
    return text


def turn_events(events: Sequence[dict]) -> Text:
    lines = Text()
    for event in events:
        style = "bold red" if event["kind"] in ("gate_deny", "violation") else "bold yellow" if event["kind"] != "tool_call" else "cyan"
        lines.append(f"\n  [{event['kind']}{': ' + event['detail'] if event['detail'] else ''}]\n", style=style)
    return lines


def mismatch(episode: StoredEpisode) -> float | None:
    """Largest |sampler - trainer| log-prob gap over the sampled tokens (None if not trained)."""
    if not episode.trainer_logprobs:
        return None
    return max(abs(a - b) for a, b in zip(episode.sampled_logprobs, episode.trainer_logprobs))


def episode_summary(episode: StoredEpisode) -> str:
    gap = mismatch(episode)
    parts = [
        f"step {episode.step} episode {episode.episode} (group {episode.group}, task {episode.task_id})",
        f"reward {episode.reward:.3f}", ", ".join(f"{k} {v:.2f}" for k, v in episode.components.items()),
        f"tokens {len(episode.token_ids)} ({sum(episode.loss_mask)} sampled)",
        "trained" if episode.kept else "not trained",
        f"max |log-prob gap| {gap:.2e}" if gap is not None else "",
        "TRUNCATED" if episode.truncated else "", f"infra error: {episode.infra_error}" if episode.infra_error else "",
    ]
    return " | ".join(p for p in parts if p)


def show_episode(episode: StoredEpisode, pieces: Sequence[str], step_episodes: Sequence[StoredEpisode]) -> Group:
    largest = max((abs(a) for e in step_episodes for a in e.advantages), default=0.0)
    legend = Text.assemble(("prompt / tool / user", "dim"), "  ", ("sampled, advantage > 0", "on rgb(0,160,0)"), "  ",
                           ("advantage < 0", "on rgb(160,0,0)"), "  ", ("advantage 0", "on grey30"))
    return Group(Text(episode_summary(episode), style="bold"), legend, Text(), episode_text(episode, pieces, largest))


def step_table(episodes: Sequence[StoredEpisode]) -> Table:
    table = Table(title=f"step {episodes[0].step}: {len(episodes)} episodes" if episodes else "no episodes")
    for column in ("episode", "group", "task", "reward", "tokens", "sampled", "denials", "truncated", "trained"):
        table.add_column(column, justify="right" if column not in ("task",) else "left")
    for e in episodes:
        denials = sum(ev["kind"] == "gate_deny" for ev in e.events)
        table.add_row(
            str(e.episode), str(e.group), e.task_id, f"{e.reward:.3f}", str(len(e.token_ids)), str(sum(e.loss_mask)),
            str(denials), "yes" if e.truncated else "", "yes" if e.kept else "",
        )
    return table
