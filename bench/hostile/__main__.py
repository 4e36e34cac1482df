import sys

from bench.hostile.run import main

sys.exit(main())
