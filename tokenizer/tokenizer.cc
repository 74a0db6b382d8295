#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

// Ids after the base tokens that are special even when tokenizer_config.json does not name them
// (spec §1: an unnamed one is "<|reserved_token_{id}|>").
constexpr int32_t kReservedSpecialIds = 256;
// Ids past this are refused (the release's highest is 163,839), so that one past an id never
// overflows.
constexpr int32_t kMaxTokenId = 1 << 24;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return contents.str();
}

// "bos_token" is either the name or {"content": name, ...}.
std::optional<std::string> TokenName(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

struct ParsedConfig {
  std::vector<SpecialToken> specials;
  std::optional<std::string> bos, eos, pad, unk;
};

// nlohmann reports errors by throwing; this is the one place that catches them.
absl::StatusOr<ParsedConfig> ParseConfig(std::string_view text) {
  ParsedConfig parsed;
  if (text.empty()) return parsed;
  try {
    const nlohmann::json config = nlohmann::json::parse(text);
    if (!config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
    }
    if (auto decoder = config.find("added_tokens_decoder"); decoder != config.end()) {
      if (!decoder->is_object()) {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: added_tokens_decoder is not an object");
      }
      for (const auto& [key, token] : decoder->items()) {
        int32_t id = -1;
        if (!absl::SimpleAtoi(Sv(key), &id) || id < 0 || id >= kMaxTokenId) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tokenizer_config.json: added_tokens_decoder key \"", Sv(key), "\" is not an id"));
        }
        if (!token.is_object() || !token.contains("content") || !token["content"].is_string() ||
            token["content"].get<std::string>().empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tokenizer_config.json: added token ", id, " has no \"content\" string"));
        }
        parsed.specials.push_back({id, token["content"].get<std::string>()});
      }
    }
    parsed.bos = TokenName(config, "bos_token");
    parsed.eos = TokenName(config, "eos_token");
    parsed.pad = TokenName(config, "pad_token");
    parsed.unk = TokenName(config, "unk_token");
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", e.what()));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& dir) {
  K3_ASSIGN_OR_RETURN(const std::string ranks, ReadFile(absl::StrCat(dir, "/", kRanksFile)));
  K3_ASSIGN_OR_RETURN(const std::string config, ReadFile(absl::StrCat(dir, "/", kConfigFile)));
  return Create(ranks, config);
}

absl::StatusOr<Tokenizer> Tokenizer::Create(std::string_view tiktoken_model,
                                            std::string_view config_json,
                                            std::string_view pattern) {
  K3_ASSIGN_OR_RETURN(BpeRanks ranks, BpeRanks::Parse(tiktoken_model));
  K3_ASSIGN_OR_RETURN(Pretokenizer pretokenizer, Pretokenizer::Create(pattern));
  K3_ASSIGN_OR_RETURN(ParsedConfig config, ParseConfig(config_json));
  Tokenizer tokenizer(std::move(ranks), std::move(pretokenizer));
  int32_t end = tokenizer.ranks_->end();
  for (const SpecialToken& special : config.specials) {
    if (!tokenizer.ranks_->Bytes(special.id).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "special token ", Sv(special.name), " has id ", special.id, ", a base token's rank"));
    }
    if (!tokenizer.special_ids_.emplace(special.name, special.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("special token name ", Sv(special.name), " appears twice"));
    }
    tokenizer.special_names_[special.id] = special.name;
    end = std::max(end, special.id + 1);
  }
  for (SpecialToken& special : config.specials) {
    tokenizer.specials_by_first_byte_[special.name[0]].push_back(std::move(special));
  }
  for (auto& [first, specials] : tokenizer.specials_by_first_byte_) {
    std::sort(specials.begin(), specials.end(), [](const SpecialToken& a, const SpecialToken& b) {
      return a.name.size() > b.name.size();
    });
  }
  tokenizer.vocab_size_ = end;
  for (auto [name, id] : {std::pair{&config.bos, &tokenizer.named_ids_.bos},
                          std::pair{&config.eos, &tokenizer.named_ids_.eos},
                          std::pair{&config.pad, &tokenizer.named_ids_.pad},
                          std::pair{&config.unk, &tokenizer.named_ids_.unk}}) {
    if (!name->has_value()) continue;
    *id = tokenizer.SpecialTokenId(**name);
    if (!id->has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer_config.json names ", Sv(**name), ", which is not an added token"));
    }
  }
  return tokenizer;
}

absl::Status Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const {
  return pretokenizer_.ForEachPiece(text, [&](std::string_view piece) { ranks_->Encode(piece, ids); });
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  K3_RETURN_IF_ERROR(EncodeOrdinary(text, &ids));
  return ids;
}

const SpecialToken* Tokenizer::SpecialAt(std::string_view text) const {
  auto it = specials_by_first_byte_.find(text[0]);
  if (it == specials_by_first_byte_.end()) return nullptr;
  for (const SpecialToken& special : it->second) {
    if (text.substr(0, special.name.size()) == special.name) return &special;
  }
  return nullptr;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeWithSpecialTokens(
    std::string_view text) const {
  std::vector<int32_t> ids;
  size_t ordinary_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const SpecialToken* special = SpecialAt(text.substr(i));
    if (special == nullptr) continue;
    K3_RETURN_IF_ERROR(EncodeOrdinary(text.substr(ordinary_start, i - ordinary_start), &ids));
    ids.push_back(special->id);
    i += special->name.size() - 1;
    ordinary_start = i + 1;
  }
  K3_RETURN_IF_ERROR(EncodeOrdinary(text.substr(ordinary_start), &ids));
  return ids;
}

absl::Status Tokenizer::AppendTokenBytes(int32_t id, std::string* out) const {
  if (std::string_view bytes = ranks_->Bytes(id); !bytes.empty()) {
    out->append(bytes);
  } else if (auto it = special_names_.find(id); it != special_names_.end()) {
    out->append(it->second);
  } else if (IsSpecial(id)) {
    absl::StrAppend(out, "<|reserved_token_", id, "|>");
  } else {
    return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) K3_RETURN_IF_ERROR(AppendTokenBytes(id, &text));
  return text;
}

std::optional<int32_t> Tokenizer::SpecialTokenId(std::string_view name) const {
  auto it = special_ids_.find(Sv(name));
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  if (special_names_.contains(id)) return true;
  return id >= ranks_->end() && id < ranks_->end() + kReservedSpecialIds;
}

}  // namespace k3
