"""The `kernels` step model: its tables read as the kernel database prices steps, the packaged ones are
current, and a table for another model is built on first use (or refused naming the extra)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from retrybench.engine import kernel_db, kernel_store
from retrybench.engine.kernel_db import KernelDatabaseMissing, breakpoints
from retrybench.engine.kernel_table import (
    KernelTable,
    Provenance,
    Shapes,
    format_kernel_table,
    interpolate,
    interpolate_2d,
    parse_kernel_table,
)
from retrybench.engine.profiles import GPUS, MODELS, EngineProfile, default_step_model, profile_for

ROOT = Path(__file__).resolve().parents[2]
PAPER_MODELS = ("qwen2.5-7b-instruct", "qwen3-14b", "llama-3.1-8b-instruct")
HAS_DATABASE = importlib.util.find_spec("aiconfigurator_core") is not None
needs_database = pytest.mark.skipif(not HAS_DATABASE, reason="the kernel database is not installed: "
                                                             "pip install 'retrybench[kernels]'")


def _table(**changes: object) -> KernelTable:
    fields: dict[str, object] = dict(
        provenance=Provenance(package="test", system="h100_sxm", backend="vllm", backend_version="0.24.0", sources={}),
        shapes=MODELS["tiny-llama"].shapes, tokens=(1, 10, 100), tokens_ms=(1.0, 2.0, 11.0),
        logits_rows=(1, 3), logits_ms=(0.5, 0.7), prefill_q=(1, 3), prefill_prefix=(0, 10),
        prefill_ms=((1.0, 2.0), (3.0, 5.0)), decode_batch=(1, 2), decode_context=(10, 20),
        decode_ms=((1.0, 2.0), (2.0, 4.0)))
    fields.update(changes)
    return KernelTable(**fields)  # type: ignore[arg-type]


def test_a_table_reads_exactly_at_its_points_and_linearly_between_and_beyond() -> None:
    table = _table()
    assert table.tokens_s(10) == pytest.approx(2e-3)
    assert table.tokens_s(55) == pytest.approx(6.5e-3)
    assert table.tokens_s(200) == pytest.approx(21e-3)  # the last interval's slope beyond the end
    assert table.prefill_attention_s(2, 5) == pytest.approx(2.75e-3)  # bilinear: (1.5 + 4) / 2
    assert table.decode_attention_s(2, 30) == pytest.approx(6e-3)
    assert interpolate((1, 2), (1.0, 0.5), 10) == 0.0  # never below zero
    assert interpolate_2d((1, 2), (0, 1), ((1.0, 1.0), (1.0, 1.0)), 1.5, 0.5) == pytest.approx(1.0)


def test_a_table_survives_its_file_and_a_damaged_one_is_refused_by_name() -> None:
    table = _table()
    assert parse_kernel_table(format_kernel_table(table)) == table
    with pytest.raises(ValueError, match=r"t\.json has format 9"):
        parse_kernel_table(json.dumps({"format": 9}), source="t.json")
    with pytest.raises(ValueError, match=r"t\.json lacks or mistypes 'decode_ms'"):
        data = json.loads(format_kernel_table(table))
        del data["decode_ms"]
        parse_kernel_table(json.dumps(data), source="t.json")
    with pytest.raises(ValueError, match="tokens grid"):
        _table(tokens=(10, 1, 100))
    with pytest.raises(ValueError, match="finite and non-negative"):
        _table(tokens_ms=(1.0, float("nan"), 2.0))


def test_breakpoints_keep_the_kinks_of_a_piecewise_linear_curve() -> None:
    xs = list(range(1, 101))
    ys = [float(x) if x <= 40 else 40.0 + 3.0 * (x - 40) for x in xs]  # a kink at 40
    kept = [xs[i] for i in breakpoints(xs, ys)]
    assert kept == [1, 40, 100]


@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("model", PAPER_MODELS)
def test_the_paper_models_are_priced_from_packaged_tables(model: str, gpu: str) -> None:
    spec = GPUS[gpu]
    assert spec.kernel_system is not None and spec.kernel_vllm is not None
    name = kernel_store.table_name(MODELS[model].shapes, spec.kernel_system, spec.kernel_vllm)
    table = parse_kernel_table(kernel_store.packaged_path(name).read_text())
    assert table.shapes == MODELS[model].shapes
    assert table.provenance["system"] == spec.kernel_system and table.provenance["backend_version"] == "0.24.0"
    assert table.provenance["package"].startswith("aiconfigurator-core ")
    profile = profile_for(model, gpu)
    assert profile.step_model == "kernels" == default_step_model(gpu)
    prefill = profile.step_time_s(seqs=1, tokens=8192, sampled=1, attention_pairs=0.0, context_tokens=0,
                                  chunks=[(8192, 0)])
    kernels = table.tokens_s(8192) + table.logits_s(1) + table.prefill_attention_s(8192, 0)
    assert prefill == pytest.approx(kernels + profile.costs.fixed_s + profile.costs.per_seq_s)


def test_the_cpu_build_keeps_the_roofline_and_kernels_there_are_refused() -> None:
    assert default_step_model("cpu") == "roofline"
    profile = profile_for("tiny-llama", "cpu")
    assert profile.step_model == "roofline"
    with pytest.raises(ValueError, match="kernel database has no"):
        EngineProfile(gpu_key="cpu", model_key="tiny-llama", gpu=GPUS["cpu"], model=MODELS["tiny-llama"],
                      engine=profile.engine, costs=profile.costs, step_model="kernels")


def test_a_model_beyond_the_packaged_tables_needs_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr("retrybench.engine.kernel_db.metadata.version", missing)
    shapes = Shapes(**{**MODELS["llama-3.1-8b-instruct"].shapes, "layers": 7})
    with pytest.raises(KernelDatabaseMissing, match=r"pip install 'retrybench\[kernels\]'"):
        kernel_store.kernel_table.__wrapped__(json.dumps(shapes, sort_keys=True), "h100_sxm", "0.24.0")


@needs_database
def test_a_model_beyond_the_packaged_tables_is_built_once_into_the_cache(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    monkeypatch.setenv("RETRYBENCH_CACHE", str(tmp_path))
    shapes = Shapes(**{**MODELS["llama-3.1-8b-instruct"].shapes, "layers": 7})
    key = json.dumps(shapes, sort_keys=True)
    built = kernel_store.kernel_table.__wrapped__(key, "h100_sxm", "0.24.0")
    path = kernel_store.cached_path(kernel_store.table_name(shapes, "h100_sxm", "0.24.0"),
                                    metadata.version("aiconfigurator-core"))
    assert path.is_file() and built.shapes == shapes

    def no_second_build(*_args: object) -> KernelTable:
        raise AssertionError("the cached table was built again")

    monkeypatch.setattr(kernel_db, "build_kernel_table", no_second_build)
    again = kernel_store.kernel_table.__wrapped__(key, "h100_sxm", "0.24.0")
    assert again == parse_kernel_table(path.read_text())
    assert again.tokens_s(5000) == pytest.approx(built.tokens_s(5000), rel=1e-5)


@needs_database
def test_the_packaged_tables_are_what_the_installed_database_gives() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_kernel_tables.py"), "--check"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


# Steps of each kind: (prefill chunks as (new tokens, prefix), decode contexts).
STEPS = {
    "prefill 8,192 new tokens": ([(8192, 0)], []),
    "prefill 3,808 after an 8,192 prefix": ([(3808, 8192)], []),
    "prefill 517 after 2,000": ([(517, 2000)], []),
    "decode 16 at 12K": ([], [12_288] * 16),
    "decode 97 at mixed contexts": ([], [9_000 + 61 * i for i in range(97)]),
    "decode 250 at 4K": ([], [4_096] * 250),
    "mixed 8,095 prefill + 97 decodes": ([(8095, 0)], [12_500] * 97),
    "mixed two chunks + 40 decodes": ([(3000, 9000), (1200, 0)], [12_000 + 10 * i for i in range(40)]),
}


@needs_database
@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("model", PAPER_MODELS)
def test_step_costs_are_the_databases_kernel_sums_plus_host_time(model: str, gpu: str) -> None:
    profile = profile_for(model, gpu)
    spec = GPUS[gpu]
    assert spec.kernel_system is not None and spec.kernel_vllm is not None
    database = kernel_db.DatabaseSteps(MODELS[model].shapes, spec.kernel_system, spec.kernel_vllm)
    for name, (chunks, contexts) in STEPS.items():
        seqs = len(chunks) + len(contexts)
        tokens = sum(q for q, _p in chunks) + len(contexts)
        modelled = profile.step_time_s(seqs=seqs, tokens=tokens, sampled=seqs, attention_pairs=0.0,
                                       context_tokens=0, decode_context_tokens=sum(contexts), chunks=chunks)
        kernels = modelled - profile.costs.fixed_s - profile.costs.per_seq_s * seqs
        measured = database.step_ms(chunks, contexts, seqs) * 1e-3
        assert kernels == pytest.approx(measured, rel=0.02), f"{name}: {kernels * 1e3:.2f} ms against the " \
                                                            f"database's {measured * 1e3:.2f} ms"
    # The database's own step sums, where it has them (one prefill from scratch; a uniform decode batch).
    whole = profile.step_time_s(seqs=1, tokens=8192, sampled=1, attention_pairs=0.0, context_tokens=0,
                                chunks=[(8192, 0)]) - profile.costs.fixed_s - profile.costs.per_seq_s
    assert whole * 1e3 == pytest.approx(database.prefill_step_ms(8192), rel=0.02)
    decode = profile.step_time_s(seqs=64, tokens=64, sampled=64, attention_pairs=0.0, context_tokens=0,
                                 decode_context_tokens=64 * 12_289)
    decode -= profile.costs.fixed_s + 64 * profile.costs.per_seq_s
    assert decode * 1e3 == pytest.approx(database.decode_step_ms(64, 12_288), rel=0.02)
