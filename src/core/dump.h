// Named intermediate tensors (llama.cpp's `cb(cur, "attn_norm", il)`): with VERL_DUMP=DIR set, a
// model writes each op's output as DIR/<model_tag>/<name>.npy and lists the names, in the order of
// the first forward, in DIR/<model_tag>/index.txt; first_divergence() names the first op of two
// dumps (CPU vs GPU, verl.cpp vs transformers) that disagree. The names are listed in
// docs/model.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace verl::dump {

// True when VERL_DUMP is set and non-empty (read once), or after set_dir() with a non-empty path.
// Cheap (one relaxed atomic load): models call it before every op they would dump.
bool enabled();
// Points the dump at `dir` (tests); "" turns dumping off. Either way a new run starts: the next
// write to a tag rewrites its index.txt from scratch.
void set_dir(const std::string& dir);
// The current dump directory ("" when disabled).
std::string dir();

// Writes DIR/<model_tag>/<name>.npy (NumPy v1.0, '<f4', C order) and, the first time `name` is
// written in this run, appends it to DIR/<model_tag>/index.txt. A later write of the same name
// (a second forward) overwrites the .npy only. Does nothing when disabled; throws verl::Error
// naming the path when the directory or file cannot be written.
void tensor(std::string_view model_tag, std::string_view name, const float* data,
            std::span<const int64_t> shape);
// Same, for bf16 data (widened to fp32 on the way out).
void tensor(std::string_view model_tag, std::string_view name, const uint16_t* bf16_data,
            std::span<const int64_t> shape);

// Writes a .npy file ('<f4', C order) at `path`; tensor() goes through it.
void write_npy(const std::string& path, const float* data, std::span<const int64_t> shape);
// Reads a '<f4' C-order .npy (ours, or numpy's); fills *shape when non-null. Throws verl::Error
// naming the file on a bad magic or header, another dtype, Fortran order, or a short file.
std::vector<float> read(const std::string& npy_path, std::vector<int64_t>* shape = nullptr);

// The first tensor (in reference order) where two dumps disagree.
struct Divergence {
  std::string name;         // e.g. "L3.q"
  int64_t index = -1;       // flat C-order index of the first failing element; -1: shapes differ
  double max_abs_diff = 0;  // max |value - ref| over the whole tensor (inf when shapes differ)
  double ref_value = 0, value = 0;  // the two values at `index` (NaN when shapes differ)
  int64_t compared = 0;             // names compared, this one included
  std::vector<int64_t> ref_shape, shape;
};

// Walks ref_dir/index.txt in order (ref_dir and dir are tag folders, e.g. DIR/cpu and DIR/cuda) and
// compares each name that has a .npy in both folders, element by element, with
// |value - ref| <= atol + rtol*|ref| (equal values, infinities included, and NaN against NaN
// agree). Returns the first name that fails, or nullopt when all agree. Throws when ref_dir has no
// index.
std::optional<Divergence> first_divergence(const std::string& ref_dir, const std::string& dir,
                                           double atol, double rtol);
// "first divergence at L3.q[17]: 0.1234 vs 0.1301 (|diff| 6.7e-03, max over the tensor 9.1e-02),
// after 12 names that agree"
std::string describe(const Divergence& d);

}  // namespace verl::dump
