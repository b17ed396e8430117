"""runners/ray_pool.py's leases, with a stand-in for Ray (tests/e2e/test_ray.py freezes a real
actor): an actor silent past --lease is killed, and its pages go to the others once Ray
says it died, or after a second lease when the kill never lands; a healthy one, or a
replacement still waiting for its node, is left alone."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from bulkfetch.api import build_options
from bulkfetch.errors import UsageError
from bulkfetch.models import Page
from bulkfetch.runners.holdings import LeaseClock
from bulkfetch.runners.ray_pool import RayPool, _Actor

LEASE = 5.0


class ActorDied(Exception):
    pass


class FakeRay:
    """What the pool asks of Ray: wait, get, kill, and a cluster with no room for more."""

    exceptions = SimpleNamespace(RayError=ActorDied)

    def __init__(self) -> None:
        self.killed: list[Any] = []
        self.answers: dict[str, object] = {}  # call -> its answer, or ActorDied

    def kill(self, handle: Any, no_restart: bool = True) -> None:
        self.killed.append(handle.name)

    def wait(self, calls: list[str], num_returns: int, timeout: float
             ) -> tuple[list[str], list[str]]:
        ready = [call for call in calls if call in self.answers]
        return ready[:num_returns], [call for call in calls if call not in ready]

    def get(self, call: str) -> object:
        answer = self.answers.pop(call)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def available_resources(self) -> dict[str, float]:
        return {"CPU": 0}


def pool() -> RayPool:
    made = RayPool.__new__(RayPool)  # (no cluster: only the bookkeeping is under test)
    made.ray = FakeRay()
    made.actors, made.by_call, made.said = {}, {}, []
    made.finishing, made.missing, made.next_room_check = False, 0, 0.0
    made.gone_why, made.empty_since, made.clock = None, None, LeaseClock(LEASE)
    return made


def actor(made: RayPool, worker: int, silent_s: float, ready: bool = True) -> _Actor:
    calls = iter(range(1, 1000))
    handle = SimpleNamespace(name=f"actor-{worker}", exchange=SimpleNamespace(
        remote=lambda *args: f"call-{worker}-{next(calls)}"))  # the next exchange
    one = _Actor(worker, handle=handle, ready=ready, call=f"call-{worker}",
                 heard=time.monotonic() - silent_s)
    one.held = {worker * 10: Page(worker * 10, None, ("a", "b"))}
    one.unfetched = 1
    made.actors[worker] = one
    made.by_call[one.call] = one
    return one


def test_an_actor_silent_past_its_lease_is_killed_and_lost_when_ray_says_so() -> None:
    made = pool()
    frozen, healthy = actor(made, 0, LEASE + 1), actor(made, 1, 0.3)
    assert made._lapse() == []  # killed first: its pages wait for Ray to confirm
    assert made.ray.killed == ["actor-0"] and frozen.lapsed is not None
    assert healthy.lapsed is None
    made.ray.answers["call-0"] = ActorDied("The actor died because it was killed")
    messages = made.receive(0.0)
    lost = [m for m in messages if m[0] == "lost"]
    assert len(lost) == 1 and lost[0][1] == 0 and lost[0][5] is True
    assert [page.seq for page in lost[0][2]] == [0] and lost[0][3] == 1
    assert "--lease" in lost[0][4]  # the reason is the silence, not Ray's words for the kill
    assert ("exit", 0) in messages and frozen.dead and not healthy.dead


def test_a_kill_that_never_lands_gives_the_pages_away_after_a_second_lease() -> None:
    made = pool()
    cut_off = actor(made, 0, 3 * LEASE)
    assert made._lapse() == []
    cut_off.lapsed = time.monotonic() - LEASE - 1  # no word from Ray since
    lost = [m for m in made._lapse() if m[0] == "lost"]
    assert len(lost) == 1 and lost[0][5] is True and cut_off.dead
    assert "call-0" not in made.by_call  # its answer, if one ever comes, is not waited for


def test_a_healthy_actor_renews_its_lease_with_each_answer() -> None:
    made = pool()
    busy = actor(made, 0, LEASE - 1)
    made.ray.answers["call-0"] = [("tick", SimpleNamespace(worker=0))]
    made.receive(0.0)
    assert time.monotonic() - busy.heard < 1 and busy.lapsed is None
    assert made.ray.killed == []


def test_a_replacement_waiting_for_its_node_has_no_lease_yet() -> None:
    made = pool()
    actor(made, 0, 10 * LEASE, ready=False)
    assert made._lapse() == [] and made.ray.killed == []


@pytest.mark.parametrize("runner", ["ray", "local"])
def test_a_lease_too_short_is_a_usage_error(tmp_path: Any, runner: str) -> None:
    with pytest.raises(UsageError, match="at least 2"):
        build_options("http://127.0.0.1:1/", tmp_path / "d", runner=runner, lease=1)
    assert build_options("http://127.0.0.1:1/", tmp_path / "d", runner="local",
                         lease=10).runner.lease_s == 10
