import sys

from trainer.compare.cli import main

sys.exit(main())
