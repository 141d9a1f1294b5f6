"""Progress lines for long data steps (tokenisation, distillation helpers), on stderr::

    [moses_tokenize] 1200000 / 4500000 sentences (26%, 41000 sent/s)

A line is printed when another tenth of the total is done (at least ``min_gap`` = 2 s after the previous
line, so a quick step prints only its last line) or ``PROGRESS_INTERVAL`` seconds (environment, default 30)
have passed since the last line, whichever comes first, and once at the end.  Standard library
only: the plain scripts of ``examples/`` load this file without importing the package (and fairseq).
"""
import os
import sys
import time


def interval_from_env(default=30.0):
    try:
        value = float(os.environ.get("PROGRESS_INTERVAL", default))
    except ValueError:
        return default
    return value if value > 0 else default


class Progress:
    """``p = Progress("label", total); p.update(k)`` per k sentences done; ``p.close()`` at the end."""

    def __init__(self, label, total, unit="sentences", interval=None, fraction=0.1, stream=None, min_gap=2.0):
        self.label, self.total, self.unit = label, int(total), unit
        self.interval = interval_from_env() if interval is None else float(interval)
        self.step = max(1, int(self.total * fraction)) if self.total > 0 else None
        self.stream = stream if stream is not None else sys.stderr
        self.min_gap = min(float(min_gap), self.interval)
        self.done = 0
        self.start = self.last = time.monotonic()
        self.next_mark = self.step
        self.closed = False

    def update(self, n=1):
        self.done += n
        now = time.monotonic()
        mark = self.next_mark is not None and self.done >= self.next_mark
        if (mark and self.done < self.total and now - self.last >= self.min_gap) or now - self.last >= self.interval:
            self._print(now)
        if mark:
            while self.next_mark <= self.done:
                self.next_mark += self.step

    def close(self):
        if not self.closed:
            self.closed = True
            self._print(time.monotonic(), final=True)

    def line(self, now=None, final=False):
        elapsed = max((now if now is not None else time.monotonic()) - self.start, 1e-9)
        pct = f"{100.0 * self.done / self.total:.0f}%, " if self.total > 0 else ""
        tail = f" in {elapsed:.1f} s" if final else ""
        return (f"[{self.label}] {self.done} / {self.total} {self.unit}{tail} "
                f"({pct}{self.done / elapsed:.0f} {self.unit[:4]}/s)")

    def _print(self, now, final=False):
        self.last = now
        print(self.line(now, final), file=self.stream, flush=True)
