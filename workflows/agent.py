"""The `agent` job kind: the model writes text and tool calls; at each `</call>` the tool runs and
`<result>...</result>` is appended by prefill, and decoding resumes from the cached state, until
the model ends its answer (EOS), the call limit is reached or the session is full.

Each decoding segment (up to a call, or the answer) is a turn of the session, the tool's result
the next turn's input, so a job's session resumes from its cached state (warm, or from Redis on
another worker) and can be read, forked or continued with another question.
Tools: workflows/tools.py (their semantics are domain.agent's, as in training).

A tool the spec names in `client_tools` is run by the job's client: at its call the workflow
raises RequiresAction and the job waits, holding no worker; once the client has sent the output
the job runs again from the top, its committed turns replayed (not decoded) and the output read
where the call was (Turns.tool_output), so the session resumes after the call from its cached
state, on whichever worker takes it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from domain import agent as corpus
from model.params import DecodeError
from model.profiles import Profile
from runtime.errors import RequiresAction
from runtime.jobs.plans import agent_input
from runtime.jobs.specs import AgentSpec
from runtime.sessions.turn import TurnResult
from workflows import tools
from workflows.checked import Retry, check
from workflows.turn import Turns, decode_params, ended, summary, text_of, with_stops


def run(turns: Turns, spec: AgentSpec) -> dict[str, Any]:
    """Answer spec.question with tools; the result has the transcript, the calls with their
    results, the answer, why it ended, and each turn's summary (resume path, nfe, timing).

    The answer is checked (workflows/checked.py): it must state the number the last call
    returned, and no number that no result and no name in the question holds.  Its retry cannot
    be a turn after it (that would see the failed answer): it is the whole document again (the
    question, the calls and their results, as the turns wrote them) as one new input, a document
    of its own, and the answer decoded after it with greedy AR.
    An answer without a call to check it against (none made, the last one failed), or no answer
    (the call limit, the token limit, a full session), is not checked: `verified` is None."""
    tok = turns.tokenizer
    # `</call>` is one id in setflow's vocabularies, a multi-token stop sequence in another's
    end_call = Profile.markup(tok, corpus.END_CALL)
    params = decode_params(spec.params)
    seg = with_stops(turns, params, end_call)  # a segment ends at a call, at EOS or at the profile's stops
    # the calls' arguments copied from the question, the sample dataset and the results so far
    names = None
    if spec.guided:
        names = corpus.CallNames(spec.question) if spec.dataset else corpus.CallNames.sample(spec.question)
    data = corpus.Dataset(spec.dataset_seed)
    text_in = corpus.prompt_text(spec.question)
    ids = agent_input(tok, spec.question, turns.profile)
    doc: list[int] = []  # the document before the segment being decoded: every input, every segment
    pieces: list[str] = []  # the assistant's side: segments and results
    calls: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []  # each turn's summary
    session, finished, reason = "", False, "length"
    r: TurnResult | None = None
    while True:
        # 1) decode a segment: up to a call, the answer's EOS, or its token limit; its calls
        #    guided to copy the question's names and the numbers of the results so far
        guide = None if names is None else tools.CallGuide(
            tok, names.after(c["result"] for c in calls if c["ok"]), unguided=spec.client_tools)
        try:
            r = turns.turn(ids, replace(seg, guide=guide), text=text_in)
        except DecodeError as e:
            if e.code != "context_overflow" or not done:
                raise
            reason = "context"  # the session is full: the answer so far, not a failed job
            break
        session = r.session
        done.append(summary(r))
        doc += ids
        text = text_of(turns, r.tokens)
        pieces.append(text)
        if not at_call(r.tokens, end_call):  # EOS or a stop (the answer), or the segment's token limit
            finished = ended(turns, r.tokens)
            reason = "answer" if finished else "length"
            break
        doc += r.tokens
        if len(calls) == spec.max_calls:  # the call limit: this call is not run
            reason = "call_limit"
            break
        # 2) run the call (here, or its client does: the job waits for the output); its result
        #    is the next turn's input
        call = _run_call(turns, spec, text.rsplit(corpus.CALL, 1)[-1].removesuffix(corpus.END_CALL),
                         f"call_{len(calls) + 1}", data)
        calls.append(call)
        text_in = f"{corpus.RESULT}{call['result']}{corpus.END_RESULT}\n"
        pieces.append(text_in)
        ids = tok.encode(text_in)
        turns.report(calls=len(calls))
    verdict: dict[str, Any] = {"verified": None, "attempt": None, "problems": []}
    number = calls[-1]["result"] if calls and calls[-1]["ok"] else None
    if finished and r is not None and number is not None:
        # 3) the answer states the number the last call returned, or is decoded again
        def read(a: TurnResult) -> tuple[str, list[str]]:
            text = text_of(turns, a.tokens)
            if not ended(turns, a.tokens):
                return text, ["no answer: the segment ended at a call or its token limit"]
            if "A:" not in text:
                return text, ["no answer (A: ...) after the last result"]
            nums = corpus.answer_numbers(text.rsplit("A:", 1)[1])
            if number not in nums:
                return text, [f"the answer states {nums}, not {number}, the number the last call returned"]
            stray = corpus.stray_numbers(nums, spec.question, [c["result"] for c in calls])
            return text, [f"the answer states {stray} too, which no result and no name in the question holds"
                          ] if stray else []

        retry = Retry(doc, seg, corpus.prompt_text(spec.question) + "".join(pieces[:-1]))
        checked = check(turns, "answer", r, read, retry, allow_unverified=spec.allow_unverified)
        if checked.attempt == "ar_retry":  # the retry's segment is the transcript's last (flagged, it may not answer)
            pieces[-1] = checked.value
            done.append(summary(checked.turn))
            finished = ended(turns, checked.turn.tokens)
            reason = "answer" if finished else "length"
        verdict = checked.fields()
    transcript = "".join(pieces)
    answer = transcript.rsplit("A:", 1)[1].strip() if finished and "A:" in transcript else None
    return {"session": session, "question": spec.question, "text": transcript, "answer": answer, "calls": calls,
            "finished": finished, "reason": reason, "turns": done, **verdict}


def _run_call(turns: Turns, spec: AgentSpec, text: str, call_id: str, data: corpus.Dataset) -> dict[str, Any]:
    """One call's record ({"id", "call", "tool", "result", "ok", "by"}): run here, or its
    client's output (RequiresAction while there is none).  A call that does not parse is
    answered here (its error), whoever runs the tool it names."""
    if spec.client_tools:
        asked = tools.client_call(text, call_id)
        if isinstance(asked, dict) and asked["tool"] in spec.client_tools:
            output = turns.tool_output(call_id)
            if output is None:
                raise RequiresAction([asked])
            return {"id": call_id, "call": asked["call"], "tool": asked["tool"], "result": output,
                    "ok": not output.startswith("error:"), "by": "client"}
    if spec.dataset is None:  # the sample dataset: the same result every time
        run = tools.run_call(text, data)
        return {"id": call_id, "call": run.call.strip(), "tool": run.tool, "result": run.result, "ok": run.ok,
                "by": "server"}
    # the tenant's own dataset, which may change: what it answered is kept with the job, and a
    # rerun reads that back (the session holds that answer already)
    kept = turns.tool_output(f"server:{call_id}")
    if kept is None:
        run = tools.run_call(text, tools.Table.of(spec.dataset, turns.dataset(spec.dataset), spec.question))
        kept = json.dumps({"tool": run.tool, "result": run.result, "ok": run.ok})
        turns.keep_output(f"server:{call_id}", kept)
    return {"id": call_id, "call": text.strip(), **json.loads(kept), "by": "server"}


def at_call(tokens: list[int], end_call: list[int]) -> bool:
    """The segment stopped at a call: it ends with `</call>`'s ids."""
    return len(tokens) >= len(end_call) and tokens[-len(end_call):] == end_call
