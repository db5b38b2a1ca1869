"""``python -m flink_agents_replay.cli``: the ``flink-agents-replay`` command."""

import sys

from flink_agents_replay.cli import main

sys.exit(main())
