"""Peak resident memory of a running process, sampled in a thread (the benches' one sampler)."""

from __future__ import annotations

import threading


class PeakRss:
    """Samples the resident memory of process ``pid`` every 50 ms while in its ``with`` block;
    with ``tree``, of it and every process below it (a CLI and the JVM it started). ``peak``
    in bytes, ``mib`` in MiB."""

    def __init__(self, pid: int, *, tree: bool = False) -> None:
        import psutil

        self.process = psutil.Process(pid)
        self.tree = tree
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _rss(self) -> int:
        import psutil

        processes = [self.process, *self.process.children(recursive=True)] if self.tree else [self.process]
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.Error:  # gone between the listing and the read
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self._rss())
            except Exception:  # the process itself ended: the peak so far stands
                pass
            self._stop.wait(0.05)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mib(self) -> int:
        return self.peak // (1024 * 1024)
