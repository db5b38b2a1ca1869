"""The one error local services raise: its message says what went wrong and what to do."""


class LocalServiceError(RuntimeError):
    """A local service could not be set up, started or stopped; the message names the fix."""
