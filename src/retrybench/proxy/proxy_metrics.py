"""The proxy's Prometheus metrics: what it decided and what became of each execution.

Counters are updated as decisions are taken; gauges read the proxy's state at scrape time, so
they cannot drift from it. The proxy hands over its core and a reader for each other gauge, so
this module needs nothing of the server's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from retrybench.control.proxy import Attach, Create, Decision, ProxyCore, Serve
from retrybench.proxy.whole_chunks import RELAY_IMPLEMENTATION

__all__ = ["FATES", "ProxyMetrics"]

# From loopback-fast (a retained or replayed answer) to the deadlines the paper's clients give up at.
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FATES = ("completed", "orphaned", "cancelled", "attached", "dropped", "refused", "failed")


class _RetentionCounts(Collector):
    """The core's retention counters, read at scrape time (the core counts them as it decides)."""

    def __init__(self, core: ProxyCore) -> None:
        self._counts = core.counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts
        kept = CounterMetricFamily("retrybench_proxy_results_retained", "Completed responses kept for late retries")
        kept.add_metric([], counts.results_retained)
        released = CounterMetricFamily("retrybench_proxy_retained_released",
                                       "Retained responses freed before being served again, by why", labels=["why"])
        released.add_metric(["expired"], counts.retained_expired)
        released.add_metric(["evicted"], counts.retained_evicted)
        too_large = CounterMetricFamily("retrybench_proxy_retain_too_large",
                                        "Completed responses over retain_result_max_bytes, not kept")
        too_large.add_metric([], counts.retain_too_large)
        return iter((kept, released, too_large))


def _reader(values: Sequence[int], index: int) -> Callable[[], float]:
    return lambda: values[index]


class ProxyMetrics:
    """The registry; `relays`, `subscribers` and `engine_waiting` read the proxy's gauges, `now`
    its clock (policy seconds), each at scrape time. With several `upstreams`, executions routed to
    each and the streams open to each (`streams`, read at scrape time) are labelled by upstream URL."""

    def __init__(self, core: ProxyCore, *, relays: Callable[[], int], subscribers: Callable[[], int],
                 engine_waiting: Callable[[], int], now: Callable[[], float], upstreams: Sequence[str] = (),
                 streams: Sequence[int] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.attempts = Counter("retrybench_proxy_attempts", "Attempts received", registry=r)
        self.retries = Counter("retrybench_proxy_retries", "Attempts of a call id seen before", registry=r)
        self.decisions = Counter("retrybench_proxy_decisions", "Decisions on attempts", ["decision"], registry=r)
        self.executions = Counter("retrybench_proxy_executions", "Executions by fate", ["fate"], registry=r)
        # Children resolved once: labels() on every attempt would cost more than the rest of the count.
        self._decision = {name: self.decisions.labels(name) for name in ("created", "attached", "served_retained",
                                                                         "refused_429", "refused_503", "refused_529")}
        self._fate = {fate: self.executions.labels(fate) for fate in FATES}
        self.limits = Counter("retrybench_proxy_limit_refusals", "Attempts refused with 503 at one of the proxy's "
                              "bounds (max_executions, max_subscribers, max_replay_bytes)", ["limit"], registry=r)
        self.time_to_first_token = Histogram(
            "retrybench_proxy_time_to_first_token_seconds",
            "Streamed attempts answered 200: wall seconds from the request read to its first payload written "
            "(an attached retry's replay and a retained response included)", buckets=TTFT_BUCKETS, registry=r)
        Gauge("retrybench_proxy_compiled_relay", "1 where the per-chunk path is the compiled one, 0 where it "
              "runs in Python (built without a C compiler, or RETRYBENCH_PYTHON_RELAY=1)",
              registry=r).set(RELAY_IMPLEMENTATION == "compiled")
        Gauge("retrybench_proxy_queue_depth", "Executions waiting in the proxy's queue",
              registry=r).set_function(lambda: core.waiting)
        Gauge("retrybench_proxy_outstanding", "Executions with an open upstream stream",
              registry=r).set_function(lambda: core.outstanding)
        Gauge("retrybench_proxy_relays", "Executions the proxy holds (queued or streaming)",
              registry=r).set_function(relays)
        Gauge("retrybench_proxy_subscribers", "Attempts connected and waiting for output",
              registry=r).set_function(subscribers)
        Gauge("retrybench_proxy_engine_waiting", "The engine's waiting gauge as last scraped (summed over "
              "the upstreams)", registry=r).set_function(engine_waiting)
        self._routed: list[Any] = []
        if upstreams:
            routed = Counter("retrybench_proxy_upstream_executions", "Executions the router sent to each upstream",
                             ["upstream"], registry=r)
            self._routed = [routed.labels(url) for url in upstreams]
            open_streams = Gauge("retrybench_proxy_upstream_outstanding",
                                 "Executions dispatched to each upstream and not ended", ["upstream"], registry=r)
            for index, url in enumerate(upstreams):
                open_streams.labels(url).set_function(_reader(streams, index))
        if core.policy.retain_s > 0:
            Gauge("retrybench_proxy_retained_bytes", "Bytes of completed responses kept for late retries",
                  registry=r).set_function(lambda: core.retained_bytes)
            Gauge("retrybench_proxy_retained_results", "Completed responses kept for late retries",
                  registry=r).set_function(lambda: core.retained_results)
            r.register(_RetentionCounts(core))
        budget = core.budget
        if budget is not None:
            Gauge("retrybench_proxy_budget_first_attempts", "First attempts in the budget window",
                  registry=r).set_function(lambda: budget.state(now())[0])
            Gauge("retrybench_proxy_budget_retries", "Retries admitted in the budget window",
                  registry=r).set_function(lambda: budget.state(now())[1])
            Gauge("retrybench_proxy_budget_ratio", "Retries allowed per first attempt",
                  registry=r).set(budget.ratio)

    def on_decision(self, attempt_no: int, decision: Decision) -> None:
        self.attempts.inc()
        if attempt_no > 0:
            self.retries.inc()
        if isinstance(decision, Create):
            name = "created"
        elif isinstance(decision, Attach):
            name = "attached"
        elif isinstance(decision, Serve):
            name = "served_retained"
        else:
            name = f"refused_{decision.status}"
        self._decision[name].inc()

    def routed(self, replica: int) -> None:
        """An execution went to upstream `replica` (several upstreams only)."""
        self._routed[replica].inc()

    def limit_refused(self, limit: str) -> None:
        self.limits.labels(limit).inc()

    def fate(self, name: str) -> None:
        self._fate[name].inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
