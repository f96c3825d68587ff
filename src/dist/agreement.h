// Checks that every rank of a job holds the same named values (the resolved configuration, less
// per-node keys), so that a rank started with another learning rate, seed or batch size stops the
// job at once, naming the keys and each rank's value, instead of diverging or failing later as a
// timeout, a truncated message or a garbage count.
#pragma once

#include <span>
#include <string>
#include <utility>

#include "dist/communicator.h"

namespace verl::dist {

// Every rank calls it with its (name, value) pairs in the same order; an Error on every rank lists
// the names whose values differ (up to 8, with each rank's value) and says what `what` is.
void check_same_on_every_rank(Communicator& comm,
                              std::span<const std::pair<std::string, std::string>> items,
                              const std::string& what);

}  // namespace verl::dist
