"""Which engine replica an execution goes to, and which proxy instance an attempt reaches, sans-IO.

A deployment runs several engine replicas behind a router, and the overload-control proxy itself as
several instances behind a load balancer. Both choices are pure functions of their inputs and of the
chooser's own state (a round-robin counter, the prefixes it has routed, a seeded generator), so the
simulator and a live proxy (`--engine A --engine B --route POLICY`) make the same choices.

Hashing uses blake2b, never Python's `hash()`, whose salt changes per process: a key maps to the same
replica in every run, every worker and every proxy instance.

`Router.choose(key, prefix, outstanding)` picks a replica:
- `round-robin`: the next replica in turn, whatever the load.
- `least-outstanding`: the replica with the fewest open streams from this router; ties go to the first
  one after the last pick, so an idle deployment still rotates.
- `key-affine`: rendezvous (highest-random-weight) hashing of the call key over the replica names: every
  attempt of a call goes to the same replica, and adding a replica moves only the keys it wins.
- `prefix-affine`: the cache-aware policy of vLLM's and SGLang's routers (defaults: cache threshold 0.3,
  balance thresholds 64 and 1.5): the replica whose routed prompts share the longest prefix with this one
  when the matched share exceeds the threshold, else the replica with the smallest record; while load is
  out of balance (the busiest has more than 64 streams over the idlest and 1.5 times as many), the least
  loaded instead.

`FrontBalancer.pick(key)` spreads attempts over proxy instances: `random` (a seeded numpy Generator,
as an L4 balancer spreads connections) or `key-affine` (rendezvous hashing of the call key, as a balancer
hashing a header such as Idempotency-Key).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = ["FRONT_POLICIES", "ROUTER_POLICIES", "SHARED_PREFIX_HASH", "FrontBalancer", "PrefixSegment", "Router",
           "prompt_prefix", "rendezvous"]

ROUTER_POLICIES = ("round-robin", "least-outstanding", "key-affine", "prefix-affine")
FRONT_POLICIES = ("random", "key-affine")

PrefixSegment = tuple[str, int]
"""One segment of a prompt as the router sees it: a chain hash (of the segment and every segment
before it, so equal hashes mean equal prefixes) and the segment's length in tokens."""

SHARED_PREFIX_HASH = "shared-prefix"  # the one system prompt every call of the trace starts with


def prompt_prefix(call_key: str, prompt_tokens: int, shared_tokens: int) -> tuple[PrefixSegment, ...]:
    """A prompt as a router sees it: the shared system prompt (its first `shared_tokens`), then the
    call's own part, named by its call key. The simulator and the live proxy describe prompts this one
    way, so prefix-affine routing makes the same choices in both."""
    shared = min(shared_tokens, prompt_tokens)
    return ((SHARED_PREFIX_HASH, shared), (f"{SHARED_PREFIX_HASH}/{call_key}", prompt_tokens - shared))


# vLLM router's and SGLang's cache_aware defaults (--cache-threshold, --balance-abs-threshold,
# --balance-rel-threshold).
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
# Prefix records the router keeps (one per segment and replica, least recently routed dropped first).
MAX_PREFIX_RECORDS = 1 << 16


def _weight(key: str, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest(), "big")


def rendezvous(key: str, names: Sequence[str]) -> int:
    """The index of the name with the highest hash weight for `key` (ties: the first such name)."""
    best, best_weight = 0, -1
    for index, name in enumerate(names):
        weight = _weight(key, name)
        if weight > best_weight:
            best, best_weight = index, weight
    return best


def _check_names(names: Sequence[str], what: str) -> tuple[str, ...]:
    names = tuple(names)
    if not names:
        raise ValueError(f"need at least one {what}")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} names must be distinct, got {list(names)}")
    return names


class Router:
    """Picks an engine replica per execution. One router per proxy instance: its load view is the
    streams that instance opened (`outstanding`, given by the caller per replica)."""

    def __init__(self, policy: str, replicas: Sequence[str], *, cache_threshold: float = CACHE_THRESHOLD,
                 balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
                 balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
                 max_prefix_records: int = MAX_PREFIX_RECORDS) -> None:
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; known: {', '.join(ROUTER_POLICIES)}")
        if not 0 <= cache_threshold <= 1:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if max_prefix_records < 1:
            raise ValueError(f"max_prefix_records must be >= 1, got {max_prefix_records}")
        self.policy = policy
        self.replicas = _check_names(replicas, "replica")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_prefix_records = max_prefix_records
        self._next = 0  # round-robin position; least-outstanding's tie-break start
        self._records: OrderedDict[tuple[str, int], int] = OrderedDict()  # (chain hash, replica) -> tokens
        self.record_tokens = [0] * len(self.replicas)  # tokens recorded per replica (its "tree size")

    def choose(self, key: str, prefix: Sequence[PrefixSegment] = (), outstanding: Sequence[int] = ()) -> int:
        """The replica index for one execution of call `key` with prompt `prefix`, given the open
        streams per replica (needed by least-outstanding and prefix-affine)."""
        n = len(self.replicas)
        if n == 1:
            if self.policy == "prefix-affine":
                self._record(prefix, 0)
            return 0
        policy = self.policy
        if policy == "round-robin":
            chosen = self._next
            self._next = (chosen + 1) % n
            return chosen
        if policy == "key-affine":
            return rendezvous(key, self.replicas)
        if len(outstanding) != n:
            raise ValueError(f"{policy} needs the outstanding streams of all {n} replicas, got {len(outstanding)}")
        if policy == "least-outstanding":
            return self._least(outstanding)
        chosen = self._prefix_choice(prefix, outstanding)
        self._record(prefix, chosen)
        return chosen

    def _least(self, outstanding: Sequence[int], among: Sequence[int] | None = None) -> int:
        """The least-loaded replica (of `among`), scanning from the rotating start so ties rotate."""
        n = len(self.replicas)
        candidates = range(n) if among is None else among
        start = self._next
        chosen = min(candidates, key=lambda i: (outstanding[i], (i - start) % n))
        self._next = (chosen + 1) % n
        return chosen

    def _prefix_choice(self, prefix: Sequence[PrefixSegment], outstanding: Sequence[int]) -> int:
        most, fewest = max(outstanding), min(outstanding)
        if most - fewest > self.balance_abs_threshold and most > self.balance_rel_threshold * fewest:
            return self._least(outstanding)
        total = sum(tokens for _hash, tokens in prefix)
        matched = [self._matched(prefix, replica) for replica in range(len(self.replicas))]
        best = max(matched)
        if total > 0 and best / total > self.cache_threshold:
            return self._least(outstanding, [i for i, m in enumerate(matched) if m == best])
        smallest = min(self.record_tokens)
        return self._least(outstanding, [i for i, size in enumerate(self.record_tokens) if size == smallest])

    def _matched(self, prefix: Sequence[PrefixSegment], replica: int) -> int:
        matched = 0
        for chain_hash, tokens in prefix:
            if (chain_hash, replica) not in self._records:
                break
            matched += tokens
        return matched

    def _record(self, prefix: Sequence[PrefixSegment], replica: int) -> None:
        records = self._records
        for chain_hash, tokens in prefix:
            entry = (chain_hash, replica)
            if entry in records:
                records.move_to_end(entry)
                continue
            records[entry] = tokens
            self.record_tokens[replica] += tokens
            if len(records) > self.max_prefix_records:
                (_old, old_replica), old_tokens = records.popitem(last=False)
                self.record_tokens[old_replica] -= old_tokens


class FrontBalancer:
    """Picks the proxy instance an attempt reaches."""

    def __init__(self, policy: str, instances: Sequence[str], rng: np.random.Generator | None = None) -> None:
        if policy not in FRONT_POLICIES:
            raise ValueError(f"unknown front policy {policy!r}; known: {', '.join(FRONT_POLICIES)}")
        if policy == "random" and rng is None:
            raise ValueError("the random front needs a seeded numpy Generator")
        self.policy = policy
        self.instances = _check_names(instances, "proxy instance")
        self._rng = rng

    def pick(self, key: str) -> int:
        """The instance index for one attempt of call `key`."""
        n = len(self.instances)
        if n == 1:
            return 0
        if self.policy == "key-affine":
            return rendezvous(key, self.instances)
        assert self._rng is not None
        return int(self._rng.integers(n))
