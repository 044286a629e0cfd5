"""Three RL updates on one fixed batch, in however many processes torchrun starts, the model
held as argv[1] says (replicate, shard, or shard-kept: shard with model.shard_reshard
false); rank 0 saves each update's loss and gradient norms and the weights after them to
argv[2]. tests/test_distributed.py compares them with one
process's.

    python tests/sharded_steps.py replicate OUT                               # one process
    python -m torch.distributed.run --nproc-per-node 2 tests/sharded_steps.py shard OUT

The batch is three groups of two episodes (a shared prompt each, responses of different
lengths) and one micro-batch a row, so two processes run unequal numbers of micro-batches:
rank 0 two groups, rank 1 one; the second of two optimizer steps a pass has rank 1 nothing
to train (a sharded rank then runs padding passes only). TIS takes pi_old from a forward pass
before the first step (unequal micro-batches again), a KL reference (beta > 0) is sharded the
same way, and the clip acts on some steps (GRAD_CLIP below their norm). Then the same with a
LoRA adapter on the frozen model, whose KL reference is that model with the adapter off.

Everything computes in float64: one process and two sum the same terms in another order, which
in float32 moves a loss by ~1e-6 after three steps by an amount that depends on the CPU's
kernels (AMX or AVX-512); in float64 that rounding is ~1e-15, so any gap above 1e-10 is a term
counted twice, dropped, or taken from the wrong weights."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from toolpolicy.algorithms.correction import Correction
from toolpolicy.build import load_config
from toolpolicy.config import ModelSection
from toolpolicy.model import PolicyModel
from toolpolicy.model.adapters import LoraSettings, attach_lora
from toolpolicy.model.placement import held_parameters
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.batch import SHARED_PROMPTS, collate
from toolpolicy.trainer.distributed import SHARINGS, World
from toolpolicy.trainer.update import UPDATE_MAXIMA, Learner, UpdateSettings, algorithm_of, train_on_batch

CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"
SHAPES = [(5, [4, 7]), (3, [2, 6]), (6, [5, 3])]
"""(prompt length, [response length of each episode]) of each group."""
GRAD_CLIP = 0.5


def sampled(model: torch.nn.Module, prompt: list[int], n: int, g: torch.Generator) -> list[int]:
    """`n` tokens `model` samples after `prompt` (plausible ones: a random token's log-prob
    and its gradient are large, and would make the losses swing with the last bit of a weight)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1)  # [V]
            ids.append(int(torch.multinomial(probs, 1, generator=g)))
    return ids[len(prompt) :]


def fixed_batch(model: torch.nn.Module, pad_id: int) -> tuple[list[Trajectory], torch.Tensor]:
    """The episodes (random prompts, responses `model` samples, their log-probs its own) and
    their advantages [6]."""
    g = torch.Generator().manual_seed(0)
    episodes = []
    for prompt_len, responses in SHAPES:
        prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g).tolist()
        for n in responses:
            response = sampled(model, prompt, n, g)
            episodes.append(Trajectory(prompt + response, [0] * prompt_len + [1] * n, [0.0] * (prompt_len + n), prompt_len, None))
    with torch.no_grad():
        logprobs, _ = SHARED_PROMPTS.logprobs(model, collate(episodes, pad_id))  # [6, L-1]
    for row, episode in zip(logprobs, episodes):
        episode.logprobs = [0.0] + row[: len(episode.token_ids) - 1].tolist()
    return episodes, torch.tensor([1.0, -1.0, 0.5, -0.5, -0.8, 0.8], dtype=torch.float64)


HOLDINGS = {
    "replicate": ModelSection(),
    "shard": ModelSection(sharing="shard"),
    "shard-kept": ModelSection(sharing="shard", shard_reshard=False),
}
"""The model settings argv[1] names."""


def updates(sharing_name: str, world: World, lora: bool) -> dict:
    """Three updates of the fixed batch: their losses, gradient norms and the weights after
    them (whole, on every rank)."""
    torch.manual_seed(0)
    policy = PolicyModel.load(CALC_SFT)
    model = policy.model.to(torch.float64)
    if lora:  # the adapter's A from the seeded generator, the same in every process; B starts at 0
        model = attach_lora(model, LoraSettings(8, 16, 0.0, ("q_proj", "v_proj", "up_proj", "down_proj")), CALC_SFT)
    reference = model if lora else PolicyModel.load(CALC_SFT).model.to(torch.float64).eval()  # LoRA: the base with the adapter off
    episodes, advantages = fixed_batch(model, policy.pad_id)
    section = HOLDINGS[sharing_name]
    sharing = SHARINGS[section.sharing](section)
    whole = sharing.place(model, world)
    if reference is not model:
        sharing.place_frozen(reference, world)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # SGD with momentum (its state sharded as well): Adam's step on a gradient near 0 turns
    # rounding into an update of lr, so weights 1e-6 apart would say little about the sums.
    optimizer = torch.optim.SGD(trainable, lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    algorithm, _, _ = algorithm_of(load_config(None, ["algorithm.beta=0.1"]).algorithm)
    settings = UpdateSettings(
        group_size=2, mini_batches=2, passes=1, micro_batch_size=1, micro_batch_tokens=None, temperature=1.0, grad_clip=GRAD_CLIP,
    )
    recompute = replace(SHARED_PROMPTS, logprobs=sharing.logprobs(SHARED_PROMPTS.logprobs))
    learner = Learner(
        model, reference, trainable, optimizer, scheduler, algorithm, Correction.named("tis", tis_cap=2.0), recompute, world,
        policy.pad_id, settings, sharing,
    )
    losses, norms = [], []
    for _ in range(3):  # as train_rl runs them: the update starts from the weights gathered for the sampler
        done = train_on_batch(learner, episodes, list(range(len(episodes))), advantages)
        losses.append(world.reduce_stats(done.sums, UPDATE_MAXIMA)["loss"])
        norms += done.grad_norms
        if section.sharing == "shard":  # the update's passes freed every gathered unit: the optimizer stepped on shards alone
            assert all(isinstance(p, DTensor) for p in model.parameters()), "a sharded unit stayed gathered through the update"
        sharing.refresh(model, whole)
    with torch.no_grad():  # a pass no backward follows (with shard_reshard false its blocks stay gathered), then a refresh
        recompute.logprobs(model, collate(episodes[:1], policy.pad_id))
    sharing.refresh(model, whole)
    if section.sharing == "shard":  # the sampler's weights are the gathered ones, not a second copy
        for name, parameter in whole.named_parameters():
            gathered = model.get_parameter(name)
            assert not isinstance(gathered, DTensor) and parameter.data_ptr() == gathered.data_ptr(), f"{name} is not the gathered weight"
        assert all(isinstance(p, DTensor) for p in held_parameters(model)), "the memory figures would count the gathered weights as held"
    return {"losses": losses, "grad_norms": norms, "weights": {name: tensor.clone() for name, tensor in whole.state_dict().items()}}


def main(sharing_name: str, out: Path) -> None:
    """Both variants in one launch (every weight trained, then a LoRA adapter), saved as {"full": ..., "lora": ...}."""
    world = World.from_environment(torch.device("cpu"))
    results = {name: updates(sharing_name, world, lora) for name, lora in (("full", False), ("lora", True))}
    if world.main:
        torch.save(results, out)
    world.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
