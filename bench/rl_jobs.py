"""The RL jobs the RL benchmarks run (bench/backend_rl.py, bench/ddp.py, bench/async_rl.py):
an environment's config and the shipped SFT checkpoint RL starts from."""

from pathlib import Path

ROOT = Path(__file__).parent.parent
JOBS = {
    "calc": (ROOT / "src" / "toolpolicy" / "configs" / "demo.yaml", ROOT / "checkpoints" / "calc-sft"),
    "hotel": (ROOT / "src" / "toolpolicy" / "configs" / "hotel.yaml", ROOT / "checkpoints" / "hotel-sft"),
}
