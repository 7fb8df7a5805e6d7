#!/usr/bin/env python3
"""Best-of-N on Hutch: try N candidate solutions side by side and keep the best one.

The setup is done once, in one sandbox. `Sandbox.explore` (`POST /v1/sandboxes/{id}/explore`)
then forks that sandbox once per candidate, runs the candidates in parallel, scores them
(exit status 0 = 1.0, else 0; `score_regex=` scores by a number the command prints instead),
keeps the winner's fork as a sandbox of its own and destroys the others. The prepared sandbox
itself is left unchanged, so it can be explored again.

On the `ns` backend the forks are filesystem-level: every candidate starts from the prepared
sandbox's files (copy-on-write, nothing is copied), not from its running processes, so do the
setup as files on disk (outside `/tmp`, which is memory-backed and not carried).

    python3 examples/best_of_n.py
"""

from __future__ import annotations

import os
import sys

from hutch import Sandbox

# The shared setup every candidate starts from: an input file.
SETUP_PATH = "/work/numbers.txt"
SETUP_DATA = "".join(f"{n}\n" for n in [42, 7, 19, 3, 88, 23])
EXPECTED = "3 7 19 23 42 88"
ANSWER_PATH = "/work/answer"

# N candidate solutions to "print the numbers sorted ascending on one line", as a model might
# propose them. Some are wrong on purpose.
SOLUTIONS = [
    f"sort {SETUP_PATH} | tr '\\n' ' ' | sed 's/ $//'",  # lexicographic sort: wrong order
    f"sort -n {SETUP_PATH} | tr '\\n' ' ' | sed 's/ $//'",  # correct
    f"sort -rn {SETUP_PATH} | tr '\\n' ' '",  # descending: wrong
    f"python3 -c \"print(*sorted(int(x) for x in open('{SETUP_PATH}')))\"",  # needs python3
]

# Each candidate command runs a solution, leaves its answer in a file and checks it, so its
# exit code is its score: that is what `explore` ranks candidates by, by default.
CANDIDATES = [
    f"{sol} > {ANSWER_PATH}; cat {ANSWER_PATH}; [ \"$(cat {ANSWER_PATH})\" = '{EXPECTED}' ]"
    for sol in SOLUTIONS
]


def untrusted_code_network() -> dict:
    """The egress policy for code a model wrote: `deny` with an allow list of what it may
    need (here the Python package index), never the open internet, so code it was tricked
    into writing cannot send data out or attack other hosts. On a server started with
    `--network off`, set HUTCH_EXAMPLE_EGRESS=none (loopback only)."""
    if os.environ.get("HUTCH_EXAMPLE_EGRESS") == "none":
        return {"egress": "none"}
    return {"egress": "deny", "allow": ["pypi.org", "files.pythonhosted.org"]}


def main() -> int:
    template = os.environ.get("HUTCH_TEMPLATE")
    with Sandbox.create(
        template=template,
        network=untrusted_code_network(),
        metadata={"example": "best_of_n"},
    ) as base:
        base.files.write(SETUP_PATH, SETUP_DATA)

        result = base.explore(CANDIDATES, timeout=60)
        for o in result.outcomes:
            print(
                f"  candidate {o.index}: exit {o.exit_code}, score {o.score},"
                f" stdout {o.stdout.strip()!r}"
            )
        winner = result.winner
        print(f"explore: winner is candidate {winner.index} in {winner.sandbox_id}")

        # There is always a winner (the best score, ties to the lowest index), even when every
        # candidate failed, and its fork is kept: attach to it, and kill it when done.
        with Sandbox.connect(winner.sandbox_id, client=base.client) as kept:
            # The kept fork holds the winning attempt's state; the prepared sandbox does not.
            answer = kept.files.read(ANSWER_PATH).strip() if winner.score > 0 else None
            print(
                f"  {ANSWER_PATH} in the winner's fork: {kept.files.exists(ANSWER_PATH)},"
                f" in the prepared sandbox: {base.files.exists(ANSWER_PATH)}"
            )
            # In a real run you would go on working in `kept` here.

    print(f"best answer: {answer!r}")
    return 0 if answer == EXPECTED else 1


if __name__ == "__main__":
    sys.exit(main())
