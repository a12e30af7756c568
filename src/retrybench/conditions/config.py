"""Run configuration as frozen data, with units in the field names.

Everything a run depends on is here, so that a run spec can be hashed, cached and
replayed. Values are checked once, when built, with messages that name the allowed range.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "CONDITIONS",
    "REFUSAL_STATUSES",
    "BreakerPolicy",
    "ClientPolicy",
    "ConfigError",
    "EngineConfig",
    "ProxyPolicy",
    "WorkloadSpec",
    "load_condition",
    "proxy_policy_from_table",
]


class ConfigError(ValueError):
    """A configuration value outside what the field allows."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """The paper's trace (Section 3.1-3.2): phases in multiples of C-hat, prompt and response lengths."""

    chat_calls_per_s: float
    base_rate_x: float = 0.6
    pulse_rate_x: float = 2.7
    base_s: float = 120.0
    pulse_s: float = 107.0
    hold_s: float = 720.0
    prompt_tokens_mean: float = 12_000.0
    prompt_tokens_sd: float = 1_200.0
    shared_prefix_tokens: int = 2_000
    response_tokens_median: float = 300.0
    response_tokens_mean: float = 400.0
    # Section 4.2: half the calls get short prompts (same shared prefix, same relative spread).
    mixed_prompts: bool = False
    short_prompt_tokens_mean: float = 3_000.0

    def __post_init__(self) -> None:
        _check(self.chat_calls_per_s > 0, f"chat_calls_per_s must be > 0, got {self.chat_calls_per_s}")
        for name in ("base_rate_x", "pulse_rate_x"):
            value = getattr(self, name)
            _check(0 <= value <= 100, f"{name} must be in [0, 100] (multiples of C-hat), got {value}")
        for name in ("base_s", "pulse_s", "hold_s"):
            value = getattr(self, name)
            _check(value >= 0, f"{name} must be >= 0 seconds, got {value}")
        _check(self.prompt_tokens_sd >= 0, "prompt_tokens_sd must be >= 0")
        _check(
            self.shared_prefix_tokens >= 0 and self.shared_prefix_tokens + 16 <= self.prompt_tokens_mean,
            "shared_prefix_tokens must be >= 0 and at least 16 tokens below prompt_tokens_mean",
        )
        _check(
            0 < self.response_tokens_median < self.response_tokens_mean,
            "response lengths are lognormal: need 0 < response_tokens_median < response_tokens_mean",
        )
        _check(
            self.short_prompt_tokens_mean >= self.shared_prefix_tokens + 16,
            "short_prompt_tokens_mean must exceed shared_prefix_tokens by at least 16",
        )

    @property
    def pulse_start_s(self) -> float:
        return self.base_s

    @property
    def pulse_end_s(self) -> float:
        return self.base_s + self.pulse_s

    @property
    def hold_end_s(self) -> float:
        return self.base_s + self.pulse_s + self.hold_s

    def scaled(self, factor: float) -> WorkloadSpec:
        """The same trace with every token length times `factor` (phases and rates unchanged): the
        paper's workload shrunk for a slower engine, such as vLLM's CPU build on a tiny model."""
        _check(0 < factor <= 1, f"the token scale must be in (0, 1], got {factor}")
        if factor == 1:
            return self
        return replace(self, prompt_tokens_mean=self.prompt_tokens_mean * factor,
                       prompt_tokens_sd=self.prompt_tokens_sd * factor,
                       shared_prefix_tokens=round(self.shared_prefix_tokens * factor),
                       response_tokens_median=self.response_tokens_median * factor,
                       response_tokens_mean=self.response_tokens_mean * factor,
                       short_prompt_tokens_mean=self.short_prompt_tokens_mean * factor)

    @property
    def response_sigma(self) -> float:
        """Lognormal shape from median and mean: mean = median * exp(sigma^2 / 2)."""
        return math.sqrt(2.0 * math.log(self.response_tokens_mean / self.response_tokens_median))


@dataclass(frozen=True, kw_only=True)
class ClientPolicy:
    """A retrying client: a whole-attempt deadline, R retries, and the waits between them.

    The defaults are the paper's client (Section 3.1): uniform waits in [backoff_min_s, backoff_max_s),
    every failed outcome retried, a 429's Retry-After honoured unless above retry_after_cap_s (then the
    call is given up). The other settings describe the official SDKs' retry policies (clients/*.toml):
    backoff "exponential" waits min(backoff_base_s * 2**k, backoff_cap_s) after the k-th attempt (0 the
    first), times a jitter factor: "reduce" 1 - jitter_fraction * u (the SDKs), "full" u (tenacity's
    wait_random_exponential), "none" 1; u is uniform in [0, 1) from the client's generator.

    retry_after says how a server's Retry-After (seconds) is used:
      "cap-or-give-up" (paper): a 429's value is waited when <= retry_after_cap_s, else the call fails;
      "positive-cap-or-give-up": a value in (0, cap] is waited, above cap the call fails, else backoff;
      "positive-cap-or-backoff": a value in (0, cap] is waited, else backoff;
      "positive-capped": a value > 0 is waited, at most cap; else backoff;
      "ignore": always backoff.
    retry_on lists the attempt outcomes that are retried, comma-separated (a string, so that the policy
    survives a JSON round trip as the live load generator's log makes it); any other ends the call.
    honour_should_retry: a refusal that says `x-should-retry: false` ends the call (the SDKs obey the
    header before looking at the status); the paper's client does not read it.
    """

    BACKOFFS = ("uniform", "exponential")
    JITTERS = ("reduce", "full", "none")
    RETRY_AFTER_RULES = ("cap-or-give-up", "positive-cap-or-give-up", "positive-cap-or-backoff",
                         "positive-capped", "ignore")
    RETRIABLE = ("timed_out", "refused_429", "refused_503", "error")
    # Outcomes a profile may list beyond the paper's (a 529 "overloaded", as NVIDIA Dynamo answers).
    RETRIABLE_BEYOND = ("refused_529",)

    retries: bool = True
    max_retries: int = 3
    attempt_timeout_s: float = 120.0
    backoff: str = "uniform"
    backoff_min_s: float = 0.25
    backoff_max_s: float = 3.0
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 8.0
    jitter: str = "reduce"
    jitter_fraction: float = 0.25
    retry_after: str = "cap-or-give-up"
    retry_after_cap_s: float = 120.0
    # Whether each attempt tells the server its deadline (Request-Timeout-Ms): the paper's client does not;
    # a proxy with deadline_propagation reads it (docs/deadlines.md).
    sends_deadline: bool = False
    retry_on: str = ",".join(RETRIABLE + RETRIABLE_BEYOND)  # every failed outcome (the paper's client)
    # Whether a refusal carrying `x-should-retry: false` ends the call (the SDKs' _should_retry); the
    # paper's client reads no such header.
    honour_should_retry: bool = False

    def __post_init__(self) -> None:
        _check(0 <= self.max_retries <= 20, f"max_retries must be in [0, 20], got {self.max_retries}")
        _check(self.attempt_timeout_s > 0, f"attempt_timeout_s must be > 0, got {self.attempt_timeout_s}")
        _check(
            0 <= self.backoff_min_s <= self.backoff_max_s,
            f"need 0 <= backoff_min_s <= backoff_max_s, got {self.backoff_min_s}, {self.backoff_max_s}",
        )
        _check(self.retry_after_cap_s >= 0, "retry_after_cap_s must be >= 0")
        self._check_choices()
        _check(self.backoff_base_s >= 0, f"backoff_base_s must be >= 0, got {self.backoff_base_s}")
        _check(self.backoff_cap_s >= 0, f"backoff_cap_s must be >= 0, got {self.backoff_cap_s}")
        _check(0 <= self.jitter_fraction <= 1, f"jitter_fraction must be in [0, 1], got {self.jitter_fraction}")

    def _check_choices(self) -> None:
        """The named settings, each against its allowed values (the message lists them)."""
        for name, allowed in (("backoff", self.BACKOFFS), ("jitter", self.JITTERS),
                              ("retry_after", self.RETRY_AFTER_RULES)):
            value = getattr(self, name)
            _check(value in allowed, f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        outcomes = self.retried_outcomes
        _check(
            all(o in self.RETRIABLE + self.RETRIABLE_BEYOND for o in outcomes)
            and len(set(outcomes)) == len(outcomes),
            f"retry_on must list distinct outcomes from {', '.join(self.RETRIABLE + self.RETRIABLE_BEYOND)}, "
            f"comma-separated; "
            f"got {self.retry_on!r}",
        )

    @property
    def retried_outcomes(self) -> tuple[str, ...]:
        """retry_on as a tuple (empty: no outcome is retried)."""
        return tuple(o.strip() for o in self.retry_on.split(",")) if self.retry_on.strip() else ()

    @property
    def max_attempts(self) -> int:
        return 1 + self.max_retries if self.retries else 1


CANCELLATION_MODES = ("off", "immediate", "deferred")
ORDERS = ("budget-first", "lookup-first")
QUEUE_ORDERS = ("fifo", "lifo")
# The statuses a refusal may carry: 429 (too many requests), 503 (unavailable), 529 (overloaded).
REFUSAL_STATUSES = (429, 503, 529)
# The sources of a refusal, each with its own status and headers: the retry budget, the deadline
# check, and the engine's queue cap (whose 503 the proxy relays).
REFUSAL_SOURCES = ("budget", "deadline", "engine")


@dataclass(frozen=True, kw_only=True)
class ProxyPolicy:
    """What the proxy does with attempts and with executions whose subscribers left.

    cancellation: "off" keeps reading for nobody (the execution is orphaned), "immediate" closes the
    upstream connection when the last subscriber leaves, "deferred" does so `defer_s` later unless a
    subscriber attached meanwhile. cancel_delay_s is how long a close takes to reach the engine (the
    paper saw < 0.5 s). retry_budget refuses retries beyond budget_ratio x first attempts over
    budget_window_s (429 with Retry-After). coalescing attaches a retry to its call's live execution;
    order says whether the budget or the lookup comes first. max_outstanding caps the executions the
    proxy has open upstream (a cancelled one stops counting when its stream closes, as a real proxy
    sees it, a moment before the engine applies the abort); further ones wait in its queue, served
    newest first once more than lifo_threshold wait when queue_order is "lifo". deadline_check
    refuses (503) an attempt the proxy estimates will miss its deadline (attempt_deadline_s).
    retain_s > 0 keeps each completed execution's response for that long under its key, so that a
    retry arriving after the completion is answered from it instead of computing the call again;
    retain_max_bytes bounds all retained responses (the oldest go first), retain_result_max_bytes
    one response (a larger one is not kept). 0 (the paper's proxy) keeps nothing.

    Beyond the paper, deadline_propagation (docs/deadlines.md): the proxy reads each attempt's deadline
    (its client's Request-Timeout-Ms, else x-stainless-timeout, else default_deadline_s after arrival,
    else none), drops a queued execution and cancels a running one once every subscriber's deadline has
    passed (whatever `cancellation` says; "deferred" counts its deferral from that deadline), and forwards
    the time left upstream. deadline_admission also refuses (with the deadline check's answer,
    `deadline_status`) an attempt the proxy estimates cannot receive its last token before its deadline.
    Beyond the paper, each refusal's answer (source = budget, deadline or engine):
    `<source>_status` (429, 503 or 529), `<source>_retry_after` (send Retry-After, the proxy's wait
    estimate) and `<source>_no_retry` (send `x-should-retry: false`). The defaults are the paper's
    proxy: the budget's 429 with Retry-After, the deadline check's and the engine's 503 without.
    """

    cancellation: str = "off"
    defer_s: float = 10.0
    cancel_delay_s: float = 0.05
    retry_budget: bool = False
    budget_ratio: float = 0.1
    budget_window_s: float = 60.0
    coalescing: bool = False
    order: str = "budget-first"
    max_outstanding: int | None = None
    queue_order: str = "fifo"
    lifo_threshold: int = 50
    deadline_check: bool = False
    attempt_deadline_s: float = 120.0  # the clients' deadline, which the deadline check holds attempts to
    retain_s: float = 0.0
    retain_max_bytes: int = 256 << 20
    retain_result_max_bytes: int = 16 << 20
    deadline_propagation: bool = False
    default_deadline_s: float | None = None
    deadline_admission: bool = False
    budget_status: int = 429
    budget_retry_after: bool = True
    budget_no_retry: bool = False
    deadline_status: int = 503
    deadline_retry_after: bool = False
    deadline_no_retry: bool = False
    engine_status: int = 503
    engine_retry_after: bool = False
    engine_no_retry: bool = False

    def __post_init__(self) -> None:
        for source in REFUSAL_SOURCES:
            status = getattr(self, f"{source}_status")
            _check(status in REFUSAL_STATUSES,
                   f"{source}_status must be one of {', '.join(map(str, REFUSAL_STATUSES))}; got {status!r}")
        _check(
            self.cancellation in CANCELLATION_MODES,
            f"cancellation must be one of {', '.join(CANCELLATION_MODES)}; got {self.cancellation!r}",
        )
        _check(self.defer_s >= 0, f"defer_s must be >= 0, got {self.defer_s}")
        _check(
            0 <= self.cancel_delay_s < 0.5,
            f"cancel_delay_s must be in [0, 0.5) seconds, got {self.cancel_delay_s}",
        )
        _check(0 <= self.budget_ratio <= 10, f"budget_ratio must be in [0, 10], got {self.budget_ratio}")
        _check(self.budget_window_s > 0, f"budget_window_s must be > 0, got {self.budget_window_s}")
        _check(self.order in ORDERS, f"order must be one of {', '.join(ORDERS)}; got {self.order!r}")
        _check(
            self.max_outstanding is None
            or (isinstance(self.max_outstanding, int) and not isinstance(self.max_outstanding, bool)
                and self.max_outstanding >= 1),
            f"max_outstanding must be a positive integer or absent, got {self.max_outstanding!r}",
        )
        _check(self.queue_order in QUEUE_ORDERS,
               f"queue_order must be one of {', '.join(QUEUE_ORDERS)}; got {self.queue_order!r}")
        _check(self.lifo_threshold >= 0, f"lifo_threshold must be >= 0, got {self.lifo_threshold}")
        _check(self.retain_s >= 0, f"retain_s must be >= 0 seconds, got {self.retain_s}")
        _check(self.retain_max_bytes >= 0, f"retain_max_bytes must be >= 0, got {self.retain_max_bytes}")
        _check(self.retain_result_max_bytes >= 0,
               f"retain_result_max_bytes must be >= 0, got {self.retain_result_max_bytes}")
        _check(
            self.max_outstanding is not None or (self.queue_order == "fifo" and not self.deadline_check),
            "queue_order \"lifo\" and deadline_check need a proxy queue: set max_outstanding",
        )
        _check(self.default_deadline_s is None or 0 < self.default_deadline_s <= 604_800,
               f"default_deadline_s must be in (0, 604800] seconds or absent, got {self.default_deadline_s}")
        _check(self.deadline_propagation or (self.default_deadline_s is None and not self.deadline_admission),
               "default_deadline_s and deadline_admission need deadline_propagation = true")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """vLLM engine arguments the paper sets (Section 3.1)."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 32_768
    gpu_memory_utilization: float = 0.90
    block_size: int = 16
    enable_prefix_caching: bool = True
    async_scheduling: bool = True
    max_num_queued_reqs: int | None = None

    def __post_init__(self) -> None:
        _check(
            16 <= self.max_num_batched_tokens <= 1 << 20,
            f"max_num_batched_tokens must be in [16, 1048576], got {self.max_num_batched_tokens}",
        )
        _check(1 <= self.max_num_seqs <= 4096, f"max_num_seqs must be in [1, 4096], got {self.max_num_seqs}")
        _check(
            0.05 <= self.gpu_memory_utilization <= 1.0,
            f"gpu_memory_utilization must be in [0.05, 1], got {self.gpu_memory_utilization}",
        )
        _check(self.block_size in (8, 16, 32, 64, 128),
               f"block_size must be 8, 16, 32, 64 or 128 (vLLM's CPU build), got {self.block_size}")
        _check(
            self.max_num_queued_reqs is None or self.max_num_queued_reqs >= 1,
            f"max_num_queued_reqs must be >= 1 or unset, got {self.max_num_queued_reqs}",
        )


@dataclass(frozen=True, kw_only=True)
class BreakerPolicy:
    """A circuit breaker in front of the proxy (control/breaker.py), beyond the paper.

    Closed, it counts faults: `failures` within `window_s` seconds open it. Open, it answers every
    attempt itself for `open_s` seconds with `status` (Retry-After = the cool-down left when
    `retry_after`; `x-should-retry: false` when `no_retry`). Then half-open, it lets `probes` attempts
    through: a probe's success closes it, a probe's fault reopens it. A timeout or an error is always a
    fault; a busy answer (429, 503 or 529 from the engine or the proxy) is one only when `busy_is_fault`
    (as sglang's router counted its workers' queue-full 503s).
    """

    failures: int = 5
    window_s: float = 10.0
    open_s: float = 30.0
    probes: int = 1
    busy_is_fault: bool = True
    status: int = 503
    retry_after: bool = True
    no_retry: bool = False

    def __post_init__(self) -> None:
        _check(1 <= self.failures <= 100_000, f"failures must be in [1, 100000], got {self.failures}")
        _check(0 < self.window_s <= 3600, f"window_s must be in (0, 3600] seconds, got {self.window_s}")
        _check(0 < self.open_s <= 3600, f"open_s must be in (0, 3600] seconds, got {self.open_s}")
        _check(1 <= self.probes <= 1000, f"probes must be in [1, 1000], got {self.probes}")
        _check(self.status in REFUSAL_STATUSES,
               f"status must be one of {', '.join(map(str, REFUSAL_STATUSES))}; got {self.status!r}")


@dataclass(frozen=True, kw_only=True)
class Condition:
    """One condition of the paper's Table 1: a client policy, a proxy policy and engine overrides."""

    name: str
    description: str = ""
    client: ClientPolicy = field(default_factory=ClientPolicy)
    proxy: ProxyPolicy = field(default_factory=ProxyPolicy)
    engine_cap: int | str | None = None  # a number, "auto" (= ceil(120 x C-hat)) or None
    breaker: BreakerPolicy | None = None  # a circuit breaker in front of the proxy ([breaker]), beyond the paper

    def __post_init__(self) -> None:
        _check(
            self.engine_cap is None
            or self.engine_cap == "auto"
            or (isinstance(self.engine_cap, int) and not isinstance(self.engine_cap, bool) and self.engine_cap >= 1),
            f"engine_cap must be a positive integer, \"auto\" or absent; got {self.engine_cap!r}",
        )


_SECTIONS = ("client", "proxy")
_Policy = TypeVar("_Policy", ClientPolicy, ProxyPolicy, BreakerPolicy)


def _type_ok(value: Any, annotation: str) -> bool:
    """TOML value against a field's annotation (bool is not a number here, though Python says so)."""
    for name in (part.strip() for part in annotation.split("|")):
        if name == "None" and value is None:
            return True
        if name == "bool" and isinstance(value, bool):
            return True
        if isinstance(value, bool):
            continue
        if (name == "int" and isinstance(value, int)) or (name == "float" and isinstance(value, int | float)):
            return True
        if name == "str" and isinstance(value, str):
            return True
    return False


def _build(cls: type[_Policy], table: dict[str, Any], where: str) -> _Policy:
    """A policy from a TOML table (as tomllib gives it), each field checked against the annotation."""
    allowed = {f.name: f for f in fields(cls)}
    for key, value in table.items():
        _check(key in allowed, f"{where}: unknown field {key!r}; allowed: {', '.join(sorted(allowed))}")
        annotation = str(allowed[key].type)
        _check(_type_ok(value, annotation), f"{where}: field {key!r} must be {annotation}, got {value!r}")
    try:
        return cls(**table)
    except TypeError as error:
        raise ConfigError(f"{where}: {error}") from error
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from error


def proxy_policy_from_table(table: dict[str, Any], where: str) -> ProxyPolicy:
    """A proxy policy written as a table (the proxy's configuration file holds one inline); every
    error names `where` and the field."""
    return _build(ProxyPolicy, table, where)


def condition_from_toml(text: str, name: str, where: str = "<policy>") -> Condition:
    """Parse one policies/*.toml file; every error names the file and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{where}: not valid TOML: {error}") from error
    top_allowed = {"description", "engine_cap", "breaker", *_SECTIONS}
    for key in data:
        _check(key in top_allowed, f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(top_allowed))}")
    _check(isinstance(data.get("client", {}), dict), f"{where}: [client] must be a table")
    client = _build(ClientPolicy, data.get("client", {}), f"{where} [client]")
    _check(isinstance(data.get("proxy", {}), dict), f"{where}: [proxy] must be a table")
    proxy = _build(ProxyPolicy, data.get("proxy", {}), f"{where} [proxy]")
    breaker = None
    if "breaker" in data:
        _check(isinstance(data["breaker"], dict), f"{where}: [breaker] must be a table")
        breaker = _build(BreakerPolicy, data["breaker"], f"{where} [breaker]")
    try:
        return Condition(
            name=name,
            description=str(data.get("description", "")),
            engine_cap=data.get("engine_cap"),
            client=client,
            proxy=proxy,
            breaker=breaker,
        )
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from error


def _policy_dir() -> Path:
    return Path(str(resources.files("retrybench.conditions") / "policies"))


def available_conditions() -> list[str]:
    return sorted(p.stem for p in _policy_dir().glob("*.toml"))


CONDITIONS = (
    "retries-off-cancel-off",
    "retries-on-cancel-off",
    "retries-off-cancel-on",
    "retries-on-cancel-on",
)


def load_condition(name_or_path: str) -> Condition:
    """A condition by its Table 1 name (a file in policies/) or by the path of a TOML file."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        return condition_from_toml(path.read_text(), path.stem, str(path))
    candidate = _policy_dir() / f"{name_or_path}.toml"
    if not candidate.exists():
        raise ConfigError(
            f"unknown condition {name_or_path!r}; known: {', '.join(available_conditions())} "
            "(or give the path of a .toml file)"
        )
    return condition_from_toml(candidate.read_text(), name_or_path, f"policies/{candidate.name}")


def with_overrides(condition: Condition, **client: Any) -> Condition:
    return replace(condition, client=replace(condition.client, **client))
