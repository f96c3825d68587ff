// Opening files for reading with errors that name the file and its role: a missing or unreadable
// path, and a directory (which std::ifstream opens and then reads as an empty file).
#pragma once

#include <fstream>
#include <string>
#include <string_view>

namespace verl {

// Opens `path` into `f`; `what` names its role in the error ("config file", "--input"), which reads
// "cannot open <what> <path>: <reason>".
void open_for_reading(std::ifstream& f, const std::string& path, std::string_view what,
                      std::ios::openmode mode = std::ios::in);

// The whole file, with the errors of open_for_reading and of a failed read.
std::string read_file(const std::string& path, std::string_view what);

}  // namespace verl
