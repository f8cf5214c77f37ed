"""Profile the server under load with py-spy: ``python -m bench.profile [one|many|starts]
[SECONDS] [SYSTEM]`` (SYSTEM: ``agentstream``, the default, or ``agentstream-postgresql``).

``one`` replays scenario 1 (one unpaced stream of 10,000 tokens, over and over); ``many``
holds scenario 2's load (concurrent streams at 30 tokens/s); ``starts`` runs of one
token from a few clients at once, back to back (what scenario 2's ramp costs). py-spy
samples the server process from outside (``--nonblocking``: it never pauses it), and the
collapsed stacks are summed into the functions with the most samples on top of the stack
(self) and anywhere in it (inclusive), which is where the time goes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench.concurrency import RATE
from bench.loadgen import load
from bench.targets import Target, start

TOP = 60
STREAMS = 300
"""Below where scenario 2 saturates, so the profile shows the cost of a token, not queues."""
RAMP = 3.0
PY_SPY = str(Path(sys.executable).with_name("py-spy"))
"""The bench extra's, beside this interpreter: found without the virtualenv activated."""
STARTING_CLIENTS = 8


def summarize(collapsed: str) -> str:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        frames = [frame.split(" (", 1)[0] + " " + _where(frame) for frame in stack.split(";")]
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples

    def table(counts: Counter[str]) -> list[str]:
        return [f"{100 * n / total:5.1f}%  {name}" for name, n in counts.most_common(TOP)]

    return "\n".join(
        [f"{total} samples", "", "self:", *table(own), "", "inclusive:", *table(inclusive)]
    )


def _where(frame: str) -> str:
    """``module.py`` of a py-spy frame ``function (path/module.py:line)``."""
    inside = frame.rpartition(" (")[2].rstrip(")")
    return "(" + inside.rpartition("/")[2].split(":")[0] + ")"


def spy(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the threads that hold the GIL: where the one core's time goes."""
    return subprocess.Popen(
        [
            *(PY_SPY, "record", "--nonblocking", "--gil", "--format", "raw"),
            *("--rate", "200", "--duration", str(seconds)),
            *("--pid", str(pid), "--output", str(out)),
        ],
        stdout=subprocess.DEVNULL,
    )


def _until_done(sampling: subprocess.Popen[bytes], target: Target, tokens: int) -> None:
    while sampling.poll() is None:
        target.stream(tokens)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "one"
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    system = sys.argv[3] if len(sys.argv) > 3 else "agentstream"
    paced = mode == "many"
    with start(system, token_delay=1 / RATE if paced else 0.0) as target:
        target.stream(100)
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "profile.txt"
            if paced:  # sample the steady state: every stream started, none ended
                worker = threading.Thread(
                    target=load,
                    args=(target,),
                    kwargs={"streams": STREAMS, "ramp": RAMP, "hold": seconds + 2, "rate": RATE},
                )
                worker.start()
                time.sleep(RAMP + 1)
                spy(target.server.pid, seconds, out).wait()
                worker.join()
            else:
                sampling = spy(target.server.pid, seconds, out)
                clients = [
                    threading.Thread(target=_until_done, args=(sampling, target, tokens))
                    for tokens in ([1] * STARTING_CLIENTS if mode == "starts" else [10_000])
                ]
                for client in clients:
                    client.start()
                for client in clients:
                    client.join()
            print(summarize(out.read_text()))


if __name__ == "__main__":
    main()
