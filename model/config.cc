#include "model/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "model/json_value.h"

namespace k3 {
namespace {

using Json = nlohmann::json;

// Typed reads of one JSON object's fields. A missing field leaves the output untouched (it keeps
// its default); messages carry `path_` so a nested field reads "text_config.linear_attn_config.x".
class ObjectReader {
 public:
  // REQUIRES: object.is_object().
  ObjectReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

  const Json* Find(std::string_view name) const {
    auto it = object_.find(name);
    return it == object_.end() ? nullptr : &*it;
  }
  std::string Path(std::string_view name) const { return absl::StrCat(path_, Sv(name)); }

  absl::Status Int(std::string_view name, int* out) const {
    return Convert(name, out, [](const Json& v, std::string_view path) {
      return json::ToInt(v, path, INT_MIN, INT_MAX);
    });
  }
  absl::Status Int64(std::string_view name, int64_t* out) const {
    return Convert(name, out, [](const Json& v, std::string_view path) {
      return json::ToInt(v, path, INT64_MIN, INT64_MAX);
    });
  }
  absl::Status Float(std::string_view name, float* out) const {
    return Convert(name, out, json::ToFloat);
  }
  // Null resets the optional.
  absl::Status OptInt(std::string_view name, std::optional<int>* out) const {
    return Optional(name, out, &ObjectReader::Int);
  }
  absl::Status OptFloat(std::string_view name, std::optional<float>* out) const {
    return Optional(name, out, &ObjectReader::Float);
  }
  absl::Status Bool(std::string_view name, bool* out) const {
    return Typed(name, out, &Json::is_boolean, "true or false");
  }
  absl::Status String(std::string_view name, std::string* out) const {
    return Typed(name, out, &Json::is_string, "a string");
  }
  absl::Status IntList(std::string_view name, std::vector<int>* out, bool* present) const {
    *present = false;
    const Json* v = Find(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Path(name), " must be a list of integers, got ", json::Describe(*v)));
    }
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      K3_ASSIGN_OR_RETURN(
          auto r, json::ToInt((*v)[i], absl::StrCat(Path(name), "[", i, "]"), INT_MIN, INT_MAX));
      out->push_back(static_cast<int>(r));
    }
    *present = true;
    return absl::OkStatus();
  }

 private:
  // A number through `convert` (json::ToInt, json::ToFloat: a StatusOr of the value, its errors
  // naming the path).
  template <typename T, typename Converter>
  absl::Status Convert(std::string_view name, T* out, const Converter& convert) const {
    const Json* v = Find(name);
    if (v == nullptr) return absl::OkStatus();
    K3_ASSIGN_OR_RETURN(auto r, convert(*v, Path(name)));
    *out = static_cast<T>(r);
    return absl::OkStatus();
  }
  // Null resets the optional; any other value is read by `read` (Int, Float).
  template <typename T>
  absl::Status Optional(std::string_view name, std::optional<T>* out,
                        absl::Status (ObjectReader::*read)(std::string_view, T*) const) const {
    const Json* v = Find(name);
    if (v == nullptr) return absl::OkStatus();
    if (v->is_null()) {
      out->reset();
      return absl::OkStatus();
    }
    T value{};
    if (auto s = (this->*read)(name, &value); !s.ok()) return s;
    *out = value;
    return absl::OkStatus();
  }
  // A value of the JSON type `is` checks for, `what` naming it in the error.
  template <typename T>
  absl::Status Typed(std::string_view name, T* out, bool (Json::*is)() const noexcept,
                     std::string_view what) const {
    const Json* v = Find(name);
    if (v == nullptr) return absl::OkStatus();
    if (!(v->*is)()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Path(name), " must be ", Sv(what), ", got ", json::Describe(*v)));
    }
    *out = v->get<T>();
    return absl::OkStatus();
  }

  const Json& object_;
  std::string path_;
};

// Far above any real model; keeps per-layer tables of a hostile config small.
constexpr int kMaxLayers = 100000;

// A Kimi Linear file that does not mention a K3-only feature does not have it (see config.h).
void ApplyKimiLinearDefaults(ModelConfig* c) {
  c->hidden_act = Activation::kSilu;
  c->activation_situ_linear_beta.reset();
  c->mla_use_output_gate = false;
  c->linear_attn.gate_lower_bound.reset();
  c->linear_attn.use_full_rank_gate = false;
  c->routed_expert_hidden_size.reset();
  c->latent_moe_use_norm = false;
  c->attn_res_block_size.reset();
}

// K3's layer pattern generalized to L layers: full attention at every 4th layer and at the last.
void K3LayerPattern(int num_layers, LinearAttnConfig* la) {
  la->kda_layers.clear();
  la->full_attn_layers.clear();
  for (int l = 1; l <= num_layers; ++l) {
    (l % 4 == 0 || l == num_layers ? la->full_attn_layers : la->kda_layers).push_back(l);
  }
}

// Layers of 1..num_layers not in `listed` (entries out of range are left for validation).
std::vector<int> Complement(const std::vector<int>& listed, int num_layers) {
  std::vector<bool> taken(num_layers + 1, false);
  for (int l : listed) {
    if (l >= 1 && l <= num_layers) taken[l] = true;
  }
  std::vector<int> rest;
  for (int l = 1; l <= num_layers; ++l) {
    if (!taken[l]) rest.push_back(l);
  }
  return rest;
}

absl::Status CheckLayerCount(int num_layers) {
  if (num_layers >= 1 && num_layers <= kMaxLayers) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("num_hidden_layers must be in 1..", kMaxLayers, ", got ", num_layers));
}

// Fields that set the model's shapes. No default fits a checkpoint that omits one: K3's full-size
// value would only fail later, on the first tensor shape, with a confusing message.
constexpr std::string_view kRequiredFields[] = {
    "vocab_size",          "hidden_size",  "num_hidden_layers", "intermediate_size",
    "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim",    "qk_rope_head_dim",    "v_head_dim",  "num_experts"};
constexpr std::string_view kRequiredLinearAttnFields[] = {"num_heads", "head_dim",
                                                          "short_conv_kernel_size"};
// Required when num_experts is positive.
constexpr std::string_view kRequiredMoeFields[] = {"num_experts_per_token", "num_shared_experts",
                                                   "moe_intermediate_size"};

// InvalidArgument naming every required field the text config lacks. A K3 config needs
// linear_attn_config; a flat Kimi Linear one without it is all MLA (see config.h).
absl::Status CheckRequiredFields(const ObjectReader& r, bool kimi_linear_semantics) {
  std::vector<std::string> missing;
  auto check = [&missing](const ObjectReader& object, absl::Span<const std::string_view> names) {
    for (std::string_view name : names) {
      if (object.Find(name) == nullptr) missing.push_back(object.Path(name));
    }
  };
  check(r, kRequiredFields);
  const Json* la = r.Find("linear_attn_config");
  if (la == nullptr && !kimi_linear_semantics) missing.push_back(r.Path("linear_attn_config"));
  if (la != nullptr && la->is_object()) {
    check(ObjectReader(*la, r.Path("linear_attn_config.")),
          kRequiredLinearAttnFields);
  }
  const Json* experts = r.Find("num_experts");
  if (experts != nullptr && experts->is_number() &&
      experts->get<double>() > 0) {
    check(r, kRequiredMoeFields);
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("missing required field",
                                                 missing.size() > 1 ? "s" : "", ": ",
                                                 absl::StrJoin(missing, ", ")));
}

// hidden_act and its SiTU parameters.
absl::Status ParseActivation(const ObjectReader& r, ModelConfig* c) {
  std::string act;
  K3_RETURN_IF_ERROR(r.String("hidden_act", &act));
  if (!act.empty()) {
    if (act == "situ") {
      c->hidden_act = Activation::kSitu;
    } else if (act == "silu") {
      c->hidden_act = Activation::kSilu;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          r.Path("hidden_act"), " \"", act, "\" is not supported (only \"situ\" and \"silu\")"));
    }
  }
  K3_RETURN_IF_ERROR(r.Float("activation_situ_beta", &c->activation_situ_beta));
  if (r.Find("activation_situ_linear_beta") != nullptr) {
    K3_RETURN_IF_ERROR(r.OptFloat("activation_situ_linear_beta", &c->activation_situ_linear_beta));
  } else if (c->hidden_act == Activation::kSilu) {
    c->activation_situ_linear_beta.reset();
  }
  return absl::OkStatus();
}

// linear_attn_config, or the layer split a config without it implies (see config.h).
absl::Status ParseLinearAttn(const ObjectReader& r, bool kimi_linear_semantics, ModelConfig* c) {
  const Json* la_value = r.Find("linear_attn_config");
  if (la_value != nullptr && !la_value->is_null()) {
    if (!la_value->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(r.Path("linear_attn_config"),
                                                     " must be an object, got ",
                                                     json::Describe(*la_value)));
    }
    ObjectReader la(*la_value, r.Path("linear_attn_config."));
    LinearAttnConfig& l = c->linear_attn;
    K3_RETURN_IF_ERROR(la.Int("num_heads", &l.num_heads));
    K3_RETURN_IF_ERROR(la.Int("head_dim", &l.head_dim));
    K3_RETURN_IF_ERROR(la.Int("short_conv_kernel_size", &l.short_conv_kernel_size));
    K3_RETURN_IF_ERROR(la.OptFloat("gate_lower_bound", &l.gate_lower_bound));
    K3_RETURN_IF_ERROR(la.Bool("use_full_rank_gate", &l.use_full_rank_gate));
    bool has_kda = false, has_full = false;
    K3_RETURN_IF_ERROR(la.IntList("kda_layers", &l.kda_layers, &has_kda));
    K3_RETURN_IF_ERROR(la.IntList("full_attn_layers", &l.full_attn_layers, &has_full));
    if (!has_kda && !has_full) {
      K3LayerPattern(c->num_hidden_layers, &l);
    } else if (!has_kda) {
      l.kda_layers = Complement(l.full_attn_layers, c->num_hidden_layers);
    } else if (!has_full) {
      l.full_attn_layers = Complement(l.kda_layers, c->num_hidden_layers);
    }
  } else if (kimi_linear_semantics) {
    c->linear_attn.kda_layers.clear();
    c->linear_attn.full_attn_layers = Complement({}, c->num_hidden_layers);
  } else {
    K3LayerPattern(c->num_hidden_layers, &c->linear_attn);
  }
  return absl::OkStatus();
}

// The MoE fields (num_experts null means a dense model).
absl::Status ParseMoe(const ObjectReader& r, ModelConfig* c) {
  const Json* experts = r.Find("num_experts");
  if (experts != nullptr && experts->is_null()) {
    c->num_experts = 0;
  } else {
    K3_RETURN_IF_ERROR(r.Int("num_experts", &c->num_experts));
  }
  K3_RETURN_IF_ERROR(r.Int("num_experts_per_token", &c->num_experts_per_token));
  K3_RETURN_IF_ERROR(r.Int("num_shared_experts", &c->num_shared_experts));
  K3_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->moe_intermediate_size));
  K3_RETURN_IF_ERROR(r.OptInt("routed_expert_hidden_size", &c->routed_expert_hidden_size));
  K3_RETURN_IF_ERROR(r.Bool("latent_moe_use_norm", &c->latent_moe_use_norm));
  K3_RETURN_IF_ERROR(r.String("moe_router_activation_func", &c->moe_router_activation_func));
  K3_RETURN_IF_ERROR(r.Bool("moe_renormalize", &c->moe_renormalize));
  K3_RETURN_IF_ERROR(r.Float("routed_scaling_factor", &c->routed_scaling_factor));
  K3_RETURN_IF_ERROR(r.Bool("use_grouped_topk", &c->use_grouped_topk));
  K3_RETURN_IF_ERROR(r.Int("num_expert_group", &c->num_expert_group));
  K3_RETURN_IF_ERROR(r.Int("topk_group", &c->topk_group));
  K3_RETURN_IF_ERROR(r.String("topk_method", &c->topk_method));
  K3_RETURN_IF_ERROR(r.Int("first_k_dense_replace", &c->first_k_dense_replace));
  K3_RETURN_IF_ERROR(r.Int("moe_layer_freq", &c->moe_layer_freq));
  return absl::OkStatus();
}

absl::Status ParseTextConfig(const ObjectReader& r, bool kimi_linear_semantics, ModelConfig* c) {
  K3_RETURN_IF_ERROR(CheckRequiredFields(r, kimi_linear_semantics));
  int64_t vocab = c->vocab_size;
  K3_RETURN_IF_ERROR(r.Int64("vocab_size", &vocab));
  c->vocab_size = vocab;
  K3_RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size));
  K3_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers));
  K3_RETURN_IF_ERROR(CheckLayerCount(c->num_hidden_layers));
  K3_RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size));

  K3_RETURN_IF_ERROR(ParseActivation(r, c));
  K3_RETURN_IF_ERROR(r.Float("rms_norm_eps", &c->rms_norm_eps));
  K3_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));

  K3_RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads));
  K3_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c->num_key_value_heads));
  K3_RETURN_IF_ERROR(r.OptInt("q_lora_rank", &c->q_lora_rank));
  K3_RETURN_IF_ERROR(r.Int("kv_lora_rank", &c->kv_lora_rank));
  K3_RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &c->qk_nope_head_dim));
  K3_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &c->qk_rope_head_dim));
  K3_RETURN_IF_ERROR(r.Int("v_head_dim", &c->v_head_dim));
  K3_RETURN_IF_ERROR(r.Bool("mla_use_nope", &c->mla_use_nope));
  K3_RETURN_IF_ERROR(r.Bool("mla_use_output_gate", &c->mla_use_output_gate));

  K3_RETURN_IF_ERROR(ParseLinearAttn(r, kimi_linear_semantics, c));

  K3_RETURN_IF_ERROR(ParseMoe(r, c));

  K3_RETURN_IF_ERROR(r.OptInt("attn_res_block_size", &c->attn_res_block_size));
  K3_RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  for (auto [name, field] : {std::pair{"bos_token_id", &c->bos_token_id},
                             std::pair{"eos_token_id", &c->eos_token_id},
                             std::pair{"pad_token_id", &c->pad_token_id}}) {
    const Json* v = r.Find(name);
    if (v != nullptr && v->is_null()) {
      *field = -1;
    } else {
      K3_RETURN_IF_ERROR(r.Int64(name, field));
    }
  }
  return absl::OkStatus();
}

absl::Status Positive(int64_t value, std::string_view field) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(Sv(field), " must be positive, got ", value));
}

absl::Status PositiveFinite(float value, std::string_view field) {
  if (std::isfinite(value) && value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(Sv(field), " must be positive, got ", value));
}

// Every layer 1..L in exactly one of the two lists.
absl::Status ValidateLayerLists(const ModelConfig& c) {
  const int num_layers = c.num_hidden_layers;
  std::vector<const char*> owner(num_layers + 1, nullptr);
  for (auto [field, list] : {std::pair{"linear_attn_config.kda_layers", &c.linear_attn.kda_layers},
                             std::pair{"linear_attn_config.full_attn_layers",
                                       &c.linear_attn.full_attn_layers}}) {
    for (int layer : *list) {
      if (layer < 1 || layer > num_layers) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": layer ", layer,
                                                       " is out of range 1..", num_layers,
                                                       " (the lists are 1-based)"));
      }
      if (owner[layer] != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": layer ", layer,
                                                       " is listed twice (also in ", owner[layer],
                                                       ")"));
      }
      owner[layer] = field;
    }
  }
  for (int layer = 1; layer <= num_layers; ++layer) {
    if (owner[layer] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("linear_attn_config: layer ", layer,
                       " is in neither kda_layers nor full_attn_layers"));
    }
  }
  return absl::OkStatus();
}

// A field's value as JSON text: one overload per field type, so that ModelConfigToJson's key list
// reads the same for every field.
std::string JsonText(int value) { return absl::StrCat(value); }
std::string JsonText(int64_t value) { return absl::StrCat(value); }
std::string JsonText(bool value) { return value ? "true" : "false"; }
std::string JsonText(float value) { return json::FormatFloat(value); }
template <typename T>
std::string JsonText(const std::optional<T>& value) {
  return value ? JsonText(*value) : "null";
}
std::string JsonText(const std::vector<int>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}
std::string JsonText(std::string_view s) {
  std::string out;
  json::AppendQuoted(s, &out);
  return out;
}
// Without it a string literal would take the bool overload (a standard conversion).
std::string JsonText(const char* s) { return JsonText(std::string_view(s)); }

std::string TokenId(int64_t id) { return id < 0 ? "null" : absl::StrCat(id); }

// Renders `fields` (already formatted values) as a JSON object indented by `indent` spaces.
std::string Object(const std::vector<std::pair<std::string, std::string>>& fields, int indent) {
  std::string pad(indent + 2, ' ');
  std::string out = "{\n";
  for (size_t i = 0; i < fields.size(); ++i) {
    absl::StrAppend(&out, pad, JsonText(fields[i].first), ": ", fields[i].second,
                    i + 1 < fields.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&out, std::string(indent, ' '), "}");
  return out;
}

// linear_attn_config's shapes (the layer lists are checked by ValidateLayerLists).
absl::Status ValidateLinearAttn(const LinearAttnConfig& la) {
  K3_RETURN_IF_ERROR(Positive(la.num_heads, "linear_attn_config.num_heads"));
  K3_RETURN_IF_ERROR(Positive(la.head_dim, "linear_attn_config.head_dim"));
  K3_RETURN_IF_ERROR(Positive(la.short_conv_kernel_size, "linear_attn_config.short_conv_kernel_size"));
  if (la.gate_lower_bound &&
      !(std::isfinite(*la.gate_lower_bound) && *la.gate_lower_bound < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "linear_attn_config.gate_lower_bound must be negative, got ", *la.gate_lower_bound));
  }
  return absl::OkStatus();
}

// The MoE fields; a dense model (num_experts 0) ignores the rest.
absl::Status ValidateMoe(const ModelConfig& c) {
  if (c.num_experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_experts must not be negative, got ", c.num_experts));
  }
  if (c.num_experts > 0) {
    if (c.num_experts_per_token < 1 || c.num_experts_per_token > c.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("num_experts_per_token must be in 1..",
                                                     c.num_experts, " (num_experts), got ",
                                                     c.num_experts_per_token));
    }
    if (c.num_shared_experts < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_shared_experts must not be negative, got ", c.num_shared_experts));
    }
    K3_RETURN_IF_ERROR(Positive(c.moe_intermediate_size, "moe_intermediate_size"));
    if (c.routed_expert_hidden_size) {
      K3_RETURN_IF_ERROR(Positive(*c.routed_expert_hidden_size, "routed_expert_hidden_size"));
    }
    if (c.moe_router_activation_func != "sigmoid") {
      return absl::InvalidArgumentError(
          absl::StrCat("moe_router_activation_func \"", c.moe_router_activation_func,
                       "\" is not supported (only \"sigmoid\")"));
    }
    if (c.num_expert_group != 1 || c.topk_group != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_expert_group ", c.num_expert_group, " / topk_group ", c.topk_group,
          " is not supported: group-limited routing is unimplemented (both must be 1)"));
    }
    if (c.topk_method != "noaux_tc") {
      return absl::InvalidArgumentError(absl::StrCat("topk_method \"", c.topk_method,
                                                     "\" is not supported (only \"noaux_tc\")"));
    }
    K3_RETURN_IF_ERROR(PositiveFinite(c.routed_scaling_factor, "routed_scaling_factor"));
    K3_RETURN_IF_ERROR(Positive(c.moe_layer_freq, "moe_layer_freq"));
    if (c.first_k_dense_replace < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "first_k_dense_replace must not be negative, got ", c.first_k_dense_replace));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool ModelConfig::IsKda(int layer) const {
  const auto& kda = linear_attn.kda_layers;
  return std::find(kda.begin(), kda.end(), layer + 1) != kda.end();
}

bool ModelConfig::IsMoe(int layer) const {
  return num_experts > 0 && layer >= first_k_dense_replace && moe_layer_freq > 0 &&
         layer % moe_layer_freq == 0;
}

int ModelConfig::NumMoeLayers() const {
  int count = 0;
  for (int l = 0; l < num_hidden_layers; ++l) count += IsMoe(l) ? 1 : 0;
  return count;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  if (c.model_type != "kimi_k3" && c.model_type != "kimi_linear") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_type \"", c.model_type, "\" is not supported (only kimi_k3 and kimi_linear)"));
  }
  K3_RETURN_IF_ERROR(Positive(c.vocab_size, "vocab_size"));
  K3_RETURN_IF_ERROR(Positive(c.hidden_size, "hidden_size"));
  K3_RETURN_IF_ERROR(CheckLayerCount(c.num_hidden_layers));
  K3_RETURN_IF_ERROR(Positive(c.intermediate_size, "intermediate_size"));
  K3_RETURN_IF_ERROR(PositiveFinite(c.activation_situ_beta, "activation_situ_beta"));
  if (c.activation_situ_linear_beta) {
    K3_RETURN_IF_ERROR(
        PositiveFinite(*c.activation_situ_linear_beta, "activation_situ_linear_beta"));
  }
  K3_RETURN_IF_ERROR(PositiveFinite(c.rms_norm_eps, "rms_norm_eps"));

  K3_RETURN_IF_ERROR(Positive(c.num_attention_heads, "num_attention_heads"));
  K3_RETURN_IF_ERROR(Positive(c.num_key_value_heads, "num_key_value_heads"));
  if (c.q_lora_rank) K3_RETURN_IF_ERROR(Positive(*c.q_lora_rank, "q_lora_rank"));
  K3_RETURN_IF_ERROR(Positive(c.kv_lora_rank, "kv_lora_rank"));
  K3_RETURN_IF_ERROR(Positive(c.qk_nope_head_dim, "qk_nope_head_dim"));
  if (c.qk_rope_head_dim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("qk_rope_head_dim must not be negative, got ", c.qk_rope_head_dim));
  }
  K3_RETURN_IF_ERROR(Positive(c.v_head_dim, "v_head_dim"));
  if (!c.mla_use_nope) {
    return absl::InvalidArgumentError(
        "mla_use_nope false (rotary MLA) is not supported: K3 and Kimi Linear use NoPE");
  }

  K3_RETURN_IF_ERROR(ValidateLinearAttn(c.linear_attn));
  K3_RETURN_IF_ERROR(ValidateLayerLists(c));

  K3_RETURN_IF_ERROR(ValidateMoe(c));
  if (c.attn_res_block_size) {
    K3_RETURN_IF_ERROR(Positive(*c.attn_res_block_size, "attn_res_block_size"));
  }
  if (c.num_nextn_predict_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_nextn_predict_layers must not be negative, got ", c.num_nextn_predict_layers));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view text) {
  auto root = json::ParseObject(text);
  if (!root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", root.status().message()));
  }
  ObjectReader outer(*root, "");
  ModelConfig c;
  std::string outer_type;
  if (auto s = outer.String("model_type", &outer_type); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", s.message()));
  }
  const Json* text_config = outer.Find("text_config");
  const bool nested = text_config != nullptr && !text_config->is_null();
  if (nested) {
    if (!text_config->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("config: text_config must be an object, got ",
                                                     json::Describe(*text_config)));
    }
    if (outer_type.empty()) outer_type = "kimi_k3";
    if (outer_type != "kimi_k3") {
      return absl::InvalidArgumentError(
          absl::StrCat("config: model_type \"", outer_type,
                       "\" is not supported with a text_config (expected \"kimi_k3\")"));
    }
    ObjectReader inner(*text_config, "text_config.");
    std::string inner_type = "kimi_linear";
    if (auto s = inner.String("model_type", &inner_type); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config: ", s.message()));
    }
    if (inner_type != "kimi_linear") {
      return absl::InvalidArgumentError(
          absl::StrCat("config: text_config.model_type \"", inner_type,
                       "\" is not supported (expected \"kimi_linear\")"));
    }
  } else {
    if (outer_type.empty()) outer_type = "kimi_linear";
    if (outer_type != "kimi_linear" && outer_type != "kimi_k3") {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: model_type \"", outer_type, "\" is not supported (expected \"kimi_linear\" "
          "or \"kimi_k3\" with a text_config)"));
    }
  }
  c.model_type = outer_type;
  c.nested_text_config = nested;
  const bool kimi_linear_semantics = outer_type == "kimi_linear";
  if (kimi_linear_semantics) ApplyKimiLinearDefaults(&c);
  ObjectReader reader(nested ? *text_config : *root, nested ? "text_config." : "");
  if (auto s = ParseTextConfig(reader, kimi_linear_semantics, &c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", s.message()));
  }
  // The release nests quantization_config in text_config (spec §10); the top level is accepted
  // too. Both at once must agree.
  for (const ObjectReader* where : {&reader, &outer}) {
    const Json* q = where->Find("quantization_config");
    if (q == nullptr || q->is_null()) continue;
    auto parsed = ParseQuantizationConfig(*q, where->Path("quantization_config."));
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("config: ", parsed.status().message()));
    }
    if (c.quantization.has_value() && *c.quantization != *parsed) {
      return absl::InvalidArgumentError(
          "config: quantization_config appears in text_config and at the top level, and they "
          "differ");
    }
    c.quantization = *std::move(parsed);
  }
  if (auto s = ValidateModelConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", s.message()));
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::string file = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read model config ", file));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", file));
  auto config = ParseModelConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(file, ": ", config.status().message()));
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  const int indent = c.nested_text_config ? 2 : 0;
  const LinearAttnConfig& la = c.linear_attn;
  std::vector<std::pair<std::string, std::string>> linear_attn = {
      {"num_heads", JsonText(la.num_heads)},
      {"head_dim", JsonText(la.head_dim)},
      {"short_conv_kernel_size", JsonText(la.short_conv_kernel_size)},
      {"gate_lower_bound", JsonText(la.gate_lower_bound)},
      {"use_full_rank_gate", JsonText(la.use_full_rank_gate)},
      {"kda_layers", JsonText(la.kda_layers)},
      {"full_attn_layers", JsonText(la.full_attn_layers)},
  };
  std::vector<std::pair<std::string, std::string>> text = {
      {"model_type", JsonText(c.nested_text_config ? "kimi_linear" : c.model_type)},
      {"vocab_size", JsonText(c.vocab_size)},
      {"hidden_size", JsonText(c.hidden_size)},
      {"num_hidden_layers", JsonText(c.num_hidden_layers)},
      {"intermediate_size", JsonText(c.intermediate_size)},
      {"hidden_act", JsonText(c.hidden_act == Activation::kSitu ? "situ" : "silu")},
      {"activation_situ_beta", JsonText(c.activation_situ_beta)},
      {"activation_situ_linear_beta", JsonText(c.activation_situ_linear_beta)},
      {"rms_norm_eps", JsonText(c.rms_norm_eps)},
      {"tie_word_embeddings", JsonText(c.tie_word_embeddings)},
      {"num_attention_heads", JsonText(c.num_attention_heads)},
      {"num_key_value_heads", JsonText(c.num_key_value_heads)},
      {"q_lora_rank", JsonText(c.q_lora_rank)},
      {"kv_lora_rank", JsonText(c.kv_lora_rank)},
      {"qk_nope_head_dim", JsonText(c.qk_nope_head_dim)},
      {"qk_rope_head_dim", JsonText(c.qk_rope_head_dim)},
      {"v_head_dim", JsonText(c.v_head_dim)},
      {"mla_use_nope", JsonText(c.mla_use_nope)},
      {"mla_use_output_gate", JsonText(c.mla_use_output_gate)},
      {"linear_attn_config", Object(linear_attn, indent + 2)},
      {"num_experts", JsonText(c.num_experts)},
      {"num_experts_per_token", JsonText(c.num_experts_per_token)},
      {"num_shared_experts", JsonText(c.num_shared_experts)},
      {"moe_intermediate_size", JsonText(c.moe_intermediate_size)},
      {"routed_expert_hidden_size", JsonText(c.routed_expert_hidden_size)},
      {"latent_moe_use_norm", JsonText(c.latent_moe_use_norm)},
      {"moe_router_activation_func", JsonText(c.moe_router_activation_func)},
      {"moe_renormalize", JsonText(c.moe_renormalize)},
      {"routed_scaling_factor", JsonText(c.routed_scaling_factor)},
      {"use_grouped_topk", JsonText(c.use_grouped_topk)},
      {"num_expert_group", JsonText(c.num_expert_group)},
      {"topk_group", JsonText(c.topk_group)},
      {"topk_method", JsonText(c.topk_method)},
      {"first_k_dense_replace", JsonText(c.first_k_dense_replace)},
      {"moe_layer_freq", JsonText(c.moe_layer_freq)},
      {"attn_res_block_size", JsonText(c.attn_res_block_size)},
      {"num_nextn_predict_layers", JsonText(c.num_nextn_predict_layers)},
      {"bos_token_id", TokenId(c.bos_token_id)},
      {"eos_token_id", TokenId(c.eos_token_id)},
      {"pad_token_id", TokenId(c.pad_token_id)},
  };
  if (c.quantization.has_value()) {
    text.emplace_back("quantization_config", QuantizationConfigToJson(*c.quantization));
  }
  if (!c.nested_text_config) return Object(text, 0) + "\n";
  return Object({{"model_type", JsonText(c.model_type)}, {"text_config", Object(text, 2)}}, 0) +
         "\n";
}

}  // namespace k3
