"""The suite's own harnesses: instrumented jobs and agents that only this project's tests and benchmarks use.

Not part of the package (users get :mod:`flink_agents_replay.testing`). Imported as ``tests.harness.<module>``
from the repository root (``python -m pytest`` and ``./run tests`` put it on ``sys.path``; ``bench/_harness.py``
adds it). Flink's Python worker imports these modules by reference too: its ``python.pythonpath``
(:func:`flink_agents_replay.flink.env.python_path`) holds the repository root of the editable install.

- ``upstreams``: same-key inputs from two upstream instances with a controlled interleaving, and an operator
  subclass that records arrivals, outputs, snapshots and checkpoints (the multi-upstream order tests);
- ``replay_agents``: the triage agent of the changed-agent replay tests;
- ``sample_keys``: keys that stress key-group computation (non-ASCII, astral-plane, edge integers).
"""
