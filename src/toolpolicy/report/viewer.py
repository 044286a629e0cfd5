"""The report's trajectory viewer: stored RL rollouts, token by token, inside report.html.

The rollout store (rollout/store.py) keeps every step; a page cannot. The viewer embeds
the last `steps` stored steps and, from each, at most `episodes` episodes taken as
whole groups, so the episodes of one task can still be compared side by side. Groups
that carry a learning signal or show the gate at work come first: mixed rewards (a
non-zero advantage), gate denials, truncations; then the rest in sampling order. The
page says what was left out and how to embed more.

The data goes in a <script type="application/json"> as compact JSON, a third the size of
the stored rows as plain JSON (bench/viewer_page.py; about 10 kB per 1,000 tokens, six
times the store's Parquet):

    vocab          {id: text}  each distinct token's text, once per page
    ids            [L]  the episode's token ids
    sampled        [[start, end), ...]  runs of loss_mask = 1 (the mask, without L booleans)
    lp, tlp        [S]  sampler and trainer log-probs, rounded to 1e-5 (tlp null if not trained)
    gap            [S]  trainer - sampler from the stored float32 values, to 3 significant
                        digits: a 1e-7 mismatch survives, which the rounded lp/tlp would lose
    adv            one number when every sampled token has the same advantage (GRPO), else [S]

The page's script (viewer.js) draws a clickable reward curve, the filtered episode
list, the tokens (with a tooltip of their numbers) and the group columns; viewer.css
styles them. Both are inlined, so the report still opens offline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from toolpolicy.rollout.store import StoredEpisode

VIEWER_STEPS = 8
"""Stored steps embedded in report.html by default: the last ones."""
VIEWER_EPISODES = 32
"""Episodes embedded per step by default (whole groups; a larger group is kept whole)."""


@dataclass(frozen=True)
class EmbeddedStep:
    """One step as the page holds it: the episodes picked, and how many the store has."""

    step: int
    episodes: list[StoredEpisode]
    stored: int


def read_viewer_steps(run_dir: Path, steps: int, episodes: int) -> tuple[list[int], list[EmbeddedStep]]:
    """Every stored step, and the last `steps` of them with their picked episodes."""
    # Imported here: the toolpolicy.rollout package imports torch, which the rest of the
    # report does without (a report rebuilds from files on any machine).
    from toolpolicy.rollout.store import read_step, stored_steps

    if steps < 0 or episodes < 0:
        raise ValueError(f"viewer limits must be >= 0, got steps={steps}, episodes={episodes}")
    folder = Path(run_dir) / "rl" / "rollouts"
    stored = stored_steps(folder)
    embedded = []
    for step in stored[-steps:] if steps else []:
        rows = read_step(folder, step)
        embedded.append(EmbeddedStep(step, pick_groups(rows, episodes), len(rows)))
    return stored, embedded


def pick_groups(episodes: Sequence[StoredEpisode], limit: int) -> list[StoredEpisode]:
    """Whole groups up to `limit` episodes (at least one group), the informative ones first,
    returned in sampling order."""
    if limit == 0:
        return []
    groups: dict[int, list[StoredEpisode]] = {}
    for e in episodes:
        groups.setdefault(e.group, []).append(e)
    ranked = sorted(groups.values(), key=lambda members: -group_interest(members))  # stable: ties keep order
    picked: list[StoredEpisode] = []
    for members in ranked:
        if picked and len(picked) + len(members) > limit:
            continue
        picked += members
    return sorted(picked, key=lambda e: e.episode)


def group_interest(members: Sequence[StoredEpisode]) -> int:
    """How much a group shows: 4 for mixed rewards, +2 for a gate denial, +1 for a truncation."""
    mixed = len({e.reward for e in members}) > 1
    denied = any(ev["kind"] == "gate_deny" for e in members for ev in e.events)
    truncated = any(e.truncated for e in members)
    return 4 * mixed + 2 * denied + truncated


def sampled_spans(loss_mask: Sequence[bool]) -> list[list[int]]:
    """The [start, end) runs of True in loss_mask.

    >>> sampled_spans([False, True, True, False, True])
    [[1, 3], [4, 5]]
    """
    spans: list[list[int]] = []
    for i, sampled in enumerate(loss_mask):
        if sampled and spans and spans[-1][1] == i:
            spans[-1][1] = i + 1
        elif sampled:
            spans.append([i, i + 1])
    return spans


def significant(value: float, digits: int = 3) -> float:
    """`value` to `digits` significant digits (JSON then writes 1.23e-07, not 20 characters)."""
    return float(f"{value:.{digits}g}")


def compact_advantages(advantages: Sequence[float]) -> float | list[float]:
    """One number when all sampled tokens share it (GRPO's per-episode advantage), else the list."""
    rounded = [round(a, 5) for a in advantages]
    return rounded[0] if rounded and len(set(rounded)) == 1 else rounded


def episode_entry(e: StoredEpisode) -> dict[str, Any]:
    """One episode in the page's compact form (see the module docstring)."""
    trained = e.trainer_logprobs is not None
    return {
        "episode": e.episode, "group": e.group, "task": e.task_id, "reward": round(e.reward, 5),
        "components": {k: round(v, 5) for k, v in e.components.items()},
        "kept": e.kept, "truncated": e.truncated, "infra_error": e.infra_error, "staleness": e.staleness,
        "prompt_len": e.prompt_len, "ids": e.token_ids, "sampled": sampled_spans(e.loss_mask),
        "lp": [round(x, 5) for x in e.sampled_logprobs],
        "tlp": [round(x, 5) for x in e.trainer_logprobs] if trained else None,
        "gap": [significant(t - s) for s, t in zip(e.sampled_logprobs, e.trainer_logprobs)] if trained else None,
        "adv": compact_advantages(e.advantages),
        "turns": [[s, t] for s, t in zip(e.turn_starts, e.turn_ends)],
        "events": [[ev["kind"], ev["turn"], ev["detail"] or ""] for ev in e.events],
        "images": [[start, f"data:image/png;base64,{image['png']}"] for start, image in zip(e.image_starts, shown_images(e.messages))],
    }


def shown_images(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pictures of stored messages (`Message.to_dict`), in the order the episode shows them."""
    return [image for message in messages for image in message.get("images", ())]


def step_rewards(metrics: Sequence[dict[str, Any]] | None) -> list[list[float]]:
    """[[step, mean reward], ...] of the RL rows of metrics.jsonl: the curve the viewer draws."""
    return [[row["step"], row["reward"]] for row in metrics or []
            if row.get("phase") == "rl" and isinstance(row.get("reward"), (int, float))]


def init_from(config_text: str | None) -> str:
    """The run's init_from (where RL started, and so where its tokenizer may be), if it set one."""
    config = yaml.safe_load(config_text) if config_text else None
    return str(config.get("init_from") or "") if isinstance(config, dict) else ""


def viewer_data(run_dir: Path, metrics: Sequence[dict[str, Any]] | None, config_text: str | None,
                steps: int = VIEWER_STEPS, episodes: int = VIEWER_EPISODES) -> dict[str, Any] | None:
    """Everything the page's script needs, or None if the run stored no rollouts."""
    stored, embedded = read_viewer_steps(run_dir, steps, episodes)
    if not stored:
        return None
    from toolpolicy.report.rollout_view import run_tokenizer_file, token_pieces  # imports the store too

    ids = sorted({i for s in embedded for e in s.episodes for i in e.token_ids})
    try:
        tokenizer = run_tokenizer_file(Path(run_dir), init_from(config_text))
        vocab, note = dict(zip(ids, token_pieces(tokenizer, ids))), ""
    except FileNotFoundError as err:
        vocab, note = {i: f"[{i}]" for i in ids}, f"Tokens are shown as ids: {err}."
    return {
        "stored_steps": stored,
        "rewards": step_rewards(metrics),
        "steps": [{"step": s.step, "stored": s.stored, "episodes": [episode_entry(e) for e in s.episodes]}
                  for s in embedded],
        "vocab": vocab,
        "limits": {"steps": steps, "episodes": episodes},
        "tokenizer_note": note,
    }


def left_out(data: dict[str, Any]) -> str:
    """What the page leaves out of the store, in one sentence (empty if nothing)."""
    stored, steps = data["stored_steps"], data["steps"]
    parts = []
    if len(steps) < len(stored):
        parts.append(f"{len(stored) - len(steps)} of {len(stored)} stored steps (only the last {len(steps)} are here)")
    shown = sum(len(s["episodes"]) for s in steps)
    total = sum(s["stored"] for s in steps)
    if shown < total:
        parts.append(f"{total - shown} of those steps' {total} episodes (up to {data['limits']['episodes']} a step "
                     "are here, as whole groups, groups with mixed rewards, gate denials or truncations first)")
    if not parts:
        return ""
    return ("Left out: " + "; ".join(parts) + ". Embed more with `toolpolicy report RUN --viewer-steps N "
            "--viewer-episodes M`; any step in the terminal: `toolpolicy rollouts show RUN --step N`.")


def viewer_section(data: dict[str, Any] | None) -> str:
    """The Rollouts section's HTML: the data, the controls the script fills in, the script."""
    if data is None:
        return '<p class="na">Not available: no rl/rollouts/step_*.parquet (store_rollouts was off, or RL has not run).</p>'
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    notes = " ".join(escape(text) for text in (left_out(data), data["tokenizer_note"]) if text)
    return f"""<p class="muted">Every token of the stored RL episodes: grey is the prompt, blue-grey what the
environment said back (tool results, user turns, gate messages), coloured what the policy sampled, green for a
positive advantage and red for a negative one, stronger the larger it is against the step's largest. Hover or
focus a token for its log-probs and advantage. Click a point of the reward curve to open that step.</p>
<p class="muted" id="viewer-left-out">{notes}</p>
<div id="viewer">
<svg id="viewer-curve" role="img" aria-label="mean reward per RL step; click a point to open its rollouts"></svg>
<div class="viewer-controls">
<label>step <select id="viewer-step"></select></label>
<label>reward from <input id="viewer-reward-min" type="number" step="any" size="6"></label>
<label>to <input id="viewer-reward-max" type="number" step="any" size="6"></label>
<label><input id="viewer-denied" type="checkbox"> gate denial</label>
<label><input id="viewer-truncated" type="checkbox"> truncated</label>
<span id="viewer-count" class="muted"></span>
</div>
<div class="viewer-body">
<table id="viewer-list"><thead><tr><th>ep</th><th>group</th><th>task</th><th>reward</th><th>tokens</th>
<th>denials</th><th>trunc.</th></tr></thead><tbody></tbody></table>
<div id="viewer-detail">
<div class="viewer-tabs"><button id="viewer-tab-episode" aria-pressed="true">episode</button>
<button id="viewer-tab-group" aria-pressed="false">its group side by side</button></div>
<div id="viewer-episode"></div>
</div>
</div>
<div id="viewer-tooltip" role="tooltip" hidden></div>
</div>
<script type="application/json" id="viewer-data">{payload}</script>
<script>{_asset("viewer.js")}</script>"""


def viewer_css() -> str:
    return _asset("viewer.css")


def _asset(name: str) -> str:
    return resources.files("toolpolicy.report").joinpath(name).read_text(encoding="utf-8")
