"""Writes sft.jsonl: the adder's demonstrations as OpenAI chat records, the SFT data of the tutorial.

    python examples/adder/make_sft.py [--records 400] [--out examples/adder/sft.jsonl]

Each record is one solved training task: call `add` with the question's two numbers, read
the sum, answer with it. The tasks are the environment's own (split "train", seed 0), so
the file is the same on every machine.
"""

import argparse
import json
import re
from pathlib import Path

from adder import AdderEnv

from toolpolicy.chat.records import chat_record
from toolpolicy.types import Message, Task, ToolCall


def demonstration(env: AdderEnv, task: Task) -> list[Message]:
    """The dialogue of one task solved the intended way: one `add` call, then the answer."""
    a, b = (int(n) for n in re.findall(r"\d+", task.prompt))  # "What is 38 + 53?"
    call = ToolCall("add", {"a": a, "b": b}, id=f"call_{task.id}")
    result = env.tools.call(call)
    return [
        *env.initial_messages(task),
        Message("assistant", tool_calls=(call,)),
        Message("tool", result.content, name="add", tool_call_id=call.id),
        Message("assistant", f"Answer: {result.content}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "sft.jsonl")
    args = parser.parse_args()
    env = AdderEnv()
    lines = [json.dumps(chat_record(demonstration(env, task), env.tools.specs())) for task in env.tasks("train", args.records, seed=0)]
    args.out.write_text("".join(line + "\n" for line in lines))
    print(f"wrote {len(lines)} records to {args.out}")


if __name__ == "__main__":
    main()
