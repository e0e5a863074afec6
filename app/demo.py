"""`setflow demo` (`make demo`): the product end to end on this machine, with no server
installed: the embedded Redis and a SQLite file, the API, one worker process; a report job over
a sample dataset with a progress bar (the report printed), a two-question agent session with
each turn's resume path and timing (the second question's metric tool runs on the client: the
job waits for its answer, its worker is replaced meanwhile, and the answer resumes the session
from Redis), the web page's address; then everything stopped cleanly
(`--serve` keeps it running until Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

from app.client import Client
from app.serve import ApiServer, port_free, sigterm_as_ctrl_c
from runtime.db import database_url
from runtime.embedded import EmbeddedRedis, from_url
from runtime.jobs import hosts
from runtime.jobs.routing import Routing
from runtime.settings import Settings, redact
from workers.local import spawn_worker, worker_env

DEMO_KEY = "setflow-demo-key"  # the demo's own tenant key (SETFLOW_API_KEYS overrides it)
DATA = {"tenant": "Northwind", "period": "2026-Q3", "style": "formal",
        "metrics": [{"key": "revenue", "value": "1240", "prev": "1105", "target": "1300"},
                    {"key": "churn", "value": "2.4", "prev": "2.6", "target": "2.5"},
                    {"key": "latency", "value": "182", "prev": "190"}],
        "breakdown": {"kind": "region", "metric": "revenue",
                      "rows": [["EMEA", "512", "468"], ["APAC", "301", "318"], ["AMER", "427", "319"]]}}
REPORT = {"title": "Northwind quarterly review", "data": DATA,
          "outline": [{"title": "Revenue", "metrics": ["revenue"]}, {"title": "Customer health", "metrics": ["churn"]},
                      {"title": "Platform performance", "metrics": ["latency"]}]}
#: the same company's figures as the agent's dataset (PUT /v1/datasets/northwind): its revenue by
#: region in the report's two quarters, so that the report and the agent agree on every number
DATASET = [{"metric": "revenue", "region": region, "period": period, "value": value}
           for region, now, before in DATA["breakdown"]["rows"]  # type: ignore[index]
           for period, value in (("2026-Q2", before), ("2026-Q3", now))]
#: the client's own warehouse, which its metric tool reads (the second question's)
CLIENT_DATA = {("churn", "APAC", "2026-Q3"): "2.7", ("churn", "APAC", "2026-Q2"): "3.1"}
#: asked as the agent's questions are phrased ("What was churn in ...": the shipped model, asked
#: "What was the churn in ...", called the tool and then wrote no answer)
QUESTIONS = ("By how much did revenue in EMEA change from 2026-Q2 to 2026-Q3, in percent?",
             "What was churn in APAC in 2026-Q3?")


class Stack:
    """The embedded Redis (unless REDIS_URL), the API on a thread and worker processes.
    start() brings them up in that order; stop() takes down whatever is up (also after a start
    that failed halfway), and is not interrupted by a second Ctrl-C."""

    def __init__(self, settings: Settings, workers: int = 1, port: int | None = None) -> None:
        if not settings.api_keys:
            settings = settings.model_copy(update={"api_keys": {DEMO_KEY: "demo"}})
        self.s = settings
        self.key = next(iter(settings.api_keys))
        self.names = [f"demo-{i}" for i in range(workers)]
        self.port = port
        self.redis_server: EmbeddedRedis | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self._api: ApiServer | None = None
        self.logs = settings.data_dir / "logs"

    @property
    def api(self) -> ApiServer:
        if self._api is None:
            raise RuntimeError("the stack is not started")
        return self._api

    def start(self, timeout_s: float = 120.0) -> Stack:
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout_s: float) -> None:
        if not self.s.redis_url:
            self.redis_server = EmbeddedRedis(self.s.data_dir / "redis")
            self.s = self.s.model_copy(update={"redis_url": self.redis_server.start()})
        port = self.port
        if port is None and self.s.api_port and not port_free(self.s.api_host, self.s.api_port):
            print(f"setflow demo: port {self.s.api_port} is taken; the API takes a free one", flush=True)
            port = 0
        self._api = ApiServer(self.s, port=port)
        self._api.start()  # migrates the database before any worker opens it
        self.logs.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            self._launch(name)
        self._wait_alive(self.names, self.procs, timeout_s)

    def _launch(self, name: str) -> None:
        self.procs.append(spawn_worker(name, worker_env(self.s), self.logs))

    def _wait_alive(self, names: list[str], procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
        client = from_url(str(self.s.redis_url))
        routing, deadline = Routing(client, self.s), time.monotonic() + timeout_s
        try:
            for name, p in zip(names, procs):
                # alive, and its model's card published: what the API checks submissions against
                while not routing.alive(name) or hosts.read(client, self.s) is None:
                    if p.poll() is not None or time.monotonic() > deadline:
                        tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                        raise RuntimeError(f"worker {name} did not start:\n{tail}")
                    time.sleep(0.1)
        finally:
            client.close()

    def replace_worker(self, timeout_s: float = 120.0) -> tuple[str, str]:
        """Stop the first worker (a warm shutdown) and start a new one: what a deploy or a
        crash does to a session's warm state.  Returns (old name, new name)."""
        old, p = self.names.pop(0), self.procs.pop(0)
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
        new = f"demo-{len(self.names) + int(old.rsplit('-', 1)[1]) + 1}"
        self.names.append(new)
        self._launch(new)
        self._wait_alive([new], [self.procs[-1]], timeout_s)
        return old, new

    def stop(self) -> None:
        """Warm shutdown: SIGTERM to each worker (it finishes its job in flight; SIGKILL after
        30 s), then the API, then the embedded Redis if this stack started it."""
        with _no_interrupts():
            for p in self.procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in self.procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            self.procs = []
            try:
                if self._api is not None:
                    self._api.stop()
            finally:
                if self.redis_server is not None and self.redis_server.owned:
                    self.redis_server.stop()


@contextmanager
def _no_interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM ignored meanwhile (from the main thread; elsewhere there is none to ignore)."""
    try:
        old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _follow(c: Client, job_id: str, label: str) -> dict[str, Any]:
    """The job's events with a progress bar (sections), then the finished job."""
    bar = tqdm(total=1, desc=label, unit="section", leave=True, file=sys.stdout, ncols=80)
    done: dict[str, Any] = {}
    for ev in c.events(job_id):
        if ev["event"] == "progress" and ev.get("sections") and (ev["section"], ev["sections"]) != (bar.n, bar.total):
            bar.total = ev["sections"]
            bar.n = ev["section"]
            bar.set_postfix_str(str(ev.get("title", ""))[:24], refresh=False)
            bar.refresh()
        elif ev["event"] == "result":
            done = {k: v for k, v in ev.items() if k not in ("event", "id")}
    bar.close()
    return done


def _turns(result: dict[str, Any], paths: dict[int, str]) -> str:
    """Each turn of the job's result, with its path as the session's record has it (a turn the
    job decoded before it waited was replayed, not decoded, when it resumed: "done")."""
    return "\n".join(f"     turn {t['turn']}: {paths.get(t['turn'], t['path']):<9} decoded before the wait"
                     if t["path"] == "done" else
                     f"     turn {t['turn']}: {t['path']:<9} load {t['load_ms']:7.1f} ms, "
                     f"decode {t['decode_ms']:7.1f} ms, {t['tokens']} tokens" for t in result["turns"])


def run_demo(serve: bool = False, port: int | None = None) -> int:
    """The demo; SIGTERM stops it as Ctrl-C does: the worker, the API and the Redis it started."""
    try:
        with sigterm_as_ctrl_c():
            return _demo(serve, port)
    except KeyboardInterrupt:  # stopped before its end (what it started is stopped: _demo's finally)
        return 130


def _demo(serve: bool, port: int | None) -> int:
    stack = Stack(Settings(), port=port)
    t0 = time.perf_counter()
    print("setflow demo: starting the embedded Redis, the API and a worker ...", flush=True)
    try:
        stack.start()
    except RuntimeError as e:
        print(f"setflow demo: could not start: {e}", file=sys.stderr)
        return 1
    where = stack.s.redis_url
    print(f"   Redis {redact(str(where))}\n   database {redact(database_url(stack.s))}\n   API {stack.api.url} "
          f"(OpenAPI at {stack.api.url}/docs); worker {', '.join(stack.names)}; up in "
          f"{time.perf_counter() - t0:.1f} s\n", flush=True)
    try:
        with Client(stack.api.url, stack.key) as c:
            print("1) A report over the sample dataset: a section per outline item, each a turn of one session,\n"
                  "   then the key figures filled by infill.\n", flush=True)
            job = c.create_job("report", REPORT)
            done = _follow(c, job["id"], "   report")
            if done["status"] != "succeeded":
                print(f"   the report job {done['status']}: {done.get('error')}")
                return 1
            r = done["result"]
            print("\n   " + r["markdown"].strip().replace("\n", "\n   ") + "\n")
            facts = sum(x["facts_ok"] for x in r["sections"]), sum(x["facts_total"] for x in r["sections"])
            exact = r["figures"]["exact"] if r.get("figures") else None
            print(f"   facts read back from the sections: {facts[0]}/{facts[1]}; key figures filled exactly: {exact}; "
                  f"session {r['session']}\n")

            print("2) An agent session: two questions on one session.  The model writes tool calls; the runtime\n"
                  "   runs each tool and appends its result, and decoding resumes from the cached state.  The first\n"
                  "   question's tools read Northwind's own dataset (the report's revenue by region, uploaded as\n"
                  "   `northwind`); the second's metric tool runs on this client, which answers from its own data.\n",
                  flush=True)
            c.put_dataset("northwind", DATASET)
            session = None
            for i, q in enumerate(QUESTIONS):
                # the second question's metric tool runs here, on this client's own data: the job
                # waits for its answer holding no worker, and its worker is replaced meanwhile
                # (it declares the names its data knows: those of the question enter the model as slots)
                spec: dict[str, Any] = {"question": q, **({"client_tools": ["metric"], "names": sorted(
                    {n for key in CLIENT_DATA for n in key})} if i else {"dataset": "northwind"})}
                job = c.create_job("agent", spec, session=session)
                session = job["session"]
                print(f"   Q: {q}", flush=True)
                a = c.wait(job["id"], 300)
                if a["status"] == "requires_action":
                    calls = a["required_action"]["calls"]
                    print(f"   (the metric tool runs on this client: the job waits for its answer to "
                          f"{', '.join(x['call'] for x in calls)}; status requires_action, no worker holds it)")
                    old, new = stack.replace_worker()
                    print(f"   (worker {old} stopped, {new} started while it waited: nothing of the session is "
                          f"warm there)", flush=True)
                    answers = {x["id"]: CLIENT_DATA.get(tuple(x["arguments"].values()), "error: no such row")
                               for x in calls}
                    print(f"   the client answers {answers} from its own data", flush=True)
                    c.tool_outputs(job["id"], answers)
                    a = c.wait(job["id"], 300)
                if a["status"] != "succeeded":
                    print(f"   the agent job {a['status']}: {a.get('error')}")
                    return 1
                res = a["result"]
                for call in res["calls"]:
                    print(f"     tool {call['call']} -> {call['result']} ({call['by']})")
                paths = {t["index"]: t["path"] for t in c.get_session(session)["turns"]}
                print(f"   A: {res['answer']}\n   turns (how the session was resumed, and the timing):\n"
                      f"{_turns(res, paths)}\n")
        print(f"3) The web page (jobs, and decoding as it happens): {stack.api.url}/#key={stack.key}\n", flush=True)
        if serve:
            print("   serving until Ctrl-C ...", flush=True)
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0
    finally:
        stack.stop()
        print("setflow demo: stopped (worker, API, Redis).", flush=True)
