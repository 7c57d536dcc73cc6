import sys

from trainer_client.traces.cli import main

sys.exit(main())
