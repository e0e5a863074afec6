"""bench/modules.py: the modules a request reaches, counted as docs/architecture.md says."""

from __future__ import annotations

from bench.modules import REQUESTS, count, graph, reached


def test_the_registry_leads_only_to_the_requests_own_kind() -> None:
    g = {"runtime.api.routes.jobs": {"workflows"}, "workers.runner": {"workflows", "runtime.jobs.context"},
         "workflows": {"workflows.narrative", "workflows.agent", "workflows.turn"}, "workflows.narrative": {"workflows.turn"},
         "workflows.agent": {"domain.agent"}, "workflows.turn": set(), "runtime.jobs.context": set(), "domain.agent": set()}
    assert reached(g, ["runtime.api.routes.jobs", "workers.runner"], "workflows.narrative") == {
        "runtime.api.routes.jobs", "workers.runner", "workflows", "workflows.narrative", "workflows.turn",
        "runtime.jobs.context"}


def test_both_requests_are_counted_on_this_tree() -> None:
    got = count(graph())
    assert set(got) == set(REQUESTS)
    for c in got.values():
        mods = set(c["list"])
        assert {"workers.runner", "runtime.sessions.engine"} <= mods
        assert 0 < c["runtime"] < c["modules"] == len(mods)
