"""Router and FrontBalancer: the four routing policies, the two front policies, determinism and checks."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from retrybench.control.router import FrontBalancer, Router, rendezvous

REPLICAS = ("replica-0", "replica-1", "replica-2", "replica-3")
KEYS = [f"call-1-{i:06d}" for i in range(4000)]


def test_round_robin_takes_turns_whatever_the_load() -> None:
    router = Router("round-robin", REPLICAS)
    assert [router.choose(k, outstanding=(9, 0, 0, 0)) for k in KEYS[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_least_outstanding_picks_the_least() -> None:
    router = Router("least-outstanding", REPLICAS)
    assert router.choose("a", outstanding=(5, 3, 1, 2)) == 2
    assert router.choose("a", outstanding=(0, 3, 1, 2)) == 0
    assert router.choose("a", outstanding=(4, 4, 4, 3)) == 3


def test_least_outstanding_rotates_ties() -> None:
    router = Router("least-outstanding", REPLICAS)
    assert [router.choose("a", outstanding=(0, 0, 0, 0)) for _ in range(5)] == [0, 1, 2, 3, 0]


def test_least_outstanding_balances_a_stream_of_long_executions() -> None:
    router = Router("least-outstanding", REPLICAS)
    open_streams = [0, 0, 0, 0]
    for key in KEYS[:400]:
        open_streams[router.choose(key, outstanding=open_streams)] += 1
    assert open_streams == [100, 100, 100, 100]


def test_a_policy_that_reads_load_needs_every_replica_s() -> None:
    with pytest.raises(ValueError, match="outstanding streams of all 4"):
        Router("least-outstanding", REPLICAS).choose("a", outstanding=(1, 2))


@pytest.mark.parametrize("policy", ["key-affine"])
def test_key_affine_spreads_keys_evenly(policy: str) -> None:
    router = Router(policy, REPLICAS)
    counts = Counter(router.choose(k) for k in KEYS)
    assert sorted(counts) == [0, 1, 2, 3]
    # 4,000 keys over 4 replicas: 1,000 each, binomial sd about 27; allow 5 sd.
    assert all(abs(n - 1000) < 140 for n in counts.values()), counts


def test_key_affine_is_stable_and_ignores_load() -> None:
    router = Router("key-affine", REPLICAS)
    first = [router.choose(k, outstanding=(0, 0, 0, 0)) for k in KEYS[:200]]
    again = [router.choose(k, outstanding=(50, 0, 9, 1)) for k in KEYS[:200]]
    assert first == again
    assert first == [Router("key-affine", REPLICAS).choose(k) for k in KEYS[:200]]


def test_key_affine_moves_only_the_keys_a_new_replica_wins() -> None:
    three = [rendezvous(k, REPLICAS[:3]) for k in KEYS]
    four = [rendezvous(k, REPLICAS) for k in KEYS]
    moved = [(a, b) for a, b in zip(three, four, strict=True) if a != b]
    assert all(b == 3 for _, b in moved)
    assert 0.15 < len(moved) / len(KEYS) < 0.35  # about a quarter


def test_the_hash_is_the_same_in_another_process() -> None:
    """blake2b, not hash(): PYTHONHASHSEED does not move a key."""
    code = "from retrybench.control.router import rendezvous; print([rendezvous(f'k{i}', 'abcd') for i in range(50)])"
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert len(outputs) == 1
    assert outputs.pop().strip() == str([rendezvous(f"k{i}", "abcd") for i in range(50)])


def _prompt(call: str) -> list[tuple[str, int]]:
    return [("shared", 2000), (f"shared/{call}", 10000)]


def test_prefix_affine_sends_a_retry_where_its_prompt_went() -> None:
    router = Router("prefix-affine", REPLICAS)
    load = [0, 0, 0, 0]
    placed = {}
    for key in KEYS[:40]:
        placed[key] = router.choose(key, _prompt(key), load)
        load[placed[key]] += 1
    assert sorted(Counter(placed.values()).values()) == [10, 10, 10, 10]  # new prompts spread: shared part < 0.3
    for key in KEYS[:40]:  # the retries: the whole prompt matches where the first attempt went
        assert router.choose(key, _prompt(key), load) == placed[key]


def test_prefix_affine_gives_way_to_load_imbalance() -> None:
    router = Router("prefix-affine", REPLICAS)
    home = router.choose("a", _prompt("a"), (0, 0, 0, 0))
    busy = [0, 0, 0, 0]
    busy[home] = 100
    assert router.choose("a", _prompt("a"), busy) != home
    fresh = Router("prefix-affine", REPLICAS)
    assert fresh.choose("a", _prompt("a"), (0, 0, 0, 0)) == home
    busy[home] = 60  # within the absolute threshold (64): affinity holds
    assert fresh.choose("a", _prompt("a"), busy) == home


def test_prefix_affine_forgets_the_least_recent_records() -> None:
    router = Router("prefix-affine", REPLICAS[:2], max_prefix_records=3)
    router.choose("a", _prompt("a"), (0, 0))
    router.choose("b", _prompt("b"), (0, 0))
    # "a" went to replica 0, "b" to replica 1 (the smaller record); the fourth record pushed out the oldest,
    # replica 0's shared prefix.
    assert router.record_tokens == [10000, 12000]


def test_one_replica_always_gets_it() -> None:
    for policy in ("round-robin", "least-outstanding", "key-affine", "prefix-affine"):
        router = Router(policy, ("only",))
        assert {router.choose(k, _prompt(k), (3,)) for k in KEYS[:20]} == {0}


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown router policy 'hash'"):
        Router("hash", REPLICAS)
    with pytest.raises(ValueError, match="distinct"):
        Router("round-robin", ("a", "a"))
    with pytest.raises(ValueError, match="at least one"):
        Router("round-robin", ())
    with pytest.raises(ValueError, match="unknown front policy"):
        FrontBalancer("least", ("a", "b"))
    with pytest.raises(ValueError, match="seeded numpy Generator"):
        FrontBalancer("random", ("a", "b"))


def test_random_front_spreads_attempts_and_repeats_with_its_seed() -> None:
    names = ("proxy-0", "proxy-1")
    front = FrontBalancer("random", names, np.random.default_rng(7))
    picks = [front.pick("same-key") for _ in range(2000)]
    assert 900 < picks.count(0) < 1100  # one key, both instances: no affinity
    again = FrontBalancer("random", names, np.random.default_rng(7))
    assert [again.pick("same-key") for _ in range(2000)] == picks


def test_key_affine_front_keeps_a_call_on_one_instance() -> None:
    front = FrontBalancer("key-affine", ("proxy-0", "proxy-1", "proxy-2"))
    assert all(len({front.pick(k) for _ in range(5)}) == 1 for k in KEYS[:100])
    assert sorted(Counter(front.pick(k) for k in KEYS)) == [0, 1, 2]
