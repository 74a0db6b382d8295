// k3serve: one binary for every role and tool; the first argument picks the subcommand.
#include <iostream>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "tools/local_commands.h"

namespace {

constexpr char kUsage[] = R"(usage: k3serve <command> [flags]

commands:
  random-checkpoint --config k3-tiny|k3-tiny-8|kimi-linear-tiny|k3-perf|FILE.json --seed N --out DIR [--shards N]
  logits    --model DIR --tokens 1,2,3 --out FILE [--decode]
  generate  (--model DIR | --server HOST:PORT) --tokens 1,2,3 --max-new-tokens N
            [--temperature T --top-p P --top-k K --seed S --stop-token-ids a,b]
  qb        --scores FILE --tokens T --experts N --top-k K [--bias FILE] [--bins B | --exact]
)";

}  // namespace

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "random-checkpoint") return k3::RandomCheckpointCommand(args);
  if (command == "logits") return k3::LogitsCommand(args);
  if (command == "generate") return k3::GenerateCommand(args);
  if (command == "qb") return k3::QbCommand(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << kUsage;
    return 0;
  }
  std::cerr << "k3serve: unknown command '" << command << "'\n" << kUsage;
  return 2;
}
