"""Run a command on the given CPUs: `python pinned.py 1 -- cmd args...` (Linux).

The bench keeps the fake server on a core of its own so that its writes and a
client's reads never wait on each other's time slices: on a 2-core machine a client
woken on the server's core would otherwise delay the server's next write (and its
log stamp). exec keeps the pid, so process-group cleanup sees the same process.
"""

import os
import sys


def main() -> None:
    cpus = {int(c) for c in sys.argv[1].split(",")}
    command = sys.argv[3:] if sys.argv[2] == "--" else sys.argv[2:]
    os.sched_setaffinity(0, cpus)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
