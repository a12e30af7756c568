"""Layer tables: the packaged H100 profile, tables built from scripts/profile_steps.py's CSV, and how the
step-time model reads them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from retrybench.engine.layer_table import (
    LINEAR_PHASES,
    LayerTable,
    format_layer_table,
    layer_table_from_steps,
    load_layer_table,
    parse_layer_table,
)
from retrybench.engine.profiles import GPUS, elementwise_s_per_token, gemm_roofline_ratios, profile_for

VIDUR = "h100_llama2_7b_layer_ms.csv"


def test_the_packaged_table_names_the_gpu_and_shapes_it_was_measured_on() -> None:
    table = load_layer_table(VIDUR)
    assert (table.peak_flops, table.bandwidth) == (989.4e12, 3.35e12)
    assert (table.hidden, table.intermediate, table.dtype_bytes) == (4096, 11008, 2)
    assert table.layer_params == 4 * 4096**2 + 3 * 4096 * 11008  # Llama-2-7B: no GQA
    assert table.rows[0] == (1, 0.156, 0.013, 0.006)


def test_a_table_survives_writing_and_reading() -> None:
    table = load_layer_table(VIDUR)
    assert parse_layer_table(format_layer_table(table, ["a comment"])) == table


def _roofline_table(peak: float, bandwidth: float, tokens: tuple[int, ...]) -> LayerTable:
    """A table whose GEMMs take exactly their roofline time."""
    params, size = 1_000_000, 2
    rows = tuple((n, 1e3 * max(2.0 * params * n / peak, size * params / bandwidth), 0.01, 0.01) for n in tokens)
    return LayerTable(rows=rows, peak_flops=peak, bandwidth=bandwidth, hidden=64, intermediate=128,
                      layer_params=params, dtype_bytes=size)


def test_a_table_at_the_roofline_gives_ratio_one_on_any_gpu() -> None:
    table = _roofline_table(1e12, 1e10, (1, 10, 100, 1000, 10_000))
    for gpu in ("h100", "h200"):
        ridge = GPUS[gpu].bf16_flops_per_s / GPUS[gpu].bandwidth_bytes_per_s
        ratios = gemm_roofline_ratios(table, ridge)
        assert min(ratios) == pytest.approx(1.0) and max(ratios) == pytest.approx(1.0, rel=0.02)


def test_a_slower_table_makes_a_prefill_step_slower() -> None:
    """A run reads the table its GPU names: the same table with twice the GEMM time costs a full prefill
    step about twice the GEMM time."""
    table = load_layer_table(VIDUR)
    slower = replace(table, rows=tuple((n, 2 * linear, hidden, act) for n, linear, hidden, act in table.rows))
    base = profile_for("qwen2.5-7b-instruct", step_model="roofline")
    other = replace(base, gpu=replace(base.gpu, layer_profile=slower))
    n = 8192
    ratio = (other.step_time_s(seqs=1, tokens=n, sampled=1, attention_pairs=0.0, context_tokens=0)
             / base.step_time_s(seqs=1, tokens=n, sampled=1, attention_pairs=0.0, context_tokens=0))
    assert 1.8 < ratio < 2.0, ratio  # the GEMMs double; the elementwise ops and fixed costs do not


def test_elementwise_costs_come_from_the_largest_rows() -> None:
    """From 1,024 tokens up where the table has such rows, else its largest row (a quick CPU table)."""
    per_token = elementwise_s_per_token(_roofline_table(1e12, 1e10, (16, 64, 256)), 64, 0, 1e10)
    assert per_token == pytest.approx(0.01e-3 / 256)


def _steps(phases: dict[str, dict[int, float]]) -> list[dict[str, str]]:
    return [{"phase": phase, "tokens": str(n), "seconds": str(seconds)}
            for phase, by_tokens in phases.items() for n, seconds in by_tokens.items()]


def test_a_table_from_the_step_profile_sums_the_linear_phases_at_shared_token_counts() -> None:
    phases = {phase: {16: 0.001, 64: 0.002, 256: 0.004} for phase in LINEAR_PHASES}
    phases["linear_down"].pop(256)  # not timed at 256: that row is left out
    phases["elementwise_hidden"] = {16: 1e-5, 64: 2e-5, 256: 3e-5}
    phases["mlp_activation"] = {16: 2e-5, 64: 3e-5, 256: 4e-5}
    phases["attention_prefill"] = {16: 1.0}  # other phases are not the table's
    table = layer_table_from_steps(_steps(phases), peak_flops=1e12, bandwidth=1e10, hidden=64, intermediate=128,
                                   layer_params=40_000, dtype_bytes=4)
    assert [row[0] for row in table.rows] == [16, 64]
    assert [row[1:] for row in table.rows] == [pytest.approx((4.0, 0.01, 0.02)), pytest.approx((8.0, 0.02, 0.03))]


def test_a_step_profile_without_the_elementwise_phases_is_refused() -> None:
    phases = {phase: {16: 0.001} for phase in LINEAR_PHASES}
    with pytest.raises(ValueError, match="elementwise_hidden, mlp_activation"):
        layer_table_from_steps(_steps(phases), peak_flops=1e12, bandwidth=1e10, hidden=64, intermediate=128,
                               layer_params=40_000, dtype_bytes=2)


def test_a_table_without_its_header_is_refused() -> None:
    with pytest.raises(ValueError, match="peak_flops, bandwidth"):
        parse_layer_table("tokens,linear_ms,hidden_elementwise_ms,mlp_activation_ms\n1,0.1,0.01,0.01\n")


def test_a_table_with_unordered_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="increasing"):
        replace(_roofline_table(1e12, 1e10, (1, 10)), rows=((10, 1.0, 0.1, 0.1), (1, 1.0, 0.1, 0.1)))
