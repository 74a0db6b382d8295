// The HTTP front as a node role (cluster/node_runtime.h): RunHttpFront, and `k3serve http`.
#include <iostream>

#include "cluster/node_runtime.h"
#include "http_front/http_front.h"

namespace k3 {

int RunHttpFront(const HttpFrontOptions& options) {
  return RunProcessNode<HttpFront>("http front", options, [&options](HttpFront& front) {
    // Launchers and people read the address from this line.
    std::cout << "http address: " << options.host << ":" << front.port() << std::endl;
  });
}

Subcommand AddHttpFrontCommand(CLI::App* top) {
  return AddSubcommand(top, "http", "the OpenAI-compatible HTTP front of the attention workers",
                       AddHttpFrontFlags, RunHttpFront);
}

}  // namespace k3
