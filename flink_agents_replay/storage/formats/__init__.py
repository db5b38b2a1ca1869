"""Persisted formats: how everything this package writes becomes plain data, and how older versions are read.

The rule: nothing persisted names a class or module of this package, so a savepoint, journal or capture
written by one version reads in every later one, whatever its modules are called then. The package's own
structure is msgpack of dicts, lists, strings, numbers and bytes; only the *user's* values (memory values,
event fields, inputs, outputs, tool results, the user's exceptions) are pickled, each as bytes in a field the
schema names.

* :mod:`.plain` — msgpack in and out; the one place user values are pickled and unpickled;
* :mod:`.events` — an event as its persisted name, a module hint, its id and its fields;
* :mod:`.exceptions` — the package's exceptions by a stable name, the user's as user values;
* :mod:`.state` — keyed state entries (memory, the run in flight, waiting inputs);
* :mod:`.schema` — what a record schema is (the journal's are in :mod:`flink_agents_replay.storage.records.schemas`,
  the capture's in :mod:`flink_agents_replay.storage.capture.schemas`);
* :mod:`.legacy` — readers of version 1 (0.1.0), which pickled the package's classes.

Every format carries a version; a reader refuses a newer one and says to upgrade. Fixtures written by each
released version are checked in under ``tests/fixtures/compat/`` and must keep reading (docs/design.md §11).
"""
