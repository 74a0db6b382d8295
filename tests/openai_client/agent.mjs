// Drives k3serve's agent features with the official OpenAI client and prints what it got as one
// JSON object for //tests:http_front_test to check: a tool-call round trip (tools declared,
// tool_choice "required" so that random weights call one, the tool's result sent back, the final
// answer), streamed and not; reasoning_content with thinking on; a json_schema answer.
//
//   node agent.mjs BASE_URL API_KEY MODEL
import OpenAI from 'openai';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city.',
    parameters: {
      type: 'object', additionalProperties: false, required: ['city', 'days'],
      properties: { city: { type: 'string', maxLength: 8 }, days: { type: 'integer' } },
    },
  },
}];
const question = [{ role: 'user', content: 'What is the weather in Paris?' }];
const noThinking = { chat_template_kwargs: { thinking: false } };
const result = {};

// The assistant's tool calls of a stream, from its deltas.
async function collectStream(stream) {
  const out = { calls: [], content: '', reasoning: '', chunks: 0 };
  for await (const chunk of stream) {
    ++out.chunks;
    for (const choice of chunk.choices) {
      out.content += choice.delta.content ?? '';
      out.reasoning += choice.delta.reasoning_content ?? '';
      for (const call of choice.delta.tool_calls ?? []) {
        out.calls[call.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
        const target = out.calls[call.index];
        if (call.id) target.id = call.id;
        if (call.function?.name) target.function.name = call.function.name;
        target.function.arguments += call.function?.arguments ?? '';
      }
      if (choice.finish_reason) out.finish_reason = choice.finish_reason;
    }
  }
  return out;
}

async function roundTrip(stream) {
  const request = {
    model, messages: question, tools, tool_choice: 'required', max_tokens: 200, temperature: 0,
    ...noThinking,
  };
  let calls, finish;
  if (stream) {
    const got = await collectStream(await client.chat.completions.create({ ...request, stream }));
    calls = got.calls;
    finish = got.finish_reason;
  } else {
    const completion = await client.chat.completions.create(request);
    calls = completion.choices[0].message.tool_calls;
    finish = completion.choices[0].finish_reason;
  }
  const messages = [...question, { role: 'assistant', content: null, tool_calls: calls }];
  for (const call of calls) {
    messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' });
  }
  const final = await client.chat.completions.create({
    model, messages, tools, max_tokens: 6, temperature: 0, ...noThinking });
  return {
    calls, finish_reason: finish,
    final_content: final.choices[0].message.content,
    final_finish_reason: final.choices[0].finish_reason,
    final_prompt_tokens: final.usage.prompt_tokens,
  };
}

result.tools = await roundTrip(false);
result.tools_stream = await roundTrip(true);

// Thinking on (the default): the answer is reasoning until the model closes its think section.
const thinking = { model, messages: question, max_tokens: 12, temperature: 0 };
const reasoned = await client.chat.completions.create(thinking);
result.reasoning = {
  reasoning_content: reasoned.choices[0].message.reasoning_content ?? null,
  content: reasoned.choices[0].message.content,
  prompt_tokens: reasoned.usage.prompt_tokens,
};
const reasonedStream = await collectStream(
  await client.chat.completions.create({ ...thinking, stream: true }));
result.reasoning_stream = { reasoning_content: reasonedStream.reasoning,
                            content: reasonedStream.content };

const schema = {
  type: 'object', additionalProperties: false, required: ['name', 'age', 'member'],
  properties: {
    name: { type: 'string', maxLength: 6 }, age: { type: 'integer' }, member: { type: 'boolean' },
  },
};
const structured = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'A person, as JSON.' }], max_tokens: 120,
  temperature: 0, ...noThinking,
  response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
});
result.json_schema = { schema, content: structured.choices[0].message.content,
                       finish_reason: structured.choices[0].finish_reason };
console.log(JSON.stringify(result));
