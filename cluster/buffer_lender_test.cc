#include "cluster/buffer_lender.h"

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

// What a retiree did, kept outside it so that a test can look after it is destroyed.
struct RetireeLog {
  absl::Mutex mu;
  std::vector<void*> released ABSL_GUARDED_BY(mu);
  bool destroyed ABSL_GUARDED_BY(mu) = false;
};

struct RetireeSeen {
  std::vector<void*> released;
  bool destroyed;
};

// A copy, so that no test holds the log's lock while it calls the lender (whose lock is taken
// first when a retiree records).
RetireeSeen Seen(RetireeLog& log) {
  absl::MutexLock lock(&log.mu);
  return {log.released, log.destroyed};
}

class RecordingRetiree final : public BufferLender::Retiree {
 public:
  explicit RecordingRetiree(std::shared_ptr<RetireeLog> log) : log_(std::move(log)) {}
  ~RecordingRetiree() override {
    absl::MutexLock lock(&log_->mu);
    log_->destroyed = true;
  }
  void Release(void* buffer) override {
    absl::MutexLock lock(&log_->mu);
    EXPECT_FALSE(log_->destroyed);
    log_->released.push_back(buffer);
  }

 private:
  std::shared_ptr<RetireeLog> log_;
};

std::set<void*> AsSet(const std::vector<void*>& buffers) {
  return std::set<void*>(buffers.begin(), buffers.end());
}

TEST(BufferLenderTest, LentBytesAreReadInPlace) {
  BufferLender lender;
  char buffer[] = "token rows";
  MessageBytes bytes = lender.Lend(buffer, 5);
  EXPECT_TRUE(bytes.lent());
  EXPECT_EQ(bytes.data(), buffer);
  EXPECT_EQ(bytes.view(), "token");
  EXPECT_EQ(lender.Outstanding(), 1);
  EXPECT_FALSE(lender.AnyReturned());
}

TEST(BufferLenderTest, GivenBackBuffersWaitForTheDriverUntilTaken) {
  BufferLender lender;
  char a[4], b[4], c[4];
  auto lent_a = std::make_unique<MessageBytes>(lender.Lend(a, sizeof(a)));
  auto lent_b = std::make_unique<MessageBytes>(lender.Lend(b, sizeof(b)));
  MessageBytes lent_c = lender.Lend(c, sizeof(c));
  EXPECT_EQ(lender.Outstanding(), 3);

  lent_a.reset();
  *lent_b = MessageBytes(std::string("owned"));  // assigning over a borrow ends it too
  EXPECT_TRUE(lender.AnyReturned());
  EXPECT_EQ(lender.Outstanding(), 3);  // given back, not yet freed

  EXPECT_EQ(AsSet(lender.TakeReturned()), (std::set<void*>{a, b}));
  EXPECT_FALSE(lender.AnyReturned());
  EXPECT_EQ(lender.Outstanding(), 1);
  EXPECT_TRUE(lender.TakeReturned().empty());
  EXPECT_EQ(lent_c.view().size(), sizeof(c));  // still lent
}

TEST(BufferLenderTest, MovingABorrowGivesTheBufferBackOnce) {
  BufferLender lender;
  char a[8];
  {
    MessageBytes first = lender.Lend(a, sizeof(a));
    MessageBytes second = std::move(first);
    MessageBytes third(std::move(second));
  }
  EXPECT_EQ(lender.TakeReturned(), std::vector<void*>{a});
  EXPECT_EQ(lender.Outstanding(), 0);
}

TEST(BufferLenderTest, RetireWithNothingLentFreesTheQueueAndDestroysTheRetireeAtOnce) {
  BufferLender lender;
  char a[4], b[4];
  lender.Lend(a, sizeof(a));  // given back at once
  lender.Lend(b, sizeof(b));
  auto log = std::make_shared<RetireeLog>();
  lender.Retire(std::make_unique<RecordingRetiree>(log));
  const RetireeSeen seen = Seen(*log);
  EXPECT_EQ(AsSet(seen.released), (std::set<void*>{a, b}));
  EXPECT_TRUE(seen.destroyed);
  EXPECT_EQ(lender.Outstanding(), 0);
}

TEST(BufferLenderTest, TheLastBufferBackAfterRetireDestroysTheRetiree) {
  auto lender = std::make_unique<BufferLender>();
  char a[4], b[4], c[4];
  lender->Lend(a, sizeof(a));  // given back before Retire: freed by it
  MessageBytes lent_b = lender->Lend(b, sizeof(b));
  MessageBytes lent_c = lender->Lend(c, sizeof(c));
  auto log = std::make_shared<RetireeLog>();
  lender->Retire(std::make_unique<RecordingRetiree>(log));
  lender.reset();  // the transport is gone; its borrowers are not
  EXPECT_EQ(Seen(*log).released, std::vector<void*>{a});
  EXPECT_FALSE(Seen(*log).destroyed);
  lent_b = MessageBytes();
  EXPECT_EQ(Seen(*log).released, (std::vector<void*>{a, b}));
  EXPECT_FALSE(Seen(*log).destroyed);
  lent_c = MessageBytes();
  EXPECT_EQ(Seen(*log).released, (std::vector<void*>{a, b, c}));
  EXPECT_TRUE(Seen(*log).destroyed);
}

TEST(BufferLenderTest, BorrowersOnManyThreadsGiveEveryBufferBackExactlyOnce) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 1000;
  std::vector<char> buffers(kThreads * kPerThread);
  BufferLender lender;
  std::vector<std::vector<MessageBytes>> lent(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      lent[t].push_back(lender.Lend(&buffers[t * kPerThread + i], 1));
    }
  }
  std::set<void*> freed;
  std::thread driver([&] {  // takes the queue while borrowers let go
    while (freed.size() < buffers.size()) {
      for (void* buffer : lender.TakeReturned()) EXPECT_TRUE(freed.insert(buffer).second);
    }
  });
  std::vector<std::thread> borrowers;
  for (int t = 0; t < kThreads; ++t) borrowers.emplace_back([&lent, t] { lent[t].clear(); });
  for (std::thread& borrower : borrowers) borrower.join();
  driver.join();
  std::set<void*> expected;
  for (char& byte : buffers) expected.insert(&byte);
  EXPECT_EQ(freed, expected);
  EXPECT_EQ(lender.Outstanding(), 0);
}

}  // namespace
}  // namespace k3
