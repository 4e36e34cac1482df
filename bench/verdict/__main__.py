import sys

from bench.verdict.run import main

sys.exit(main())
