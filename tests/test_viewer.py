"""The report's trajectory viewer: its data picked and packed from the rollout store (pure
functions), then the smoke run's report.html in a real browser (headless Chromium through
Playwright): no console errors, filters, a token's numbers, the curve's links, the group."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from browser import chromium, missing_browser
from toolpolicy.report.__main__ import main as report_main
from toolpolicy.report.viewer import compact_advantages, left_out, pick_groups, sampled_spans, significant, viewer_data, viewer_section
from toolpolicy.rollout.store import StoredEpisode, read_step, stored_steps


def stored(episode: int, group: int, reward: float, *, events=(), truncated=False) -> StoredEpisode:
    return StoredEpisode(
        step=1, episode=episode, group=group, task_id=f"t{group}", prompt_len=2, token_ids=[1, 2, 3], loss_mask=[False, False, True],
        sampled_logprobs=[-0.5], trainer_logprobs=None, advantages=[0.0], reward=reward, success=reward == 1.0, components={}, turn_starts=[2],
        turn_ends=[3], events=list(events), truncated=truncated, infra_error=None, kept=False, staleness=0, messages=[], outcome={},
    )


def test_sampled_spans_are_the_runs_of_the_mask():
    assert sampled_spans([True, True, False, False, True, False, True, True]) == [[0, 2], [4, 5], [6, 8]]
    assert sampled_spans([False, False]) == []


def test_advantages_collapse_to_one_number_only_when_all_equal():
    assert compact_advantages([0.25, 0.25, 0.25]) == 0.25
    assert compact_advantages([0.25, -0.5]) == [0.25, -0.5]
    assert compact_advantages([]) == []


def test_a_small_gap_keeps_its_significant_digits():
    assert significant(-1.23456e-7) == -1.23e-7
    assert significant(0.0) == 0.0


def test_whole_groups_are_picked_informative_first_in_sampling_order():
    deny = [{"kind": "gate_deny", "turn": 0, "detail": "no-refund"}]
    episodes = [
        stored(0, 0, 1.0), stored(1, 0, 1.0),                     # same rewards: nothing to learn
        stored(2, 1, 0.0), stored(3, 1, 0.0, truncated=True),     # a truncation
        stored(4, 2, 0.0, events=deny), stored(5, 2, 0.0),        # a gate denial
        stored(6, 3, 1.0), stored(7, 3, 0.0),                     # mixed rewards
    ]
    assert [e.episode for e in pick_groups(episodes, 4)] == [4, 5, 6, 7]
    assert [e.episode for e in pick_groups(episodes, 6)] == [2, 3, 4, 5, 6, 7]
    assert [e.episode for e in pick_groups(episodes, 1)] == [6, 7]  # one group at least, kept whole
    assert pick_groups(episodes, 0) == []


def test_the_page_says_what_it_left_out():
    data = {"stored_steps": [1, 2, 3], "limits": {"episodes": 2},
            "steps": [{"step": 3, "stored": 8, "episodes": [{}, {}]}]}
    assert left_out(data).startswith("Left out: 2 of 3 stored steps (only the last 1 are here); 6 of those steps' 8 episodes")
    assert left_out({"stored_steps": [1], "limits": {"episodes": 2}, "steps": [{"step": 1, "stored": 2, "episodes": [{}, {}]}]}) == ""


def test_token_text_cannot_close_the_data_script():
    data = {"stored_steps": [1], "limits": {"episodes": 2}, "steps": [], "rewards": [], "tokenizer_note": "",
            "vocab": {"7": "</script><script>alert(1)</script>"}}
    section = viewer_section(data)
    assert "alert" not in section.split('<script type="application/json"')[0]
    assert section.count("</script>") == 2  # the data's and the viewer's own
    assert embedded_data(section)["vocab"]["7"] == "</script><script>alert(1)</script>"
    assert "Not available" in viewer_section(None)


def embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', page, re.DOTALL)
    assert match, "report.html has no viewer data"
    return json.loads(match.group(1))


def test_the_page_embeds_the_last_steps_and_their_exact_tokens(smoke_run: Path):
    folder = smoke_run / "rl" / "rollouts"
    metrics = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    data = viewer_data(smoke_run, metrics, (smoke_run / "config.yaml").read_text(), steps=2, episodes=4)
    assert [s["step"] for s in data["steps"]] == stored_steps(folder)[-2:]
    assert [step for step, _ in data["rewards"]] == stored_steps(folder)  # the curve has every step
    assert left_out(data).startswith("Left out: 2 of 4 stored steps")
    assert data["tokenizer_note"] == ""  # the run's own tokenizer decoded them
    for step in data["steps"]:
        by_index = {e.episode: e for e in read_step(folder, step["step"])}
        assert len(step["episodes"]) == 4
        for entry in step["episodes"]:
            e = by_index[entry["episode"]]
            assert entry["ids"] == e.token_ids
            assert sum(end - start for start, end in entry["sampled"]) == len(entry["lp"]) == sum(e.loss_mask)
            assert entry["lp"] == pytest.approx(e.sampled_logprobs, abs=1e-5)
            assert all(i in data["vocab"] for i in e.token_ids)


def test_the_report_command_refuses_negative_limits(smoke_run: Path, capsys):
    with pytest.raises(SystemExit):
        report_main([str(smoke_run), "--viewer-steps", "-1"])
    assert "--viewer-steps and --viewer-episodes must be 0 or more" in capsys.readouterr().err


# ---- in the browser ----

@pytest.fixture(scope="module")
def browser(smoke_run: Path):
    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    with chromium() as context:
        yield context


@pytest.fixture
def viewer(browser, smoke_run: Path):
    """The smoke run's report.html (as `toolpolicy demo` wrote it) in a new tab, and the list
    of every console error and uncaught exception the page raises."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto((smoke_run / "report.html").as_uri())
    page.wait_for_selector("#viewer-list tbody tr")
    yield page, errors
    page.close()


def step_episodes(smoke_run: Path, step: int) -> list[StoredEpisode]:
    return read_step(smoke_run / "rl" / "rollouts", step)


def selected_step(page) -> int:
    return int(page.eval_on_selector("#viewer-step", "s => s.options[s.selectedIndex].text").split()[0])


def listed(page) -> list[int]:
    return [int(row.get_attribute("data-episode")) for row in page.query_selector_all("#viewer-list tbody tr")]


def test_the_viewer_loads_without_console_errors(viewer, smoke_run: Path):
    page, errors = viewer
    last = stored_steps(smoke_run / "rl" / "rollouts")[-1]
    episodes = step_episodes(smoke_run, last)
    assert errors == []
    assert selected_step(page) == last
    assert listed(page) == [e.episode for e in episodes]  # the smoke run's 16 a step fit the default cap
    assert page.locator("#viewer-episode .tokens .tok").count() == len(episodes[0].token_ids)
    assert page.locator("#viewer-episode .tokens .tok.sampled").count() == sum(episodes[0].loss_mask)


def test_a_reward_filter_narrows_the_list(viewer, smoke_run: Path):
    page, errors = viewer
    episodes = step_episodes(smoke_run, selected_step(page))
    rewards = sorted({e.reward for e in episodes})
    assert len(rewards) > 1, "the smoke run's last step should have episodes of different rewards"
    threshold = round((rewards[-2] + rewards[-1]) / 2, 3)
    page.fill("#viewer-reward-min", str(threshold))
    expected = [e.episode for e in episodes if e.reward >= threshold]
    assert listed(page) == expected and 0 < len(expected) < len(episodes)
    page.check("#viewer-truncated")
    assert listed(page) == [e.episode for e in episodes if e.reward >= threshold and e.truncated]
    page.uncheck("#viewer-truncated")
    page.fill("#viewer-reward-min", "")
    assert listed(page) == [e.episode for e in episodes]
    assert errors == []


def number_after(label: str, text: str) -> float:
    match = re.search(re.escape(label) + r" (-?[0-9.e+-]+)", text)
    assert match, f"no {label!r} in the tooltip {text!r}"
    return float(match.group(1))


def test_a_tokens_tooltip_shows_its_numbers_from_the_store(viewer, smoke_run: Path):
    page, errors = viewer
    trained = [e for e in step_episodes(smoke_run, selected_step(page)) if e.trainer_logprobs]
    e = max(trained, key=lambda e: abs(e.advantages[0]))  # the strongest colour
    page.locator(f'#viewer-list tbody tr[data-episode="{e.episode}"]').click()
    k = len(e.sampled_logprobs) // 2  # a sampled token in the middle
    position = e.sampled_positions[k]
    page.hover(f'#viewer-episode .tok[data-i="{position}"]')
    tip = page.locator("#viewer-tooltip")
    assert tip.is_visible()
    text = tip.inner_text()
    assert f"token {position} · id {e.token_ids[position]}" in text
    assert number_after("sampled log-prob", text) == pytest.approx(e.sampled_logprobs[k], abs=1e-5)
    assert number_after("trainer log-prob", text) == pytest.approx(e.trainer_logprobs[k], abs=1e-5)
    gap = e.trainer_logprobs[k] - e.sampled_logprobs[k]
    assert number_after("difference (trainer - sampled)", text) == pytest.approx(gap, rel=0.01, abs=1e-12)
    assert number_after("advantage", text) == pytest.approx(e.advantages[k], abs=1e-5)
    page.hover('#viewer-episode .tok[data-i="0"]')  # the prompt: no numbers, and says why
    assert "prompt: not sampled" in tip.inner_text() and "log-prob" not in tip.inner_text()
    assert errors == []


def test_a_curve_point_opens_its_step_and_a_group_shows_side_by_side(viewer, smoke_run: Path, tmp_path: Path):
    page, errors = viewer
    first = stored_steps(smoke_run / "rl" / "rollouts")[0]
    page.click(f'#viewer-curve circle[data-step="{first}"]')
    assert selected_step(page) == first
    assert f"step {first} stored" in page.locator("#viewer-count").inner_text()
    episodes = step_episodes(smoke_run, first)
    assert listed(page) == [e.episode for e in episodes]
    page.click("#viewer-tab-group")
    group = [e for e in episodes if e.group == episodes[0].group]
    heads = page.locator(".group-head").all_inner_texts()
    assert [float(h.split("reward ")[1].split()[0]) for h in heads] == pytest.approx([e.reward for e in group], abs=1e-3)
    shot = tmp_path / "viewer.png"
    page.locator("#rollouts").screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert errors == []
