"""The progress display of ``posenc compare``: one bar over all schemes' training steps.

Tasks report events, plain tuples because they cross process boundaries through a queue:

    ("step", scheme, step, loss, tokens_per_s)   training logged a step
    ("eval", label, what)                        evaluating ``label`` (what: the length, or None)
    ("done", label, how)                         ``label`` finished; how is "cached" when reused from disk

``label`` is a scheme, or ``scheme+X`` for an eval-time extension, followed by ``/s<seed>`` when a
comparison trains several seeds. The bar's postfix says what each running task is doing.
"""

from __future__ import annotations

from collections.abc import Callable


class CompareProgress:
    """One tqdm bar over ``total_steps``; :meth:`handle` takes the events above. Silent unless ``enabled``."""

    def __init__(self, total_steps: int, schemes, enabled: bool):
        self.steps = {s: 0 for s in schemes}
        self.status: dict[str, str] = {}
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, desc="compare", unit="step", dynamic_ncols=True)

    def handle(self, event: tuple) -> None:
        kind, label = event[0], event[1]
        if kind == "step":
            _, _, step, loss, tps = event
            delta, self.steps[label] = step - self.steps[label], step
            self.status[label] = f"{loss:.2f} {tps:,.0f}tok/s"
            if self.bar is not None:
                self.bar.update(max(0, delta))
        elif kind == "eval":
            self.status[label] = f"eval {event[2] or ''}".strip()
        elif kind == "done":
            self.status.pop(label, None)
            if self.bar is not None and event[2] == "cached":
                self.bar.write(f"{label}: already trained and evaluated, reusing")
        if self.bar is not None:
            self.bar.set_postfix_str(" | ".join(f"{k}: {v}" for k, v in self.status.items()))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class InlineQueue:
    """The queue interface (``put``) for tasks run in this process: events go straight to ``sink``."""

    def __init__(self, sink: Callable[[tuple], None]):
        self.sink = sink

    def put(self, event: tuple) -> None:
        self.sink(event)
