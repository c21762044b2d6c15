"""Ctrl-C in the first 0.3 s of `pgrace`: how often is it one line and exit 130?

Starts `pgrace run lost-update --step` (which then waits for Enter) ROUNDS times and
sends SIGINT at a random moment in its first 0.3 s, the window where the interpreter
and pgrace's imports run. Counts exit codes and tracebacks. The console entry takes over
SIGINT in its first lines; what remains is the interpreter's own start-up (site, the
console script's first import), before any pgrace code runs.

    python bench/bench_early_sigint.py [ROUNDS]
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

from pgrace.servers import open_server


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    command = shutil.which("pgrace") or sys.exit("the pgrace console script is not on PATH (make install)")
    codes: Counter[int] = Counter()
    tracebacks = 0
    in_pgrace = 0  # tracebacks with a frame in pgrace's own package (the entry's job to prevent)
    with open_server() as server:
        for _ in range(rounds):
            child = subprocess.Popen(
                [command, "run", "lost-update", "--step", "--dsn", server.dsn],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(random.uniform(0, 0.3))  # the measurement itself: a random moment after start
            child.send_signal(signal.SIGINT)
            _, err = child.communicate(timeout=60)
            codes[child.returncode] += 1
            tracebacks += "Traceback" in err
            in_pgrace += "Traceback" in err and "/pgrace/" in err
    one_line = codes[130]
    print(f"{rounds} SIGINTs in the first 0.3 s: {one_line} exit 130 ({100 * one_line / rounds:.1f}%), {dict(codes)}")
    print(f"tracebacks: {tracebacks}, of which {in_pgrace} with a frame in pgrace's package")
    return 1 if in_pgrace else 0


if __name__ == "__main__":
    sys.exit(main())
