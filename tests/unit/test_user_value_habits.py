"""User values as ordinary Python makes them: exceptions with keyword-only constructors, dataclasses of a job
script shipped by value to another process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import cloudpickle
import pytest

from flink_agents_replay.core.errors import NotPicklableError
from flink_agents_replay.storage.formats.plain import dump_user, load_user


class RefundError(Exception):
    """Like many HTTP client errors: a keyword-only constructor storing other things than its arguments."""

    def __init__(self, *, order: str, amount: int):
        super().__init__(f"refund of {amount} for {order} refused")
        self.order, self.amount = order, amount


class Reduced(Exception):
    """An exception that says itself how it pickles."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code

    def __reduce__(self):
        return Reduced, (self.code + 1,)


class Coded(Exception):
    """A constructor that stores another message than its arguments, and counts how often it runs."""

    made = 0
    __slots__ = ("status",)

    def __init__(self, code: str, detail: str = "no detail"):
        type(self).made += 1
        super().__init__(f"{code}: {detail}")
        self.status = 500


def test_an_exception_is_rebuilt_as_it_was_without_running_its_constructor():
    """Pickle's default would call ``Coded("E1: no detail")`` at load: another message ("E1: no detail: no
    detail"), and the constructor run again. Slots come back too."""
    made = Coded.made
    back = load_user(dump_user([Coded("E1")]))[0]
    assert (back.args, back.status, Coded.made) == (("E1: no detail",), 500, made + 1)


def test_an_exception_with_a_keyword_only_constructor_kept_in_a_value_comes_back_with_its_type_and_fields():
    value = {"last_error": RefundError(order="o1", amount=3), "errors": [ValueError("bad"), OSError(2, "gone", "f")]}
    back = load_user(dump_user(value))
    refund = back["last_error"]
    assert type(refund) is RefundError and (refund.args, refund.order, refund.amount) == (
        ("refund of 3 for o1 refused",), "o1", 3)
    assert str(back["errors"][0]) == "bad" and back["errors"][1].filename == "f"
    assert load_user(dump_user(Reduced(1))).code == 2  # its own __reduce__ is kept


class Exhausted(StopIteration):
    """Built on an exception with a field in C (``value``) that only its constructor sets."""

    def __init__(self, *, value: int):
        super().__init__(value)


def test_an_exception_that_could_not_load_is_refused_when_kept_naming_where():
    with pytest.raises(NotPicklableError, match=r"^memory path 'last' holds exception Exhausted, which would not load"):
        dump_user({"e": Exhausted(value=1)}, what="memory path 'last'")


def test_a_dataclass_of_a_module_pickled_by_value_keeps_its_fields_in_another_process(tmp_path):
    """cloudpickle 2.2 pickles the dataclasses sentinels as new objects: without the package's registration the
    other process sees no fields and pydantic refuses the class (a tool taking it could not be called)."""
    (tmp_path / "shapes.py").write_text(textwrap.dedent("""
        import dataclasses

        @dataclasses.dataclass
        class Point:
            x: int
            y: int = 0
            tags: list = dataclasses.field(default_factory=list)
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        import shapes

        cloudpickle.register_pickle_by_value(shapes)
        (tmp_path / "point.pkl").write_bytes(cloudpickle.dumps((shapes.Point, shapes.Point(1, 2, ["a"]))))
        user_value = dump_user(shapes.Point(3))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("shapes", None)
    (tmp_path / "value.pkl").write_bytes(user_value)
    check = textwrap.dedent(f"""
        import dataclasses, pickle, pydantic
        from flink_agents_replay.storage.formats.plain import load_user
        Point, point = pickle.loads(open({str(tmp_path / "point.pkl")!r}, "rb").read())
        print([f.name for f in dataclasses.fields(Point)], dataclasses.asdict(point))
        print(pydantic.TypeAdapter(Point).validate_python({{"x": 5}}))
        print(dataclasses.asdict(load_user(open({str(tmp_path / "value.pkl")!r}, "rb").read())))
    """)
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["['x', 'y', 'tags'] {'x': 1, 'y': 2, 'tags': ['a']}",
                                       "Point(x=5, y=0, tags=[])", "{'x': 3, 'y': 0, 'tags': []}"]
