#include "launcher/restart_supervisor.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(RestartSupervisorTest, BackoffDoublesUpToTheCapAndIsLogged) {
  RestartPolicy policy;
  policy.max_failures_in_a_row = 10;
  RestartSupervisor supervisor(policy);
  absl::Time now = kT0;
  supervisor.Started("router-1", now);
  const std::vector<int64_t> expected_ms = {200, 400, 800, 1600, 3200, 5000, 5000};
  for (size_t i = 0; i < expected_ms.size(); ++i) {
    now += absl::Milliseconds(50);  // dies quickly every time
    RestartSupervisor::Decision d = supervisor.Exited("router-1", 128 + 9, now);
    ASSERT_FALSE(d.give_up) << i;
    EXPECT_EQ(d.attempt, static_cast<int>(i) + 1);
    EXPECT_EQ(d.delay, absl::Milliseconds(expected_ms[i])) << i;
    EXPECT_EQ(supervisor.NextDue(), now + d.delay);
    EXPECT_TRUE(supervisor.TakeDue(now + d.delay - absl::Milliseconds(1)).empty());
    now += d.delay;
    EXPECT_EQ(supervisor.TakeDue(now), std::vector<std::string>{"router-1"});
    EXPECT_TRUE(supervisor.TakeDue(now).empty()) << "a restart is due once";
    EXPECT_EQ(supervisor.NextDue(), absl::InfiniteFuture());
    supervisor.Started("router-1", now);
  }
  RestartSupervisor fresh(policy);
  fresh.Started("router-1", kT0);
  EXPECT_EQ(fresh.Exited("router-1", 128 + 9, kT0 + absl::Seconds(1)).message,
            "restarting router-1 (exit: killed by signal 9), attempt 1 in 200 ms");
}

TEST(RestartSupervisorTest, AHealthyRunResetsTheCount) {
  RestartSupervisor supervisor(RestartPolicy{});
  absl::Time now = kT0;
  supervisor.Started("expert-0", now);
  for (int i = 0; i < 3; ++i) {
    now += absl::Seconds(1);
    RestartSupervisor::Decision d = supervisor.Exited("expert-0", 1, now);
    now = d.due;
    supervisor.Started("expert-0", now);
  }
  now += absl::Seconds(10);  // a healthy run
  RestartSupervisor::Decision d = supervisor.Exited("expert-0", 1, now);
  EXPECT_FALSE(d.give_up);
  EXPECT_EQ(d.attempt, 1);
  EXPECT_EQ(d.delay, absl::Milliseconds(200));
  EXPECT_NE(d.message.find("exit: exit status 1"), std::string::npos) << d.message;
}

TEST(RestartSupervisorTest, GivesUpAfterTooManyFailuresInARow) {
  RestartPolicy policy;
  policy.max_failures_in_a_row = 2;
  RestartSupervisor supervisor(policy);
  absl::Time now = kT0;
  supervisor.Started("expert-1", now);
  supervisor.Started("router-0", now);
  for (int i = 0; i < 2; ++i) {
    now += absl::Seconds(1);
    RestartSupervisor::Decision d = supervisor.Exited("expert-1", 128 + 9, now);
    ASSERT_FALSE(d.give_up);
    now = d.due;
    supervisor.Started("expert-1", now);
  }
  // Other nodes count on their own.
  EXPECT_FALSE(supervisor.Exited("router-0", 128 + 9, now).give_up);
  RestartSupervisor::Decision d = supervisor.Exited("expert-1", 128 + 9, now + absl::Seconds(1));
  EXPECT_TRUE(d.give_up);
  EXPECT_NE(d.message.find("expert-1"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("giving up"), std::string::npos) << d.message;
  EXPECT_EQ(supervisor.TakeDue(absl::InfiniteFuture()), std::vector<std::string>{"router-0"});

  RestartPolicy off;
  off.max_failures_in_a_row = 0;
  RestartSupervisor never(off);
  never.Started("router-0", kT0);
  EXPECT_TRUE(never.Exited("router-0", 0, kT0 + absl::Hours(1)).give_up);
}

TEST(RestartSupervisorTest, PolicyValidation) {
  EXPECT_TRUE(RestartPolicy{}.Validate().ok());
  RestartPolicy bad;
  bad.max_backoff = absl::Milliseconds(100);
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = RestartPolicy{};
  bad.max_failures_in_a_row = -1;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
