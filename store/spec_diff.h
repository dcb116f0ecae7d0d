#ifndef ASYNCPS_STORE_SPEC_DIFF_H_
#define ASYNCPS_STORE_SPEC_DIFF_H_

#include <string>

#include "google/protobuf/message.h"

namespace asyncps {

// How a requested spec (TensorSpec or TableSpec) differs from the one a
// shard holds, field by field, for an ALREADY_EXISTS message an operator
// can act on: "optimizer.learning_rate is 0.01 on the shard, 0.5 asked;
// shape is [10] on the shard, [11] asked". "" when they are equal.
// REQUIRES: both are of the same message type.
std::string SpecDifferences(const google::protobuf::Message& held,
                            const google::protobuf::Message& asked);

}  // namespace asyncps

#endif  // ASYNCPS_STORE_SPEC_DIFF_H_
