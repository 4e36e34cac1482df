import sys

from tokrecord.server.fake.serve import main

sys.exit(main())
