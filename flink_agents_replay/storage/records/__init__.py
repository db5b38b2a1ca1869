"""The bottom layer: what the package persists, as plain data, and the codec that signs and encodes it.

* :mod:`.journal` — the journal's record types (calls, completions, accepted inputs, failed actions,
  attempts), memory updates, and the Kafka record keys;
* :mod:`.schemas` — each record kind as a versioned plain-data schema;
* :mod:`.raised` — exceptions as a journaled call keeps them;
* :mod:`.codec` — the signed, versioned envelope around a record.

Nothing here knows Flink, Kafka or the run engine; everything above builds on it (see docs/design.md §2).
"""
