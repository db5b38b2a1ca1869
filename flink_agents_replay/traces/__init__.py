"""Traces of runs, derived from what each execution did and what the journal holds (docs/design.md §17).

:mod:`.spans` makes a run's spans from the engine's notes (:mod:`flink_agents_replay.engine.trace`); :mod:`.ids`
derives their ids from the run's identity, so every attempt of a run exports into one trace and a span made again is
the same span; :mod:`.export` sends them through the package's own OpenTelemetry tracer provider, off the run
threads; :mod:`.conventions` names the attributes (OpenTelemetry GenAI, OpenInference, the package's own).
"""
