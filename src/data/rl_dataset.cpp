// RLDataset: reading and validating verl-schema rows, rendering and truncating prompts.
// Row checks happen at load so a bad file fails before training starts, with file and line.
#include "data/rl_dataset.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "config/config.h"
#include "core/error.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "core/log.h"
#include "data/parquet.h"
#include "tokenizer/tokenizer.h"

namespace verl::data {

Truncation parse_truncation(const std::string& name) {
  if (name == "error") return Truncation::Error;
  if (name == "left") return Truncation::Left;
  if (name == "right") return Truncation::Right;
  if (name == "middle") return Truncation::Middle;
  VERL_FAIL("data.truncation: unknown mode '{}', expected one of error, left, right, middle", name);
}

const char* truncation_name(Truncation t) {
  switch (t) {
    case Truncation::Error:
      return "error";
    case Truncation::Left:
      return "left";
    case Truncation::Right:
      return "right";
    case Truncation::Middle:
      return "middle";
  }
  return "?";
}

std::vector<int32_t> truncate_prompt(std::vector<int32_t> ids, int64_t max_len, Truncation mode) {
  const auto n = static_cast<int64_t>(ids.size());
  if (n <= max_len) return ids;
  switch (mode) {
    case Truncation::Left:
      return std::vector<int32_t>(ids.end() - max_len, ids.end());
    case Truncation::Right:
      ids.resize(static_cast<size_t>(max_len));
      return ids;
    case Truncation::Middle: {
      // verl: ids[:max // 2] + ids[-(max - max // 2):]
      const int64_t head = max_len / 2, tail = max_len - head;
      std::vector<int32_t> out(ids.begin(), ids.begin() + head);
      out.insert(out.end(), ids.end() - tail, ids.end());
      return out;
    }
    case Truncation::Error:
      break;
  }
  VERL_FAIL("prompt length {} is longer than max_prompt_length {}", n, max_len);
}

std::string expand_user(const std::string& path) {
  if (path == "~" || path.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    if (home != nullptr) return std::string(home) + path.substr(1);
  }
  return path;
}

DatasetOptions DatasetOptions::from_config(const config::Config& cfg, bool validation) {
  DatasetOptions o;
  o.prompt_key = cfg.get<std::string>("data.prompt_key");
  o.reward_fn_key = cfg.get<std::string>("data.reward_fn_key");
  o.max_prompt_length = cfg.get<int64_t>("data.max_prompt_length");
  o.filter_overlong_prompts = cfg.get<bool>("data.filter_overlong_prompts");
  o.truncation = parse_truncation(cfg.get<std::string>("data.truncation"));
  o.max_samples = cfg.get<int64_t>(validation ? "data.val_max_samples" : "data.train_max_samples");
  const config::Json kwargs = cfg.get<config::Json>("data.apply_chat_template_kwargs");
  if (kwargs.is_object()) o.chat_template_kwargs = nlohmann::ordered_json(kwargs);
  return o;
}

namespace {

const char* type_of(const nlohmann::ordered_json& j) {
  return j.type_name();
}

// Runs fn(i) for i in [0, n) on a few threads; the first exception is rethrown here.
template <typename Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16);
  if (n < 64 || threads == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
          next = n;  // stop the others early
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void RLDataset::add_row(const nlohmann::ordered_json& row, const std::string& file, int64_t line) {
  const std::string at = fmt::format("{}:{}", file, line);
  VERL_CHECK(row.is_object(), "{}: a dataset row must be a JSON object, got {}", at, type_of(row));

  Row r;
  r.file = file;
  r.line = line;

  // prompt: a non-empty list of {"role": str, "content": str, ...} messages.
  const std::string& pk = opts_.prompt_key;
  auto p = row.find(pk);
  VERL_CHECK(p != row.end(),
             "{}: the row has no '{}' field (data.prompt_key): expected a list of chat "
             "messages [{{\"role\": ..., \"content\": ...}}]",
             at, pk);
  VERL_CHECK(p->is_array() && !p->empty(),
             "{}: field '{}' must be a non-empty list of chat messages "
             "[{{\"role\": ..., \"content\": ...}}], got {}",
             at, pk, p->is_array() ? "an empty list" : type_of(*p));
  for (size_t m = 0; m < p->size(); ++m) {
    const auto& msg = (*p)[m];
    VERL_CHECK(msg.is_object(),
               "{}: {}[{}] must be a message object {{\"role\": ..., \"content\": ...}}, "
               "got {}",
               at, pk, m, type_of(msg));
    auto role = msg.find("role");
    VERL_CHECK(role != msg.end() && role->is_string(),
               "{}: {}[{}] needs a string 'role' (system, user, "
               "assistant, ...)",
               at, pk, m);
    auto content = msg.find("content");
    VERL_CHECK(content != msg.end() && content->is_string(),
               "{}: {}[{}] needs a string 'content'{}", at, pk, m,
               content != msg.end() ? fmt::format(", got {}", type_of(*content)) : "");
  }
  r.messages = *p;

  // The field that selects the reward function (data_source by default).
  auto ds = row.find(opts_.reward_fn_key);
  VERL_CHECK(ds != row.end() && ds->is_string(),
             "{}: the row needs a string field '{}' "
             "(data.reward_fn_key), {}",
             at, opts_.reward_fn_key,
             ds == row.end() ? "it is missing" : fmt::format("got {}", type_of(*ds)));
  r.data_source = ds->get<std::string>();

  if (auto ab = row.find("ability"); ab != row.end() && !ab->is_null()) {
    VERL_CHECK(ab->is_string(), "{}: 'ability' must be a string, got {}", at, type_of(*ab));
    r.ability = ab->get<std::string>();
  }

  // reward_model.ground_truth is what rule scorers compare against. Rows scored by a reward
  // model (style "model") may leave it out.
  auto rm = row.find("reward_model");
  VERL_CHECK(rm != row.end() && rm->is_object(),
             "{}: the row needs a 'reward_model' object "
             "{{\"style\": \"rule\", \"ground_truth\": ...}}, {}",
             at, rm == row.end() ? "it is missing" : fmt::format("got {}", type_of(*rm)));
  r.reward_model = nlohmann::json::parse(rm->dump());
  auto gt = rm->find("ground_truth");
  const bool model_style = rm->contains("style") && (*rm)["style"] == "model";
  VERL_CHECK((gt != rm->end() && !gt->is_null()) || model_style,
             "{}: reward_model.ground_truth is missing (needed by rule-based rewards)", at);
  if (gt != rm->end()) r.ground_truth = r.reward_model["ground_truth"];
  if (opts_.check_reward_inputs) {  // an unknown data_source or a bad ground_truth fails here, not
                                    // at reward time
    try {
      opts_.check_reward_inputs(r.data_source, r.ground_truth);
    } catch (const std::exception& e) {
      VERL_FAIL("{}: {}", at, e.what());
    }
  }

  if (auto ex = row.find("extra_info"); ex != row.end() && !ex->is_null()) {
    VERL_CHECK(ex->is_object(), "{}: 'extra_info' must be an object, got {}", at, type_of(*ex));
    r.extra_info = nlohmann::json::parse(ex->dump());
  } else {
    r.extra_info = nlohmann::json::object();
  }
  // verl's agent_name column (the agent loop of the row: single_turn_agent, tool_agent).
  if (auto an = row.find("agent_name"); an != row.end() && !an->is_null()) {
    VERL_CHECK(an->is_string(), "{}: 'agent_name' must be a string, got {}", at, type_of(*an));
    r.agent_name = an->get<std::string>();
  }
  rows_.push_back(std::move(r));
}

std::string RLDataset::render(const Row& r) const {
  try {
    return tok_->apply_chat_template(r.messages, /*add_generation_prompt=*/true,
                                     opts_.chat_template_kwargs);
  } catch (const std::exception& e) {
    VERL_FAIL("{}:{}: rendering the chat template failed: {}", r.file, r.line, e.what());
  }
}

void RLDataset::finish() {
  stats_.rows_read = size();
  if (opts_.max_samples >= 0 && opts_.max_samples < size()) {
    stats_.rows_capped = size() - opts_.max_samples;
    rows_.resize(static_cast<size_t>(opts_.max_samples));
  }
  if (opts_.filter_overlong_prompts) {
    std::vector<uint8_t> keep(rows_.size(), 1);
    parallel_for(size(), [&](int64_t i) {
      keep[i] =
          static_cast<int64_t>(tok_->encode(render(rows_[i])).size()) <= opts_.max_prompt_length;
    });
    std::vector<Row> kept;
    kept.reserve(rows_.size());
    for (size_t i = 0; i < rows_.size(); ++i)
      if (keep[i]) kept.push_back(std::move(rows_[i]));
    stats_.rows_filtered = size() - static_cast<int64_t>(kept.size());
    rows_ = std::move(kept);
    log::info(
        "data: filtered out {} of {} prompts longer than {} tokens (data.filter_overlong_prompts)",
        stats_.rows_filtered, stats_.rows_filtered + size(), opts_.max_prompt_length);
  }
}

RLDataset RLDataset::load(const std::vector<std::string>& files, const tokenizer::Tokenizer& tok,
                          const DatasetOptions& opts) {
  VERL_CHECK(!files.empty(), "data: no dataset files given (data.train_files / data.val_files)");
  VERL_CHECK(opts.max_prompt_length >= 1, "data.max_prompt_length must be >= 1, got {}",
             opts.max_prompt_length);
  RLDataset ds(tok, opts);
  for (const std::string& given : files) {
    const std::string path = expand_user(given);
    const int64_t before = ds.size();
    if (ends_with(path, ".parquet")) {
      // Row by row, row group by row group; "line" is the 1-based row number in the file.
      const ParquetFile pf = ParquetFile::open(path);
      int64_t rowno = 0;
      for (int g = 0; g < pf.num_row_groups(); ++g)
        for (const nlohmann::ordered_json& row : pf.read_row_group(g))
          ds.add_row(row, path, ++rowno);
      log::info("data: {} rows from {}", ds.size() - before, path);
      continue;
    }
    std::ifstream in;
    open_for_reading(in, path, "dataset file", std::ios::binary);
    if (ends_with(path, ".json")) {
      // One JSON array of rows; "line" is then the 1-based element number.
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      check_json_depth(text, path);
      nlohmann::ordered_json arr;
      try {
        arr = nlohmann::ordered_json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        VERL_FAIL(
            "{}: not valid JSON ({}); a .json dataset is one array of rows, use .jsonl for one row "
            "per line",
            path, e.what());
      }
      VERL_CHECK(arr.is_array(), "{}: a .json dataset must be an array of rows, got {}", path,
                 arr.type_name());
      for (size_t i = 0; i < arr.size(); ++i) ds.add_row(arr[i], path, static_cast<int64_t>(i) + 1);
    } else {
      std::string line;
      int64_t lineno = 0;
      while (std::getline(in, line)) {
        ++lineno;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        check_json_depth(line, fmt::format("{}:{}", path, lineno));
        nlohmann::ordered_json row;
        try {
          row = nlohmann::ordered_json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          VERL_FAIL("{}:{}: not valid JSON ({}); a JSONL dataset holds one JSON object per line",
                    path, lineno, e.what());
        }
        ds.add_row(row, path, lineno);
      }
    }
    log::info("data: {} rows from {}", ds.size() - before, path);
  }
  VERL_CHECK(ds.size() > 0, "data: {} hold(s) no rows; a dataset needs at least one",
             fmt::join(files, ", "));
  ds.finish();
  VERL_CHECK(ds.size() > 0,
             "data: no rows of {} are left after data.filter_overlong_prompts (all {} prompts are "
             "longer than data.max_prompt_length={})",
             fmt::join(files, ", "), ds.stats_.rows_filtered, opts.max_prompt_length);
  return ds;
}

RLDataset RLDataset::from_config(const config::Config& cfg, const tokenizer::Tokenizer& tok,
                                 bool validation) {
  return load(cfg.get<std::vector<std::string>>(validation ? "data.val_files" : "data.train_files"),
              tok, DatasetOptions::from_config(cfg, validation));
}

RLDataset RLDataset::from_rows(const std::vector<nlohmann::ordered_json>& rows,
                               const std::string& name, const tokenizer::Tokenizer& tok,
                               const DatasetOptions& opts) {
  RLDataset ds(tok, opts);
  for (size_t i = 0; i < rows.size(); ++i) ds.add_row(rows[i], name, static_cast<int64_t>(i) + 1);
  ds.finish();
  return ds;
}

int64_t RLDataset::prompt_length(int64_t i) const {
  VERL_CHECK(i >= 0 && i < size(), "RLDataset: row {} out of range (size {})", i, size());
  return static_cast<int64_t>(tok_->encode(render(rows_[static_cast<size_t>(i)])).size());
}

Sample RLDataset::get(int64_t i) const {
  VERL_CHECK(i >= 0 && i < size(), "RLDataset: row {} out of range (size {})", i, size());
  const Row& r = rows_[static_cast<size_t>(i)];
  Sample s;
  s.index = i;
  s.file = r.file;
  s.line = r.line;
  s.raw_prompt = render(r);
  std::vector<int32_t> ids = tok_->encode(s.raw_prompt);
  s.full_prompt_length = static_cast<int64_t>(ids.size());
  VERL_CHECK(
      opts_.truncation != Truncation::Error || s.full_prompt_length <= opts_.max_prompt_length,
      "{}:{}: prompt length {} is longer than data.max_prompt_length {} (set data.truncation to "
      "left/right/middle, or data.filter_overlong_prompts=true)",
      r.file, r.line, s.full_prompt_length, opts_.max_prompt_length);
  s.prompt_ids = truncate_prompt(std::move(ids), opts_.max_prompt_length, opts_.truncation);
  s.messages = r.messages;
  s.data_source = r.data_source;
  s.ability = r.ability;
  s.ground_truth_json = r.ground_truth;
  if (r.ground_truth.is_string()) {
    s.ground_truth = r.ground_truth.get<std::string>();
  } else if (!r.ground_truth.is_null()) {
    s.ground_truth = r.ground_truth.dump();
  }
  s.reward_model = r.reward_model;
  s.extra_info = r.extra_info;
  s.agent_name = r.agent_name;
  return s;
}

}  // namespace verl::data
