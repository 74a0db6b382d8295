#include "cluster/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "absl/time/clock.h"

extern char** environ;

namespace k3 {

std::unique_ptr<ChildProcess> ChildProcess::Spawn(const std::map<std::string, std::string>& env,
                                                  const std::vector<std::string>& wrapper,
                                                  const std::vector<std::string>& args) {
  char exe[4096];
  ssize_t exe_length = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (exe_length <= 0) return nullptr;
  std::vector<std::string> command = wrapper;
  command.push_back(std::string(exe, exe_length));
  command.insert(command.end(), args.begin(), args.end());
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) return nullptr;
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return nullptr;
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    if (!env.count(entry.substr(0, entry.find('=')))) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::unique_ptr<ChildProcess> child(new ChildProcess);
  int rc = posix_spawnp(&child->pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  child->in_ = to_child[1];
  child->out_ = from_child[0];
  if (rc != 0) return nullptr;
  return child;
}

ChildProcess::~ChildProcess() {
  Kill();
  close(in_);
  close(out_);
}

std::string ChildProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    pollfd p = {out_, POLLIN, 0};
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0 || poll(&p, 1, ms) != 1) return "timeout";
    char buf[4096];
    ssize_t n = read(out_, buf, sizeof(buf));
    if (n <= 0) return "eof";
    buffer_.append(buf, n);
  }
}

void ChildProcess::WriteLine(const std::string& line) {
  std::string text = line + "\n";
  ssize_t ignored = write(in_, text.data(), text.size());
  (void)ignored;
}

int ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (pid_ > 0) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (absl::Now() > deadline) return -1;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return -1;
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void DieWithParent() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) _exit(1);  // the parent is already gone
}

}  // namespace k3
