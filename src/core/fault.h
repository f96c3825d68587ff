// Fault injection for crash tests: with VERL_FAULT_INJECT=<point>:<step> in the environment, the
// process kills itself with SIGKILL (as `kill -9` would) when it reaches that point at that step;
// with <point>:<step>:stop it stops itself (SIGSTOP: a stuck rank that neither answers nor exits);
// with <point>:<step>:error it throws a verl::Error there instead, to test that an error in that
// phase comes out as a message. Used by tests/e2e at exact places.
// fault_requested leaves the fault to the caller (<point>:<step>:<mode>).
#pragma once

#include <cstdint>

namespace verl {

void fault_point(const char* point, int64_t step);
// Whether VERL_FAULT_INJECT asks for <point>:<step>:<mode> (a fault the caller makes itself, such
// as "perturb": one rank's weights nudged to test the ranks' agreement check).
bool fault_requested(const char* point, int64_t step, const char* mode);

}  // namespace verl
