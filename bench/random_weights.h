// The weights of a random checkpoint for benches that run the model in process: written once per
// named config under $TMPDIR (/tmp without it) and kept there, so that later runs of the bench
// only load it.
#ifndef K3SERVE_BENCH_RANDOM_WEIGHTS_H_
#define K3SERVE_BENCH_RANDOM_WEIGHTS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/weights.h"

namespace k3 {

// All weights of the random checkpoint (seed 1) of the named config (model/config.h's
// NamedConfig) in the folder <temp>/<folder_prefix><config_name>, written there first unless it
// has a config.json already. The caller owns the weights; the folder stays.
absl::StatusOr<std::unique_ptr<ModelWeights>> CachedRandomWeights(const std::string& config_name,
                                                                  const std::string& folder_prefix);

}  // namespace k3

#endif  // K3SERVE_BENCH_RANDOM_WEIGHTS_H_
