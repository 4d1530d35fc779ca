"""The docs' benchmark figures come from bench/results/latest.json: a changed result changes the page, and
``python -m bench.pages --check`` (make lint) fails on a page that no longer matches the file."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from bench import pages

pytestmark = pytest.mark.unit


@pytest.fixture
def latest() -> dict:
    return json.loads((pages.RESULTS / "latest.json").read_text())


def bucketq_cell(data: dict, scenario: str) -> dict:
    return next(r for r in data["results"]
                if (r["contender"], r["scenario"], r["processes"]) == ("bucketq", scenario, 1))


def test_the_results_table_follows_the_file(latest: dict) -> None:
    changed = copy.deepcopy(latest)
    bucketq_cell(changed, "push")["msgs_per_s"] = 123_456.0
    assert "| bucketq | push | 1 KiB x1 | 123,456 |" in pages.results_section(changed)
    assert "123,456" not in pages.results_section(latest)


def test_the_capacity_model_follows_the_file(latest: dict) -> None:
    changed = copy.deepcopy(latest)
    cell = bucketq_cell(changed, "end_to_end")
    cell["commands_per_1000"], cell["cpu_s_per_1000"] = 5.0, 0.02
    section = pages.capacity_section(changed)
    assert "× 1000 / 5.00` (end to end)" in section and "500 commands/s per 100,000" in section
    assert "`1 / 20.0 µs ≈ 50,000`" in section


def test_check_fails_on_a_stale_page_and_passes_once_written(latest: dict, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BENCHMARKS", "SCALING", "CHART_COPY"):
        original = getattr(pages, name)
        copied = tmp_path / original.name
        if original.exists():
            shutil.copy(original, copied)
        monkeypatch.setattr(pages, name, copied)
    results = tmp_path / "latest.json"
    bucketq_cell(latest, "push")["msgs_per_s"] = 123_456.0
    results.write_text(json.dumps(latest))
    assert pages.main(["--check", "--results", str(results)]) == 1
    assert pages.main(["--results", str(results)]) == 0
    assert pages.main(["--check", "--results", str(results)]) == 0
    assert "123,456" in pages.BENCHMARKS.read_text()
