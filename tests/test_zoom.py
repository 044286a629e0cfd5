"""The zoom environment (envs/zoom), its picture tools (tools/images.py), policy and rewards."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image as PILImage

from toolpolicy.chat import HermesTemplate
from toolpolicy.chat.images import IMAGE_PAD, ImageSpan
from toolpolicy.envs import make_env
from toolpolicy.envs.zoom import ExpertStyle, ZoomEnv, draw_task
from toolpolicy.envs.zoom.env import CELL, GRID, VIEW, zoom_on
from toolpolicy.gate import Gate, Policy
from toolpolicy.model import char_codec
from toolpolicy.rewards import reward_function
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend
from toolpolicy.tools.images import picture, picture_tools
from toolpolicy.types import Episode, Message, Task, ToolCall

TEMPLATE = replace(HermesTemplate.compact(), image_span=ImageSpan(lambda image: 4))
LIMITS = EpisodeLimits(max_turns=4, max_tokens=20000, max_turn_tokens=2000)


@pytest.fixture(scope="module")
def env() -> ZoomEnv:
    return make_env("zoom")


@pytest.fixture(scope="module")
def tasks(env) -> dict[str, Task]:
    drawn = env.tasks("train", 40, seed=0)
    return {"easy": next(t for t in drawn if t.info["difficulty"] == "easy"), "hard": next(t for t in drawn if t.info["difficulty"] == "hard")}


def run(env: ZoomEnv, tasks: list[Task], scripts: list[list[Message]]) -> list[Episode]:
    encode, decode = char_codec()
    backend = ScriptedBackend(dict(enumerate(scripts)), TEMPLATE.render_assistant, encode)
    gate = Gate(Policy.load(env.policy_file), env.tools)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, LIMITS, gate) as engine:
        return [t.episode for t in engine.run(tasks)]


def score(name: str, episode: Episode) -> float:
    return reward_function(name)(episode)


def answer(code: str) -> Message:
    return Message("assistant", f"Answer: {code}")


def test_tasks_are_deterministic_and_the_code_sits_in_its_cell(env):
    one, two = env.tasks("eval", 20, seed=3), env.tasks("eval", 20, seed=3)
    assert [t.info for t in one] == [t.info for t in two]
    assert {t.info["difficulty"] for t in one} == {"easy", "hard"}
    assert {t.info["seed"] for t in one}.isdisjoint(t.info["seed"] for t in env.tasks("train", 20, seed=3))  # each split its own pictures
    for t in one:
        x0, y0, x1, y1 = t.info["evidence"]
        assert 0 <= x0 < x1 <= 256 and 0 <= y0 < y1 <= 256
        if t.info["difficulty"] == "hard":
            row, col = t.info["cell"]
            assert col * CELL <= x0 and x1 <= (col + 1) * CELL and row * CELL <= y0 and y1 <= (row + 1) * CELL
    assert np.array_equal(np.asarray(draw_task(one[0].info)), np.asarray(draw_task(two[0].info)))


def test_the_zoom_on_the_cell_is_the_cell_at_full_resolution(env, tasks):
    hard = tasks["hard"]
    row, col = hard.info["cell"]
    tools = env.session(hard).tools
    result = tools.call(zoom_on(row, col).tool_calls[0])
    assert result.ok and result.content == "" and len(result.images) == 1
    crop = np.asarray(picture(result.images[0]))
    full = np.asarray(draw_task(hard.info))
    assert crop.shape == (VIEW, VIEW, 3) and np.array_equal(crop, full[row * CELL : (row + 1) * CELL, col * CELL : (col + 1) * CELL])


def test_the_first_view_is_the_whole_picture_scaled_down(env, tasks):
    (_, user) = env.initial_messages(tasks["hard"])
    (view,) = user.images
    assert (view.width, view.height) == (VIEW, VIEW)


def test_other_picture_tools_return_views_and_refuse_bad_arguments():
    source = PILImage.new("RGB", (100, 60), "white")
    tools = picture_tools(source, 32)
    for call in (ToolCall("rotate", {"degrees": 90}), ToolCall("draw_box", {"x": 10, "y": 10, "width": 20, "height": 20}),
                 ToolCall("draw_point", {"x": 50, "y": 30})):  # fmt: skip
        result = tools.call(call)
        assert result.ok and (result.images[0].width, result.images[0].height) == (32, 32), call
    assert tools.call(ToolCall("rotate", {"degrees": 45})).error == "tool_error"
    assert tools.call(ToolCall("zoom", {"x": 90, "y": 0, "width": 20, "height": 10})).error == "tool_error"
    assert tools.call(ToolCall("draw_point", {"x": 100, "y": 0})).error == "tool_error"


def test_faithful_needless_and_unfaithful_zooms_are_scored_apart(env, tasks):
    easy, hard = tasks["easy"], tasks["hard"]
    row, col = hard.info["cell"]
    other = ((row + 1) % GRID, col)
    episodes = run(env, [hard, hard, easy, easy], [
        [zoom_on(row, col), answer(hard.answer)],          # faithful, right
        [zoom_on(*other), answer(hard.answer)],            # unfaithful: a lucky right answer
        [answer(easy.answer)],                             # no zoom needed, none taken
        [zoom_on(0, 0), answer(easy.answer)],              # needless
    ])  # fmt: skip
    right, lucky, plain, needless = episodes
    assert [score("correct_answer", e) for e in episodes] == [1.0] * 4
    assert [score("faithful_zoom", e) for e in episodes] == [1.0, 0.0, 0.0, 0.0]
    assert [score("unfaithful_zooms", e) for e in episodes] == [0.0, 1.0, 0.0, 1.0]
    assert [score("excess_tool_calls", e) for e in episodes] == [0.0, 0.0, 0.0, 1.0]
    assert right.messages[-2].images and right.messages[-2].role == "tool"
    (ignored,) = run(env, [hard], [[zoom_on(row, col), answer("000")]])
    assert score("ignored_crop", ignored) == 1.0 and score("ignored_crop", right) == 0.0


@pytest.mark.parametrize("region", [
    {"x": -1, "y": 0, "width": 64, "height": 64},
    {"x": 200, "y": 0, "width": 64, "height": 64},
    {"x": 0, "y": 0, "width": 0, "height": 64},
    {"x": 0, "y": 0, "width": -64, "height": 64},
    {"x": 0, "y": 255, "width": 1, "height": 2},
    {"x": 2**40, "y": 0, "width": 1, "height": 1},
])  # fmt: skip
def test_the_gate_refuses_a_region_outside_the_picture(env, tasks, region):
    hard = tasks["hard"]
    (episode,) = run(env, [hard], [[Message("assistant", "", (ToolCall("zoom", region),)), answer(hard.answer)]])
    assert episode.denials_by_rule() == {"region-inside": 1} and episode.count("tool_call") == 0


def test_the_gate_allows_two_zooms_and_refuses_a_third(env, tasks):
    hard = tasks["hard"]
    row, col = hard.info["cell"]
    (episode,) = run(env, [hard], [[zoom_on(row, col), zoom_on(0, 0), zoom_on(1, 1), answer(hard.answer)]])
    assert episode.count("tool_call") == 2 and episode.count("gate_deny") == 1


def test_the_demonstrator_is_imperfect_as_its_options_say(env):
    drawn = env.tasks("train", 400, seed=1)
    rng = random.Random(0)
    scripts = [env.expert_turns(t, rng, ExpertStyle(zoom_on_hard=0.5, right_cell=0.8, zoom_on_easy=0.3)) for t in drawn]
    hard = [s for t, s in zip(drawn, scripts) if t.info["difficulty"] == "hard"]
    easy = [s for t, s in zip(drawn, scripts) if t.info["difficulty"] == "easy"]
    assert 0.4 < sum(len(s) == 2 for s in hard) / len(hard) < 0.6
    assert 0.2 < sum(len(s) == 2 for s in easy) / len(easy) < 0.4
    assert all(s[-1].content.startswith("Answer: ") for s in scripts)


def test_a_rendered_episode_holds_a_span_per_picture(env, tasks):
    hard = tasks["hard"]
    row, col = hard.info["cell"]
    encode, decode = char_codec()
    backend = ScriptedBackend({0: [zoom_on(row, col), answer(hard.answer)]}, TEMPLATE.render_assistant, encode)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, LIMITS) as engine:
        (trajectory,) = engine.run([hard])
    assert decode(trajectory.token_ids).count(IMAGE_PAD) == 2 * 4  # the view and the crop, 4 pads each here


# ---- the whole job on a tiny VLM: SFT, RL, evaluation and the report's viewer ----------------

TINY_VLM = {
    "embedded.vocab_size": 300, "embedded.hidden_size": 32, "embedded.layers": 1, "embedded.heads": 2, "embedded.kv_heads": 1,
    "embedded.intermediate_size": 64, "embedded.tokenizer_texts": 20, "embedded.image_size": 16, "embedded.vision_hidden_size": 16,
    "embedded.vision_layers": 1, "embedded.reading_steps": 3, "embedded.reading_pictures": 40, "sft.examples": 32, "sft.steps": 2, "sft.batch_size": 8, "rl.steps": 1, "rl.prompts_per_step": 2,
    "rl.group_size": 2, "rl.max_idle_steps": 0, "rl.store_rollouts": True, "eval.tasks": 2, "eval.samples": 1, "run.threads": 1,
}  # fmt: skip


@pytest.fixture(scope="module")
def zoom_run(tmp_path_factory: pytest.TempPathFactory):
    """`toolpolicy demo` of configs/zoom.yaml at a tiny size: an embedded VLM built, SFT on the
    demonstrator's pictures, one RL step with stored rollouts, evaluations and the report."""
    from toolpolicy.cli import main
    from toolpolicy.demo import default_config_path

    run_dir = tmp_path_factory.mktemp("zoom") / "run"
    settings = [a for key, value in {**TINY_VLM, "run.dir": run_dir}.items() for a in ("--set", f"{key}={value}")]
    assert main(["demo", "--config", str(default_config_path().with_name("zoom.yaml")), *settings]) == 0
    return run_dir


def test_the_zoom_job_runs_end_to_end_on_an_embedded_vlm(zoom_run):
    import json

    from toolpolicy.rollout.store import read_step

    config = json.loads((zoom_run / "model" / "config.json").read_text())
    assert config["model_type"] == "llava" and config["vision_config"]["image_size"] == 16
    (episode, *_) = read_step(zoom_run / "rl" / "rollouts", 1)
    assert episode.image_starts and len(episode.image_starts) == sum(len(m.get("images", ())) for m in episode.messages)
    rl = [json.loads(line) for line in (zoom_run / "metrics.jsonl").read_text().splitlines() if '"rl"' in line]
    assert rl and "rewards/faithful_zoom" in rl[0]


def test_the_viewer_shows_the_pictures_inline(zoom_run):
    from browser import chromium, missing_browser

    from toolpolicy.rollout.store import read_step

    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    (first, *_) = read_step(zoom_run / "rl" / "rollouts", 1)
    pads = first.token_ids.count(first.token_ids[first.image_starts[0]])  # the placeholders, drawn as the pictures
    with chromium() as context:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto((zoom_run / "report.html").as_uri())
        page.wait_for_selector("#viewer-list tbody tr")
        pictures = page.locator("#viewer-episode .tokens img.picture")
        assert pictures.count() == len(first.image_starts)
        assert all(pictures.nth(k).evaluate("img => img.complete && img.naturalWidth > 0") for k in range(pictures.count()))
        assert page.locator("#viewer-episode .tokens .tok").count() == len(first.token_ids) - pads
        assert errors == []
