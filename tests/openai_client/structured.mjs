// Structured output under load of seeds (issue 38), with the official OpenAI client: COUNT
// seeded requests over {thinking on, off} x {tool_choice required, a named function,
// json_object, json_schema strict with maxLength, numeric bounds, enum, nested objects}, each
// sent whole and streamed. Prints one JSON object for //tests:http_front_test, which checks each
// answer with python3-jsonschema: {"results": [{case, thinking, seed, schema, whole, stream}]},
// where whole and stream are {instance (the JSON text: content or the call's arguments), name
// (the called function, or null), finish_reason, calls (how many), reasoning}.
//
//   node structured.mjs BASE_URL API_KEY MODEL COUNT MAX_TOKENS
import OpenAI from 'openai';

const [baseURL, apiKey, model, countText, maxTokensText] = process.argv.slice(2);
const count = Number(countText);
const maxTokens = Number(maxTokensText);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const weather = {
  type: 'object', additionalProperties: false, required: ['city', 'days'],
  properties: { city: { type: 'string', maxLength: 8 },
                days: { type: 'integer', minimum: 1, maximum: 14 } },
};
const search = {
  type: 'object', additionalProperties: false, required: ['query'],
  properties: { query: { type: 'string', minLength: 1, maxLength: 20 },
                limit: { type: 'integer', exclusiveMinimum: 0, maximum: 50 } },
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather.',
                                  parameters: weather, strict: true } },
  { type: 'function', function: { name: 'search', description: 'Searches the web.',
                                  parameters: search, strict: true } },
];
const schemas = {
  max_length: {
    type: 'object', additionalProperties: false, required: ['name', 'motto'],
    properties: { name: { type: 'string', minLength: 1, maxLength: 12 },
                  motto: { type: 'string', maxLength: 5 } },
  },
  numeric_bounds: {
    type: 'object', additionalProperties: false, required: ['age', 'score', 'step', 'temp'],
    properties: { age: { type: 'integer', minimum: 0, maximum: 150 },
                  score: { type: 'number', exclusiveMinimum: 0, maximum: 1 },
                  step: { type: 'integer', multipleOf: 5, minimum: -20, exclusiveMaximum: 40 },
                  temp: { type: 'number', minimum: -273.15, maximum: 1e3 } },
  },
  enum: {
    type: 'object', additionalProperties: false, required: ['color', 'size', 'any'],
    properties: { color: { enum: ['red', 'green', 'blue'] },
                  size: { type: 'string', enum: ['S', 'M', 'XL'] },
                  any: { enum: [1, 2.5, null, true, 'x', [1, 'é'], { k: [null] }] },
                  fixed: { const: 'k3' } },
  },
  nested: {
    type: 'object', additionalProperties: false, required: ['user', 'tags', 'choice'],
    properties: {
      user: { type: 'object', additionalProperties: false, required: ['name', 'address'],
              properties: { name: { type: 'string', maxLength: 10 },
                            address: { type: 'object', additionalProperties: false,
                                       required: ['city', 'zip'],
                                       properties: { city: { type: 'string', maxLength: 8 },
                                                     zip: { type: 'integer', minimum: 10000,
                                                            maximum: 99999 } } } } },
      tags: { type: 'array', minItems: 1, maxItems: 3, items: { type: 'string', maxLength: 4 } },
      choice: { anyOf: [
        { type: 'object', additionalProperties: false, required: ['a'],
          properties: { a: { anyOf: [{ type: 'integer', minimum: 0, maximum: 9 },
                                     { type: 'null' }] } } },
        { type: 'string', maxLength: 3 },
      ] },
    },
  },
};
const modes = ['required', 'named_function', 'json_object', 'max_length', 'numeric_bounds', 'enum',
               'nested'];

function requestOf(mode, thinking, seed) {
  const request = {
    model, max_tokens: maxTokens, temperature: 1, seed,
    messages: [{ role: 'user', content: `Request ${seed}: answer in the asked format.` }],
    chat_template_kwargs: { thinking },
  };
  if (mode === 'required') {
    Object.assign(request, { tools, tool_choice: 'required' });
  } else if (mode === 'named_function') {
    Object.assign(request, { tools,
                             tool_choice: { type: 'function', function: { name: 'search' } } });
  } else if (mode === 'json_object') {
    request.response_format = { type: 'json_object' };
  } else {
    request.response_format = { type: 'json_schema',
                                json_schema: { name: mode, strict: true, schema: schemas[mode] } };
  }
  return request;
}

function answerOf(message, finishReason) {
  const calls = message.tool_calls ?? [];
  const reasoning = message.reasoning_content ?? '';
  if (calls.length > 0) {
    return { instance: calls[0].function.arguments, name: calls[0].function.name,
             finish_reason: finishReason, calls: calls.length, reasoning };
  }
  return { instance: message.content ?? '', name: null, finish_reason: finishReason, calls: 0,
           reasoning };
}

async function whole(request) {
  const completion = await client.chat.completions.create(request);
  return answerOf(completion.choices[0].message, completion.choices[0].finish_reason);
}

async function streamed(request) {
  const stream = await client.chat.completions.create({ ...request, stream: true });
  const message = { content: '', reasoning_content: '', tool_calls: [] };
  let finishReason = null;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      message.content += choice.delta.content ?? '';
      message.reasoning_content += choice.delta.reasoning_content ?? '';
      for (const call of choice.delta.tool_calls ?? []) {
        message.tool_calls[call.index] ??= { function: { name: '', arguments: '' } };
        const target = message.tool_calls[call.index];
        if (call.function?.name) target.function.name = call.function.name;
        target.function.arguments += call.function?.arguments ?? '';
      }
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
  }
  return answerOf(message, finishReason);
}

function schemaOf(mode, name) {
  if (mode === 'required' || mode === 'named_function') {
    return name === 'search' ? search : name === 'get_weather' ? weather : false;
  }
  return mode === 'json_object' ? { type: 'object' } : schemas[mode];
}

const results = [];
const started = Date.now();
for (let i = 0; i < count; ++i) {
  const mode = modes[i % modes.length];
  const thinking = Math.floor(i / modes.length) % 2 === 0;
  const request = requestOf(mode, thinking, 1000 + i);
  const result = { case: mode, thinking, seed: 1000 + i };
  try {
    result.whole = await whole(request);
    result.stream = await streamed(request);
  } catch (error) {
    result.error = String(error);
  }
  result.schema = schemaOf(mode, result.whole?.name ?? null);
  if (mode === 'named_function') result.expected_name = 'search';
  results.push(result);
}
console.log(JSON.stringify({ results, seconds: (Date.now() - started) / 1000 }));
