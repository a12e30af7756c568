"""The paper's findings as checks on run results, for `retrybench reproduce`'s verdicts.

Each check states one claim on one run (or one trace's conditions) exactly as the finding tests in
benchmarks/ assert it, with the same thresholds (retrybench.paper's NEAR and FAR, and the tests' own
named constants), so that a verdict here and a test outcome there agree. Under pytest the report takes
the verdict from the tests' outcomes instead; these checks then only supply the measured figures.
Pure: results in, checks out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from retrybench.blocks import BLOCKS, PRIMARY_MODEL
from retrybench.paper import FAR, near, paper_values
from retrybench.report.runs import MissingRun, RunFailed, RunSet

__all__ = ["FINDINGS", "Check", "Finding", "checks_of", "verdict"]

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
UNCERTAIN = "uncertain in the paper"
NOT_RUN = "not run"

SMALL_FRACTION = 0.05  # Finding 3: "close to the deadline" = median time left at most 5% of it
NEARLY_EVERY_PCT = 95.0  # Finding 7: "nearly every retry" attaches
ALMOST_NOTHING = 0.01  # Finding 7: cancels at most this share of executions


@dataclass(frozen=True, kw_only=True)
class Check:
    """One claim on one run: passed, failed, or not evaluated (a run missing or failed)."""

    claim: str
    subject: str  # model, run (seed) and step size or pulse
    passed: bool | None
    measured: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # why not evaluated: the failed run's error, or the missing run


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A row of the report's summary: a finding (or section) of the paper and how to check it."""

    key: str  # finding1 .. finding7, section64, section65 (pytest marker or test group)
    title: str
    claim: str
    checks: Callable[[RunSet], list[Check]]
    uncertain: bool = False  # the paper itself draws no conclusion: recorded, never a verdict
    marker: str = ""  # the pytest marker of its tests (key if empty)
    tests: tuple[str, ...] = ()  # test functions of the marker that belong here rather than to the marker's row


Body = Callable[[], tuple[bool, dict[str, Any], dict[str, Any]]]


def _check(claim: str, subject: str, body: Body) -> Check:
    try:
        passed, measured, paper = body()
    except MissingRun as missing:
        return Check(claim=claim, subject=subject, passed=None, note=f"not run: {missing}")
    except RunFailed as failed:
        return Check(claim=claim, subject=subject, passed=None, note=f"run failed: {failed}")
    return Check(claim=claim, subject=subject, passed=bool(passed), measured=measured, paper=paper)


def _subject(model: str, seed: int, extra: str = "") -> str:
    return f"{model} run {seed}{', ' + extra if extra else ''}"


P = paper_values()
TABLE2 = P["diagnostic"]["hold_delivered_pct"]
QWEN = P["diagnostic"]["qwen25"]
TRACING = P["tracing"]
COMPOSITION = P["composition"]["qwen25"]
BUDGET_CANCEL = P["budget_with_cancellation"]["qwen25"]
ORDER = P["order"]["qwen25"]
QUEUE = P["queue_policy"]["qwen25"]
CAP = P["engine_cap"]["qwen25"]
DEFERRAL = P["deferral"]["qwen25"]
DEADLINE_S = P["workload"]["attempt_timeout_s"]


def _sweep_cell(model: str, retries: str, pulse_x: float) -> list[float]:
    cells: list[list[float]] = P["trigger_sweep"][model][retries]
    return cells[P["trigger_sweep"]["pulses_x"].index(pulse_x)]


# -- Finding 1 ---------------------------------------------------------------------------------------

def _finding1(rs: RunSet) -> list[Check]:
    out: list[Check] = []
    for model, seed in rs.pairs("diagnostic"):
        def a(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "retries-on-cancel-off", seed)
            return (run["hold_delivered_pct"] == 0.0 and run["recovered"] is False,
                    {"hold_delivered_pct": run["hold_delivered_pct"], "recovered": run["recovered"]},
                    {"hold_delivered_pct": TABLE2[model]["retries_on_cancel_off"], "recovered": False})

        def b(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "retries-on-cancel-on", seed)
            return (run["recovered"] is False,
                    {"recovered": run["recovered"], "hold_delivered_pct": run["hold_delivered_pct"]},
                    {"recovered": False, "hold_delivered_pct": TABLE2[model]["retries_on_cancel_on"]})

        out.append(_check("retries on, cancellation off: no hold call delivered, not recovered",
                          _subject(model, seed), a))
        out.append(_check("retries on, cancellation on: not recovered", _subject(model, seed), b))
        for condition in ("retries-off-cancel-off", "retries-off-cancel-on"):
            def c(model: str = model, seed: int = seed, condition: str = condition
                  ) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                run = rs.run(model, condition, seed)
                return (run["recovered"] is True,
                        {"recovered": run["recovered"], "recovery_s": run["recovery_s"]},
                        {"recovered": True, "hold_delivered_pct": TABLE2[model][condition.replace("-", "_")]})

            out.append(_check(f"{condition}: recovers within the hold", _subject(model, seed), c))
    for model, seed in rs.pairs("diagnostic", (PRIMARY_MODEL,)):
        def d(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            on, off = rs.run(model, "retries-off-cancel-on", seed), rs.run(model, "retries-off-cancel-off", seed)
            ok = bool(on["recovered"] and off["recovered"]) and on["recovery_s"] < off["recovery_s"]
            return (ok, {"recovery_s_cancel_on": on["recovery_s"], "recovery_s_cancel_off": off["recovery_s"]},
                    {"recovery_s_cancel_on": QWEN["recovery_s_retries_off_cancel_on"],
                     "recovery_s_cancel_off": QWEN["recovery_s_retries_off_cancel_off"]})

        def e(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "retries-on-cancel-off", seed)
            low, high = (v / 100 for v in QWEN["completed_pct_of_chat_retries_on_cancel_off"])
            return (run["accepted_x"] > 2.0 and near(run["completed_x"], low, high),
                    {"accepted_x": run["accepted_x"], "completed_x": run["completed_x"],
                     "retry_share_pct": run["retry_share_pct"]},
                    {"accepted_x": QWEN["accepted_x_retries_on_cancel_off"], "completed_x": [low, high],
                     "retry_share_pct": QWEN["retry_share_of_executions_pct_retries_on_cancel_off"]})

        def f(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "retries-on-cancel-on", seed)
            low, high = QWEN["mean_waiting_pct_of_littles_law"]
            ok = (run["accepted_x"] > 2.0 and 100 * run["completed_x"] < 1.0
                  and near(run["mean_waiting_pct_of_littles_law"], low, high))
            return (ok, {"accepted_x": run["accepted_x"], "completed_pct_of_chat": round(100 * run["completed_x"], 2),
                         "mean_waiting_pct_of_littles_law": run["mean_waiting_pct_of_littles_law"]},
                    {"accepted_x": QWEN["accepted_x_retries_on_cancel_on"],
                     "completed_pct_of_chat": QWEN["completed_pct_of_chat_retries_on_cancel_on"],
                     "mean_waiting_pct_of_littles_law": [low, high]})

        out.append(_check("without retries, cancellation recovers earlier", _subject(model, seed), d))
        out.append(_check("retries keep vLLM accepting over 2 C-hat, completing near C-hat", _subject(model, seed), e))
        out.append(_check("with cancellation, completion under 1% of C-hat, Little's-law queue",
                          _subject(model, seed), f))
    for model, seed in rs.pairs("trigger-sweep"):
        for pulse_x, retries, want in ((1.5, "on", True), (2.7, "on", False), (1.5, "off", True),
                                       (2.0, "off", True), (2.7, "off", True)):
            def g(model: str = model, seed: int = seed, pulse_x: float = pulse_x, retries: str = retries,
                  want: bool = want) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                run = rs.run(model, f"retries-{retries}-cancel-off", seed, pulse_x=pulse_x)
                return (run["recovered"] is want,
                        {"recovered": run["recovered"], "hold_delivered_pct": run["hold_delivered_pct"],
                         "recovery_s": run["recovery_s"]},
                        {"recovered": want,
                         "hold_delivered_pct_and_recovery_s": _sweep_cell(model, f"retries_{retries}", pulse_x)})

            verb = "recovers" if want else "does not recover"
            out.append(_check(f"retries {retries}, pulse {pulse_x} C-hat: {verb}",
                              _subject(model, seed, f"pulse {pulse_x}"), g))
    for model, seed in rs.pairs("mixed-prompts", (PRIMARY_MODEL,)):
        def m(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            runs = {c: rs.run(model, c, seed, mixed_prompts=True) for c in BLOCKS["mixed-prompts"].conditions}
            ok = (runs["retries-on-cancel-off"]["recovered"] is False
                  and runs["retries-on-cancel-on"]["recovered"] is False
                  and runs["retries-off-cancel-on"]["recovered"] is True
                  and runs["retries-off-cancel-off"]["recovered"] is True
                  and runs["retries-off-cancel-on"]["recovery_s"] < runs["retries-off-cancel-off"]["recovery_s"])
            mixed = P["mixed_prompts"]
            return (ok, {"recovered": {c: r["recovered"] for c, r in runs.items()},
                         "recovery_s_retries_off_cancel_on": runs["retries-off-cancel-on"]["recovery_s"],
                         "recovery_s_retries_off_cancel_off": runs["retries-off-cancel-off"]["recovery_s"]},
                    {"recovery_s_retries_off_cancel_on": mixed["recovery_s_retries_off_cancel_on"],
                     "recovery_s_retries_off_cancel_off": mixed["recovery_s_retries_off_cancel_off"]})

        out.append(_check("mixed prompts: the diagnostic's recovery outcomes", _subject(model, seed), m))
    return out


def _uncertain_pulse(rs: RunSet) -> list[Check]:
    out = []
    for model, seed in rs.pairs("trigger-sweep"):
        def body(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "retries-on-cancel-off", seed, pulse_x=2.0)
            cell = _sweep_cell(model, "retries_on", 2.0)
            return (True, {"recovered": run["recovered"], "hold_delivered_pct": run["hold_delivered_pct"],
                           "recovery_s": run["recovery_s"]},
                    {"recovered": cell[1] >= 0, "hold_delivered_pct": cell[0],
                     "recovery_s": cell[1] if cell[1] >= 0 else None})

        out.append(_check("retries on, pulse 2 C-hat: recorded", _subject(model, seed, "pulse 2.0"), body))
    return out


# -- Findings 2-4 (tracing block) ----------------------------------------------------------------------

def _traced(rs: RunSet, seed: int, steps: int, condition: str = "retries-on-cancel-on") -> dict[str, Any]:
    return rs.run(PRIMARY_MODEL, condition, seed, max_batched_tokens=steps, trace=True)


def _finding2(rs: RunSet) -> list[Check]:
    out = []
    for model, seed in rs.pairs("tracing", (PRIMARY_MODEL,)):
        for steps in (8192, 2048):
            key = "8k" if steps == 8192 else "2k"

            def a(seed: int = seed, steps: int = steps, key: str = key) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                run = _traced(rs, seed, steps)
                return (run["aborted_prompt_share_pct"] > 50.0,
                        {"aborted_prompt_share_pct": run["aborted_prompt_share_pct"],
                         "missed_share_pct": run["missed_share_pct"]},
                        {"aborted_prompt_share_pct": TRACING[f"aborted_share_of_computed_prompt_pct_{key}"],
                         "missed_share_pct": TRACING[f"aborted_before_first_output_share_pct_{key}"]})

            def b(seed: int = seed, steps: int = steps, key: str = key) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                run = _traced(rs, seed, steps)
                shares = run["step_time_aborted_share_by_rule_pct"]
                return (all(v > 50.0 for v in shares.values()),
                        {"step_time_aborted_share_pct": run["step_time_aborted_share_pct"]},
                        {"step_time_aborted_share_pct": TRACING[f"aborted_share_of_step_time_pct_{key}"]})

            out.append(_check("aborted executions hold most computed prompt tokens",
                              _subject(model, seed, f"{steps} tokens"), a))
            out.append(_check("aborted prompt work takes most step time under every rule",
                              _subject(model, seed, f"{steps} tokens"), b))

        def c(seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            big, small = _traced(rs, seed, 8192), _traced(rs, seed, 2048)
            low, high = TRACING["in_flight_share_of_aborted_pct_8k"]
            return (near(big["in_flight_share_pct"], low, high)
                    and small["in_flight_share_pct"] < big["in_flight_share_pct"],
                    {"in_flight_share_pct_8k": big["in_flight_share_pct"],
                     "in_flight_share_pct_2k": small["in_flight_share_pct"]},
                    {"in_flight_share_pct_8k": [low, high],
                     "in_flight_share_pct_2k": TRACING["in_flight_share_of_aborted_pct_2k"]})

        def d(seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = _traced(rs, seed, 2048, "retries-on-cancel-off")
            return (run["aborted_prompt_share_pct"] == 0.0 and run["missed_share_pct"] == 0.0,
                    {"aborted_prompt_share_pct": run["aborted_prompt_share_pct"],
                     "missed_share_pct": run["missed_share_pct"]},
                    {"missed_share_pct": TRACING["missed_share_pct"]["k2_cancel_off"]})

        out.append(_check("at 8K about half the aborted work was in flight; 2K steps cut it",
                          _subject(model, seed), c))
        out.append(_check("without cancellation no prompt work is missed", _subject(model, seed), d))
    return out


def _finding3(rs: RunSet) -> list[Check]:
    out = []
    low, high = TRACING["retry_first_scheduled_after_predecessor_abort_median_s"]
    for model, seed in rs.pairs("tracing", (PRIMARY_MODEL,)):
        for steps in (8192, 2048):
            def a(seed: int = seed, steps: int = steps) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                run = _traced(rs, seed, steps)
                left = run["retry_time_left_at_first_step_median_s"]
                after = run["retry_first_scheduled_after_abort_median_s"]
                return (left <= SMALL_FRACTION * DEADLINE_S and near(after, low, high),
                        {"retry_time_left_at_first_step_median_s": left,
                         "retry_first_scheduled_after_abort_median_s": after},
                        {"retry_time_left_at_first_step_median_s": TRACING[
                            "scheduled_retry_time_left_at_first_step_median_s"],
                         "retry_first_scheduled_after_abort_median_s": [low, high]})

            out.append(_check("retries are first scheduled close to their deadline",
                              _subject(model, seed, f"{steps} tokens"), a))

        def b(seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            big, small = _traced(rs, seed, 8192), _traced(rs, seed, 2048)
            ok = (near(small["retry_first_scheduled_after_abort_median_s"], low, high)
                  and small["retry_time_left_at_first_step_median_s"] <= SMALL_FRACTION * DEADLINE_S
                  and small["recovered"] is False and small["hold_delivered_pct"] > big["hold_delivered_pct"])
            return (ok, {"hold_delivered_pct_8k": big["hold_delivered_pct"],
                         "hold_delivered_pct_2k": small["hold_delivered_pct"], "recovered_2k": small["recovered"]},
                    {"hold_delivered_pct_8k": TRACING["hold_delivered_pct_8k_cancel_on"],
                     "hold_delivered_pct_2k": TRACING["hold_delivered_pct_2k_cancel_on"], "recovered_2k": False})

        out.append(_check("2K steps keep the timing, do not restore service, raise hold delivery",
                          _subject(model, seed), b))
    return out


def _finding4(rs: RunSet) -> list[Check]:
    out = []
    within = TRACING["counter_matches_rule_within_pct"]
    for model, seed in rs.pairs("tracing", (PRIMARY_MODEL,)):
        for steps in (8192, 2048):
            def a(seed: int = seed, steps: int = steps) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                error = _traced(rs, seed, steps)["counter_rule_error_pct"]
                return error <= within, {"counter_rule_error_pct": error}, {"counter_rule_error_pct": within}

            out.append(_check("the prompt-token counter follows its rule", _subject(model, seed, f"{steps} tokens"), a))
    for model, seed in rs.pairs("diagnostic"):
        def b(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            gap = rs.run(model, "retries-on-cancel-on", seed)["counter_gap_pct"]
            return near(gap, 100 / 5, 200 / 3), {"counter_gap_pct": gap}, {"counter_gap_pct": P["counter_gap"][model]}

        out.append(_check("the counter misses a fifth to two thirds of admitted prompt tokens",
                          _subject(model, seed), b))
    return out


# -- Findings 5-7 and Sections 6.4, 6.5 --------------------------------------------------------------------

def _finding5(rs: RunSet) -> list[Check]:
    out = []
    for model, seed in rs.pairs("composition"):
        def a(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            budget, none = rs.run(model, "retry-budget", seed), rs.run(model, "no-control", seed)
            ok = (budget["recovered"] is True and none["recovered"] is False and none["primary_delivered_pct"] == 0.0
                  and near(budget["pulse_delivered_pct"], none["pulse_delivered_pct"], none["pulse_delivered_pct"]))
            return (ok, {"recovered": budget["recovered"], "pulse_delivered_pct": budget["pulse_delivered_pct"],
                         "no_control_pulse_delivered_pct": none["pulse_delivered_pct"]},
                    {"recovered": True, "pulse_delivered_pct": COMPOSITION["budget_pulse_by_840_pct"],
                     "no_control_pulse_delivered_pct": COMPOSITION["no_control_pulse_by_840_pct"]})

        def b(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "coalescing", seed)
            ok = run["recovered"] is True and run["pulse_delivered_pct"] == 100.0 and run["hold_delivered_pct"] == 100.0
            return (ok, {"recovered": run["recovered"], "pulse_delivered_pct": run["pulse_delivered_pct"],
                         "hold_delivered_pct": run["hold_delivered_pct"]},
                    {"recovered": True, "pulse_delivered_pct": COMPOSITION["coalescing_pulse_by_840_pct"]})

        def c(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            coalescing, budget = rs.run(model, "coalescing", seed), rs.run(model, "retry-budget", seed)
            late = round(coalescing["pulse_delivered_pct"] - coalescing["pulse_timely_pct"], 4)
            ok = (budget["pulse_delivered_pct"] <= FAR * coalescing["pulse_delivered_pct"]
                  and near(late, 100 / 3, 50.0))
            return (ok, {"pulse_late_pct": late, "budget_pulse_delivered_pct": budget["pulse_delivered_pct"]},
                    {"pulse_late_pct": [33.3, 50.0],
                     "budget_pulse_delivered_pct": COMPOSITION["budget_pulse_by_840_pct"]})

        def d(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            coalescing, budget = rs.run(model, "coalescing", seed), rs.run(model, "retry-budget", seed)
            return (coalescing["primary_timely_pct"] > budget["primary_timely_pct"],
                    {"coalescing_primary_timely_pct": coalescing["primary_timely_pct"],
                     "budget_primary_timely_pct": budget["primary_timely_pct"]},
                    {"coalescing_primary_timely_pct": COMPOSITION["coalescing_primary_within_120_pct"],
                     "budget_primary_timely_pct": COMPOSITION["budget_primary_within_120_pct"]})

        subject = _subject(model, seed)
        out.append(_check("the retry budget restores service, delivers as many pulse calls as no control", subject, a))
        out.append(_check("coalescing restores service, delivers every pulse and hold call", subject, b))
        out.append(_check("only coalescing rescues the pulse, a third to half of it late", subject, c))
        out.append(_check("coalescing delivers more of the primary cohort within 120 s than the budget", subject, d))
    for model, seed in rs.pairs("budget-with-cancellation", (PRIMARY_MODEL,)):
        def e(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            alone = rs.run(model, "retries-on-cancel-on", seed)
            on, off = rs.run(model, "retry-budget-cancel-on", seed), rs.run(model, "retry-budget", seed)
            deferred = rs.run(model, "deferred-cancellation", seed)
            ok = (alone["recovered"] is False and on["recovered"] is True
                  and near(on["pulse_delivered_pct"], off["pulse_delivered_pct"], off["pulse_delivered_pct"])
                  and on["primary_timely_pct"] > off["primary_timely_pct"]
                  and on["primary_timely_pct"] > deferred["primary_timely_pct"]
                  and deferred["pulse_delivered_pct"] == 100.0)
            return (ok, {"budget_cancel_on_pulse_delivered_pct": on["pulse_delivered_pct"],
                         "budget_cancel_on_primary_timely_pct": on["primary_timely_pct"],
                         "budget_cancel_off_primary_timely_pct": off["primary_timely_pct"],
                         "deferred_primary_timely_pct": deferred["primary_timely_pct"]},
                    {"budget_cancel_on_pulse_delivered_pct": BUDGET_CANCEL["budget_cancel_on_pulse_by_840_pct"],
                     "budget_cancel_on_primary_timely_pct": BUDGET_CANCEL["budget_cancel_on_primary_within_120_pct"],
                     "budget_cancel_off_primary_timely_pct": BUDGET_CANCEL["budget_cancel_off_primary_within_120_pct"],
                     "deferred_primary_timely_pct": BUDGET_CANCEL["deferred_primary_within_120_pct"]})

        out.append(_check("with cancellation the budget restores service and favours timely delivery",
                          _subject(model, seed), e))
    return out


def _section64(rs: RunSet) -> list[Check]:
    out = []
    for model, seed in rs.pairs("composition", (PRIMARY_MODEL,)):
        def a(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "budget-first", seed)
            return (run["retries_refused_live"] > run["retries_refused"] / 2,
                    {"retries_refused": run["retries_refused"], "retries_refused_live": run["retries_refused_live"]},
                    {"retries_refused": ORDER["budget_first_refused_per_run"],
                     "retries_refused_live": "more than half"})

        out.append(_check("budget-first refuses retries, over half while their call had a live execution",
                          _subject(model, seed), a))
    for model, seed in rs.pairs("composition"):
        def b(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run, first = rs.run(model, "lookup-first", seed), rs.run(model, "budget-first", seed)
            ok = (run["retries_refused"] == 0 and run["pulse_delivered_pct"] == 100.0
                  and run["hold_delivered_pct"] == 100.0)
            return (ok, {"retries_refused": run["retries_refused"], "pulse_delivered_pct": run["pulse_delivered_pct"],
                         "gain_by_840_points": round(run["primary_delivered_pct"] - first["primary_delivered_pct"], 2)},
                    {"retries_refused": ORDER["lookup_first_refused_per_run"], "pulse_delivered_pct": [100.0, 100.0],
                     "gain_by_840_points": ORDER["lookup_first_gain_by_840_points"]})

        out.append(_check("lookup-first refuses no retry, delivers every pulse and hold call",
                          _subject(model, seed), b))
    return out


def _finding6(rs: RunSet) -> list[Check]:
    out = []
    for model, seed in rs.pairs("engine-cap", (PRIMARY_MODEL,)):
        def a(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            capped, none = rs.run(model, "engine-cap-100", seed), rs.run(model, "no-control", seed)
            return (capped["recovered"] is True and capped["pulse_delivered_pct"] < none["pulse_delivered_pct"],
                    {"recovered": capped["recovered"], "pulse_delivered_pct": capped["pulse_delivered_pct"],
                     "no_control_pulse_delivered_pct": none["pulse_delivered_pct"]},
                    {"recovered": True, "pulse_delivered_pct": CAP["q100_pulse_by_840_pct"]})

        out.append(_check("vLLM's cap at 100 restores service, delivers fewer pulse calls", _subject(model, seed), a))
    for model, seed in rs.pairs("queue-policy", (PRIMARY_MODEL,)):
        def b(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            lifo, none = rs.run(model, "lifo", seed), rs.run(model, "no-control", seed)
            ok = (lifo["recovered"] is True and lifo["pulse_delivered_pct"] > none["pulse_delivered_pct"]
                  and lifo["created_x"] < 1.0)
            return (ok, {"recovered": lifo["recovered"], "pulse_delivered_pct": lifo["pulse_delivered_pct"],
                         "no_control_pulse_delivered_pct": none["pulse_delivered_pct"], "created_x": lifo["created_x"]},
                    {"recovered": True, "pulse_delivered_pct": QUEUE["lifo_pulse_by_840_pct"],
                     "no_control_pulse_delivered_pct": QUEUE["no_control_pulse_by_840_pct"]})

        out.append(_check("LIFO under a proxy cap restores service, delivers more pulse calls",
                          _subject(model, seed), b))
        for condition in ("proxy-cap", "deadline-check"):
            def c(model: str = model, seed: int = seed, condition: str = condition
                  ) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                run = rs.run(model, condition, seed)
                return (run["recovered"] is False, {"recovered": run["recovered"], "created_x": run["created_x"]},
                        {"recovered": False})

            out.append(_check(f"{condition} (arrival order under a proxy cap) does not restore service",
                              _subject(model, seed), c))
    return out


def _uncertain_cap(rs: RunSet) -> list[Check]:
    out = []
    for model, seed in rs.pairs("engine-cap", (PRIMARY_MODEL,)):
        for condition in ("engine-cap-338", "engine-cap-338-cancel-on"):
            def body(model: str = model, seed: int = seed, condition: str = condition
                     ) -> tuple[bool, dict[str, Any], dict[str, Any]]:
                run = rs.run(model, condition, seed)
                return (True, {"recovered": run["recovered"], "created_x": run["created_x"],
                               "engine_cap": run["engine_cap"]},
                        {"recovered": CAP["q338_recovered_runs"]})

            out.append(_check(f"{condition}: recorded", _subject(model, seed), body))
    return out


def _finding7(rs: RunSet) -> list[Check]:
    out = []
    for model, seed in rs.pairs("deferral", (PRIMARY_MODEL,)):
        def a(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "coalescing-cancel-on", seed)
            return (run["retries_attached"] == 0 and run["recovered"] is False,
                    {"retries_attached": run["retries_attached"], "recovered": run["recovered"],
                     "executions_cancelled": run["executions_cancelled"]},
                    {"retries_attached": DEFERRAL["coalescing_cancel_on_attached"], "recovered": False,
                     "executions_cancelled": DEFERRAL["coalescing_cancel_on_aborted_per_run"]})

        def b(model: str = model, seed: int = seed) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            run = rs.run(model, "deferred-cancellation", seed)
            ok = (run["retries_attached_pct"] >= NEARLY_EVERY_PCT and run["recovered"] is True
                  and run["pulse_delivered_pct"] == 100.0 and run["hold_delivered_pct"] == 100.0
                  and run["executions_cancelled"] <= ALMOST_NOTHING * run["executions_created"])
            return (ok, {"retries_attached_pct": run["retries_attached_pct"], "recovered": run["recovered"],
                         "pulse_delivered_pct": run["pulse_delivered_pct"],
                         "executions_cancelled": run["executions_cancelled"]},
                    {"retries_attached_pct": DEFERRAL["deferred_attached_pct"], "recovered": True,
                     "pulse_delivered_pct": DEFERRAL["deferred_pulse_and_hold_by_840_pct"],
                     "executions_cancelled": DEFERRAL["deferred_cancelled_executions"]})

        out.append(_check("immediate cancellation leaves coalescing nothing to attach to", _subject(model, seed), a))
        out.append(_check("deferred cancellation lets retries attach and restores service", _subject(model, seed), b))
    return out


def _section65(rs: RunSet) -> list[Check]:
    out = []
    seen: set[tuple[str, str, int, float]] = set()
    for entry in rs.entries:
        spec = entry.spec
        block = BLOCKS[entry.block]
        group = (entry.block, spec.model, spec.seed, spec.pulse_x)
        if group in seen:
            continue
        seen.add(group)

        def body(spec: Any = spec, block: Any = block) -> tuple[bool, dict[str, Any], dict[str, Any]]:
            steps = block.step_tokens or (8192,) * len(block.conditions)
            runs = {f"{c} ({s})" if block.step_tokens else c:
                    rs.run(spec.model, c, spec.seed, pulse_x=spec.pulse_x, mixed_prompts=block.mixed_prompts,
                           max_batched_tokens=s, trace=block.traced)
                    for c, s in zip(block.conditions, steps, strict=True)}
            above = {c: r["created_x"] for c, r in runs.items() if r["recovered"] and r["created_x"] >= 1.0}
            below = {c: r["created_x"] for c, r in runs.items() if not r["recovered"] and r["created_x"] < 1.0}
            return (not above, {"recovered_at_or_above_chat": above, "below_chat_not_recovered": below},
                    {"every_recovered_run_created_below_chat": True})

        out.append(_check("every recovered run created executions below C-hat",
                          f"{entry.block}, {_subject(spec.model, spec.seed, f'pulse {spec.pulse_x}')}", body))
    return out


FINDINGS: tuple[Finding, ...] = (
    Finding(key="finding1", title="Finding 1 (Section 4)", checks=_finding1,
            claim="Retries alone keep every model from recovering after the 2.7 C-hat pulse, cancellation alone "
                  "does not restore service while clients retry, and every model recovers after a 1.5 C-hat pulse."),
    Finding(key="finding2", title="Finding 2 (Section 5.1)", checks=_finding2,
            claim="Most of the engine's prompt work under cancellation goes to executions it later aborts; at 8,192 "
                  "batched tokens about half of it is in steps already issued, and 2,048-token steps cut that share."),
    Finding(key="finding3", title="Finding 3 (Section 5.2)", checks=_finding3,
            claim="Retries are first scheduled, if at all, close to their deadline, about one deadline after their "
                  "predecessor's abort; smaller steps neither change that nor restore service."),
    Finding(key="finding4", title="Finding 4 (Section 5.3)", checks=_finding4,
            claim="vLLM's prompt-token counter records a prompt only at its first output, so under retries and "
                  "cancellation it falls a fifth to two thirds short of the admission counter."),
    Finding(key="finding5", title="Finding 5 (Section 6.1)", checks=_finding5,
            claim="The retry budget and coalescing restore service on all three models, yet only coalescing rescues "
                  "the pulse calls, a third to half of them late."),
    Finding(key="finding6", title="Finding 6 (Section 6.2)", checks=_finding6,
            claim="vLLM's cap at 100 restores service but delivers fewer pulse calls; newest-first dequeue under a "
                  "proxy cap restores service and delivers more; arrival order does not, even with a deadline check."),
    Finding(key="finding7", title="Finding 7 (Section 6.3)", checks=_finding7,
            claim="Cancellation propagated at once leaves coalescing nothing to attach to; deferring it by 10 s lets "
                  "retries attach again and restores service."),
    Finding(key="section64", title="Section 6.4", checks=_section64, marker="finding5",
            tests=("test_budget_first_refuses_retries_whose_call_still_had_a_live_execution",
                   "test_lookup_first_refuses_no_retry_and_delivers_every_pulse_and_hold_call"),
            claim="Budget-first refuses retries while their call still has a live execution; lookup-first refuses "
                  "none and delivers every pulse and hold call."),
    Finding(key="section65", title="Section 6.5", checks=_section65,
            claim="Every recovered run, in every block, created executions at the proxy below C-hat."),
    Finding(key="section42-2x", title="Section 4.2, 2 C-hat pulse", checks=_uncertain_pulse, uncertain=True,
            marker="finding1", tests=("test_the_2x_pulse_with_retries_is_recorded_not_asserted",),
            claim="With retries on, after a 2 C-hat pulse the outcomes split (one run per cell); the paper draws no "
                  "boundary."),
    Finding(key="section62-q338", title="Section 6.2, Q = 338", checks=_uncertain_cap, uncertain=True,
            marker="finding6", tests=("test_engine_cap_338_is_recorded_not_asserted",),
            claim="vLLM's cap at ceil(120 C-hat) = 338 recovered in one of two runs per cancellation setting; the "
                  "paper draws no conclusion."),
)


def checks_of(rs: RunSet) -> dict[str, list[Check]]:
    """Every finding's checks on this run set."""
    return {f.key: f.checks(rs) for f in FINDINGS}


def verdict(finding: Finding, checks: list[Check]) -> str:
    """reproduced if every evaluated check passed; not reproduced if any failed or its run failed;
    not run if no check could be evaluated; the paper's uncertain cases are never judged."""
    if finding.uncertain:
        return UNCERTAIN if any(c.passed is not None for c in checks) else NOT_RUN
    if any(c.passed is False or c.note.startswith("run failed") for c in checks):
        return NOT_REPRODUCED
    if not any(c.passed for c in checks):
        return NOT_RUN
    return REPRODUCED
