"""The suite's own machinery: ``make test`` runs pytest-xdist with ``--dist loadgroup`` so
that tests sharing a costly module fixture (``xdist_group``) run on one worker and build it
once. When the group stops reaching the scheduler (pytest 9.2 with pytest-xdist 3.8), nothing
fails, the suite only grows by minutes: this test makes it fail instead."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("suite_grouping")
def test_xdist_group_reaches_the_scheduler(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup (make test does)")
    assert request.node.nodeid.endswith("@suite_grouping"), (
        f"pytest-xdist's loadgroup lost the group of {request.node.nodeid!r}: grouped tests "
        "run on several workers and rebuild their module fixtures (pin pytest, pyproject.toml)"
    )
