"""Training across processes: `torchrun --nproc-per-node 2 -m toolpolicy train` on this CPU
(gloo) takes the steps one process takes with the same global batch, and resumes exactly,
whether the processes hold the whole model each (model.sharing: replicate) or shards of it
(shard, FSDP2).

With episode sampling streams every episode's tokens depend only on its seed, so the two
runs sample the same episodes; the update differs only in the order floats are summed."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from safetensors.torch import load_file

from toolpolicy.cli import main
from toolpolicy.gate import verify
from toolpolicy.trainer.distributed import World
from toolpolicy.trainer.update import rank_share

from conftest import SMOKE, free_port

CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"
BASE = ["--set", f"rl.init_from={CALC_SFT}", "--set", "rl.steps=3", "--set", "run.checkpoint_every=2"]
RUN = [*BASE, "--set", "rl.sampling_streams=episode", "--set", "gate.audit=true"]
VARIES = ("time/", "memory/", "tokens/prefill", "tokens/decode", "tokens_per_s")  # timings, and work that depends on batch shape


def torchrun(*args: str) -> None:
    """`toolpolicy` under torchrun with 2 processes, one thread each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "toolpolicy", *args]
    process = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert process.returncode == 0, process.stderr[-3000:]


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(VARIES)} for row in rows]


def decisions(run_dir: Path) -> Counter:
    """Every gate decision of the run, from all its processes' audit logs, without order."""
    rows = [json.loads(line) for log in sorted(run_dir.glob("audit*.jsonl")) for line in log.read_text().splitlines()]
    return Counter((r["tool"], r["args_digest"], r["decision"], tuple(r["rule_ids"])) for r in rows)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "rl" / "final" / "model.safetensors")


def assert_trained_alike(one: Path, other: Path) -> None:
    """The two runs' final weights differ by under 1% of what their 3 steps moved them: float32
    sums taken in another order or with other threads (AMD EPYC: 0.36% in a Ray run, whose
    trainer runs one thread). A step more or fewer differs by about a third of the move."""
    w1, w2 = weights(one), weights(other)
    start = load_file(CALC_SFT / "model.safetensors")
    moved = max(float((w1[k] - start[k]).abs().max()) for k in w1)  # what 3 steps changed
    apart = max(float((w1[k] - w2[k]).abs().max()) for k in w1)  # where the two runs differ
    assert moved > 1e-4 and apart < moved / 100, (moved, apart)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ddp") / "one"
    assert main(["train", str(SMOKE), *RUN, "--set", f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.fixture(scope="module", params=["replicate", "shard"])
def two_processes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ddp") / f"two-{request.param}"
    torchrun("train", str(SMOKE), *RUN, "--set", f"model.sharing={request.param}", "--set", f"run.dir={run_dir}")
    return run_dir


ROUNDING = ("mismatch/", "ratio_max")
"""Metrics that measure float32 rounding itself (the sampler's log-probs against the trainer's,
whose batch shapes differ with the number of processes): each run's are within the float32
agreement bound, not equal to the other's (their gaps differ by 20% on an AMD EPYC)."""
FLOAT32_AGREEMENT = 1e-4
"""Nats between sampler and trainer in float32 (tests/test_lora_precision.py's bound)."""


def assert_same_steps(one: list[dict], other: list[dict]) -> None:
    """The same steps, with the same metrics: rollouts, rewards and counts equal, the update's
    float32 sums (loss, grad_norm, entropy, kl) to rel 1e-5: sums taken in another order,
    measured 2e-6 at most on an AMD EPYC (grad_norm; loss 2e-7). The rounding metrics
    (ROUNDING) within FLOAT32_AGREEMENT in both."""
    assert len(one) == len(other)
    for a, b in zip(one, other):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith(ROUNDING):
                gap = (lambda v: abs(v - 1.0)) if key == "ratio_max" else abs
                assert gap(a[key]) < FLOAT32_AGREEMENT and gap(b[key]) < FLOAT32_AGREEMENT, (a["step"], key, a[key], b[key])
                continue
            expected = pytest.approx(a[key], rel=1e-5, abs=1e-5) if isinstance(a[key], float) else a[key]
            assert b[key] == expected, (a["step"], key)


def test_two_processes_take_the_steps_one_process_takes(one_process: Path, two_processes: Path):
    one, two = metrics(one_process), metrics(two_processes)
    assert [row["step"] for row in two] == [1, 2, 3]
    assert_same_steps(one, two)
    # Each sharded process holds half the model state (parameters, gradients, AdamW's moments).
    share = 2 if two_processes.name.endswith("shard") else 1
    for a, b in zip(*(map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) for run in (one_process, two_processes))):
        assert b["memory/model_state_mb"] == pytest.approx(a["memory/model_state_mb"] / share, rel=0.01)
    for a, b in zip(one, two):
        assert b["reward"] == a["reward"] and b["trained_episodes"] == a["trained_episodes"]
    # Each rank ran half of the groups: together, the decisions one process made.
    assert decisions(two_processes) == decisions(one_process)
    assert sorted(p.name for p in two_processes.glob("audit*.jsonl")) == ["audit.jsonl", "audit.rank1.jsonl"]
    for log in two_processes.glob("audit*.jsonl"):
        assert verify(log).ok, log
    assert_trained_alike(one_process, two_processes)


def test_two_processes_resume_exactly(two_processes: Path, tmp_path: Path):
    """Step 3 done but its checkpoint lost (a kill just before it): resuming from step 2's
    checkpoint replays step 3 and leaves the metrics and each rank's audit log as they were."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(two_processes, run_dir)
    shutil.rmtree(run_dir / "rl" / "checkpoints" / "step_000003")
    shutil.rmtree(run_dir / "rl" / "final")
    sharded = (run_dir / "rl" / "checkpoints" / "step_000002" / "optimizer_shards").is_dir()
    assert sharded == two_processes.name.endswith("shard")  # a sharded run's optimizer state is in shards
    torchrun("train", "--resume", str(run_dir))
    assert metrics(run_dir) == metrics(two_processes)  # same samples, same sums: bit for bit
    for name in ("audit.jsonl", "audit.rank1.jsonl"):
        assert (run_dir / name).read_text() != ""
        again = [json.loads(line) for line in (run_dir / name).read_text().splitlines()]
        before = [json.loads(line) for line in (two_processes / name).read_text().splitlines()]
        assert [(r["seq"], r["args_digest"], r["decision"]) for r in again] == [(r["seq"], r["args_digest"], r["decision"]) for r in before]
        assert verify(run_dir / name).ok
    w1, w2 = weights(run_dir), weights(two_processes)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_lora_from_an_adapter_in_two_sharded_processes_takes_one_process_steps(tmp_path: Path):
    """RL with a LoRA adapter from an adapter checkpoint (folded into its base first, which
    rank 0 writes to rl/base and both ranks then load), in 2 processes holding shards: the
    steps of one process, the same adapter to float rounding, and a resume from step 2 bit
    for bit."""
    from toolpolicy.model import PolicyModel
    from toolpolicy.model.adapters import LoraSettings, attach_lora

    adapter = tmp_path / "adapter"  # a trained-looking adapter: B away from 0, so folding it changes the base
    policy = PolicyModel.load(CALC_SFT)
    torch.manual_seed(0)
    model = attach_lora(policy.model, LoraSettings(4, 8, 0.0, ("q_proj", "v_proj")), CALC_SFT)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.02)
    model.save_pretrained(adapter)
    policy.tokenizer.save_pretrained(adapter)
    lora = [*RUN, "--set", f"rl.init_from={adapter}", "--set", "model.lora_rank=4", "--set", "run.threads=1"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", str(SMOKE), *lora, "--set", f"run.dir={one}"]) == 0
    torchrun("train", str(SMOKE), *lora, "--set", "model.sharing=shard", "--set", f"run.dir={two}")
    assert_same_steps(metrics(one), metrics(two))
    assert load_file(two / "rl" / "base" / "model.safetensors").keys() == load_file(CALC_SFT / "model.safetensors").keys()
    w1, w2 = (load_file(run / "rl" / "final" / "adapter_model.safetensors") for run in (one, two))
    assert w1.keys() == w2.keys() and max(float(t.abs().max()) for k, t in w1.items() if "lora_B" in k) > 0
    for name, tensor in w1.items():
        torch.testing.assert_close(w2[name], tensor, rtol=1e-5, atol=1e-6)
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "rl" / "checkpoints" / "step_000003")
    shutil.rmtree(resumed / "rl" / "final")
    torchrun("train", "--resume", str(resumed))
    assert metrics(resumed) == metrics(two)
    again = load_file(resumed / "rl" / "final" / "adapter_model.safetensors")
    assert all(torch.equal(again[k], w2[k]) for k in w2)


STEPS = Path(__file__).with_name("sharded_steps.py")
GRAD_CLIP = 0.5  # sharded_steps.GRAD_CLIP
FLOAT64_GAP = 1e-10
"""How far float64 updates summed in another order may drift apart: 1e6 times their rounding
(measured on an AMD EPYC: 1e-16 on the losses, 1e-17 on the weights; float64 rounding is 2^-52 relative on every IEEE CPU)."""


def run_steps(out: Path, processes: int, sharing: str) -> dict:
    """tests/sharded_steps.py in one process or under torchrun, one thread each (sums in the
    same order): what it saved, by variant (full, lora)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)] if processes > 1 else []
    process = subprocess.run([sys.executable, *launcher, str(STEPS), sharing, str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert process.returncode == 0, process.stderr[-3000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def one_process_steps(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One process's updates, with every weight trained and with a LoRA adapter."""
    return run_steps(tmp_path_factory.mktemp("steps") / "one.pt", 1, "replicate")


@pytest.mark.parametrize("sharing", ["replicate", "shard", "shard-kept"])
def test_two_processes_update_a_fixed_batch_as_one_process_does(sharing: str, one_process_steps: dict, tmp_path: Path):
    """Three RL updates of the calc model on one batch (tests/sharded_steps.py: unequal
    micro-batches per rank, a rank with nothing to train, TIS's pi_old pass, a sharded KL
    reference or, with LoRA, the base with the adapter off, clipping), every weight trained
    and then a LoRA adapter, all in float64: the same losses, gradient norms and weights as one
    process to 1e-10. The two sum the same terms in another order; float64 rounds that to
    ~1e-16 on any CPU (float32 to ~1e-6, by an amount that depends on the CPU's kernels), so
    a gap above 1e-10 is a term counted twice, dropped or taken from the wrong weights.
    shard-kept: blocks stay gathered from forward to backward (model.shard_reshard: false),
    which the no-grad pi_old and reference passes leave gathered too."""
    both = run_steps(tmp_path / "two.pt", 2, sharing)
    start = load_file(CALC_SFT / "model.safetensors")
    for variant in ("full", "lora"):
        one, two = one_process_steps[variant], both[variant]
        assert len(two["grad_norms"]) == 6 and max(two["grad_norms"]) > GRAD_CLIP  # 2 optimizer steps an update, some clipped
        assert two["losses"] == pytest.approx(one["losses"], rel=FLOAT64_GAP, abs=FLOAT64_GAP)
        assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=FLOAT64_GAP)
        if variant == "lora":  # the base stays as loaded in every process; the adapter's B, from 0, moves
            base = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): t for k, t in two["weights"].items() if ".lora_" not in k}
            assert all(torch.equal(base[k], start[k]) for k in start)  # the file has no lm_head: tied to the embedding
            moved = max(float(t.abs().max()) for k, t in one["weights"].items() if "lora_B" in k)
        else:
            moved = max(float((one["weights"][k] - start[k]).abs().max()) for k in start)
        assert moved > 1e-4  # the gap below is a gap, not a standstill
        assert one["weights"].keys() == two["weights"].keys()
        for name, tensor in one["weights"].items():
            assert tensor.dtype == torch.float64, name
            torch.testing.assert_close(two["weights"][name], tensor, rtol=FLOAT64_GAP, atol=FLOAT64_GAP)


SFT = [
    "--set", "sft.steps=4", "--set", "run.checkpoint_every=2", "--set", "sft.examples=64", "--set", "embedded.tokenizer_texts=50",
    "--set", "sft.batch_size=13", "--set", "optim.micro_batch_size=2",  # 7 and 6 examples: 4 and 3 micro-batches
    "--set", "run.threads=1",  # one process computes with one thread, as each torchrun process
]


@pytest.fixture(scope="module")
def one_process_sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("sft") / "one"
    assert main(["sft", str(SMOKE), *SFT, "--set", f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def sharded_sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("sft") / "shard"
    torchrun("sft", str(SMOKE), *SFT, "--set", "model.sharing=shard", "--set", f"run.dir={run_dir}")
    return run_dir


def test_sharded_sft_takes_the_steps_one_process_takes(one_process_sft: Path, sharded_sft: Path):
    """`toolpolicy sft` in 2 processes holding shards of the model (each a share of every
    batch, unequal micro-batches): one process's losses, and its weights to float rounding."""
    one, two = metrics(one_process_sft), metrics(sharded_sft)
    assert [row["step"] for row in two] == [1, 2, 3, 4]
    # float32 sums in another order: measured on an AMD EPYC 4e-8 (loss), 2e-7 (grad_norm), 6e-7 (weights)
    assert [row["loss"] for row in two] == pytest.approx([row["loss"] for row in one], rel=1e-6)
    assert [row["grad_norm"] for row in two] == pytest.approx([row["grad_norm"] for row in one], rel=1e-5)
    w1 = load_file(one_process_sft / "sft" / "final" / "model.safetensors")
    w2 = load_file(sharded_sft / "sft" / "final" / "model.safetensors")
    for name, tensor in w1.items():
        torch.testing.assert_close(w2[name], tensor, rtol=1e-5, atol=1e-5)
    state = [json.loads(line) for line in (sharded_sft / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < row["memory/model_state_mb"] for row in state)


def test_sharded_sft_resumes_exactly_and_exports_a_plain_model(sharded_sft: Path, tmp_path: Path):
    """Step 4 done but its checkpoint lost: resuming from step 2's (the model folder whole,
    the optimizer state in each rank's shards) replays steps 3 and 4 bit for bit; `toolpolicy
    export` writes a folder transformers loads."""
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "resumed"
    shutil.copytree(sharded_sft, run_dir)
    shutil.rmtree(run_dir / "sft" / "checkpoints" / "step_000004")
    shutil.rmtree(run_dir / "sft" / "final")
    assert (run_dir / "sft" / "checkpoints" / "step_000002" / "optimizer_shards" / ".metadata").is_file()
    torchrun("sft", "--resume", str(run_dir))
    assert metrics(run_dir) == metrics(sharded_sft)
    final = (run_dir / "sft" / "final" / "model.safetensors").read_bytes()
    assert final == (sharded_sft / "sft" / "final" / "model.safetensors").read_bytes()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "exported")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    weights = load_file(run_dir / "sft" / "final" / "model.safetensors")
    assert all(torch.equal(exported.state_dict()[name], tensor) for name, tensor in weights.items())


@pytest.mark.parametrize("settings", [[], ["rl.sampling_streams=episode", "rl.max_staleness=1"]])
def test_what_cannot_split_across_processes_is_refused_before_any_work(settings: list[str], tmp_path: Path, monkeypatch):
    """Under torchrun (WORLD_SIZE=2) batch streams or asynchronous sampling are a config error,
    raised before a model is loaded or a process group joined."""
    from toolpolicy.build import load_config
    from toolpolicy.config import ConfigError
    from toolpolicy.trainer.rl import train_rl

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = load_config(SMOKE, [f"rl.init_from={CALC_SFT}", f"run.dir={tmp_path}", *settings])
    with pytest.raises(ConfigError, match="2 processes need rl.sampling_streams: episode on a backend that takes a seed per request"):
        train_rl(cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "moment",
    [
        (["toolpolicy.trainer.sft", "sft_loss"], 3, None),  # step 3 mid-update, after step 2's checkpoint
        (["toolpolicy.trainer.sft", "save_checkpoint"], 1, None),  # as step 2's checkpoint is written
    ],
    ids=["mid-update", "at-a-checkpoint"],
)
def test_a_killed_sharded_sft_resumes_exactly(moment: tuple, sharded_sft: Path, tmp_path: Path):
    """Both processes of a sharded SFT run killed with SIGKILL (each at its own call of the
    function: one may die while the other still writes), then `--resume` under torchrun: the
    metrics and the final weights of the uninterrupted run."""
    from test_resume import DRIVER

    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    run_dir = tmp_path / "killed"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(driver), json.dumps(list(moment)),
        "sft", str(SMOKE), *SFT, "--set", "model.sharing=shard", "--set", f"run.dir={run_dir}",
    ]
    process = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert process.returncode != 0 and "Signal 9 (SIGKILL) received" in process.stderr, process.stderr[-2000:]
    torchrun("sft", "--resume", str(run_dir))
    assert metrics(run_dir) == metrics(sharded_sft)
    final = (run_dir / "sft" / "final" / "model.safetensors").read_bytes()
    assert final == (sharded_sft / "sft" / "final" / "model.safetensors").read_bytes()


def test_shard_offload_on_the_cpu_is_refused_before_any_work(tmp_path: Path, monkeypatch):
    """FSDP2's CPU offload needs an accelerator to copy the shards to; on the CPU it is a config error."""
    from toolpolicy.build import load_config
    from toolpolicy.config import ConfigError
    from toolpolicy.trainer.sft import train_sft

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = load_config(SMOKE, ["model.device=cpu", "model.sharing=shard", "model.shard_offload=true", f"run.dir={tmp_path}"])
    with pytest.raises(ConfigError, match="model.shard_offload moves the shards between CPU memory and an accelerator"):
        train_sft(cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="model.shard_offload keeps the shards of model.sharing: shard"):
        load_config(SMOKE, ["model.shard_offload=true"])


@pytest.mark.parametrize("groups,size", [(8, 2), (7, 2), (1, 2), (5, 3)])
def test_ranks_share_every_group_once(groups: int, size: int):
    shares = [World(rank, size).share(groups) for rank in range(size)]
    assert [g for share in shares for g in share] == list(range(groups))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_each_rank_trains_whole_groups():
    order = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]  # kept episodes of groups 0, 2, 3 (group size 4)
    mine = [rank_share(order, 4, World(rank, 2)) for rank in range(2)]
    assert mine == [[0, 1, 2, 3, 8, 9, 10, 11], [12, 13, 14, 15]]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A Ray head on loopback, started as a user would (`ray start --head`) with a token the
    trainer must present (RAY_AUTH_TOKEN in its environment), stopped after."""
    ray_cli = str(Path(sys.executable).parent / "ray")
    port = free_port()
    temp = tmp_path_factory.mktemp("ray")
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    start = [
        ray_cli, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
        "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(temp),
    ]
    process = subprocess.run(start, capture_output=True, text=True, timeout=300, env={**os.environ, **auth})
    assert process.returncode == 0, process.stderr[-2000:]
    try:
        yield RayCluster(f"127.0.0.1:{port}", auth)
    finally:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=300)


class RayCluster(NamedTuple):
    address: str
    auth: dict[str, str]
    """What the trainer's environment needs to join it."""

    def train(self, *args: str) -> None:
        """`toolpolicy train ...` in a process of its own, as a user runs it (Ray reads its
        authentication settings once, when it is first imported)."""
        env = {**os.environ, **self.auth, "OMP_NUM_THREADS": "1"}
        process = subprocess.run([sys.executable, "-m", "toolpolicy", "train", *args], capture_output=True, text=True, env=env, timeout=900)
        assert process.returncode == 0, process.stderr[-3000:]


@pytest.fixture(scope="module")
def two_ray_workers(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ray") / "two-workers"
    settings = ["--set", "rl.ray_workers=2", "--set", f"rl.ray_address={ray_cluster.address}", "--set", f"run.dir={run_dir}"]
    ray_cluster.train(str(SMOKE), *RUN, *settings)
    return run_dir


def test_ray_workers_roll_out_what_one_process_does(one_process: Path, two_ray_workers: Path):
    """Two Ray actors, fed the weights after each step, sample the episodes the trainer's own
    process samples; the update runs on the driver, as with one process."""
    one, ray_run = metrics(one_process), metrics(two_ray_workers)
    assert [row["step"] for row in ray_run] == [1, 2, 3]
    assert_same_steps(one, ray_run)
    assert sorted(p.name for p in two_ray_workers.glob("audit*.jsonl")) == ["audit.worker0.jsonl", "audit.worker1.jsonl"]
    assert decisions(two_ray_workers) == decisions(one_process)
    for log in two_ray_workers.glob("audit*.jsonl"):
        assert verify(log).ok, log
    assert_trained_alike(one_process, two_ray_workers)  # one process trains either way


def test_ray_workers_resume_exactly(ray_cluster: RayCluster, two_ray_workers: Path, tmp_path: Path):
    """As with torchrun: step 3's checkpoint lost, the resumed run replays step 3 on fresh
    workers and each worker's audit log is cut back and rewritten as it was."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(two_ray_workers, run_dir)
    shutil.rmtree(run_dir / "rl" / "checkpoints" / "step_000003")
    shutil.rmtree(run_dir / "rl" / "final")
    ray_cluster.train("--resume", str(run_dir))
    assert metrics(run_dir) == metrics(two_ray_workers)
    for name in ("audit.worker0.jsonl", "audit.worker1.jsonl"):
        assert [json.loads(x)["args_digest"] for x in (run_dir / name).read_text().splitlines()] == [
            json.loads(x)["args_digest"] for x in (two_ray_workers / name).read_text().splitlines()
        ]
        assert verify(run_dir / name).ok


@pytest.mark.parametrize(
    "settings,message",
    [
        (["rl.sampling_streams=episode", "backend=vllm"], "rl.sampling_streams: episode needs a backend that takes a seed per request"),
        (["rl.ray_workers=2"], "rl.ray_workers needs rl.sampling_streams: episode"),
        (["rl.ray_workers=2", "rl.sampling_streams=episode", "model.lora_rank=4"], "no model.lora_rank"),
    ],
)
def test_settings_that_cannot_split_a_step_are_config_errors(settings: list[str], message: str):
    from toolpolicy.build import load_config
    from toolpolicy.config import ConfigError

    with pytest.raises(ConfigError, match=message) as error:
        load_config(SMOKE, settings)
    assert "got {" not in str(error.value)  # names the fields, does not dump the whole config
