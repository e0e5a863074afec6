// The Vercel AI SDK (`ai` with `@ai-sdk/openai`'s Responses provider) against setflow's
// Responses API: the README's agent question answered with a client-run `get_metric`, by
// generateText and by streamText over several steps, then a second question in each of the
// three ways a client goes on (the messages re-sent, previousResponseId, a conversation); and a
// get_weather(city, unit) of two parameters over a loop of two questions; get_fibonacci(n) and
// compare_cities(cities: string[]), of no string.
// Knows nothing of setflow beyond its URL and key (SETFLOW_URL, SETFLOW_KEY): it prints one JSON
// line per case, {case, ok, ...what the SDK returned, requests: the bodies it sent}, and the
// test (tests/clients/test_aisdk.py) judges them.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const BASE = process.env.SETFLOW_URL;
const KEY = process.env.SETFLOW_KEY;
const QUESTION = "What was churn in APAC in 2026-Q3?";
const FOLLOW_UP = "What was churn in APAC in 2026-Q2?";
const VALUES = { "2026-Q3": "2.7", "2026-Q2": "2.5" }; // the client's metric store

let requests = []; // what the SDK sent in the case running now
async function logged(url, init) {
  const seen = { method: init?.method ?? "GET", url: String(url) };
  try {
    seen.body = init?.body ? JSON.parse(init.body) : undefined;
  } catch {
    seen.body = String(init.body);
  }
  const res = await fetch(url, init);
  seen.status = res.status;
  if (res.status >= 400) seen.error = await res.clone().text();
  requests.push(seen);
  return res;
}

const openai = createOpenAI({ baseURL: `${BASE}/v1`, apiKey: KEY, fetch: logged });
const model = openai.responses("small");
const calls = []; // each get_metric call the SDK ran: its input

const zodMetric = tool({
  description: "a metric's value in a region and period",
  inputSchema: z.object({ metric: z.string(), region: z.string(), period: z.string() }),
  execute: async (input) => {
    calls.push(input);
    return VALUES[input.period] ?? "error: no such period";
  },
});
const jsonMetric = tool({
  description: "a metric's value in a region and period",
  inputSchema: jsonSchema({
    type: "object",
    properties: { metric: { type: "string" }, region: { type: "string" }, period: { type: "string" } },
    required: ["metric", "region", "period"],
    additionalProperties: false,
  }),
  execute: async (input) => {
    calls.push(input);
    return VALUES[input.period] ?? "error: no such period";
  },
});

// a function of two parameters (issue 51): setflow fills `unit` from what the question writes
// ("°F", "in C") and the model writes `city`; the SDK runs it and its words are the answer's
const WEATHER = "What's the weather in Paris in °F?";
const WEATHER_NEXT = "How warm is it in Lisbon right now, in C?";
const SKIES = { "Paris/f": "72 and sunny", "Lisbon/c": "21" }; // the client's weather service
const weather = tool({
  description: "The weather in a city, now",
  inputSchema: z.object({ city: z.string(), unit: z.enum(["c", "f"]) }),
  execute: async (input) => {
    calls.push(input);
    return SKIES[`${input.city}/${input.unit}`] ?? "error: no such city";
  },
});

// functions of no string (issue 51): a number the question writes as "the 10th", and an array of
// the names it lists ("Paris and Rome"); setflow fills each, the model writes its text
const fibonacci = tool({
  description: "The n-th Fibonacci number",
  inputSchema: z.object({ n: z.number().int() }),
  execute: async (input) => {
    calls.push(input);
    return input.n === 10 ? "55" : "error: not asked";
  },
});
const compare = tool({
  description: "Compares cities",
  inputSchema: z.object({ cities: z.array(z.string()) }),
  execute: async (input) => {
    calls.push(input);
    return "Rome is warmer";
  },
});

function summary(r) {
  return {
    text: r.text,
    finishReason: r.finishReason,
    steps: r.steps.map((s) => ({
      finishReason: s.finishReason,
      text: s.text,
      toolCalls: s.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
      toolResults: s.toolResults.map((c) => c.output),
      responseId: s.providerMetadata?.openai?.responseId,
    })),
    responseId: r.providerMetadata?.openai?.responseId,
  };
}

async function generate(args) {
  return summary(await generateText({ model, stopWhen: stepCountIs(5), ...args }));
}

async function stream(args) {
  const errors = [];
  const r = streamText({ model, stopWhen: stepCountIs(5), onError: ({ error }) => errors.push(String(error)), ...args });
  let deltas = "";
  for await (const d of r.textStream) deltas += d;
  const out = summary({
    text: await r.text,
    finishReason: await r.finishReason,
    steps: await r.steps,
    providerMetadata: await r.providerMetadata,
  });
  return { ...out, deltas, errors };
}

async function conversation() {
  const res = await logged(`${BASE}/v1/conversations`, {
    method: "POST",
    headers: { Authorization: `Bearer ${KEY}`, "Content-Type": "application/json" },
    body: JSON.stringify({}),
  });
  return (await res.json()).id;
}

const CASES = {
  // generateText: the call, its output "2.7", the answer; then the follow-up with the messages re-sent
  "generate-resent": async () => {
    const first = await generateText({ model, stopWhen: stepCountIs(5), tools: { get_metric: zodMetric }, prompt: QUESTION });
    const messages = [{ role: "user", content: QUESTION }, ...first.response.messages, { role: "user", content: FOLLOW_UP }];
    return { first: summary(first), second: await generate({ tools: { get_metric: zodMetric }, messages }) };
  },
  // the follow-up goes on from the first answer's response (providerOptions.openai.previousResponseId)
  "generate-previous": async () => {
    const first = await generate({ tools: { get_metric: jsonMetric }, prompt: QUESTION });
    const second = await generate({
      tools: { get_metric: jsonMetric },
      prompt: FOLLOW_UP,
      providerOptions: { openai: { previousResponseId: first.responseId } },
    });
    return { first, second };
  },
  // both questions in one conversation (providerOptions.openai.conversation)
  "generate-conversation": async () => {
    const id = await conversation();
    const opts = { providerOptions: { openai: { conversation: id } } };
    const first = await generate({ tools: { get_metric: zodMetric }, prompt: QUESTION, ...opts });
    const second = await generate({ tools: { get_metric: zodMetric }, prompt: FOLLOW_UP, ...opts });
    return { first, second, conversation: id };
  },
  // the weather function, its second question with the messages re-sent
  "generate-weather": async () => {
    const first = await generateText({ model, stopWhen: stepCountIs(5), tools: { get_weather: weather }, prompt: WEATHER });
    const messages = [{ role: "user", content: WEATHER }, ...first.response.messages, { role: "user", content: WEATHER_NEXT }];
    return { first: summary(first), second: await generate({ tools: { get_weather: weather }, messages }) };
  },
  // a number only, then an array: each a question of its own
  "generate-nostring": async () => ({
    first: await generate({ tools: { get_fibonacci: fibonacci }, prompt: "What is the 10th Fibonacci number?" }),
    second: await generate({ tools: { compare_cities: compare }, prompt: "Compare Paris and Rome" }),
  }),
  // streamed, its second question going on from the first answer's response
  "stream-weather": async () => {
    const first = await stream({ tools: { get_weather: weather }, prompt: WEATHER });
    const second = await stream({
      tools: { get_weather: weather },
      prompt: WEATHER_NEXT,
      providerOptions: { openai: { previousResponseId: first.responseId } },
    });
    return { first, second };
  },
  "stream-resent": async () => {
    const first = await streamText({ model, stopWhen: stepCountIs(5), tools: { get_metric: zodMetric }, prompt: QUESTION });
    for await (const _ of first.textStream);
    const messages = [{ role: "user", content: QUESTION }, ...(await first.response).messages, { role: "user", content: FOLLOW_UP }];
    const done = summary({ text: await first.text, finishReason: await first.finishReason, steps: await first.steps,
                           providerMetadata: await first.providerMetadata });
    return { first: done, second: await stream({ tools: { get_metric: zodMetric }, messages }) };
  },
  "stream-previous": async () => {
    const first = await stream({ tools: { get_metric: zodMetric }, prompt: QUESTION });
    const second = await stream({
      tools: { get_metric: zodMetric },
      prompt: FOLLOW_UP,
      providerOptions: { openai: { previousResponseId: first.responseId } },
    });
    return { first, second };
  },
  "stream-conversation": async () => {
    const id = await conversation();
    const opts = { providerOptions: { openai: { conversation: id } } };
    const first = await stream({ tools: { get_metric: zodMetric }, prompt: QUESTION, ...opts });
    const second = await stream({ tools: { get_metric: zodMetric }, prompt: FOLLOW_UP, ...opts });
    return { first, second, conversation: id };
  },
};

const only = process.argv.slice(2);
for (const [name, run] of Object.entries(CASES)) {
  if (only.length && !only.includes(name)) continue;
  requests = [];
  calls.length = 0;
  let line;
  try {
    line = { case: name, ok: true, ...(await run()) };
  } catch (e) {
    line = { case: name, ok: false, error: String(e?.stack ?? e), status: e?.statusCode, body: e?.responseBody };
  }
  console.log(JSON.stringify({ ...line, calls: [...calls], requests }));
}
