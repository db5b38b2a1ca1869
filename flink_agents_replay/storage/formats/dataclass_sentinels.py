"""Dataclasses shipped by value keep their fields: their sentinels pickle by reference, as singletons.

A dataclass defined in a job script or test module travels to the TaskManagers pickled by value (cloudpickle).
Its ``__dataclass_fields__`` hold ``Field`` objects that ``dataclasses`` recognises by identity: the field kind
(``_FIELD``, ``_FIELD_CLASSVAR``, ``_FIELD_INITVAR``) and the ``MISSING`` default. cloudpickle 2.2 (the version
apache-flink allows) pickles those sentinels as new objects, so in the worker ``dataclasses.fields()`` is empty
and every field looks as if it had both a default and a default factory: pydantic then refuses the class
("cannot specify both default and default_factory"), a tool taking such a dataclass cannot be called, and
``dataclasses.asdict`` returns ``{}``. cloudpickle 3 pickles them by reference; :func:`install` registers the
same with :mod:`copyreg` (which every pickler consults), for this process's pickling, at the package's import.
"""

from __future__ import annotations

import copyreg
import dataclasses

__all__ = ["install"]

#: Sentinel objects of ``dataclasses`` by their global name there (``KW_ONLY`` from Python 3.10).
_SENTINELS = ("MISSING", "_HAS_DEFAULT_FACTORY", "KW_ONLY", "_FIELD", "_FIELD_CLASSVAR", "_FIELD_INITVAR")


def install() -> None:
    """Pickle each sentinel as a reference to its global in ``dataclasses`` (idempotent)."""
    for name in _SENTINELS:
        sentinel = getattr(dataclasses, name, None)
        if sentinel is not None and type(sentinel) is not type and type(sentinel).__module__ == "dataclasses":
            copyreg.pickle(type(sentinel), _by_name)


def _by_name(sentinel: object) -> str | tuple:
    """A reduce value naming the global: pickle writes it as ``dataclasses.<name>``."""
    for name in _SENTINELS:
        if getattr(dataclasses, name, None) is sentinel:
            return name
    return sentinel.__reduce_ex__(2)  # another instance of a sentinel's type: as pickle would without this
