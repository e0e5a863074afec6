"""Fair shares of an API process (runtime/api/shares.py): a tenant that keeps its turns busier
than the others while they are active waits before its requests, for as long as its use takes
to decay to its cap; a tenant alone, one under the floor, and the light one never wait.  Pure
logic on a clock the test moves; then gate.Turns with a tenant held (its request starts after
the wait, another tenant's at once)."""

from __future__ import annotations

import asyncio
import math

import pytest

from runtime.api.gate import Turns
from runtime.api.shares import BUSY, LEAD, MAX_WAIT_S, ApiShares
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


def test_turns_hold_a_heavy_tenants_request_for_its_wait_and_not_anothers(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(s: float) -> None:  # a wait is recorded, not spent (settle's sleep(0)s are not waits)
        if s > 0:
            slept.append(s)
        await real_sleep(0)

    async def scenario() -> None:
        held, out = Held(), {}
        app = Turns(held, inflight=2, fair_window_s=10.0)
        app.shares.wait_s("acme")
        app.shares.charge("acme", 0.1)
        app.shares.wait_s("globex")
        app.shares.charge("globex", 6.0)  # globex kept a turn busy 0.6 of the window
        monkeypatch.setattr(asyncio, "sleep", sleep)
        first = call(app, "/v1/hold/a0", "key-acme-0001", out)
        await settle()
        assert held.started == ["a0"] and slept == [], "the light tenant at once"
        heavy = call(app, "/v1/hold/g0", "key-globex-01", out)
        await settle()
        assert held.started == ["a0", "g0"] and len(slept) == 1 and slept[0] > 0, "the heavy one after its wait"
        for name in ("a0", "g0"):
            held.gate(name).set()
        await asyncio.gather(first, heavy)
        assert out == {"/v1/hold/a0": 200, "/v1/hold/g0": 200}
        assert app.shares.use["globex"][0] > 6.0 * 0.99, "its request's turn was charged to it"

    asyncio.run(scenario())
