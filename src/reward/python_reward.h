// A Python scoring function in verl's form (custom_reward_function.path + name:
// compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict) run as a
// reward command: a small driver, shipped inside the binary, imports the user's file in a
// python3 process and answers the command protocol (reward/command_reward.h), so a Python reward
// gets the command's isolation, timeouts and per-row error counts. The binary links no Python.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace verl::reward {

struct PythonRewardSpec {
  std::string path;                                  // the user's .py file
  std::string name;                                  // the function in it
  std::string python = "python3";                    // the interpreter (looked up on PATH)
  nlohmann::json kwargs = nlohmann::json::object();  // reward_kwargs merged into each call
};

// Runs the driver once in check mode: python3 starts, the file imports and `name` is a callable.
// Throws an Error naming the file, the function and what went wrong (python3 missing, an import
// error with its last traceback line, no such function).
void check_python_reward(const PythonRewardSpec& spec);

// The /bin/sh command line that runs the driver over `spec` (for CommandRewardConfig::command).
std::string python_reward_command(const PythonRewardSpec& spec);

// The driver's source (tests print it; docs/rewards.md describes what it does).
const char* python_reward_driver();

}  // namespace verl::reward
