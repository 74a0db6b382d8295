#include "cluster/message_bytes.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(MessageBytesTest, OwnedStringKeepsItsAddressAcrossMoves) {
  std::string text(1000, 'a');
  const char* where = text.data();
  MessageBytes bytes(std::move(text));
  EXPECT_FALSE(bytes.lent());
  EXPECT_EQ(bytes.data(), where);
  MessageBytes moved(std::move(bytes));
  EXPECT_EQ(moved.data(), where);
  EXPECT_EQ(moved.size(), 1000u);
  EXPECT_TRUE(bytes.empty());  // NOLINT(bugprone-use-after-move): a moved-from one is empty
  EXPECT_EQ(std::move(moved).TakeString(), std::string(1000, 'a'));
}

TEST(MessageBytesTest, LentBufferIsGivenBackOnceWhenTheLastHolderLetsGo) {
  const char buffer[] = "lent bytes";
  int given_back = 0;
  {
    MessageBytes bytes = MessageBytes::Lent(buffer, 4, [&given_back] { ++given_back; });
    EXPECT_TRUE(bytes.lent());
    EXPECT_EQ(bytes.data(), buffer);
    EXPECT_EQ(bytes, "lent");
    MessageBytes moved(std::move(bytes));
    MessageBytes assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.data(), buffer);
    EXPECT_EQ(given_back, 0);
  }
  EXPECT_EQ(given_back, 1);
}

TEST(MessageBytesTest, AssigningOverALentBufferGivesItBack) {
  const char buffer[] = "abc";
  int given_back = 0;
  MessageBytes bytes = MessageBytes::Lent(buffer, 3, [&given_back] { ++given_back; });
  bytes = MessageBytes(std::string("owned"));
  EXPECT_EQ(given_back, 1);
  EXPECT_EQ(bytes, "owned");
  EXPECT_FALSE(bytes.lent());
}

TEST(MessageBytesTest, TakeStringCopiesALentBufferAndGivesItBack) {
  const char buffer[] = "xyz";
  int given_back = 0;
  MessageBytes bytes = MessageBytes::Lent(buffer, 3, [&given_back] { ++given_back; });
  std::string copy = std::move(bytes).TakeString();
  EXPECT_EQ(copy, "xyz");
  EXPECT_NE(copy.data(), buffer);
  EXPECT_EQ(given_back, 1);
}

}  // namespace
}  // namespace k3
