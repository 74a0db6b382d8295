#include "http_front/text_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "proto/generate.pb.h"

namespace k3 {

namespace v1 = k3serve::v1;

namespace {

// Appends a parsed delta to a piece (ChatDelta::Append: a call's arguments pieces merge).
void AddDelta(const ChatDelta& parsed, Choice* piece) {
  ChatDelta sum{.reasoning = std::move(piece->reasoning),
                .content = std::move(piece->text),
                .tool_calls = std::move(piece->tool_calls)};
  sum.Append(parsed);
  piece->reasoning = std::move(sum.reasoning);
  piece->text = std::move(sum.content);
  piece->tool_calls = std::move(sum.tool_calls);
}

}  // namespace

TextStream::TextStream(const Tokenizer& tokenizer, TextStreamOptions options)
    : tokenizer_(tokenizer),
      decoder_(tokenizer),
      options_(std::move(options)),
      matcher_(options_.stops) {
  if (options_.chat_format.has_value()) {
    chat_.emplace(*options_.chat_format, options_.thinking, options_.call_id_prefix);
  }
}

bool TextStream::Silent(int32_t id) const {
  const std::vector<int32_t>& stops = options_.stop_ids;
  return std::find(stops.begin(), stops.end(), id) != stops.end() ||
         (options_.skip_special_tokens && tokenizer_.IsSpecial(id));
}

void TextStream::Release(const std::string& text, Choice* piece) {
  if (text.empty()) return;
  if (!chat_.has_value()) {
    piece->text.append(matcher_.Push(text));
    return;
  }
  ChatDelta parsed;
  chat_->Text(text, &parsed);
  parsed.content = matcher_.Push(parsed.content);
  AddDelta(parsed, piece);
}

std::string TextStream::TokenText(int32_t id) const {
  absl::StatusOr<std::string> text = tokenizer_.Decode({id});
  return text.ok() ? *std::move(text) : std::string(kReplacementCharacter);
}

bool TextStream::Next(GenerateCall& call, Choice* piece) {
  v1::GenerateResponse response;
  if (!call.Next(&response)) return false;
  if (response.has_complete()) {
    const v1::Complete& complete = response.complete();
    if (complete.finish_reason() == v1::Complete::CANCELLED ||
        complete.finish_reason() == v1::Complete::ERROR) {
      error_ = absl::UnavailableError(
          absl::StrCat("the generation ended early: ", complete.message()));
      return false;
    }
    Release(decoder_.Finish(), piece);
    piece->text.append(matcher_.Finish());
    if (chat_.has_value()) {
      // A call whose close tag did not come is closed; one cut mid-arguments stays a prefix,
      // with finish_reason "length" or "stop" telling why.
      ChatDelta closing;
      chat_->Finish(&closing).IgnoreError();
      AddDelta(closing, piece);
    }
    finish_reason_ = complete.finish_reason() == v1::Complete::LENGTH ? "length" : "stop";
    if (finish_reason_ == "stop" && chat_.has_value() && chat_->tool_call_count() > 0) {
      finish_reason_ = "tool_calls";
    }
    return false;
  }
  const v1::TokenChunk& chunk = response.chunk();
  for (int i = 0; i < chunk.token_ids_size(); ++i) {
    const int32_t id = chunk.token_ids(i);
    ++generated_;
    const bool stop =
        std::find(options_.stop_ids.begin(), options_.stop_ids.end(), id) != options_.stop_ids.end();
    if (piece->logprobs.has_value() && i < chunk.logprobs_size() && !stop) {
      TokenLogprob entry{.token = TokenText(id), .logprob = chunk.logprobs(i).logprob()};
      for (const v1::TopLogprob& top : chunk.logprobs(i).top()) {
        entry.top.emplace_back(TokenText(top.token_id()), top.logprob());
      }
      piece->logprobs->push_back(std::move(entry));
    }
    if (chat_.has_value() && !stop && tokenizer_.IsSpecial(id)) {
      Release(decoder_.Finish(), piece);
      ChatDelta parsed;
      std::string name;
      if (tokenizer_.AppendTokenBytes(id, &name).ok()) chat_->Special(name, &parsed);
      AddDelta(parsed, piece);
      continue;
    }
    if (Silent(id)) continue;
    absl::StatusOr<std::string> text = decoder_.Push(id);
    Release(text.ok() ? *text : std::string(kReplacementCharacter), piece);
  }
  if (matcher_.stopped()) {
    finish_reason_ = "stop";
    call.Cancel();  // the worker stops generating and frees the request's state
    return false;
  }
  return true;
}

absl::Status TextStream::Error(GenerateCall& call) {
  if (!error_.ok()) return error_;
  K3_RETURN_IF_ERROR(call.Finish());
  return absl::InternalError("the Generate stream ended without a Complete message");
}

}  // namespace k3
