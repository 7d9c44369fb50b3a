"""Acknowledgments of one batch by several sinks: a reference count that the checkpoint waits on.

A batch goes to every sink of the application (``[[sinks]]``). Each sink answers once per batch:

* ``written``: its write returned;
* ``dead-lettered``: its write kept failing and its failure policy stored the batch in its
  dead-letter location (counts as done, as in Data Prepper's end-to-end acknowledgments);
* ``failed``: its write kept failing (an exception, or no answer within ``write_timeout``) and its
  policy is to park.

The batch's checkpoint may move only when every sink answered positively (``done``); one
``failed`` answer makes the whole batch negative (``failed``): nothing moves, the leases park and
the records are delivered again later. A sink that answered is not asked again for this batch.
Pure: no I/O, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from checkpoint.base.errors import KclpySparkError

WRITTEN = "written"
DEAD_LETTERED = "dead-lettered"
FAILED = "failed"
_POSITIVE = frozenset({WRITTEN, DEAD_LETTERED})
OUTCOMES = (WRITTEN, DEAD_LETTERED, FAILED)  # every answer a sink may give


@dataclass
class AckSet:
    expected: tuple[str, ...]  # the sinks' names, in the order they are written
    answers: dict[str, str] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.expected or len(set(self.expected)) != len(self.expected):
            raise ValueError(f"an AckSet needs distinct sink names, got {self.expected!r}")

    def answer(self, name: str, outcome: str, error: BaseException | None = None) -> None:
        if name not in self.expected:
            raise KeyError(f"no sink named {name!r} in this batch")
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown acknowledgment {outcome!r}")
        if name in self.answers:
            raise ValueError(f"sink {name!r} already answered {self.answers[name]!r}")
        self.answers[name] = outcome
        if error is not None:
            self.errors[name] = error

    @property
    def waiting(self) -> tuple[str, ...]:
        """The sinks still to answer (the reference count is its length)."""
        return tuple(n for n in self.expected if n not in self.answers)

    @property
    def failed(self) -> bool:
        return FAILED in self.answers.values()

    @property
    def done(self) -> bool:
        """Every sink answered positively: the checkpoint may move."""
        return not self.waiting and not self.failed

    @property
    def written_any(self) -> bool:
        return WRITTEN in self.answers.values()

    @property
    def dead_lettered(self) -> bool:
        return DEAD_LETTERED in self.answers.values()

    def error(self) -> BaseException | None:
        """The first failed sink's error, named after its sink when there are several."""
        for name in self.expected:
            if self.answers.get(name) == FAILED:
                error = self.errors.get(name)
                if error is None or len(self.expected) == 1:
                    return error
                return SinkFailedError(name, error)
        return None


class SinkFailedError(KclpySparkError):
    """One sink of several gave up on a batch (its leases park)."""

    retriable = False

    def __init__(self, sink: str, error: BaseException) -> None:
        super().__init__(f"sink {sink!r}: {error!r}")
        self.sink = sink
        self.error = error


class PrepareFailedError(SinkFailedError):
    """A sink's ``prepare`` raised: the batch failed for that sink before any write (after
    its retries, its failure policy holds as for a failed write)."""
