"""Resources an agent calls through ``ctx.call``: tools (Python callables) here, chat models in
:mod:`flink_agents_replay.api.chat_model`.

Every resource declares its *side effects*, which decide what happens to a call that started before a
failure and never reported back (*in doubt*), and later what a replay may do with it:

* ``none`` — reading or computing only (a model, a lookup): an in-doubt call is simply made again.
* ``idempotent`` — repeating it does no harm (an upsert keyed by a request id): made again.
* ``external`` — an effect on the world (an e-mail, a charge): before the call starts, a *started*
  record is journaled and acknowledged, so a call in doubt is detected; ``in_doubt`` decides
  (``rerun`` by default, or ``fail``, or ``assume_done``, or a *reconciler*).

A **reconciler** asks the service whether a call in doubt took effect, for services that honour no idempotency
key. It is a function of the call (:class:`InDoubtCall`: its call id, key and arguments) that answers in one of
three ways::

    def refund_reconciler(call: InDoubtCall):
        refund = payments.find(reference=call.call_id)   # the id the call sent with it
        if refund is None:
            return NOT_DONE                              # never arrived: made now, under the same call id
        if refund.status == "rejected":
            raise RefundRejected(refund.reason)          # took effect as a failure: the call's exception
        return refund.as_dict()                          # took effect: the call's result

    Tool(issue_refund, in_doubt=refund_reconciler)

The answer is journaled as the call's outcome (a result, or an exception the action sees raised), and reused from
then on like any call's. A reconciler that cannot tell raises :class:`ReconcileError` (or an ``OSError``: a
connection refused, a timeout); it is asked again with backoff (:class:`Reconciler` sets how often), and when it
still cannot tell, ``ctx.call`` raises :class:`ReconcileError` and the call stays in doubt: the next attempt
reconciles it again. It is never made under a new call id. An exception the call took effect with that leaves the
action keeps the call in doubt too (the action failed; the next attempt asks again): only one the action handled is
reused as it was.
"""

from __future__ import annotations

import contextvars
import copy
import enum
import inspect
import logging
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import tenacity

from flink_agents_replay.api.call_site import current_call_id
from flink_agents_replay.api.tool_schema import (
    arguments_model,
    bound_arguments,
    function_arguments,
    schema_of,
    summary,
    takes_any_keyword,
    tool_name,
)
from flink_agents_replay.core.errors import CallTimeoutError, ChatModelError, ReconcileError

__all__ = ["NOT_DONE", "ChatModelError", "InDoubtCall", "InDoubtPolicy", "ReconcileError", "Reconciler", "Resource",
           "SideEffects", "Tool", "current_call_id"]

log = logging.getLogger(__name__)


class SideEffects(str, enum.Enum):
    """What calling a resource does to the world outside the job."""

    NONE = "none"
    IDEMPOTENT = "idempotent"
    EXTERNAL = "external"


class InDoubtPolicy(str, enum.Enum):
    """What to do with a call that started before a failure and has no recorded result."""

    RERUN = "rerun"
    FAIL = "fail"
    ASSUME_DONE = "assume_done"


class _NotDone:
    """The type of :data:`NOT_DONE` (one instance, the same after pickling)."""

    def __reduce__(self) -> str:
        return "NOT_DONE"

    def __repr__(self) -> str:
        return "NOT_DONE"


#: A reconciler's answer for a call in doubt that did not take effect: it is made now, under the same call id.
NOT_DONE: Final = _NotDone()


@dataclass(frozen=True)
class InDoubtCall:
    """A call that started before a failure and never reported back, as a reconciler is asked about it.

    Attributes:
        call_id: the id the call was made with (``current_call_id()`` inside it: the idempotency key it sent).
        resource: the resource's name in the agent. key: the run's key. seq: the input's number within its key.
        action: the action that made the call.
        args, kwargs: the call's arguments, as the action gave them (private copies).
        arguments: the arguments by parameter name (a tool's positional ones bound to its signature).
        started: what the call's *started* record noted (``{}`` for most resources; a model with fallbacks
            notes which model it was asking).
    """

    call_id: str
    resource: str
    key: Any
    seq: int
    action: str
    args: tuple
    kwargs: dict[str, Any]
    arguments: dict[str, Any]
    started: dict[str, Any] = field(default_factory=dict)


class Reconciler:
    """An ``in_doubt`` policy that asks: ``function(call: InDoubtCall)`` answers what became of a call in doubt
    (see the module docstring). A plain function given as ``in_doubt=`` is wrapped in one with these defaults.

    Args:
        function: the reconciler.
        attempts: how often it is asked before the call is left in doubt (at least 1).
        backoff_s, max_backoff_s: the wait before the second question, doubled after each, at most
            ``max_backoff_s`` (with the defaults: 0.5 s, then 1 s).
        retry_on: what it raises to say it cannot tell now (asked again); anything else it raises is the call's
            exception.
    """

    def __init__(self, function: Callable[[InDoubtCall], Any], *, attempts: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 5.0,
                 retry_on: tuple[type[BaseException], ...] = (ReconcileError, OSError)):
        if not callable(function):
            raise TypeError(f"a reconciler is a function of the call in doubt, got {function!r}")
        _check_takes_one_argument(function)
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"Reconciler attempts must be a whole number of at least 1, got {attempts!r}")
        if not 0 <= backoff_s <= max_backoff_s < math.inf:
            raise ValueError(f"Reconciler needs 0 <= backoff_s <= max_backoff_s, got {backoff_s!r} and "
                             f"{max_backoff_s!r}")
        if not retry_on or not all(isinstance(t, type) and issubclass(t, BaseException) for t in retry_on):
            raise TypeError(f"Reconciler retry_on takes exception classes, got {retry_on!r}")
        self.function = function
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.retry_on = tuple(retry_on)

    def reconcile(self, call: InDoubtCall) -> Any:
        """The reconciler's answer (a result or :data:`NOT_DONE`; the call's exception raised as it is), asked up
        to ``attempts`` times; :class:`ReconcileError` if it still cannot tell."""
        def report(state: tenacity.RetryCallState) -> None:
            log.warning("reconciling call %s (%s): %s; asking again in %.1f s", call.call_id, call.resource,
                        state.outcome.exception(), state.next_action.sleep if state.next_action else 0.0)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(self.retry_on), stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, min=self.backoff_s, max=self.max_backoff_s),
            before_sleep=report, reraise=True)
        try:
            return retrying(self.function, call)
        except self.retry_on as exc:
            raise ReconcileError(
                f"call {call.call_id} to {call.resource!r} is in doubt and its reconciler could not tell whether "
                f"it took effect ({self.attempts} attempts; last: {type(exc).__name__}: {exc}); it stays in doubt "
                "and the next attempt asks again") from exc

    def __repr__(self) -> str:
        return f"Reconciler({getattr(self.function, '__qualname__', self.function)!r}, attempts={self.attempts})"


def _check_takes_one_argument(function: Callable[..., Any]) -> None:
    """Refuse, where the resource is made, a reconciler that cannot be called with the call in doubt: called only
    after a crash, it would otherwise fail then, as the call's outcome."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature Python can read (a builtin): trusted
        return
    try:
        signature.bind(None)
    except TypeError:
        raise TypeError(f"a reconciler is called with one argument, the call in doubt (InDoubtCall); "
                        f"{getattr(function, '__qualname__', function)!r} takes {signature}") from None


#: What ``in_doubt=`` takes.
InDoubt = InDoubtPolicy | str | Reconciler | Callable[[InDoubtCall], Any]


def in_doubt_policy(in_doubt: InDoubt) -> InDoubtPolicy | Reconciler:
    """``in_doubt=`` as a resource keeps it: a policy, or a :class:`Reconciler` (a plain function wrapped)."""
    if isinstance(in_doubt, Reconciler):
        return in_doubt
    if isinstance(in_doubt, (InDoubtPolicy, str)):
        try:
            return InDoubtPolicy(in_doubt)
        except ValueError:
            raise ValueError(f"in_doubt takes {', '.join(repr(p.value) for p in InDoubtPolicy)} or a reconciler "
                             f"function, got {in_doubt!r}") from None
    if callable(in_doubt):
        return Reconciler(in_doubt)
    raise TypeError(f"in_doubt takes {', '.join(repr(p.value) for p in InDoubtPolicy)} or a reconciler function, "
                    f"got {in_doubt!r}")


class Resource(ABC):
    """Something an action calls through ``ctx.call(name, ...)``."""

    def __init__(self, *, side_effects: SideEffects | str, in_doubt: InDoubt = InDoubtPolicy.RERUN):
        self.side_effects = SideEffects(side_effects)
        self.in_doubt = in_doubt_policy(in_doubt)

    @abstractmethod
    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """Make the call for real."""

    def restore_result(self, result: Any, args: tuple, kwargs: dict) -> Any:
        """The result an action gets from a call's result as journaled (``result``), given the call's arguments:
        itself by default. A resource whose result the journal keeps as plain data rebuilds typed parts here
        (a chat model, the parsed pydantic object), the same for a call made now and one reused later."""
        return result

    @property
    def tracks_start(self) -> bool:
        """Whether calls journal an acknowledged *started* record first (to detect calls in doubt)."""
        return self.side_effects is SideEffects.EXTERNAL

    def writes(self, args: tuple, kwargs: dict) -> bool:
        """Whether this call may change what a later call reads (a write). A write is made only once the run's
        earlier records are acknowledged: a crash after it must never make those earlier reads again, since they
        could now find the write and the run go another way (a search finding the memory its own lost attempt
        added). Every call of a resource with side effects, by default."""
        return self.side_effects is not SideEffects.NONE

    def close(self) -> None:
        """Release what the resource holds (clients, connections): the operator calls it when its task ends
        (cancel, failure, stop). Nothing by default."""
        return None


class Tool(Resource):
    """A plain Python callable. Defaults to ``external`` side effects: the safe assumption.

    Args:
        function: what a call runs.
        side_effects: ``none``, ``idempotent`` or ``external`` (see the module docstring).
        in_doubt: what the next attempt does with a call that started and never reported back: a policy or a
            reconciler (see the module docstring).
        timeout_s: give up waiting after this many seconds and raise :class:`CallTimeoutError` (the function
            keeps running on its own thread: Python cannot stop it, so its effect is in doubt). ``None``
            (default) waits as long as the function runs.
        name, description, schema: how a model sees the tool (:mod:`flink_agents_replay.api.tools`): by default
            the function's name, its docstring's summary and the JSON schema of its signature.
        needs_approval: ``True`` to have every call approved first, or a function of the call's arguments (a
            dict by parameter name) that says whether this call needs approval; it must decide the same way in
            every attempt (no clock, no randomness). A call that needs it waits
            (:meth:`~flink_agents_replay.api.agent.RunnerContext.wait_for`, named ``approve:<resource name>``,
            with ``{"tool": <resource name>, "arguments": {...}}`` as payload; the arguments must be JSON data).
            Approved, the tool is called once; denied or not decided within ``approval_timeout_s``, it is not
            called and :class:`~flink_agents_replay.core.errors.ToolCallDeniedError` is raised (a tool loop
            tells the model the call was denied, and why).
        approval_timeout_s: how long a call waits for its approval (``None``: as long as it takes).
    """

    def __init__(self, function: Callable[..., Any], *, side_effects: SideEffects | str = SideEffects.EXTERNAL,
                 in_doubt: InDoubt = InDoubtPolicy.RERUN, timeout_s: float | None = None,
                 name: str | None = None, description: str | None = None,
                 schema: Mapping[str, Any] | None = None,
                 needs_approval: bool | Callable[[dict[str, Any]], bool] = False,
                 approval_timeout_s: float | None = None):
        if not callable(function):
            raise TypeError(f"Tool needs a callable, got {function!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"Tool timeout_s must be positive, got {timeout_s!r}")
        if not isinstance(needs_approval, bool) and not callable(needs_approval):
            raise TypeError(f"Tool needs_approval takes True, False or a function of the arguments, got "
                            f"{needs_approval!r}")
        if approval_timeout_s is not None and not 0 < approval_timeout_s < math.inf:
            raise ValueError(f"Tool approval_timeout_s must be a positive number of seconds, got "
                             f"{approval_timeout_s!r}")
        self.needs_approval = needs_approval
        self.approval_timeout_s = approval_timeout_s
        super().__init__(side_effects=side_effects, in_doubt=in_doubt)
        if isinstance(self.in_doubt, Reconciler) and self.side_effects is not SideEffects.EXTERNAL:
            raise ValueError(f"a reconciler settles calls in doubt, and only an 'external' tool's calls can be (a "
                             f"started record is journaled before each); this tool's side effects are "
                             f"{self.side_effects.value!r}: drop in_doubt= or declare side_effects='external'")
        self.function = function
        self.timeout_s = timeout_s
        self.name = name or tool_name(function)
        self.bound = bound_arguments(function)  # a partial's: the model may not set them
        self.description = description
        self.schema = dict(schema) if schema is not None else None
        self.arguments: tuple[Any, ...] | None = None  # resolved from the signature (tools.Argument)
        self._schema_error: str | None = None
        self._validator: Any = None
        if schema is None:
            self._derive_schema()

    def _derive_schema(self) -> None:
        """The schema of the function's signature, derived now: in the job's client process, where the module
        the hints name is whole (a job script's function reaches the workers pickled by value, and names used
        only in string annotations do not travel with it). A tool no model is shown may have any signature."""
        try:
            self.arguments = function_arguments(self.function)
            self.schema = schema_of(self._arguments_model())
            self.description = self.description or summary(self.function)
        except Exception as exc:  # noqa: BLE001 - reported when a model is to be shown the tool
            self.arguments, self._schema_error = None, f"{type(exc).__name__}: {exc}"

    def _arguments_model(self) -> Any:
        if self._validator is None:  # made once per process (a pydantic class does not travel pickled)
            self._validator = arguments_model(self.name, self.arguments)
        return self._validator

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_validator": None}

    def approval_needed(self, args: tuple, kwargs: dict) -> bool:
        """Whether this call must be approved before it is made (``needs_approval``)."""
        if isinstance(self.needs_approval, bool):
            return self.needs_approval
        return bool(self.needs_approval(self.arguments_by_name(args, kwargs)))

    def arguments_by_name(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's arguments by parameter name (positional ones bound to the signature when it has one)."""
        try:
            return dict(inspect.signature(self.function).bind_partial(*args, **kwargs).arguments)
        except (TypeError, ValueError):  # no signature to bind to (a builtin), or arguments that do not fit it
            return {**{str(index): value for index, value in enumerate(args)}, **kwargs}

    def openai_schema(self) -> dict[str, Any]:
        """The tool as a chat model is shown it (OpenAI's ``tools`` format)."""
        if self.schema is None:
            raise TypeError(f"{self!r} has no schema a model could be shown ({self._schema_error}); give "
                            "Tool(..., schema={...})")
        return {"type": "function", "function": {  # a copy: an action changing it changes no other's
            "name": self.name, "description": self.description or "", "parameters": copy.deepcopy(self.schema)}}

    def model_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A model's JSON arguments as the function's types (an enum member, a pydantic model...); raises
        ``ValueError`` naming what does not fit. A schema given by hand takes them as they are."""
        taken = sorted(self.bound.intersection(arguments))
        if taken:
            raise ValueError("; ".join(f"{name}: is set by the tool, not given" for name in taken))
        if self.arguments is None:
            return dict(arguments)
        import pydantic

        # A name the function does not take (a misspelt one would otherwise leave its parameter at the default).
        names = [argument.name for argument in self.arguments]
        extra = {name: value for name, value in arguments.items() if name not in names}
        if extra and not takes_any_keyword(self.function):
            raise ValueError("; ".join(f"{name}: not a parameter of the tool" for name in sorted(extra))
                             + f" (it takes {', '.join(names) or 'none'})")
        try:
            validated = self._arguments_model().model_validate(dict(arguments))
        except pydantic.ValidationError as exc:  # told to the model: no pydantic version or URL in the text
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                                 for e in exc.errors(include_url=False))
            raise ValueError(problems) from None
        return {**{name: getattr(validated, name) for name in arguments if name in names}, **extra}

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        if self.timeout_s is None:
            return self.function(*args, **kwargs)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = self.function(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome["error"] = exc

        # The call's context (its call id) goes along to the thread.
        worker = threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True,
                                  name=f"tool-{getattr(self.function, '__name__', 'call')}")
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise CallTimeoutError(f"{self!r} did not return within {self.timeout_s} s; it may still take effect")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", self.function)
        return f"Tool({name!r}, side_effects={self.side_effects.value})"

