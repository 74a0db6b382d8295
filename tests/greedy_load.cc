#include "tests/greedy_load.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "attention_nodes/server/generate_client.h"
#include "cluster/test_wait.h"
#include "tests/cluster_testing.h"

namespace k3 {

GreedyLoad::GreedyLoad(std::string address, std::vector<std::vector<int32_t>> prompts,
                       std::vector<std::vector<int32_t>> expected, int clients,
                       int max_new_tokens, absl::Duration request_timeout)
    : address_(std::move(address)),
      prompts_(std::move(prompts)),
      expected_(std::move(expected)),
      clients_(clients),
      max_new_tokens_(max_new_tokens),
      request_timeout_(request_timeout) {
  for (int c = 0; c < clients_; ++c) threads_.emplace_back([this, c] { Run(c); });
}

GreedyLoad::~GreedyLoad() { Stop(); }

void GreedyLoad::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool GreedyLoad::WaitMore(int more, absl::Duration timeout) {
  const int target = completed() + more;
  return WaitFor([&] { return completed() >= target || failed() > 0; }, timeout) &&
         failed() == 0;
}

bool GreedyLoad::WaitFailed(absl::Duration timeout) {
  return WaitFor([&] { return failed() > 0; }, timeout);
}

int GreedyLoad::failed() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(failures_.size());
}

std::vector<std::string> GreedyLoad::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

absl::Time GreedyLoad::first_failure() const {
  absl::MutexLock lock(&mu_);
  return first_failure_;
}

absl::Duration GreedyLoad::longest_gap() const {
  absl::MutexLock lock(&mu_);
  return longest_gap_;
}

void GreedyLoad::ResetLongestGap() {
  absl::MutexLock lock(&mu_);
  longest_gap_ = absl::ZeroDuration();
}

void GreedyLoad::Run(int client) {
  for (int n = 0; !stop_; ++n) {
    const size_t p = (client + n * clients_) % prompts_.size();
    const std::string id = absl::StrCat("client-", client, "-", n);
    absl::Time last = absl::Now();
    auto on_tokens = [&](absl::Span<const int32_t>) {
      const absl::Time now = absl::Now();
      absl::MutexLock lock(&mu_);
      longest_gap_ = std::max(longest_gap_, now - last);
      last = now;
    };
    absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
        address_, GreedyRequest(id, prompts_[p], max_new_tokens_), request_timeout_, on_tokens);
    const absl::Time end = absl::Now();
    std::string failure;
    if (!outcome.ok()) {
      failure = outcome.status().ToString();
    } else if (outcome->tokens != expected_[p]) {
      failure = absl::StrCat("tokens ", absl::StrJoin(outcome->tokens, ","), " differ from ",
                             absl::StrJoin(expected_[p], ","));
    }
    absl::MutexLock lock(&mu_);
    longest_gap_ = std::max(longest_gap_, end - last);
    if (!failure.empty()) {
      std::cerr << id << " failed after " << absl::FormatDuration(end - last) << ": " << failure
                << std::endl;
      if (failures_.empty()) first_failure_ = end;
      failures_.push_back(absl::StrCat(id, ": ", failure));
    } else {
      ++completed_;
    }
  }
}

}  // namespace k3
