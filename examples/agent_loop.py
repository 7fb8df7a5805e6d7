#!/usr/bin/env python3
"""An agent-style loop on Hutch: the model proposes a tool call, the sandbox runs it, and the
result goes back to the model as the next observation.

The "model" here is scripted so the example runs anywhere without an LLM, but it reacts to
what it observes the way a real one would (it notices that `python3` is missing and falls
back to `awk`). To use a real model, replace `ScriptedModel.next_action` with a call to your
LLM that returns the same small JSON tool-call shape.

Run it against a local server (as root on the server's machine, nothing to configure):

    python3 examples/agent_loop.py
    HUTCH_URL=http://127.0.0.1:7700 HUTCH_API_KEY=... python3 examples/agent_loop.py
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hutch import ExecResult, HutchError, Sandbox

TASK = "Create /work/data.csv with some sales figures, then report the total."

# Tools the model may call, described the way you would describe them to an LLM.
TOOLS = {
    "run": "Run a command. Args: cmd (list of strings = argv, no shell; or a string for sh -c).",
    "write_file": "Write a file. Args: path (absolute), content (text).",
    "finish": "Stop and give the final answer. Args: answer (text).",
}


@dataclass
class Turn:
    action: Dict[str, Any]
    observation: str


@dataclass
class ScriptedModel:
    """Stands in for an LLM: decides the next tool call from the transcript so far."""

    transcript: List[Turn] = field(default_factory=list)

    def next_action(self) -> Dict[str, Any]:
        step = len(self.transcript)
        last = self.transcript[-1].observation if self.transcript else ""
        if step == 0:
            return {
                "tool": "write_file",
                "args": {
                    "path": "/work/data.csv",
                    "content": "region,amount\nnorth,120\nsouth,75\neast,210\nwest,95\n",
                },
            }
        if step == 1:
            # First attempt: Python. Templates without it answer with exit code 127.
            code = (
                "import csv; rows = csv.DictReader(open('/work/data.csv'));"
                " print(sum(int(r['amount']) for r in rows))"
            )
            return {"tool": "run", "args": {"cmd": ["python3", "-c", code]}}
        if step == 2 and '"exit_code": 127' in last:
            # React to the observation: no python3 here, use awk instead.
            return {
                "tool": "run",
                "args": {
                    "cmd": ["awk", "-F,", "NR > 1 { s += $2 } END { print s }", "/work/data.csv"]
                },
            }
        # The last successful run printed the total.
        total = json.loads(last).get("stdout", "").strip()
        return {"tool": "finish", "args": {"answer": f"The total of the sales figures is {total}."}}


def observe(result: ExecResult) -> str:
    """What the model sees after a command: compact JSON, output trimmed to keep prompts small."""
    return json.dumps(
        {
            "exit_code": result.exit_code,
            "stdout": result.stdout[-2000:],
            "stderr": result.stderr[-2000:],
            "timed_out": result.timed_out,
        }
    )


def run_tool(sb: Sandbox, action: Dict[str, Any]) -> str:
    """Execute one tool call in the sandbox and return the observation text."""
    tool, args = action["tool"], action.get("args", {})
    try:
        if tool == "run":
            return observe(sb.exec(args["cmd"], timeout=30))
        if tool == "write_file":
            sb.files.write(args["path"], args["content"])
            return json.dumps({"ok": True, "bytes": len(args["content"].encode())})
        return json.dumps({"error": f"unknown tool {tool!r}"})
    except HutchError as e:
        # Errors go back to the model as observations, not crashes: it can try something else.
        return json.dumps({"error": str(e)})


def untrusted_code_network() -> dict:
    """The egress policy for code a model wrote: `deny` with an allow list of what it may
    need (here the Python package index), never the open internet, so code it was tricked
    into writing cannot send data out or attack other hosts. On a server started with
    `--network off`, set HUTCH_EXAMPLE_EGRESS=none (loopback only)."""
    if os.environ.get("HUTCH_EXAMPLE_EGRESS") == "none":
        return {"egress": "none"}
    return {"egress": "deny", "allow": ["pypi.org", "files.pythonhosted.org"]}


def main(max_turns: int = 8) -> Optional[str]:
    model = ScriptedModel()
    template = os.environ.get("HUTCH_TEMPLATE")  # None: the server's default template
    # The sandbox is killed when the block ends, even if the loop raises.
    with Sandbox.create(
        template=template,
        ttl_seconds=300,
        network=untrusted_code_network(),
        metadata={"example": "agent_loop"},
    ) as sb:
        print(f"task: {TASK}\nsandbox: {sb.id}")
        for turn in range(1, max_turns + 1):
            action = model.next_action()
            print(f"\n[{turn}] model -> {json.dumps(action)[:200]}")
            if action["tool"] == "finish":
                answer = str(action["args"]["answer"])
                print(f"\nanswer: {answer}")
                return answer
            observation = run_tool(sb, action)
            print(f"[{turn}] sandbox -> {observation[:200]}")
            model.transcript.append(Turn(action, observation))
    print("gave up after", max_turns, "turns")
    return None


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
