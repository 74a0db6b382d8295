#include "router/qb_tool.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

void WriteFloats(const std::string& path, const std::vector<float>& values) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(std::fwrite(values.data(), sizeof(float), values.size(), file), values.size());
  std::fclose(file);
}

struct ToolOutput {
  std::vector<float> bias;
  double maxvio_old = -1, maxvio_new = -1;
};

ToolOutput Parse(const std::string& text) {
  ToolOutput result;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    if (word == "maxvio_old") {
      in >> result.maxvio_old;
    } else if (word == "maxvio_new") {
      in >> result.maxvio_new;
    } else {
      result.bias.push_back(std::stof(word));
    }
  }
  return result;
}

// Slow routing by a full sort of s + b (lower id first on ties); returns MaxVio of the loads.
double SlowMaxVio(const std::vector<float>& scores, int n, int k, const std::vector<float>& bias) {
  std::vector<double> loads(n, 0.0);
  for (size_t t = 0; t < scores.size() / n; ++t) {
    const float* s = &scores[t * n];
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
    for (int c = 0; c < k; ++c) loads[order[c]] += 1;
  }
  double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / n;
  return (*std::max_element(loads.begin(), loads.end()) - mean) / mean;
}

class QbToolTest : public ::testing::Test {
 protected:
  static constexpr int kExperts = 12, kTopK = 3;
  static constexpr int64_t kTokens = 5000;

  void SetUp() override {
    dir_ = ::testing::TempDir();
    std::mt19937_64 rng(42);
    std::normal_distribution<double> normal(0.0, 1.0);
    scores_.resize(kTokens * kExperts);
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int j = 0; j < kExperts; ++j) {
        double logit = 0.15 * j - 0.8 + normal(rng);
        scores_[t * kExperts + j] = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
      }
    }
    bias_.resize(kExperts);
    for (int j = 0; j < kExperts; ++j) bias_[j] = 0.02f * (j % 5) - 0.03f;
    WriteFloats(dir_ + "/scores.f32", scores_);
    WriteFloats(dir_ + "/bias.f32", bias_);
  }

  QbToolOptions Options() const {
    QbToolOptions options;
    options.scores_path = dir_ + "/scores.f32";
    options.bias_path = dir_ + "/bias.f32";
    options.tokens = kTokens;
    options.experts = kExperts;
    options.top_k = kTopK;
    return options;
  }

  std::string dir_;
  std::vector<float> scores_;
  std::vector<float> bias_;
};

TEST_F(QbToolTest, PrintsACentredBiasAndBothMaxVios) {
  for (bool exact : {false, true}) {
    QbToolOptions options = Options();
    options.exact = exact;
    std::ostringstream out;
    ASSERT_TRUE(RunQbTool(options, out).ok());
    ToolOutput result = Parse(out.str());
    ASSERT_EQ(result.bias.size(), static_cast<size_t>(kExperts)) << out.str();
    double sum = std::accumulate(result.bias.begin(), result.bias.end(), 0.0);
    EXPECT_NEAR(sum, 0.0, 1e-5);
    EXPECT_NEAR(result.maxvio_old, SlowMaxVio(scores_, kExperts, kTopK, bias_), 1e-6);
    EXPECT_NEAR(result.maxvio_new, SlowMaxVio(scores_, kExperts, kTopK, result.bias), 1e-6);
    EXPECT_LT(result.maxvio_new, result.maxvio_old / 2) << "exact = " << exact;
  }
}

TEST_F(QbToolTest, HistogramAndExactModesAgreeWithinTheBinWidth) {
  QbToolOptions options = Options();
  std::ostringstream hist_out, exact_out;
  ASSERT_TRUE(RunQbTool(options, hist_out).ok());
  options.exact = true;
  ASSERT_TRUE(RunQbTool(options, exact_out).ok());
  ToolOutput hist = Parse(hist_out.str()), exact = Parse(exact_out.str());
  ASSERT_EQ(hist.bias.size(), exact.bias.size());
  // Range [min(b) - 1, max(b) + 1] in 1000 bins; centring moves both by their means, each within
  // one bin of the other.
  float lo = *std::min_element(bias_.begin(), bias_.end()) - 1;
  float hi = *std::max_element(bias_.begin(), bias_.end()) + 1;
  double width = (hi - lo) / 1000.0;
  for (int j = 0; j < kExperts; ++j) EXPECT_LE(std::fabs(hist.bias[j] - exact.bias[j]), 2 * width);
}

TEST_F(QbToolTest, BadInputGivesClearErrors) {
  std::ostringstream out;
  QbToolOptions options = Options();
  options.tokens = kTokens + 1;  // the file is one row short
  absl::Status status = RunQbTool(options, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("scores.f32"), std::string::npos) << status;

  options = Options();
  options.tokens = kTokens - 1;  // the file is one row long
  EXPECT_EQ(RunQbTool(options, out).code(), absl::StatusCode::kInvalidArgument);

  options = Options();
  options.scores_path = dir_ + "/missing.f32";
  EXPECT_EQ(RunQbTool(options, out).code(), absl::StatusCode::kNotFound);

  options = Options();
  options.top_k = kExperts;
  EXPECT_EQ(RunQbTool(options, out).code(), absl::StatusCode::kInvalidArgument);

  options = Options();
  options.bins = 0;
  EXPECT_EQ(RunQbTool(options, out).code(), absl::StatusCode::kInvalidArgument);

  std::vector<float> logits = scores_;
  logits[7] = 1.5f;  // not a sigmoid score
  WriteFloats(dir_ + "/logits.f32", logits);
  options = Options();
  options.scores_path = dir_ + "/logits.f32";
  status = RunQbTool(options, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("[0, 7]"), std::string::npos) << status;

  std::vector<float> bad_bias = bias_;
  bad_bias[2] = NAN;
  WriteFloats(dir_ + "/nan_bias.f32", bad_bias);
  options = Options();
  options.bias_path = dir_ + "/nan_bias.f32";
  EXPECT_EQ(RunQbTool(options, out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.str().empty());
}

}  // namespace
}  // namespace k3
