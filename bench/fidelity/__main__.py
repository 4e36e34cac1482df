import sys

from bench.fidelity.run import main

sys.exit(main())
