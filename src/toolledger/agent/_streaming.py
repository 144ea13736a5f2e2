"""``Agent.stream``: a run as an iterator of the model's text, piece by piece as it is written.

```python
stream = agent.stream(session="outage-42", prompt="...")
for text in stream:
    print(text, end="", flush=True)
run = stream.run                  # the Run, once the iteration is over
```

The run goes on in a thread of its own (``Agent.run`` with ``on_text`` putting each piece in a
queue); the iteration takes them out, and raises what the run raised. Nothing of what is
durable changes: a reply is checkpointed only once it is complete, so a process killed
mid-stream loses only the partial text, and the resumed run asks the model again (and yields
that reply from its start: what was shown of it is shown again). A consumer
that stops iterating early does not stop the run: it finishes (or stops at a call nobody can
settle) as it would have; ``run`` waits for it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from ._state import Run

__all__ = ["AgentStream"]

_END = object()


class AgentStream:
    """The text of one ``Agent.run``, as it is written; see the module docstring."""

    def __init__(self, run: Callable[[Callable[[str], object]], Run], *, session: str) -> None:
        """``run(on_text)`` runs the session, handing each piece of text to ``on_text``."""
        self._pieces: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._run: Run | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._work, args=(run,), name=f"toolledger-stream:{session}"
        )
        self._thread.start()

    def _work(self, run: Callable[[Callable[[str], object]], Run]) -> None:
        try:
            self._run = run(self._pieces.put)
        except BaseException as exc:  # handed to the consumer, raised by the iteration
            self._error = exc
        finally:
            self._pieces.put(_END)

    def __iter__(self) -> Iterator[str]:
        while True:
            piece = self._pieces.get()
            if piece is _END:
                self._pieces.put(_END)  # a second iteration ends at once
                break
            assert isinstance(piece, str)
            yield piece
        self._thread.join()
        if self._error is not None:
            raise self._error

    @property
    def run(self) -> Run:
        """The run's result, once it is over (waits for it); raises what the run raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._run is not None
        return self._run
