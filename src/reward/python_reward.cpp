// The Python reward bridge: the driver program and how it is started and checked.
#include "reward/python_reward.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"

extern char** environ;

namespace verl::reward {
namespace {

// The driver. argv: [-c, path, name, kwargs-json] or [-c, --check, path, name]. Rows arrive as
// JSON lines on stdin; each gets one answer line on the real stdout, which the user's code cannot
// write to (its prints go to stderr). A dict result gives "score" and its other numeric entries
// (verl's reward_extra_info); a float result is also reported as "acc", as verl's naive manager
// does. An exception, a missing or non-finite score is that row's "error".
constexpr const char* kDriver = R"PY(
import asyncio, importlib.util, inspect, json, math, numbers, os, sys, traceback

def load(path, name):
    if not os.path.isfile(path):
        raise SystemExit(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location("custom_module", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_module"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        raise SystemExit(f"importing {path} failed: {last}")
    fn = getattr(module, name, None)
    if fn is None:
        raise SystemExit(f"{path} has no function '{name}'")
    if not callable(fn):
        raise SystemExit(f"{path}: '{name}' is not a function")
    return fn

def number(v):
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, numbers.Real):
        return float(v)
    if hasattr(v, "item"):
        try:
            return number(v.item())
        except Exception:
            return None
    return None

def main():
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if sys.argv[1] == "--check":
        load(sys.argv[2], sys.argv[3])
        return
    fn = load(sys.argv[1], sys.argv[2])
    kwargs = json.loads(sys.argv[3])
    is_async = inspect.iscoroutinefunction(fn)
    for line in sys.stdin:
        if not line.strip():
            continue
        row = json.loads(line)
        answer = {"index": row["index"]}
        try:
            args = dict(data_source=row["data_source"], solution_str=row["solution_str"],
                        ground_truth=row["ground_truth"], extra_info=row.get("extra_info"))
            args.update(kwargs)
            result = asyncio.run(fn(**args)) if is_async else fn(**args)
            if isinstance(result, dict):
                if "score" not in result:
                    raise ValueError(f"the returned dict has no 'score' (keys: {sorted(result)})")
                extras, score = result, number(result["score"])
            else:
                score = number(result)
                extras = {"acc": score}
            if score is None or not math.isfinite(score):
                raise ValueError(f"the score {result!r} is not a finite number")
            for k, v in extras.items():
                x = number(v)
                if k not in ("index", "score", "error") and x is not None and math.isfinite(x):
                    answer[k] = x
            answer["score"] = score
        except Exception as e:
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            answer = {"index": row["index"], "error": last}
        out.write(json.dumps(answer) + "\n")
        out.flush()

main()
)PY";

// One shell word: single-quoted, with ' written as '\''.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

const char* python_reward_driver() {
  return kDriver;
}

std::string python_reward_command(const PythonRewardSpec& spec) {
  return "exec " + shell_quote(spec.python) + " -u -c " + shell_quote(kDriver) + " " +
         shell_quote(spec.path) + " " + shell_quote(spec.name) + " " +
         shell_quote(spec.kwargs.dump());
}

void check_python_reward(const PythonRewardSpec& spec) {
  const std::string what =
      fmt::format("custom_reward_function.path={} (function '{}')", spec.path, spec.name);
  VERL_CHECK(std::filesystem::is_regular_file(spec.path), "{}: no such file", what);
  int pipe_fds[2];
  VERL_CHECK(pipe(pipe_fds) == 0, "{}: pipe failed", what);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipe_fds[1], 2);
  posix_spawn_file_actions_adddup2(&fa, pipe_fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, pipe_fds[0]);
  std::vector<std::string> args = {spec.python, "-c", kDriver, "--check", spec.path, spec.name};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, spec.python.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(pipe_fds[1]);
  if (rc != 0) {
    close(pipe_fds[0]);
    VERL_FAIL(
        "{}: cannot start the Python interpreter '{}' ({}); install python3 or use "
        "custom_reward_function.command",
        what, spec.python, strerror(rc));
  }
  std::string output;
  std::array<char, 4096> buf;
  ssize_t r;
  while ((r = read(pipe_fds[0], buf.data(), buf.size())) > 0 || (r < 0 && errno == EINTR))
    if (r > 0) output.append(buf.data(), static_cast<size_t>(r));
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  const size_t last = output.rfind('\n');
  VERL_FAIL("{}: {}", what,
            output.empty() ? std::string("the Python interpreter failed")
                           : output.substr(last == std::string::npos ? 0 : last + 1));
}

}  // namespace verl::reward
