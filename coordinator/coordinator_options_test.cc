#include "coordinator/coordinator_options.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

CoordinatorOptions Options(int layers, int experts, int expected) {
  CoordinatorOptions options;
  options.num_moe_layers = layers;
  options.num_experts = experts;
  options.expected_expert_nodes = expected;
  return options;
}

TEST(CoordinatorOptionsTest, RejectsInconsistentValues) {
  EXPECT_TRUE(Options(3, 8, 2).Validate().ok());
  EXPECT_FALSE(Options(3, 0, 2).Validate().ok());   // layers without experts
  EXPECT_FALSE(Options(3, 8, 0).Validate().ok());   // nobody to place them on
  CoordinatorOptions dense = Options(0, 0, 0);
  EXPECT_FALSE(dense.Validate().ok());  // ROLE_EXPERT required without experts
  dense.required_roles = {pb::ROLE_ATTENTION, pb::ROLE_ROUTER};
  EXPECT_TRUE(dense.Validate().ok());
  CoordinatorOptions o = Options(1, 4, 1);
  o.heartbeat_timeout = o.heartbeat_interval;
  EXPECT_FALSE(o.Validate().ok());
  o = Options(1, 4, 1);
  o.required_roles = {pb::ROLE_ROUTER, pb::ROLE_ROUTER};
  EXPECT_FALSE(o.Validate().ok());
  o.required_roles = {pb::ROLE_COORDINATOR};
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace k3
