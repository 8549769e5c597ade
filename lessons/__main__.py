import sys

from lessons.cli import main

sys.exit(main())
