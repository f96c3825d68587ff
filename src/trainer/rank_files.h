// Before rank 0 publishes a checkpoint, every rank's own files (optimizer shards, LightweightSync
// carries) must be in the directory rank 0 is about to rename: a rank whose
// trainer.default_local_dir is another directory, or a node-local disk on a multi-node job, would
// otherwise leave a checkpoint without its shard behind a tracker that names it, and retention
// would then delete the older complete ones.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace verl::trainer {

// A collective: each rank reports the files it wrote under its `dir` (paths relative to it);
// rank 0 looks for every one under its own `dir`. Missing ones are an Error on every rank naming
// the rank, its host and directory, and the files, for checkpoint step `step`.
void verify_rank_files(dist::Communicator& comm, const std::filesystem::path& dir, int64_t step,
                       const std::vector<std::string>& wrote);

}  // namespace verl::trainer
