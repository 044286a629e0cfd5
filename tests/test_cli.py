"""The real commands, end to end: `toolpolicy demo` in the smoke configuration, config
errors, bugs that show their traceback, the audit log across phases (resume: test_resume.py)."""

from __future__ import annotations

import json
import os
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from toolpolicy.algorithms.losses import SURROGATE_STATS
from toolpolicy.cli import main
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError

from conftest import SMOKE


def test_demo_writes_a_complete_run_folder(smoke_run: Path):
    for name in ("config.yaml", "metrics.jsonl", "report.html", "summary.json", "model/config.json",
                 "sft/final/model.safetensors", "rl/final/model.safetensors", "eval/sft.json", "eval/rl.json"):
        assert (smoke_run / name).is_file(), name
    config = yaml.safe_load((smoke_run / "config.yaml").read_text())
    assert config["rl"]["init_from"].endswith("sft/final")
    lines = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["phase"] == "sft"] == list(range(1, 61))
    rl = [r for r in lines if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3, 4]
    for key in ("reward", "accuracy", "accuracy/easy", "accuracy/hard", "tool_calls/easy", "invalid_call_rate", "entropy"):
        assert all(key in r for r in rl), key
    assert not any("kl" in r for r in rl), "log_kl is off by default: no reference forward for a metric"
    assert all(r["tokens/prefill"] > 0 and r["tokens/decode"] > 0 for r in rl)
    trained = [r for r in rl if r["trained_episodes"]]
    assert trained, "no RL step of the smoke run trained"
    for r in trained:  # old log-probs are the rollout's own: the update starts at ratio 1, nothing clipped
        assert abs(r["ratio_mean"] - 1) < 1e-4 and r["ratio_max"] < 1 + 1e-3 and r["clip_fraction"] == 0.0, r
        assert r["mismatch/abs_max"] < 1e-4 and r["mismatch/truncated"] == 0.0, r  # the hf sampler is the trainer
        assert 0 < r["tokens/update"] and r["tokens/reference"] == 0
        assert all(name in r for name in SURROGATE_STATS), r  # every stat the loss returns, under its own name
    for name in ("sft", "rl"):
        result = json.loads((smoke_run / "eval" / f"{name}.json").read_text())
        assert result["n"] == 24 and result["infra_errors"] == 0
        # accuracy is the mean over episodes: the difficulties' accuracies weighted by their episodes
        by_difficulty = result["by_difficulty"]
        assert set(by_difficulty) == {"easy", "hard"} and sum(d["n"] for d in by_difficulty.values()) == 24
        correct = sum(round(d["accuracy"] * d["n"]) for d in by_difficulty.values())
        assert result["accuracy"] == correct / 24 and result["pass_hat_k"]["1"] == pytest.approx(result["accuracy"])
        samples = (smoke_run / "eval" / f"{name}_samples.jsonl").read_text().splitlines()
        assert len(samples) == 4 and all(json.loads(s)["messages"][0]["role"] == "system" for s in samples)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images = 0
        self.text = []

    def handle_starttag(self, tag, attrs):
        if tag == "img" and dict(attrs).get("src", "").startswith("data:image/png;base64,"):
            self.images += 1

    def handle_data(self, data):
        self.text.append(data)


def test_report_is_well_formed(smoke_run: Path):
    parser = _Tags()
    parser.feed((smoke_run / "report.html").read_text())
    text = " ".join(parser.text)
    assert parser.images >= 6
    assert "calculator" in text and "Answer" in text


def test_config_errors_name_the_file_and_field(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl:\n  steps: many\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    message = str(err.value)
    assert str(bad) in message and "'rl.steps'" in message and "'rl.learning_rate'" in message and "unknown field" in message
    assert "did you mean 'rl.lr'" not in message  # no close name to learning_rate in rl; the list is in `toolpolicy config`
    with pytest.raises(ConfigError, match="'sft.lr'"):
        load_config(None, ["sft.lr=-1"])
    with pytest.raises(ConfigError, match="expected section.field=value"):
        load_config(None, ["sft.lr"])
    with pytest.raises(ConfigError, match="did you mean 'rl.steps', 'rl.warmup_steps' or 'sft.steps'"):
        load_config(None, ["rl.step=3"])
    with pytest.raises(ConfigError, match="unknown section 'rll'"):
        load_config(None, ["rll.steps=3"])
    assert load_config(None, ["rl.steps=7"]).rl.steps == 7


def test_a_flat_config_of_before_sections_is_refused_with_its_migration(tmp_path: Path, capsys):
    """A config file or --set of the flat config names where each field lives now, and
    `toolpolicy config --migrate` rewrites the file in sections, comments aside."""
    flat = tmp_path / "flat.yaml"
    flat.write_text("run_dir: runs/x\nrl_steps: 3\nenv: hotel\nexpert_violation: 0.5\nbackend: endpoint\nrollout_url: http://h:1\nvllm_threads: 2\n")
    with pytest.raises(ConfigError, match=r"fields 'run_dir', 'rl_steps', 'expert_violation', 'rollout_url', 'vllm_threads' are the flat config .*--migrate"):
        load_config(flat)
    with pytest.raises(ConfigError, match=r"--set rl_steps=\.\.\.: not a field; its place is 'rl.steps'"):
        load_config(None, ["rl_steps=3"])
    assert main(["config", "--migrate", str(flat), "--write"]) == 0
    migrated = yaml.safe_load(flat.read_text())
    assert migrated == {
        "run": {"dir": "runs/x"}, "env": {"name": "hotel"}, "backend": {"name": "server", "url": "http://h:1"},
        "rl": {"steps": 3}, "demonstrator": {"violation": 0.5},
    }  # vllm_threads was ignored with backend endpoint, and is dropped
    cfg = load_config(flat)
    assert (cfg.rl.steps, cfg.env.name, cfg.backend.url, cfg.demonstrator.options) == (3, "hotel", "http://h:1", {"violation": 0.5})


def test_a_bug_shows_its_traceback_and_a_user_error_does_not(tmp_path: Path, capsys, monkeypatch):
    import toolpolicy.eval.run

    def broken(*args, **kwargs):
        raise ValueError("a bug in evaluate")

    monkeypatch.setattr(toolpolicy.eval.run, "evaluate", broken)
    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"
    with pytest.raises(ValueError, match="a bug in evaluate"):  # not turned into "error: ..." and exit 2
        main(["eval", str(SMOKE), "--set", f"run.dir={tmp_path}", "--set", f"eval.checkpoint={shipped}"])
    assert main(["eval", str(SMOKE), "--set", f"run.dir={tmp_path}", "--trials", "0"]) == 2
    assert "--trials must be at least 1" in capsys.readouterr().err


def test_cli_reports_config_errors_without_a_traceback(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl:\n  group_size: 1\n")
    assert main(["train", str(bad)]) == 2
    assert "rl.group_size" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_demo_starts_from_a_cold_start_checkpoint(smoke_run: Path, tmp_path: Path):
    run_dir = tmp_path / "warm"
    code = main(["demo", "--config", str(SMOKE), "--set", f"run.dir={run_dir}",
                 "--set", f"sft.cold_start={smoke_run / 'sft' / 'final'}", "--set", "rl.steps=2"])
    assert code == 0
    assert not (run_dir / "sft").exists(), "SFT must be skipped with a cold start"
    assert (run_dir / "rl" / "final" / "model.safetensors").is_file() and (run_dir / "report.html").is_file()


def test_missing_cold_start_is_a_clear_error(tmp_path: Path, capsys):
    code = main(["demo", "--config", str(SMOKE), "--set", f"run.dir={tmp_path / 'x'}", "--set", f"sft.cold_start={tmp_path / 'nope'}"])
    assert code == 2
    assert "nope" in capsys.readouterr().err


def test_audit_log_spans_every_phase_of_a_run(tmp_path: Path):
    """Each engine closes its audit log, so one evaluation after another appends to one chain."""
    from toolpolicy.gate import verify

    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"  # a model that calls the tool
    run_dir = tmp_path / "audited"
    common = ["--set", f"run.dir={run_dir}", "--set", "gate.audit=true", "--set", f"eval.checkpoint={shipped}",
              "--set", "eval.tasks=8", "--set", "eval.samples=2"]
    assert main(["eval", str(SMOKE), *common, "--name", "first"]) == 0
    assert main(["eval", str(SMOKE), *common, "--name", "second"]) == 0
    result = verify(run_dir / "audit.jsonl")
    assert result.ok, result.problems
    records = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert len({r["decision_id"] for r in records}) == len(records) == result.records  # each decision once
    # Allow-all on calc: every call the model wrote well enough to reach the gate is allowed and
    # runs; the gate's own denials are malformed calls (unknown tool, arguments off the schema).
    executed = sum(round(json.loads((run_dir / "eval" / f"{n}.json").read_text())["tool_calls_per_episode"] * 16) for n in ("first", "second"))
    assert executed > 0 and sum(r["decision"] == "allow" for r in records) == executed
    assert all(r["rule_ids"][0].startswith("gate:") for r in records if r["decision"] != "allow")


def test_a_refused_resume_leaves_the_runs_config_as_it_was(tmp_path: Path, capsys):
    """Resuming with an override that makes the config unusable is an error before anything
    is written: the run folder's config, the record of how the run started, is kept."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = _saved_smoke(run_dir)
    (run_dir / "config.yaml").write_text(saved)
    assert main(["train", "--resume", str(run_dir), "--set", "rl.init_from=", "--override"]) == 2
    assert "'rl.init_from' is empty" in capsys.readouterr().err
    assert (run_dir / "config.yaml").read_text() == saved


def _saved_smoke(run_dir: Path) -> str:
    """SMOKE's sections with rl.init_from and run.dir set, as YAML."""
    sections = yaml.safe_load(SMOKE.read_text())
    sections["rl"]["init_from"] = "checkpoints/calc-sft"
    sections["run"]["dir"] = str(run_dir)
    return yaml.safe_dump(sections)


def _started_run(run_dir: Path) -> str:
    """A run folder as `toolpolicy train SMOKE --set rl.init_from=... --set rl.steps=4` leaves it."""
    run_dir.mkdir()
    saved = _saved_smoke(run_dir)
    (run_dir / "config.yaml").write_text(saved)
    return saved


def test_resume_goes_on_with_the_runs_own_config(tmp_path: Path, capsys, monkeypatch):
    import toolpolicy.trainer.rl

    run_dir = tmp_path / "run"
    _started_run(run_dir)
    resumed = []
    monkeypatch.setattr(toolpolicy.trainer.rl, "train_rl", lambda cfg, run, resume: resumed.append((cfg, resume)) or run)
    # The config file again, without the --set it started with: the run's config.yaml is what counts.
    assert main(["train", str(SMOKE), "--resume", str(run_dir)]) == 0
    assert "note: resuming with" in capsys.readouterr().err
    assert main(["train", "--resume", str(run_dir), "--set", "rl.steps=4"]) == 0  # a --set that changes nothing
    assert [(cfg.rl.init_from, cfg.rl.steps, resume) for cfg, resume in resumed] == [("checkpoints/calc-sft", 4, True)] * 2
    # A --set that contradicts the saved config is refused, naming the field and both values.
    saved = (run_dir / "config.yaml").read_text()
    assert main(["train", "--resume", str(run_dir), "--set", "rl.steps=20"]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir / 'config.yaml'}: rl.steps from 4 to 20" in err and "--override" in err
    assert (run_dir / "config.yaml").read_text() == saved
    assert main(["train", "--resume", str(run_dir), "--set", "rl.steps=20", "--override"]) == 0
    assert resumed[-1][0].rl.steps == 20 and yaml.safe_load((run_dir / "config.yaml").read_text())["rl"]["steps"] == 20
    assert "rl.lr_schedule cosine" not in capsys.readouterr().err  # a constant LR has no plan to change
    # Under a cosine LR more steps stretch the decay: the LR jumps at the resumed step, and the note says so.
    assert main(["train", "--resume", str(run_dir), "--set", "rl.lr_schedule=cosine", "--override"]) == 0
    assert "rl.lr_schedule cosine" not in capsys.readouterr().err  # the same plan
    assert main(["train", "--resume", str(run_dir), "--set", "algorithm.mini_batches=2", "--override"]) == 0
    assert "decays over 40 optimizer steps now where the run planned 20" in capsys.readouterr().err
    assert main(["train", str(SMOKE), "--override"]) == 2
    assert "--override lets --set change a resumed run's saved config" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sft", "train", "demo"])
def test_ctrl_c_says_where_the_run_stopped_and_how_to_resume(command: str, tmp_path: Path, capsys, monkeypatch):
    import toolpolicy.demo
    import toolpolicy.trainer.rl
    import toolpolicy.trainer.sft
    from toolpolicy.trainer.checkpoint import MetricsLog

    run_dir = tmp_path / "run"
    phase = "sft" if command == "sft" else "rl"

    def interrupted(cfg, *args, **kwargs):
        (run_dir / phase / "checkpoints" / "step_000002").mkdir(parents=True)
        for step in (1, 2, 3):
            MetricsLog(run_dir / "metrics.jsonl").write({"phase": phase, "step": step})
        raise KeyboardInterrupt

    monkeypatch.setattr(toolpolicy.trainer.sft, "train_sft", interrupted)
    monkeypatch.setattr(toolpolicy.trainer.rl, "train_rl", interrupted)
    monkeypatch.setattr(toolpolicy.demo, "run_demo", interrupted)
    flag = ["--config"] if command == "demo" else []
    assert main([command, *flag, str(SMOKE), "--set", f"run.dir={run_dir}", "--set", "rl.init_from=checkpoints/calc-sft"]) == 130
    trainer, total = ("sft", 60) if phase == "sft" else ("train", 4)
    assert capsys.readouterr().err == (
        f"toolpolicy {command}: interrupted in {phase} after step 3 of {total}; "
        f"resume from its checkpoint of step 2 with: toolpolicy {trainer} --resume {run_dir}\n"
    )


def test_a_config_write_cut_short_keeps_the_old_file(tmp_path: Path, monkeypatch):
    from toolpolicy.config import save_config

    path = tmp_path / "config.yaml"
    save_config(load_config(None), path)
    before = path.read_text()

    def cut_short(descriptor: int, data: bytes) -> None:  # Ctrl-C halfway through the write
        os.write(descriptor, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr("toolpolicy.atomic.write_all", cut_short)
    with pytest.raises(KeyboardInterrupt):
        save_config(load_config(None, ["rl.steps=7"]), path)
    monkeypatch.undo()
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_version_is_printed():
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0


def test_an_unknown_field_suggests_the_closest_known_ones(tmp_path: Path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("rl:\n  step: 3\n  initfrom: x\n  zzz: 1\nrun:\n  sft_steps: 2\nalgorithms:\n  beta: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{bad}: invalid config"
    expected = [
        "  field 'algorithms': unknown field; did you mean 'algorithm'?",
        "  field 'run.sft_steps': unknown field; did you mean 'sft.steps'?",  # a flat name, in the wrong section
        "  field 'rl.step': unknown field; did you mean 'rl.steps'",
        "  field 'rl.initfrom': unknown field; did you mean 'rl.init_from'",
        "  field 'rl.zzz': unknown field (see `toolpolicy config` for the list)",
    ]
    assert len(lines) == 1 + len(expected)
    assert all(any(line.startswith(start) for line in lines[1:]) for start in expected), lines


def test_a_path_in_a_config_file_is_found_from_the_current_folder_then_from_the_file(tmp_path: Path, monkeypatch):
    from toolpolicy.demo import default_config_path

    configs, elsewhere = tmp_path / "project" / "configs", tmp_path / "elsewhere"
    configs.mkdir(parents=True)
    elsewhere.mkdir()
    (configs / "rules.yaml").write_text("rules: []\n")
    (tmp_path / "project" / "data.jsonl").write_text("")
    config = configs / "run.yaml"
    config.write_text("gate: {policy: rules.yaml}\nsft: {data: data.jsonl}\nrun: {dir: runs/x}\nrl: {init_from: nowhere/model}\n")
    monkeypatch.chdir(elsewhere)
    cfg = load_config(config)
    assert cfg.gate.policy == str(configs / "rules.yaml")  # beside the config file
    assert cfg.sft.data == str(tmp_path / "project" / "data.jsonl")  # in a folder above it
    assert (cfg.run.dir, cfg.rl.init_from) == ("runs/x", "nowhere/model")  # written, or found nowhere: as written
    (elsewhere / "rules.yaml").write_text("rules: []\n")
    assert load_config(config).gate.policy == "rules.yaml"  # the current folder's comes first
    assert load_config(config, ["sft.data=data.jsonl"]).sft.data == "data.jsonl"  # a --set: as given
    # The shipped demo config finds the repository's checkpoints/calc-sft from any folder.
    assert (Path(load_config(default_config_path()).sft.cold_start) / "config.json").is_file()


def test_the_demo_announces_the_sft_data_it_trains_on():
    from toolpolicy.demo import sft_source

    assert sft_source(load_config(SMOKE, [])) == "building the embedded model and SFT cold start on the calc demonstrator's episodes"
    own = load_config(SMOKE, ["model.source=models/mine", "sft.data=data/sft.jsonl"])
    assert sft_source(own) == "models/mine: SFT cold start on the conversations of data/sft.jsonl"
