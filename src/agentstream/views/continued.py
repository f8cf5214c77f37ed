"""A run that went on after a pause, for protocols whose clients read the rest of it as a
new message or run (the AI SDK's, AG-UI's): it opens again."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from agentstream.events import Event
from agentstream.views.frames import Frame

__all__ = ["continued"]


def continued(
    render: Callable[[Event], Iterable[Frame]], after: int, opening: Frame
) -> Callable[[Event], Iterable[Frame]]:
    """``render`` fed a run from its first event (a view keeps state from event to event),
    showing only the frames of the events after seq ``after``, the first of them after
    ``opening``. With ``after`` 0, ``render`` as it is: the run's first event opens it."""
    if not after:
        return render
    opened = False

    def shown(event: Event) -> Iterator[Frame]:
        nonlocal opened
        frames = list(render(event))
        if event.seq <= after:
            return
        if not opened:
            opened = True
            yield opening
        yield from frames

    return shown
