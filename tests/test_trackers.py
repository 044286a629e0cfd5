"""`report_to`: a real SFT and RL run logging to TensorBoard, wandb (offline) and Trackio,
each read back from what the library wrote and compared with metrics.jsonl."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from toolpolicy.trainer.trackers import metric_names

SMOKE = Path(__file__).parent.parent / "src" / "toolpolicy" / "configs" / "smoke.yaml"
PROJECT = "toolpolicy-test"


def toolpolicy(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "toolpolicy", *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 3-step SFT and a 2-step RL run in one folder with every tracker on."""
    root = tmp_path_factory.mktemp("tracked")
    run_dir, trackio_dir = root / "run", root / "trackio"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TRACKIO_DIR": str(trackio_dir),
           "OMP_NUM_THREADS": "1"}
    common = ["--set", f"run.dir={run_dir}", "--set", "run.report_to=[tensorboard, wandb, trackio]",
              "--set", f"run.tracker_project={PROJECT}", "--set", "run.threads=1"]
    toolpolicy("sft", str(SMOKE), *common, "--set", "sft.steps=3", env=env)
    toolpolicy("train", str(SMOKE), *common, "--set", f"rl.init_from={run_dir / 'sft' / 'final'}", "--set", "rl.steps=2", env=env)
    return run_dir, trackio_dir


def logged(run_dir: Path) -> dict[tuple[str, int], float]:
    """metrics.jsonl as {(PHASE/METRIC, step): value}."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.update({(name, record["step"]): v for name, v in metric_names(record["phase"], record).items()})
    return out


def test_tensorboard_events_read_back_equal_to_metrics_jsonl(tracked_run: tuple[Path, Path]):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = tracked_run
    found = {}
    for phase in ("sft", "rl"):
        events = EventAccumulator(str(run_dir / "tensorboard" / phase), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            found.update({(tag, e.step): e.value for e in events.Scalars(tag)})
    expected = logged(run_dir)
    assert {k for k in expected if k[0].startswith("rl/")} and set(found) == set(expected)
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, rel=1e-6, abs=1e-30), key  # TensorBoard keeps float32


def wandb_records(path: str) -> list:
    """The records of a W&B offline run file: a 7-byte header, then LevelDB-log records
    (32 KiB blocks; each chunk: crc32c, length, type) holding `Record` protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, records, chunks, pos, block = Path(path).read_bytes(), [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def test_wandb_offline_run_reads_back_equal_to_metrics_jsonl(tracked_run: tuple[Path, Path]):
    run_dir, _ = tracked_run
    found, config = {}, {}
    files = sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert len(files) == 2  # the SFT and the RL command appended to one run id
    assert len({Path(f).name for f in files}) == 1
    for path in files:
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                phase = next(k.split("/")[0] for k in row if k.endswith("/step") and not k.startswith("_"))
                found.update({(k, row[f"{phase}/step"]): v for k, v in row.items() if not k.startswith("_") and k != f"{phase}/step"})
            elif record.WhichOneof("record_type") == "run":  # the run's start carries its config
                config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    expected = logged(run_dir)
    assert set(found) == set(expected)
    assert all(found[k] == pytest.approx(v) for k, v in expected.items())
    assert config["run.seed"] == 0 and config["env.name"] == "calc" and config["run.report_to"] == json.dumps(["tensorboard", "wandb", "trackio"])


def test_trackio_run_reads_back_equal_to_metrics_jsonl(tracked_run: tuple[Path, Path]):
    run_dir, trackio_dir = tracked_run
    script = (
        "import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
        f"print(json.dumps([S.get_logs({PROJECT!r}, {run_dir.name!r}), S.get_run_config({PROJECT!r}, {run_dir.name!r})], default=str))"
    )
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TRACKIO_DIR": str(trackio_dir)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    logs, config = json.loads(done.stdout)
    found = {}
    for row in logs:
        phase = next(k.split("/")[0] for k in row if k.endswith("/step"))
        found.update({(k, row[f"{phase}/step"]): v for k, v in row.items() if "/" in k and k != f"{phase}/step"})
    expected = logged(run_dir)
    assert set(found) == set(expected)
    assert all(found[k] == pytest.approx(v) for k, v in expected.items())
    assert config["run.seed"] == 0 and config["env.name"] == "calc"


def test_a_tracker_that_is_not_installed_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from toolpolicy.config import Config, ConfigError
    from toolpolicy.trainer.trackers import open_trackers

    monkeypatch.setitem(sys.modules, "trackio", None)  # import trackio now raises ImportError
    with pytest.raises(ConfigError, match="run.report_to: 'trackio' needs the trackio package"):
        open_trackers(Config(run={"report_to": ["trackio"]}), tmp_path, "rl", 0)
