// ExpertAssignment: one (row, expert, weight) triple of a dispatch to an expert worker. Plain data;
// moe/moe_wire.h encodes it field by field in an ExpertRequest.
#ifndef K3SERVE_MOE_EXPERT_ASSIGNMENT_H_
#define K3SERVE_MOE_EXPERT_ASSIGNMENT_H_

#include <cstdint>

namespace k3 {

struct ExpertAssignment {
  int32_t row;     // index into the rows sent to the worker
  int32_t expert;  // global expert id
  float weight;    // router weight (renormalized and scaled)
};

}  // namespace k3

#endif  // K3SERVE_MOE_EXPERT_ASSIGNMENT_H_
