// Values a careless or unlucky user writes and the loader must refuse by key (issue 41): NaN and
// infinities (they pass every range check by comparing false), a key written twice in one YAML
// mapping, an integer past 64 bits, and a mistyped choice that must suggest its nearest neighbour.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"

namespace verl::config {
namespace {

Config load(const std::vector<std::string>& overrides, const std::string& yaml = "") {
  return load_config_string(yaml, "user.yaml", overrides);
}

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (msg)

TEST(ConfigHostile, NonFiniteNumbersAreRefusedByKey) {
  // lr has a range (>= 0): NaN passed it and trained a step into all-NaN weights.
  std::string m = test::expected_error_of([] { load({"actor_rollout_ref.actor.optim.lr=.nan"}); });
  EXPECT_HAS(m, "actor_rollout_ref.actor.optim.lr = .nan is not a finite number");
  EXPECT_HAS(m, "a finite value in its range");
  m = test::expected_error_of([] { load({"actor_rollout_ref.rollout.temperature=.inf"}); });
  EXPECT_HAS(m, "actor_rollout_ref.rollout.temperature = .inf is not a finite number");
  // A key without a range must be finite too.
  m = test::expected_error_of([] { load({"actor_rollout_ref.actor.entropy_coeff=-.inf"}); });
  EXPECT_HAS(m, "actor_rollout_ref.actor.entropy_coeff = -.inf is not a finite number");
  // In a file, with its line; and inside a list of numbers, with the element.
  m = test::expected_error_of(
      [] { load({}, "actor_rollout_ref:\n  actor:\n    optim:\n      lr: .NaN\n"); });
  EXPECT_HAS(m, "user.yaml:4: actor_rollout_ref.actor.optim.lr = .nan");
  m = test::expected_error_of([] { load({"actor_rollout_ref.actor.optim.betas=[0.9,.nan]"}); });
  EXPECT_HAS(m, "actor_rollout_ref.actor.optim.betas[1] = .nan is not a finite number");
  // Through an interpolation, naming the key that holds it.
  m = test::expected_error_of([] { load({"critic.optim.lr=${oc.select:no.such.key,.nan}"}); });
  EXPECT_HAS(m, "critic.optim.lr = .nan is not a finite number");
  // Config::set (a value the trainer derives) is checked the same way.
  Config c = load({});
  m = test::expected_error_of([&] {
    c.set("actor_rollout_ref.actor.optim.lr", Json(std::numeric_limits<double>::quiet_NaN()));
  });
  EXPECT_HAS(m, "actor_rollout_ref.actor.optim.lr = .nan is not a finite number");
  // Finite values still load.
  EXPECT_DOUBLE_EQ(load({"actor_rollout_ref.actor.optim.lr=3e-6"})
                       .get<double>("actor_rollout_ref.actor.optim.lr"),
                   3e-6);
}

TEST(ConfigHostile, AKeyTwiceInOneMappingNamesBothLines) {
  const std::string yaml = "trainer:\n  total_epochs: 2\n  save_freq: 5\n  total_epochs: 7\n";
  std::string m = test::expected_error_of([&] { load({}, yaml); });
  EXPECT_HAS(
      m, "user.yaml:4: trainer.total_epochs appears twice in one mapping (first at user.yaml:2)");
  // A top-level section twice (a pasted block) too.
  m = test::expected_error_of([] { load({}, "data:\n  shuffle: false\ndata:\n  seed: 3\n"); });
  EXPECT_HAS(m, "user.yaml:3: data appears twice in one mapping (first at user.yaml:1)");
  // The same key in two different sections is no duplicate; the command line still updates a
  // file's value (Hydra's rule: the last one wins).
  Config c =
      load({"trainer.total_epochs=9"}, "trainer:\n  total_epochs: 2\ncritic:\n  ppo_epochs: 2\n");
  EXPECT_EQ(c.get<int64_t>("trainer.total_epochs"), 9);
  EXPECT_EQ(c.get<int64_t>("critic.ppo_epochs"), 2);
}

TEST(ConfigHostile, IntegersPast64BitsAndNearestChoice) {
  std::string m = test::expected_error_of([] { load({"data.seed=123456789012345678901"}); });
  EXPECT_HAS(m, "data.seed = 123456789012345678901 is an integer too large for 64 bits");
  // grpoo is one edit from grpo and two from rloo: the nearest is suggested.
  m = test::expected_error_of([] { load({"algorithm.adv_estimator=grpoo"}); });
  EXPECT_HAS(m, "did you mean 'grpo'?");
}

// What the ranks of a job compare at start (dist/agreement.h): every value, less the keys naming
// files and directories, which may differ per node; reading them marks nothing as read.
TEST(ConfigHostile, RankComparableValuesLeaveOutLocations) {
  Config c = load({"actor_rollout_ref.actor.optim.lr=2e-6", "trainer.default_local_dir=/x"});
  c.clear_reads();
  const auto items = c.rank_comparable_values();
  auto find = [&](const std::string& key) -> std::string {
    for (const auto& [k, v] : items)
      if (k == key) return v;
    return "(absent)";
  };
  EXPECT_EQ(find("actor_rollout_ref.actor.optim.lr"), "2e-06");
  EXPECT_EQ(find("data.seed"), "null");
  EXPECT_EQ(find("trainer.default_local_dir"), "(absent)");
  EXPECT_EQ(find("actor_rollout_ref.model.path"), "(absent)");
  EXPECT_EQ(find("data.train_files"), "(absent)");
  EXPECT_EQ(find("data.tokenizer"), "(absent)");
  EXPECT_TRUE(c.read_keys().empty());
}

}  // namespace
}  // namespace verl::config
