"""A response job's event stream -> OpenAI's stream events (Translator), numbered in order, and
their read from Redis (events), which the SSE route and the WebSocket share; the response object
each carries is view.py's."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from anyio.to_thread import run_sync

from model.tokenizer import Tokenizer
from runtime.api.openai.forget import abandon, forget
from runtime.api.openai.view import output_items, status, view
from runtime.api.services import Services, close_fully
from runtime.tables import TERMINAL, JobRecord

KEEPALIVE_S = 15.0  # a stream quiet this long sends a keep-alive
STEP_EVENT = "setflow:step"  # an extension event: the implementor's slug, a colon, the event's name
TERMINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
                  "failed": "response.failed", "cancelled": "response.cancelled"}


class Translator:
    """A response job's events (runtime/jobs/events.py) -> OpenAI's stream events, numbered in
    order.  A pure function of the job's event stream and its final row: read again from the
    start (a client resuming after `starting_after`, an API restarted), it writes the same events
    with the same numbers, so the client skips what it has and misses nothing.

    Text deltas follow the committed prefix of a text response (its positions from `text_at`,
    the progress event the workflow sends before its turn): set diffusion commits out of order,
    and a token is final once committed, so a delta is never taken back.  An agent's answer is
    known once it is checked: its text comes whole at the end.  Where the request asked for them
    (`steps`: setflow.step_events), each set the model commits is also one `setflow:step` event
    (positions and their text; an extension event, named with setflow's prefix as the Open
    Responses spec names them), for clients that show sets where they land; a rerun's steps that
    say nothing new (the same positions) are not said again.  Not asked for, none is sent: a
    client that validates events refuses one it does not know."""

    def __init__(self, job: JobRecord, tok: Tokenizer | None, steps: bool = False) -> None:
        self.job, self.tok, self.steps = job, tok, steps
        self.seq = 0
        self.text_at: int | None = None
        self.tokens: dict[int, int] = {}  # position -> token, committed (a text response's)
        self.said = ""  # the text its deltas said
        self.seen: set[tuple[int, int]] = set()  # (turn, position) a step event said
        self.opened = False  # the message item and its part were said to be added
        #: the compaction item context_management made (it is whole from the start: said first),
        #: and where the message's output_index is
        self.compaction: dict[str, Any] | None = job.spec.get("request", {}).get("compaction")
        self.at = 0 if self.compaction is None else 1

    def _ev(self, kind: str, **data: Any) -> dict[str, Any]:
        e = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return e

    def start(self) -> list[dict[str, Any]]:
        out = [self._ev("response.created", response=view(self.job, snapshot="queued")),
               self._ev("response.in_progress", response=view(self.job, snapshot="in_progress"))]
        if self.compaction is not None:
            out += [self._ev("response.output_item.added", output_index=0, item=self.compaction),
                    self._ev("response.output_item.done", output_index=0, item=self.compaction)]
        return out

    def feed(self, ev: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one job event says (none for most)."""
        if ev.get("type") == "progress" and isinstance(ev.get("text_at"), int):
            self.text_at = ev["text_at"]
            return []
        if ev.get("type") != "step":
            return []
        turn, positions, tokens = int(ev.get("turn", 0)), ev.get("positions", []), ev.get("tokens", [])
        cut = ev.get("cut")
        new = [(p, t, x) for p, t, x in zip(positions, tokens, ev.get("pieces") or [""] * len(tokens))
               if (turn, p) not in self.seen]
        out = []
        self.seen.update((turn, p) for p, _, _ in new)
        if self.steps and (new or cut is not None):
            out.append(self._ev(STEP_EVENT, turn=turn, positions=[p for p, _, _ in new],
                                pieces=[x for _, _, x in new], cut=cut))
        if self.text_at is not None:
            for p, t, _ in new:
                self.tokens[p] = t
            if cut is not None:
                self.tokens = {p: t for p, t in self.tokens.items() if p < cut}
            out += self._delta(self._prefix())
        return out

    def _prefix(self) -> str:
        """The committed prefix's text, up to a special token (EOS: the text ends there), a
        character's first bytes held back until it is whole."""
        if self.tok is None or self.text_at is None:
            return self.said
        ids, p = [], self.text_at
        special = self.tok.specials.all()
        while p in self.tokens and self.tokens[p] not in special:
            ids.append(self.tokens[p])
            p += 1
        return self.tok.decode(ids, skip_special=True).rstrip("\ufffd")

    def _delta(self, text: str) -> list[dict[str, Any]]:
        if not text.startswith(self.said) or len(text) == len(self.said):
            return []
        out = self._open()
        out.append(self._ev("response.output_text.delta", item_id=f"msg_{self.job.id}_0", output_index=self.at,
                            content_index=0, delta=text[len(self.said):], logprobs=[]))
        self.said = text
        return out

    def _open(self) -> list[dict[str, Any]]:
        if self.opened:
            return []
        self.opened = True
        iid = f"msg_{self.job.id}_0"
        return [self._ev("response.output_item.added", output_index=self.at,
                         item={"type": "message", "id": iid, "status": "in_progress", "role": "assistant", "content": []}),
                self._ev("response.content_part.added", item_id=iid, output_index=self.at, content_index=0,
                         part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

    def finish(self, job: JobRecord) -> list[dict[str, Any]]:
        """The job has ended: its output items, done, and the terminal event."""
        self.job = job
        out: list[dict[str, Any]] = []
        items = output_items(job)
        if self.opened and len(items) == self.at:  # a text said in part, and no message came of it (failed, cancelled)
            iid, part = f"msg_{job.id}_0", {"type": "output_text", "text": self.said, "annotations": [], "logprobs": []}
            out += [self._ev("response.output_text.done", item_id=iid, output_index=self.at, content_index=0,
                             text=self.said, logprobs=[]),
                    self._ev("response.content_part.done", item_id=iid, output_index=self.at, content_index=0,
                             part=part),
                    self._ev("response.output_item.done", output_index=self.at, item={
                        "type": "message", "id": iid, "status": "incomplete", "role": "assistant", "content": [part]})]
        for i, item in enumerate(items):
            if i < self.at:  # the compaction item: said at the start
                continue
            if item["type"] == "message":
                text = item["content"][0]["text"]
                if i == self.at:
                    out += self._open()
                    rest = text[len(self.said):] if text.startswith(self.said) else ""
                else:
                    out.append(self._ev("response.output_item.added", output_index=i,
                                        item={**item, "status": "in_progress", "content": []}))
                    out.append(self._ev("response.content_part.added", item_id=item["id"], output_index=i,
                                        content_index=0, part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
                    rest = text
                if rest:
                    out.append(self._ev("response.output_text.delta", item_id=item["id"], output_index=i,
                                        content_index=0, delta=rest, logprobs=[]))
                out.append(self._ev("response.output_text.done", item_id=item["id"], output_index=i,
                                    content_index=0, text=text, logprobs=[]))
                out.append(self._ev("response.content_part.done", item_id=item["id"], output_index=i,
                                    content_index=0, part=item["content"][0]))
            else:
                out.append(self._ev("response.output_item.added", output_index=i,
                                    item={**item, "status": "in_progress", "arguments": ""}))
                out.append(self._ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                    delta=item["arguments"]))
                out.append(self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                    name=item["name"], arguments=item["arguments"]))
            out.append(self._ev("response.output_item.done", output_index=i, item=item))
        out.append(self._ev(TERMINAL_EVENT[status(job)], response=view(job)))
        return out


# ---- the read: a job's event stream as the response's events ----------------------------------

async def events(svc: Services, job: JobRecord, after: int,
                 drop: bool) -> AsyncGenerator[dict[str, Any] | None, None]:
    """The response's events with sequence_number > after: translated from the job's event
    stream from its start (JobEvents.follow; Translator: the same events and numbers on every
    read), the last ones from its row once it has ended.  None: KEEPALIVE_S went by without
    one.  `drop` (store false): forgotten at its end, abandoned where the reader leaves first.
    The SSE stream (routes.py) and a WebSocket (websocket.py) read it alike."""
    tr = Translator(job, await run_sync(svc.tokenizer, ""),
                                    steps=bool(job.spec.get("request", {}).get("step_events")))
    r = svc.aclient()  # made where the finally below closes it: no await between them
    try:
        for ev in tr.start():
            if ev["sequence_number"] > after:
                yield ev
        async with aclosing(svc.dispatcher.events.follow(r, job.id, lambda: run_sync(svc.jobs.get, job.id),
                                                         keepalive_s=KEEPALIVE_S)) as followed:
            async for got in followed:
                if got is None:
                    yield None
                elif not isinstance(got, JobRecord):
                    for ev in tr.feed(got[1]):
                        if ev["sequence_number"] > after:
                            yield ev
                elif got.status in TERMINAL:
                    for ev in tr.finish(got):
                        if ev["sequence_number"] > after:
                            yield ev
                    if drop:
                        drop = False
                        await run_sync(forget, svc, got)
    finally:
        if drop:  # the client left before the end (or this read failed): nobody can read it now
            abandon(svc, job)
        await close_fully(r)
