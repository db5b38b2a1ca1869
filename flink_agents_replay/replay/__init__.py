"""Replay: run a changed agent against production's state and recorded traffic, with side effects contained.

The concept
-----------
A replay job is the production job's agent operator (same uid, same max parallelism, same key type) with a
replay's job mode plugged in (:class:`.mode.ReplayMode`), started from a production savepoint, so every key
has the memory and seq production had at that moment. Its input is the capture
(:mod:`flink_agents_replay.storage.capture`) from the savepoint's position on: the inputs production accepted after
it, in the same per-key order, with their event times. Inputs the savepoint already holds (in flight, or
waiting behind a key's run) are run from the savepoint's state, and their captured copies dropped; runs in
flight in the savepoint finish with what production's journal holds (read, never written). The replay writes
its own journal and its own capture; comparing its capture with production's gives the diff.

Side effects
------------
Every ``ctx.call`` goes through a policy per resource (:mod:`.policy`), applied by the run engine's call
gate in a replay (:mod:`.gate`): ``live`` calls for real, ``recorded`` returns what production's call with
the same identity returned (blocked if production made no such call), ``blocked`` does not call and raises
:class:`~flink_agents_replay.core.errors.CallBlocked`, which the action may handle; blocked calls are listed in
the report with their arguments. Defaults
follow the resource's declared side effects: ``none`` and ``idempotent`` live, ``external`` blocked.
Actions whose code changed re-execute instead of reusing production's records (``fingerprint_policy``
defaults to ``re-execute`` in a replay). A run that fails (an unhandled ``CallBlocked``, a bug in the new
code) is reported in the diff instead of failing the job.

Steps
-----
1. Production runs with capture on and takes a savepoint (``flink savepoint <job id> <dir>``).
2. Change the agent (prompt, model, action code).
3. ``flink run -s <savepoint> -pym flink_agents_replay.jobs.replay_job --replay-name try-1 ...``:
   :func:`.job.prepare_replay` checks the savepoint and the capture first; the replay ends when the
   capture's end (at submission) is reached.
4. ``flink-agents-replay diff --production <capture> --replay <replay capture>``: same / changed / new /
   missing / waiting per (key, seq), each run's waits and decisions on both sides, blocked calls, errors;
   ``--html`` for a page, ``--fail-on-diff`` for CI.

Limits of the containment
-------------------------
* Calls made outside ``ctx.call`` (an HTTP request written inline in an action, a database write) are
  not seen by the policy: they happen for real in a replay.
* ``live`` means live: a live call to a service with effects has them. Keep ``external`` resources
  ``blocked`` or ``recorded``.
* Live calls carry call ids (``current_call_id()``) of their own (prefixed ``replay:<journal topic>:``), so
  a service's idempotency store does not answer them with production's result.
* The replay reads the capture up to its end when the job is submitted; traffic captured later is not
  part of it.
"""

from flink_agents_replay.replay.gate import ReplayCalls
from flink_agents_replay.replay.policy import CallPolicy, default_policy, parse_policies
from flink_agents_replay.replay.settings import ReplaySettings

__all__ = ["CallPolicy", "ReplayCalls", "ReplaySettings", "default_policy", "parse_policies"]
