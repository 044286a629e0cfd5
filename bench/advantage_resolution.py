"""How many distinct advantages GRPO and GDPO give the same rollouts (GDPO's claim, arXiv 2601.05242).

GRPO normalises the weighted sum of the reward components, so two episodes with
different component values but the same total get the same advantage. GDPO
normalises each component within the group first. This rolls out groups of the
shipped SFT model on `calc` and counts, per group, the distinct reward-component
vectors and the distinct advantages each estimator gives them.

    .venv/bin/python bench/advantage_resolution.py [--groups 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from toolpolicy.algorithms import gdpo_advantages, grpo_advantages
from toolpolicy.model import PolicyModel
from toolpolicy.rewards import Rubric
from toolpolicy.build import load_config
from toolpolicy.build import build_engine

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent


def distinct(values: list[float]) -> int:
    return len({round(v, 6) for v in values})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "advantage_resolution.json"))
    args = parser.parse_args()
    cfg = load_config(ROOT / "src/toolpolicy/configs/demo.yaml", ["run.dir=/tmp/advantage-resolution"])
    policy = PolicyModel.load(ROOT / "checkpoints/calc-sft")
    with build_engine(cfg, policy, torch.Generator().manual_seed(0), cfg.rl.temperature) as engine:
        tasks = engine.env.tasks("train", args.groups, seed=123)
        trajectories = engine.run([t for t in tasks for _ in range(cfg.rl.group_size)], progress="rollouts")
        rubric = Rubric.from_weights(engine.env.default_rewards)
    terms = [t for t in rubric.terms if t.weight != 0]
    scores = [rubric.score(t.episode) for t in trajectories]
    components = torch.tensor([[s.components[t.name] for t in terms] for s in scores])  # [B, C]
    weights = torch.tensor([t.weight for t in terms])  # [C]
    grpo = grpo_advantages(torch.tensor([s.total for s in scores]), cfg.rl.group_size).tolist()
    gdpo = gdpo_advantages(components, weights, cfg.rl.group_size).tolist()
    size = cfg.rl.group_size
    rows = {"groups": args.groups, "combinations": 0, "grpo_values": 0, "gdpo_values": 0, "groups_where_grpo_merges": 0}
    for g in range(args.groups):
        part = slice(g * size, (g + 1) * size)
        combos = len({tuple(c) for c in components[part].tolist()})
        rows["combinations"] += combos
        rows["grpo_values"] += distinct(grpo[part])
        rows["gdpo_values"] += distinct(gdpo[part])
        rows["groups_where_grpo_merges"] += distinct(grpo[part]) < combos
    print(f"{args.groups} groups of {size}: {rows['combinations']} distinct reward-component vectors in all;")
    print(f"distinct advantages: GRPO {rows['grpo_values']}, GDPO {rows['gdpo_values']};"
          f" groups where GRPO gives two different vectors one advantage: {rows['groups_where_grpo_merges']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, rows)


if __name__ == "__main__":
    main()
