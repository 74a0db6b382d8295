// What the multi-process cluster tests share: random checkpoints, a LocalCluster of the k3serve
// binary the test depends on (data = ["//:k3serve"]), greedy requests, and the single-process
// answers to compare with. Test-only.
#ifndef K3SERVE_TESTS_CLUSTER_TESTING_H_
#define K3SERVE_TESTS_CLUSTER_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attention_nodes/server/generate_client.h"  // GreedyRequest, for the tests
#include "launcher/local_cluster.h"
#include "proto/generate.pb.h"

namespace k3 {

// A random checkpoint of the named config (k3-tiny, kimi-linear-tiny, ...) under $TEST_TMPDIR,
// written on the first call for each (config, seed, mxfp4); `mxfp4`: routed experts in the
// release's MXFP4 layout.
std::string RandomCheckpointDir(const std::string& config, uint64_t seed, bool mxfp4 = false);

// Options for a cluster of the k3serve binary next to the test (its runfiles), logging into a
// fresh folder under $TEST_TMPDIR and showing progress on stderr. Bounded: 60 s to start, 3 s
// per tier to stop.
LocalClusterOptions TestClusterOptions(const std::string& model, int attention, int routers,
                                       int experts, std::vector<int> expert_slots = {});

// The greedy tokens for each prompt of the plain one-sequence loop on the CPU (OracleGenerate),
// ending at eos or max_new_tokens.
absl::StatusOr<std::vector<std::vector<int32_t>>> SingleProcessTokens(
    const std::string& model, const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens);

// Prompts of different lengths with token ids below `vocab_size`, a function of `seed`.
std::vector<std::vector<int32_t>> TestPrompts(int count, int vocab_size, uint64_t seed);

// Runs a shell command (a client of a process under test: curl, node, the k3serve binary) and
// returns its stdout, whatever its exit status; its stderr goes to the test's log.
std::string CommandOutput(const std::string& command);

}  // namespace k3

#endif  // K3SERVE_TESTS_CLUSTER_TESTING_H_
