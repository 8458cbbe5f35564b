"""The rank exchange: every rank's forecast to rank 0, one job view back, through the job's store.

Why the store: a process group is created by a collective that every rank must enter in the
same order as the user's own ``new_group`` calls, and a collective of ours on the job's group
would share its streams and ordering. The rendezvous store that ``init_process_group`` set up
(a ``TCPStore`` under ``torchrun`` and ``env://``) is a key/value server with timeouts: ranks
write and read keys independently, nobody waits inside a collective, and a missing rank costs a
timeout on a background thread, never a hang of the training loop.

Protocol, for exchange ``n`` (keys under ``ets_hook/<namespace>/<n>/``):

1. every rank's training thread hands its ``RankForecast`` to ``RankExchange.publish`` (a queue
   put: no I/O on the training thread); the exchange's thread writes it under ``rank<N>``;
2. rank 0's thread polls until all ``world_size`` keys exist (at most ``timeout_s``), reads
   them in one request, aggregates (``forecast.ranks.aggregate_ranks``) and writes the
   ``JobView`` under ``view``; if some rank did not report in time it writes a ``skipped`` note
   naming the missing ranks instead;
3. every other rank's thread polls for ``view`` (at most ``2 * timeout_s``) and reads it.

Each rank then gets the view (``on_view``) or the reason it has none (``on_skip``). Polls use a
connection of our own (``Store.clone``) with a short timeout, so the job's own store traffic
never queues behind ours, and back off from 5 ms to 0.5 s. Each rank deletes its key of the
exchange before the previous one. Per exchange: rank 0 makes ``2 + polls`` requests and reads
``world_size`` small values (~300 bytes each); the others ``2 + polls``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..forecast.ranks import JobView, RankForecast, aggregate_ranks

logger = logging.getLogger("ets_hook")

#: Poll back-off of the exchange thread, seconds: first pause, growth factor, longest pause.
POLL_FIRST_S, POLL_GROWTH, POLL_MAX_S = 0.005, 1.5, 0.5
#: Key prefix of every key ets-hook writes into the job's store.
KEY_PREFIX = "ets_hook/v1"

StoreFactory = Callable[[], Any]


def default_store_factory(timeout_s: float) -> StoreFactory:
    """A factory of our own connection to the job's rendezvous store.

    Args:
        timeout_s: the timeout of each request on that connection, seconds (> 0).

    Returns:
        A callable returning a clone of ``torch.distributed``'s default store with that timeout
        once the default process group exists, else None (not initialised yet, or a store that
        cannot be cloned: then the exchange is off, logged once).
    """

    def factory() -> Any:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store().clone()
        store.set_timeout(datetime.timedelta(seconds=timeout_s))
        return store

    return factory


class RankExchange:
    """Exchanges forecasts between the ranks of one job on a background thread (see module).

    Attributes:
        rank, world_size: this process's place in the job.
        timeout_s: how long rank 0 waits for every rank's forecast, seconds.
        exchanges_done: exchanges that produced a view on this rank.
        exchanges_skipped: exchanges that ended without one.
        last_cost_s: seconds the exchange thread spent on the last exchange (requests and
            waiting included).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        namespace: str,
        timeout_s: float,
        on_view: Callable[[JobView], None],
        on_skip: Callable[[int, str], None],
        store_factory: StoreFactory | None = None,
    ) -> None:
        """Set up the exchange; the thread starts at the first ``publish``.

        Args:
            rank: this process's rank (0 <= rank < world_size).
            world_size: processes in the job (>= 2).
            namespace: keys' namespace, the same on every rank and unique per hook in the job
                (e.g. restart count and the hook's sequence number).
            timeout_s: seconds rank 0 waits for all forecasts (> 0); the others wait twice that.
            on_view: called on the exchange thread with each job view.
            on_skip: called on the exchange thread with the exchange's number and why it has no
                view.
            store_factory: returns the store to use, or None when there is none yet; default:
                ``default_store_factory(timeout_s)``.

        Raises:
            ValueError: ``rank``, ``world_size`` or ``timeout_s`` out of range.
        """
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size and world_size >= 2, got {rank}, {world_size}"
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._prefix = f"{KEY_PREFIX}/{namespace}"
        self._on_view, self._on_skip = on_view, on_skip
        self._factory = store_factory or default_store_factory(timeout_s)
        self._store: Any = None
        self._queue: queue.SimpleQueue[tuple[int, RankForecast] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._broken = False
        self.exchanges_done = 0
        self.exchanges_skipped = 0
        self.last_cost_s = 0.0

    def publish(self, exchange: int, forecast: RankForecast) -> None:
        """Hand this rank's forecast for exchange ``exchange`` to the exchange thread. O(1).

        Never raises; ignored after ``close()`` or once the store failed.

        Args:
            exchange: the exchange's number, counted alike on every rank.
            forecast: this rank's forecast.
        """
        if self._stop.is_set() or self._broken:
            return
        self._queue.put((exchange, forecast))
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="ets-hook-rank-exchange", daemon=True
            )
            self._thread.start()

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the exchange thread (an exchange in progress is abandoned). Never raises.

        Args:
            timeout_s: seconds to wait for the thread to notice.
        """
        self._stop.set()
        self._queue.put(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    # ------------------------------------------------------------------------------------------
    # Exchange thread

    def _key(self, exchange: int, name: str) -> str:
        return f"{self._prefix}/{exchange}/{name}"

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._queue.get()
            if item is None:
                return
            exchange, forecast = item
            started = time.perf_counter()
            try:
                self._exchange(exchange, forecast)
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._broken = True
                self.exchanges_skipped += 1
                self._on_skip(exchange, f"the job's store failed ({exc!r}); exchanges stop")
                return
            finally:
                self.last_cost_s = time.perf_counter() - started

    def _exchange(self, exchange: int, forecast: RankForecast) -> None:
        store = self._store
        if store is None:
            store = self._store = self._factory()
            if store is None:
                self.exchanges_skipped += 1
                self._on_skip(exchange, "torch.distributed is not initialised")
                return
        store.set(self._key(exchange, f"rank{self.rank}"), forecast.to_json())
        if exchange >= 2:  # ours of the exchange before the previous one: everyone has read it
            with contextlib.suppress(Exception):
                store.delete_key(self._key(exchange - 2, f"rank{self.rank}"))
                if self.rank == 0:
                    store.delete_key(self._key(exchange - 2, "view"))
        if self.rank == 0:
            self._gather(store, exchange)
        else:
            self._receive(store, exchange)

    def _poll(self, store: Any, keys: list[str], timeout_s: float) -> bool:
        """Poll until every key exists; False after ``timeout_s`` or on ``close()``."""
        deadline = time.monotonic() + timeout_s
        pause = POLL_FIRST_S
        while True:
            if store.check(keys):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._stop.wait(min(pause, left)):
                return False
            pause = min(pause * POLL_GROWTH, POLL_MAX_S)

    def _gather(self, store: Any, exchange: int) -> None:
        keys = [self._key(exchange, f"rank{r}") for r in range(self.world_size)]
        view_key = self._key(exchange, "view")
        if not self._poll(store, keys, self.timeout_s):
            if self._stop.is_set():
                return
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            reason = (
                f"rank(s) {', '.join(map(str, missing))} did not report within "
                f"{self.timeout_s:g} s (out of step, or no longer calling the hook)"
            )
            store.set(view_key, json.dumps({"skipped": reason}).encode())
            self.exchanges_skipped += 1
            self._on_skip(exchange, reason)
            return
        forecasts = []
        for rank, raw in enumerate(store.multi_get(keys)):
            try:
                forecasts.append(RankForecast.from_json(bytes(raw)))
            except ValueError as exc:
                reason = f"rank {rank}'s forecast is unreadable ({exc})"
                store.set(view_key, json.dumps({"skipped": reason}).encode())
                self.exchanges_skipped += 1
                self._on_skip(exchange, reason)
                return
        view = aggregate_ranks(forecasts, exchange=exchange, world_size=self.world_size)
        store.set(view_key, view.to_json())
        self.exchanges_done += 1
        self._deliver(view)

    def _receive(self, store: Any, exchange: int) -> None:
        view_key = self._key(exchange, "view")
        if not self._poll(store, [view_key], 2 * self.timeout_s):
            if not self._stop.is_set():
                self.exchanges_skipped += 1
                self._on_skip(exchange, f"rank 0 sent no job view within {2 * self.timeout_s:g} s")
            return
        raw = bytes(store.get(view_key))
        if raw.startswith(b'{"skipped"'):
            try:
                reason = str(json.loads(raw)["skipped"])[:500]
            except (ValueError, KeyError, TypeError):
                reason = "rank 0 skipped it"
            self.exchanges_skipped += 1
            self._on_skip(exchange, reason)
            return
        try:
            view = JobView.from_json(raw)
        except ValueError as exc:
            self.exchanges_skipped += 1
            self._on_skip(exchange, f"the job view is unreadable ({exc})")
            return
        self.exchanges_done += 1
        self._deliver(view)

    def _deliver(self, view: JobView) -> None:
        """Hand the view over; a failure there is logged, not taken for a store failure."""
        try:
            self._on_view(view)
        except Exception as exc:
            logger.warning("applying the job view failed: %r", exc)
