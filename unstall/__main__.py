import sys

from unstall.cli import main

sys.exit(main())
