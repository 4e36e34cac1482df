import sys

from tokrecord.cli import main

sys.exit(main())
