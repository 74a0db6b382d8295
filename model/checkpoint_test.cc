#include "model/checkpoint.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace k3 {
namespace {

std::string MakeDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/" + name;
  EXPECT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  return dir;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

void WriteConfig(const std::string& dir) {
  auto config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok());
  WriteText(dir + "/config.json", ModelConfigToJson(*config));
}

TensorToWrite U8(const std::string& name, char value) {
  return {name, DType::kU8, {1}, std::string(1, value)};
}

char ValueOf(const Checkpoint& ckpt, const std::string& name) {
  auto view = ckpt.Find(name);
  EXPECT_TRUE(view.ok()) << view.status();
  return view.ok() ? static_cast<char>(view->data[0]) : '?';
}

TEST(CheckpointTest, SingleFileFindsNamesWithOrWithoutPrefix) {
  const std::string dir = MakeDir("ckpt_single");
  WriteConfig(dir);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors",
                               {U8("language_model.model.norm.weight", 'a'), U8("lm_head.weight", 'b')})
                  .ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->config().num_hidden_layers, 9);
  EXPECT_EQ((*ckpt)->files().size(), 1u);
  EXPECT_EQ(ValueOf(**ckpt, "model.norm.weight"), 'a');
  EXPECT_EQ(ValueOf(**ckpt, "language_model.model.norm.weight"), 'a');
  EXPECT_EQ(ValueOf(**ckpt, "lm_head.weight"), 'b');
  EXPECT_EQ(ValueOf(**ckpt, "language_model.lm_head.weight"), 'b');
  EXPECT_TRUE((*ckpt)->Has("model.norm.weight"));
  EXPECT_FALSE((*ckpt)->Has("model.embed_tokens.weight"));
  auto missing = (*ckpt)->Find("model.embed_tokens.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("model.embed_tokens.weight"), std::string::npos);
  EXPECT_NE(missing.status().message().find(dir), std::string::npos);
}

void WriteShards(const std::string& dir) {
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00001-of-00002.safetensors",
                               {U8("a", '1'), U8("b", '2')})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors",
                               {U8("c", '3'), U8("d", '4')})
                  .ok());
}

TEST(CheckpointTest, ShardedIndex) {
  const std::string dir = MakeDir("ckpt_sharded");
  WriteConfig(dir);
  WriteShards(dir);
  WriteText(dir + "/model.safetensors.index.json",
            R"({"metadata": {"total_size": 4}, "weight_map": {
                 "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ(ValueOf(**ckpt, "a"), '1');
  EXPECT_EQ(ValueOf(**ckpt, "d"), '4');
  auto c = (*ckpt)->Find("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->file, dir + "/model-00002-of-00002.safetensors");
}

struct BadIndex {
  const char* index;
  const char* message;
};

TEST(CheckpointTest, BadIndexesGiveClearErrors) {
  const BadIndex cases[] = {
      {R"({"weight_map": {"a": "model-00003-of-00002.safetensors"}})",
       "model-00003-of-00002.safetensors"},
      {R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})",
       "maps tensor 'a' to model-00002-of-00002.safetensors, which does not contain it"},
      {R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})", "inside the directory"},
      {R"({"weight_map": {"a": 7}})", "weight_map entry 'a'"},
      {R"({"metadata": {}})", "no \"weight_map\""},
      {R"({"weight_map": )", "invalid JSON"},
  };
  for (const BadIndex& bad : cases) {
    const std::string dir = MakeDir("ckpt_bad_index");
    WriteConfig(dir);
    WriteShards(dir);
    WriteText(dir + "/model.safetensors.index.json", bad.index);
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_FALSE(ckpt.ok()) << bad.index;
    const std::string message(ckpt.status().message());
    EXPECT_NE(message.find(bad.message), std::string::npos)
        << "expected \"" << bad.message << "\" in: " << message;
    EXPECT_NE(message.find(dir), std::string::npos) << message;
  }
}

TEST(CheckpointTest, MissingPieces) {
  const std::string dir = MakeDir("ckpt_missing");
  auto no_config = Checkpoint::Open(dir);
  EXPECT_EQ(no_config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_config.status().message().find("config.json"), std::string::npos);
  WriteConfig(dir);
  auto no_weights = Checkpoint::Open(dir);
  EXPECT_EQ(no_weights.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_weights.status().message().find("model.safetensors"), std::string::npos);
  WriteText(dir + "/model.safetensors", "garbage");
  auto bad_file = Checkpoint::Open(dir);
  EXPECT_FALSE(bad_file.ok());
  EXPECT_NE(bad_file.status().message().find(dir + "/model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace k3
