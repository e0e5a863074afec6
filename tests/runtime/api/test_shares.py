"""Fair shares of an API process (runtime/api/shares.py): a tenant that keeps its turns busier
than the others while they are active waits before its requests, for as long as its use takes
to decay to its cap; a tenant alone, one under the floor, and the light one never wait.  Pure
logic on a clock the test moves; then gate.Turns with a tenant held (its request starts after
the wait, another tenant's at once), and its cancels going at once, one per write answered."""

from __future__ import annotations

import asyncio
import math

import pytest

from runtime.api.gate import WAITING_PER_TURN, Paced, Turns
from runtime.api.shares import MAX_WAIT_S, ApiShares
from runtime.jobs.fairness import BUSY, LEAD
from tests.runtime.api.test_turns import Held, call, settle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_alone_never_waits_however_much_it_asks() -> None:
    clock = Clock()
    shares = ApiShares(10.0, clock)
    for _ in range(200):
        assert shares.wait_s("abuser") == 0.0
        shares.charge("abuser", 0.1)  # a turn always busy
        clock.now += 0.1


def test_a_heavy_tenant_waits_until_its_use_decays_to_its_cap_and_the_light_one_never_waits() -> None:
    clock = Clock()
    shares = ApiShares(10.0, clock)
    assert shares.wait_s("normal") == 0.0
    shares.charge("normal", 0.1)  # 0.01 turns over the window
    assert shares.wait_s("abuser") == 0.0, "under the floor (BUSY / n): never held"
    shares.charge("abuser", 3.0)  # 0.3 turns: over the floor of 2 tenants (0.25) and far over 1.25x normal's
    cap = max(LEAD * 0.1, BUSY * 10.0 / 2)
    assert shares.wait_s("abuser") == pytest.approx(10.0 * math.log(3.0 / cap))  # 1.8 s
    assert shares.wait_s("normal") == 0.0, "the light one goes at once"
    clock.now += 10.0 * math.log(3.0 / cap)  # it waited: its use is at its cap now
    assert shares.wait_s("abuser") == pytest.approx(0.0, abs=1e-9)
    shares.charge("abuser", 40.0)
    assert shares.wait_s("abuser") == MAX_WAIT_S, "one wait is bounded"


def test_the_others_leave_after_the_window_and_the_shares_turn_off_at_window_0() -> None:
    clock = Clock()
    shares = ApiShares(10.0, clock)
    shares.wait_s("normal")
    shares.charge("normal", 0.1)
    shares.wait_s("abuser")
    shares.charge("abuser", 5.0)
    assert shares.wait_s("abuser") > 0
    clock.now += 10.5  # normal asked nothing for a window: the abuser is alone
    assert shares.wait_s("abuser") == 0.0 and "normal" not in shares.active and "normal" not in shares.use
    assert shares.total[0] == pytest.approx(5.0 * math.exp(-1.05), rel=1e-6), "normal's use left the total"
    off = ApiShares(0.0, clock)
    off.wait_s("normal")
    off.charge("abuser", 100.0)
    assert off.wait_s("abuser") == 0.0 and off.use == {}


def test_a_heavy_tenants_request_waits_at_the_door_anothers_does_not_and_turns_charge_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gate.Paced (outermost) holds the heavy tenant's request for its wait, whatever it is;
    gate.Turns charges each request's turn to its tenant; past WAITING_PER_TURN x inflight
    waiting, the heavy one's next request is refused 429 at once."""
    slept: list[float] = []
    real_sleep = asyncio.sleep
    release = asyncio.Event()

    async def sleep(s: float) -> None:  # a wait is recorded, and ends when the test says (settle's sleep(0)s are not waits)
        if s > 0:
            slept.append(s)
            await release.wait()
        await real_sleep(0)

    async def scenario() -> None:
        held, out = Held(), {}
        shares = ApiShares(10.0)
        app = Paced(Turns(held, inflight=1, shares=shares), shares, inflight=1)
        shares.wait_s("acme")
        shares.charge("acme", 0.1)
        shares.wait_s("globex")
        shares.charge("globex", 6.0)  # globex kept a turn busy 0.6 of the window
        monkeypatch.setattr(asyncio, "sleep", sleep)
        first = call(app, "/v1/hold/a0", "key-acme-0001", out)
        await settle()
        assert held.started == ["a0"] and slept == [], "the light tenant at once"
        heavy = [call(app, f"/v1/hold/g{i}", "key-globex-01", out) for i in range(WAITING_PER_TURN + 1)]
        await settle()
        assert held.started == ["a0"] and len(slept) == WAITING_PER_TURN and slept[0] > 0, "the heavy one waits"
        assert out == {f"/v1/hold/g{WAITING_PER_TURN}": 429}, "past its waiting requests: refused at once"
        release.set()
        await settle()
        assert held.started[:2] == ["a0", "g0"], "after its wait it runs (its turn, one at a time)"
        for name in ["a0", *(f"g{i}" for i in range(WAITING_PER_TURN))]:
            held.gate(name).set()
        await asyncio.gather(first, *heavy)
        assert out["/v1/hold/a0"] == out["/v1/hold/g0"] == 200
        assert shares.use["globex"][0] > 6.0 * 0.99 and shares.use["acme"][0] > 0.1 * 0.99, "their turns were charged"

    asyncio.run(scenario())


def test_a_held_tenants_cancel_goes_at_once_once_per_write_it_was_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel frees the work it follows: held at the door, it let that work run to its end.
    A held tenant's cancel skips its wait while it has a credit (one per write of its this
    process answered 2xx); past them its cancels wait as its other requests do, and the other
    tenant's credits are its own."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(s: float) -> None:
        if s > 0:
            slept.append(s)
        await real_sleep(0)

    async def scenario() -> None:
        held, out = Held(), {}
        shares = ApiShares(10.0)
        app = Paced(Turns(held, inflight=4, shares=shares), shares, inflight=4)
        for name in ("s0", "s1", "cancel", "g0", "a0"):
            held.gate(name).set()  # every request answers at once
        shares.wait_s("acme")
        shares.charge("acme", 0.1)
        monkeypatch.setattr(asyncio, "sleep", sleep)
        await call(app, "/v1/hold/s0", "key-globex-01", out, "POST")  # not held yet: at once, answered 200
        await call(app, "/v1/hold/g0", "key-globex-01", out)  # a read: no credit
        assert slept == [] and app.credits == {"globex": 1}
        shares.charge("globex", 6.0)  # now globex kept a turn busy 0.6 of the window: held
        await call(app, "/v1/jobs/j1/cancel", "key-globex-01", out, "POST")
        assert slept == [] and app.credits == {"globex": 0}, "its cancel of the work it was answered for: at once"
        await call(app, "/v1/jobs/j2/cancel", "key-globex-01", out, "POST")
        assert len(slept) == 1 and slept[0] > 0, "no credit left: its cancel waits as any request"
        await call(app, "/v1/hold/s1", "key-globex-01", out, "POST")
        assert len(slept) == 2 and app.credits == {"globex": 1}, "a write waits, and its answer gives a credit"
        await call(app, "/v1/hold/a0", "key-acme-0001", out, "POST")
        assert len(slept) == 2 and app.credits == {"globex": 1, "acme": 1}, "the light one at once; its credit its own"

    asyncio.run(scenario())
