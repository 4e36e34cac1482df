"""The packaged fake server, with its own log of every chunk it wrote (the truth).

Started by path (the plan's server argv), so it needs nothing but tokrecord on the
path. The log goes to $TOKRECORD_CHAOS_TRUTH/<port>-<pid>.jsonl: a file per server
start, so a killed server's log is never reused, and the port names the attempt
(its config.json records the port).
"""

from __future__ import annotations

import os
import sys

from tokrecord.server.fake.serve import main

TRUTH_ENV = "TOKRECORD_CHAOS_TRUTH"

if __name__ == "__main__":
    argv = sys.argv[1:]
    truth = os.environ.get(TRUTH_ENV)
    if truth:
        port = argv[argv.index("--port") + 1] if "--port" in argv else "0"
        argv += ["--log", os.path.join(truth, f"{port}-{os.getpid()}.jsonl")]
    sys.exit(main(argv))
