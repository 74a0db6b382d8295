// Drives /v1/chat/completions of k3serve's HTTP front with the official OpenAI client, streaming
// and not, with one choice and with two (n=2) carrying log-probabilities, and prints what it got
// as one JSON object for //tests:http_front_test to check.
//
//   node chat.mjs BASE_URL API_KEY MODEL PROMPT MAX_TOKENS
import OpenAI from 'openai';

const [baseURL, apiKey, model, prompt, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const request = {
  model,
  messages: [{ role: 'user', content: prompt }],
  max_tokens: Number(maxTokens),
  temperature: 0,
  chat_template_kwargs: { thinking: false },  // the answer is content
};

const result = {};
const completion = await client.chat.completions.create(request);
result.content = completion.choices[0].message.content;
result.finish_reason = completion.choices[0].finish_reason;
result.usage = completion.usage;

const stream = await client.chat.completions.create({
  ...request, stream: true, stream_options: { include_usage: true } });
result.stream_content = '';
result.stream_chunks = 0;
for await (const chunk of stream) {
  ++result.stream_chunks;
  if (chunk.usage) result.stream_usage = chunk.usage;
  for (const choice of chunk.choices) {
    result.stream_content += choice.delta.content ?? '';
    if (choice.finish_reason) result.stream_finish_reason = choice.finish_reason;
  }
}

// Two choices with log-probabilities, whole and streamed (the stream's pieces joined by choice).
const withLogprobs = { ...request, n: 2, logprobs: true, top_logprobs: 3 };
const two = await client.chat.completions.create(withLogprobs);
result.choices = two.choices.map((c) => ({
  index: c.index, content: c.message.content, finish_reason: c.finish_reason,
  logprobs: c.logprobs.content }));
result.choices_usage = two.usage;
const twoStream = await client.chat.completions.create({ ...withLogprobs, stream: true });
result.stream_choices = [];
for await (const chunk of twoStream) {
  for (const c of chunk.choices) {
    const out = (result.stream_choices[c.index] ??= { content: '', logprobs: [] });
    out.content += c.delta.content ?? '';
    out.logprobs.push(...(c.logprobs?.content ?? []));
    if (c.finish_reason) out.finish_reason = c.finish_reason;
  }
}

// A wrong key: the client raises its AuthenticationError with the server's status.
try {
  await new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).chat.completions.create(request);
  result.wrong_key_status = 200;
} catch (error) {
  result.wrong_key_status = error.status;
  result.wrong_key_type = error.type ?? error.error?.type;
}
console.log(JSON.stringify(result));
