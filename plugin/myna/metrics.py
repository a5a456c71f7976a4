"""Prometheus metrics of one worker (served at ``GET /metrics``).

Each :class:`Metrics` owns its own registry, so several workers (e.g. in tests) can live in one
process without clashing on metric names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Server TTFA buckets (seconds): dense where a streaming engine lands (50-500 ms).
_TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0)
# Pre-roll buckets (seconds): the budget is 0.1 s by default.
_PRE_ROLL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5)


class Metrics:
    """The worker's counters, gauges and histograms.

    Attributes:
        active_sessions: peer connections currently holding a session.
        turns: turns started, by engine.
        server_ttfa: first text chunk received → first audible frame handed to the track (s).
        pre_roll: a turn's first audio ready → its first frame out (s), by engine; never more
            than the start rule's budget (``--max-hold-ms``).
        underruns: playout underruns (the queue ran dry inside a chunk: a word was cut), by engine.
        gaps: pauses at a chunk boundary (the next chunk of a word-boundary producer came
            late), by engine; separate from underruns.
        gap_seconds: silence those pauses inserted (s), by engine.
        errors: ``error`` events and HTTP errors sent, by contract ``code`` (refusals too:
            ``full``, ``rate_limited``, ``token_required``, ...).
        events_dropped: events not sent, by reason (``too_large`` for the peer, ``send_failed``).
        fallbacks: turns (or their rest) moved to a fallback engine, by ``from`` and ``to``
            engine and ``reason`` (``error``, ``late``, ``stall``, ``open``).
        breaker: each fallback-wrapped engine's circuit breaker, by ``engine``: 0 closed,
            1 half-open, 2 open (:class:`myna.engines.fallback.CircuitBreaker`).
        limit: the worker's limits, by name (``max_sessions``, ``offer_rate``, ...).
        draining: 1 while draining.

    With a phrase cache (:meth:`watch_phrase_cache`): ``myna_phrase_cache_hits_total``,
    ``_misses_total``, ``_evictions_total``, ``myna_phrase_cache_bytes``, ``_entries`` and
    ``_max_bytes``, read from the cache at each scrape.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.active_sessions = Gauge(
            "myna_active_sessions", "Sessions (peer connections) currently open", registry=self.registry
        )
        self.turns = Counter("myna_turns", "Turns started", ["engine"], registry=self.registry)
        self.server_ttfa = Histogram(
            "myna_server_ttfa_seconds",
            "First text chunk received to first audible frame handed to the track",
            ["engine"],
            buckets=_TTFA_BUCKETS,
            registry=self.registry,
        )
        self.pre_roll = Histogram(
            "myna_pre_roll_seconds",
            "A turn's first audio ready to its first frame out (the start rule's hold)",
            ["engine"],
            buckets=_PRE_ROLL_BUCKETS,
            registry=self.registry,
        )
        self.underruns = Counter("myna_underruns", "Playout underruns (starved inside a chunk)", ["engine"],
                                 registry=self.registry)
        self.gaps = Counter("myna_gaps", "Pauses at a chunk boundary (a late next chunk)", ["engine"],
                            registry=self.registry)
        self.gap_seconds = Counter("myna_gap_seconds", "Silence inserted by gaps", ["engine"], registry=self.registry)
        self.errors = Counter("myna_errors", "Errors reported to clients", ["code"], registry=self.registry)
        self.events_dropped = Counter("myna_events_dropped", "Events that could not be sent to a client",
                                      ["reason"], registry=self.registry)
        self.fallbacks = Counter("myna_fallbacks", "Turns moved to a fallback engine", ["from", "to", "reason"],
                                 registry=self.registry)
        self.breaker = Gauge("myna_breaker_state", "Circuit breaker of an engine: 0 closed, 1 half-open, 2 open",
                             ["engine"], registry=self.registry)
        self.limit = Gauge("myna_limit", "Configured limits (myna serve flags)", ["name"], registry=self.registry)
        self.draining = Gauge("myna_draining", "1 while the worker drains before exiting", registry=self.registry)

    def set_limits(self, limits) -> None:
        """Publish a :class:`myna.limits.Limits` (limits that are off are left out)."""
        for name, value in vars(limits).items():
            if value is not None:
                self.limit.labels(name).set(value)

    def watch_phrase_cache(self, cache) -> None:
        """Publish a :class:`myna.engines.phrase_cache.PhraseCache`'s counts (read at each scrape)."""
        self.registry.register(_PhraseCacheCollector(cache))

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)


class _PhraseCacheCollector:
    """The phrase cache's counts as Prometheus metrics, read when scraped."""

    def __init__(self, cache) -> None:
        self.cache = cache

    def collect(self):
        stats = self.cache.stats()
        for name, doc in (("hits", "Synthesis jobs answered from the phrase cache"),
                          ("misses", "Synthesis jobs the phrase cache did not hold"),
                          ("evictions", "Phrase cache entries dropped to stay within its size")):
            yield CounterMetricFamily(f"myna_phrase_cache_{name}", doc, value=stats[name])
        yield GaugeMetricFamily("myna_phrase_cache_bytes", "Bytes the phrase cache holds", value=stats["bytes"])
        yield GaugeMetricFamily("myna_phrase_cache_entries", "Units the phrase cache holds", value=stats["entries"])
        yield GaugeMetricFamily("myna_phrase_cache_max_bytes", "The phrase cache's bound (--phrase-cache-mb)",
                                value=self.cache.max_bytes)
