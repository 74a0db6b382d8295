#include "tests/serve_process.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace k3 {

ServeProcess::~ServeProcess() {
  if (pid_ > 0) kill(pid_, SIGKILL);
  if (pipe_ != nullptr) pclose(pipe_);
}

absl::Status ServeProcess::Start(const std::string& binary, const std::string& model,
                                 const std::vector<std::string>& extra_flags) {
  std::string command = absl::StrCat("sh -c 'echo $$; exec ", binary, " serve --model ", model,
                                     " --host 127.0.0.1 --port 0 --http-port 0 --metrics-port 0");
  for (const std::string& flag : extra_flags) absl::StrAppend(&command, " ", flag);
  absl::StrAppend(&command, "'");
  pipe_ = popen(command.c_str(), "r");
  if (pipe_ == nullptr) return absl::UnavailableError("cannot start a shell");
  pid_ = std::atoi(ReadLine().c_str());
  while (generate_.empty() || http_.empty() || metrics_.empty()) {
    const std::string line = ReadLine();
    if (line.empty()) {
      return absl::UnavailableError(absl::StrCat("`", command, "` exited before serving"));
    }
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "generate address: ")) generate_ = std::string(rest);
    if (absl::ConsumePrefix(&rest, "http address: ")) http_ = std::string(rest);
    if (absl::ConsumePrefix(&rest, "metrics address: ")) metrics_ = std::string(rest);
  }
  return absl::OkStatus();
}

int ServeProcess::Stop() {
  if (pid_ <= 0 || pipe_ == nullptr) return -1;
  kill(pid_, SIGTERM);
  const int status = pclose(pipe_);  // the shell exec'ed k3serve: this is k3serve's status
  pipe_ = nullptr;
  pid_ = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string ServeProcess::ReadLine() {
  char line[1024];
  if (fgets(line, sizeof(line), pipe_) == nullptr) return "";
  return std::string(absl::StripTrailingAsciiWhitespace(line));
}

}  // namespace k3
