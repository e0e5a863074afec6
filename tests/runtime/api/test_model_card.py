"""The API learns the model from the card a worker publishes (it reads no model file): before any
card, a submission is a 503 no_model that changes nothing, while what needs no model works (a
session's page shows its stored input, without the output text); once a card is published the
same submission is accepted and the page decodes the output with the card's tokenizer."""

from __future__ import annotations

from collections.abc import Callable

from runtime.jobs import hosts as models
from tests.runtime.api.conftest import ACME, NARRATIVE, TURN, Api, shipped_card


def test_no_card_no_submission_then_a_card_and_it_is_accepted(make_api: Callable[..., Api]) -> None:
    api = make_api(card=False)
    sid = api.seed_session("acme", turns=1)
    before = api.snapshot()
    for path, body in ((f"/v1/sessions/{sid}/turns", TURN), ("/v1/jobs", {"kind": "narrative", "spec": NARRATIVE})):
        r = api.http.post(path, headers=ACME, json=body)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "no_model" and "start a worker" in err["message"] and int(r.headers["retry-after"]) >= 1
    bad = api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json={"text": "hi", "params": {"window": 0}})
    assert bad.status_code == 422  # a bad spec is refused as such, model or not
    assert api.snapshot() == before  # no job, no session (a token paid: checked after the rate limit)
    page = api.http.get(f"/v1/sessions/{sid}", headers=ACME)
    assert page.status_code == 200 and page.json()["turns"][0]["input"] == "Question 0?"
    assert page.json()["turns"][0]["output"] == ""  # no tokenizer yet

    models.publish(api.r, api.s, shipped_card())  # a worker has started
    r = api.http.post(f"/v1/sessions/{sid}/turns", headers=ACME, json=TURN)
    assert r.status_code == 202 and r.json()["status"] == "queued"
    assert api.http.get(f"/v1/sessions/{sid}", headers=ACME).json()["turns"][0]["output"] == " An answer."
