#include "base/text_file.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace k3 {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// The file's bytes as std::ifstream reads them, independently of the writer.
std::string ReadBack(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(WriteTextFileTest, WritesTheBytesAndReplacesAnOlderFile) {
  const std::string path = TempPath("text_file_test.txt");
  const std::string binary("line\r\nwith \0 a NUL\n", 19);
  ASSERT_TRUE(WriteTextFile(path, "an older, longer file's contents").ok());
  ASSERT_TRUE(WriteTextFile(path, binary).ok());
  EXPECT_EQ(ReadBack(path), binary);
  ASSERT_TRUE(WriteTextFile(path, "").ok());
  EXPECT_EQ(ReadBack(path), "");
}

TEST(WriteTextFileTest, MissingDirectoryIsAnInternalErrorNamingThePath) {
  const std::string path = TempPath("no_such_dir/file.txt");
  const absl::Status status = WriteTextFile(path, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "cannot write " + path);
}

}  // namespace
}  // namespace k3
