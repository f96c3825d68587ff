// Deterministic fuzzing of the safetensors parser, built with AddressSanitizer + UBSan (see the
// end of CMakeLists.txt; the .cc suffix keeps the generic per-folder *.cpp test glob away from it).
// Every mutated image must either parse with all tensors inside the buffer or throw verl::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/safetensors.h"

namespace verl::model {
namespace {

// A valid image: odd sizes, a zero-size tensor, metadata, and an unpadded header.
std::string base_header() {
  return R"({"__metadata__":{"format":"pt","note":"fuzz"},)"
         R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
         R"("b":{"dtype":"BF16","shape":[5],"data_offsets":[24,34]},)"
         R"("c":{"dtype":"U8","shape":[3,1],"data_offsets":[34,37]},)"
         R"("d":{"dtype":"I64","shape":[0],"data_offsets":[37,37]},)"
         R"("e":{"dtype":"F16","shape":[2,2],"data_offsets":[37,45]}})";
}
constexpr size_t kDataBytes = 45;

std::vector<uint8_t> assemble(const std::string& header, const std::vector<uint8_t>& data,
                              uint64_t header_len) {
  std::vector<uint8_t> img(8);
  for (int i = 0; i < 8; ++i) img[i] = static_cast<uint8_t>(header_len >> (8 * i));
  img.insert(img.end(), header.begin(), header.end());
  img.insert(img.end(), data.begin(), data.end());
  return img;
}

// Random text edits that keep the result JSON-like, so the parser's deeper checks are reached.
std::string mutate_header(std::string h, Rng& rng) {
  static const char* kNumbers[] = {"0",
                                   "1",
                                   "-1",
                                   "24",
                                   "37",
                                   "45",
                                   "46",
                                   "4294967296",
                                   "18446744073709551615",
                                   "18446744073709551616",
                                   "9223372036854775807",
                                   "4611686018427387904",
                                   "1.5",
                                   "1e3",
                                   "-0",
                                   "null",
                                   "\"7\"",
                                   "[]",
                                   "{}",
                                   "true"};
  static const char* kDtypes[] = {"F32", "BF16", "F16",     "I64", "I32", "U8",
                                  "F64", "BOOL", "F8_E4M3", "",    "f32"};
  static const char* kKeys[] = {"\"dtype\"",        "\"shape\"", "\"data_offsets\"",
                                "\"__metadata__\"", "\"a\"",     "\"e\""};
  static const char kPunct[] = "{}[],:\" 0-";
  switch (rng.below(7)) {
    case 6: {  // shift one tensor's [begin, end] by the same amount: gaps and overlaps
      size_t pos = h.find("\"data_offsets\":[");
      for (uint64_t k = rng.below(5); k > 0 && pos != std::string::npos; --k) {
        pos = h.find("\"data_offsets\":[", pos + 1);
      }
      if (pos == std::string::npos) return h;
      size_t s = pos + 16, e = h.find(']', s);
      unsigned long long b = 0, en = 0;
      if (e == std::string::npos || std::sscanf(h.c_str() + s, "%llu,%llu", &b, &en) != 2) return h;
      const long long delta = static_cast<long long>(rng.below(9)) - 4;
      return h.replace(s, e - s, fmt::format("{},{}", b + delta, en + delta));
    }
    case 0: {  // replace one number with another token
      std::vector<size_t> starts;
      for (size_t i = 0; i < h.size(); ++i) {
        if (std::isdigit(static_cast<unsigned char>(h[i])) &&
            (i == 0 || !std::isalnum(static_cast<unsigned char>(h[i - 1])))) {
          starts.push_back(i);
        }
      }
      if (starts.empty()) return h;
      size_t s = starts[rng.below(starts.size())];
      size_t e = s;
      while (e < h.size() && std::isdigit(static_cast<unsigned char>(h[e]))) ++e;
      return h.replace(s, e - s, kNumbers[rng.below(std::size(kNumbers))]);
    }
    case 1: {  // swap a dtype string
      size_t pos = h.find("\"dtype\":\"");
      for (uint64_t k = rng.below(5); k > 0 && pos != std::string::npos; --k) {
        pos = h.find("\"dtype\":\"", pos + 1);
      }
      if (pos == std::string::npos) return h;
      size_t s = pos + 9, e = h.find('"', s);
      if (e == std::string::npos) return h;
      return h.replace(s, e - s, kDtypes[rng.below(std::size(kDtypes))]);
    }
    case 2: {  // delete a key and its value up to the next ',' or '}'
      const char* key = kKeys[rng.below(std::size(kKeys))];
      size_t s = h.find(key);
      if (s == std::string::npos) return h;
      size_t e = h.find_first_of(",}", s);
      if (e == std::string::npos) return h;
      if (h[e] == ',') ++e;
      return h.erase(s, e - s);
    }
    case 3:  // insert structural punctuation
      h.insert(h.begin() + static_cast<std::ptrdiff_t>(rng.below(h.size() + 1)),
               kPunct[rng.below(sizeof(kPunct) - 1)]);
      return h;
    case 4:  // delete a span
      if (!h.empty()) {
        size_t s = rng.below(h.size());
        h.erase(s, 1 + rng.below(std::min<size_t>(8, h.size() - s)));
      }
      return h;
    default:  // duplicate a span (duplicate keys, repeated entries)
      if (!h.empty()) {
        size_t s = rng.below(h.size());
        size_t n = 1 + rng.below(std::min<size_t>(40, h.size() - s));
        h.insert(rng.below(h.size() + 1), h.substr(s, n));
      }
      return h;
  }
}

// Byte-level edits of the whole image, including its length field.
void mutate_bytes(std::vector<uint8_t>& img, Rng& rng) {
  switch (rng.below(6)) {
    case 5:  // overwrite a byte near the end (usually tensor data: the image stays valid)
      if (!img.empty()) img[img.size() - 1 - rng.below(std::min<size_t>(img.size(), 64))] ^= 0xa5;
      return;
    case 0:  // flip one bit anywhere
      if (!img.empty()) img[rng.below(img.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
      return;
    case 1:  // overwrite a byte
      if (!img.empty()) img[rng.below(img.size())] = static_cast<uint8_t>(rng.next_u32());
      return;
    case 2:  // truncate
      img.resize(rng.below(img.size() + 1));
      return;
    case 3:  // append bytes
      for (uint64_t k = 1 + rng.below(16); k > 0; --k)
        img.push_back(static_cast<uint8_t>(rng.next_u32()));
      return;
    default: {  // rewrite the header length: a nearby value, a random one, or a huge one
      if (img.size() < 8) return;
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | img[i];
      switch (rng.below(3)) {
        case 0:
          n += static_cast<uint64_t>(static_cast<int64_t>(rng.below(17)) - 8);
          break;
        case 1:
          n = rng.below(img.size() + 16);
          break;
        default:
          n = rng.next_u64();
          break;
      }
      for (int i = 0; i < 8; ++i) img[i] = static_cast<uint8_t>(n >> (8 * i));
      return;
    }
  }
}

TEST(SafetensorsFuzz, MutatedImagesParseOrThrowError) {
  const std::string header = base_header();
  std::vector<uint8_t> data(kDataBytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 37 + 11);

  // The unmutated image must parse, or the fuzzer would only exercise the first rejection.
  {
    auto img = assemble(header, data, header.size());
    auto f = SafetensorsFile::from_memory(img.data(), img.size(), "base");
    ASSERT_EQ(f->tensors().size(), 5u);
  }

  Rng rng(20240611, 3);
  const int kIters = 20000;
  int accepted = 0, rejected = 0;
  uint64_t checksum = 0;  // of all accepted tensor bytes; printed so the reads are not elided
  for (int it = 0; it < kIters; ++it) {
    std::string h = header;
    std::vector<uint8_t> d = data;
    const uint64_t kind = rng.below(3);
    if (kind != 1) {  // header edits, with the length field kept consistent
      for (uint64_t k = 1 + rng.below(3); k > 0; --k) h = mutate_header(h, rng);
    }
    std::vector<uint8_t> img = assemble(h, d, h.size());
    if (kind != 0) {
      for (uint64_t k = 1 + rng.below(3); k > 0; --k) mutate_bytes(img, rng);
    }
    // An exactly sized heap copy, so ASan flags any read past the end.
    std::unique_ptr<uint8_t[]> buf(new uint8_t[img.size() + (img.empty() ? 1 : 0)]);
    if (!img.empty()) std::memcpy(buf.get(), img.data(), img.size());
    try {
      auto f = SafetensorsFile::from_memory(buf.get(), img.size(), "fuzz.safetensors");
      ++accepted;
      ASSERT_GE(img.size(), 8u);
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | img[i];
      const uint64_t data_size = img.size() - 8 - n;
      uint64_t covered = 0;
      for (const TensorInfo& t : f->tensors()) {
        ASSERT_LE(t.begin, t.end) << "iteration " << it << " tensor " << t.name;
        ASSERT_LE(t.end, data_size) << "iteration " << it << " tensor " << t.name;
        ASSERT_EQ(t.end - t.begin, static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype));
        covered += t.end - t.begin;
        // Touch every byte so ASan checks the range really lies in the buffer.
        const uint8_t* p = f->data(t);
        for (uint64_t i = 0; i < t.end - t.begin; ++i) checksum += p[i];
      }
      EXPECT_EQ(covered, data_size) << "iteration " << it << ": tensors must tile the data";
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-verl exception: " << e.what();
    }
  }
  std::printf("safetensors fuzz: %d mutations, %d accepted, %d rejected (checksum %llu)\n", kIters,
              accepted, rejected, static_cast<unsigned long long>(checksum));
  EXPECT_EQ(accepted + rejected, kIters);
  // Both outcomes must be common, or the mutations are not exercising the parser.
  EXPECT_GT(accepted, kIters / 50);
  EXPECT_GT(rejected, kIters / 2);
}

}  // namespace
}  // namespace verl::model
