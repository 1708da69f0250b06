"""bench.memory_phases: its phase marks wrap the core's steps without changing them."""

from __future__ import annotations

import pytest

from bench import memory_phases


class Steps:
    def __init__(self) -> None:
        self.calls = 0

    def method(self, x: int) -> int:
        self.calls += 1
        return x + 1

    @staticmethod
    def static(x: int) -> int:
        return x * 2


def test_wrapped_steps_return_what_they_did_and_mark(capsys: pytest.CaptureFixture[str]) -> None:
    phases = memory_phases.Phases()
    phases.wrap(Steps, "method", "a method")
    phases.wrap(Steps, "static", "a static method")
    steps = Steps()
    assert steps.method(1) == 2 and steps.calls == 1
    assert Steps.static(3) == 6 and steps.static(4) == 8
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["a", "method", "RSS"], ["a", "static", "method"], ["a", "static", "method"],
    ]  # fmt: skip


def test_the_mappings_add_up_to_the_resident_size() -> None:
    kinds, files = memory_phases.smaps_mb()
    rss = memory_phases.status_mb()["VmRSS"]
    assert abs(sum(kinds.values()) - rss) < 0.05 * rss
    assert sum(files.values()) == pytest.approx(kinds["file-backed (code, data of libraries)"])
