// ProcessTopology against DeepSpeed's documented examples and its tests/unit/runtime/pipe/test_topology.py cases,
// and the groups of make_parallel_groups on Gloo ranks: an all-reduce on each axis' group sums exactly the ranks
// that a brute-force scan of the coordinates says belong together.
#include <gtest/gtest.h>

#include "dist/comm_reference.h"
#include "dist/multiprocess.h"
#include "dscpp/comm/topology.h"

using namespace dscpp;
using namespace dscpp::test;

namespace {

using Lists = std::vector<std::vector<int>>;

TEST(Topology, TwoDimensionalDocExamples) {
  ProcessTopology x({"x", "y"}, {2, 3});
  EXPECT_EQ(x.get_rank({0, 1}), 1);
  EXPECT_EQ(x.get_dim("y"), 3);
  EXPECT_EQ(x.get_coord(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(x.get_coord(1, "y"), 1);
  EXPECT_EQ(x.get_axis_list("x", 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(x.get_axis_list("y", 0), (std::vector<int>{0, 3}));

  ProcessTopology rc({"row", "col"}, {2, 2});
  EXPECT_EQ(rc.world_size(), 4);
  EXPECT_EQ(rc.get_rank({1, 0}), 2);
  EXPECT_EQ(rc.get_axis_list("row", 1), (std::vector<int>{2, 3}));
  EXPECT_EQ(rc.get_axis_list("col", 1), (std::vector<int>{1, 3}));
}

TEST(Topology, ThreeDimensionalRowMajor) {
  ProcessTopology t({"a", "b", "c"}, {2, 3, 4});
  EXPECT_EQ(t.world_size(), 24);
  EXPECT_EQ(t.get_dim("a"), 2);
  EXPECT_EQ(t.get_dim("b"), 3);
  EXPECT_EQ(t.get_dim("c"), 4);
  EXPECT_EQ(t.get_dim("jeff"), 0);
  // The last axis varies fastest: rank = (a * 3 + b) * 4 + c, and get_coord inverts get_rank everywhere.
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c) {
        const int r = (a * 3 + b) * 4 + c;
        EXPECT_EQ(t.get_rank({a, b, c}), r);
        EXPECT_EQ(t.get_coord(r), (std::vector<int>{a, b, c}));
      }
  ProcessTopology cube({"a", "b", "c"}, {2, 2, 2});
  EXPECT_EQ(cube.get_axis_list("a", 1), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(cube.get_axis_list("b", 0), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(cube.get_axis_list("c", 1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(cube.rank_at(3, "a", 1), 7);  // (0,1,1) -> (1,1,1)
}

TEST(Topology, PipeDataModelCommLists) {
  // DeepSpeed's PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2) and the lists its tests expect.
  const ProcessTopology t = pipe_model_data_parallel_topology(2, 2, 2);
  EXPECT_EQ(t.axes(), (std::vector<std::string>{"pipe", "data", "model"}));
  EXPECT_EQ(t.get_rank({1, 0, 1}), 5);
  EXPECT_EQ(t.get_axis_comm_lists("pipe"), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(t.get_axis_comm_lists("data"), (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(t.get_axis_comm_lists("model"), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(t.get_axis_comm_lists("jeff"), Lists{});
  EXPECT_EQ(t.get_axis_list("data", 1), (std::vector<int>{2, 3, 6, 7}));  // DeepSpeed's filter_match(data=1)

  // Unequal dims: the argument order is (pp, mp, dp) but the axes are (pipe, data, model).
  const ProcessTopology u = pipe_model_data_parallel_topology(3, 2, 1);
  EXPECT_EQ(u.dims(), (std::vector<int>{3, 1, 2}));
  EXPECT_EQ(u.get_axis_comm_lists("pipe"), (Lists{{0, 2, 4}, {1, 3, 5}}));
  EXPECT_EQ(u.get_axis_comm_lists("data"), (Lists{{0}, {1}, {2}, {3}, {4}, {5}}));
  EXPECT_EQ(u.get_axis_comm_lists("model"), (Lists{{0, 1}, {2, 3}, {4, 5}}));
  const ProcessTopology v = pipe_model_data_parallel_topology(1, 2, 3);
  EXPECT_EQ(v.get_axis_comm_lists("data"), (Lists{{0, 2, 4}, {1, 3, 5}}));
  EXPECT_EQ(v.get_coord(5), (std::vector<int>{0, 2, 1}));
}

TEST(Topology, RankRepr) {
  ProcessTopology ab({"a", "b"}, {2, 2});
  EXPECT_EQ(ab.get_rank_repr(0), "a_00-b_00");
  EXPECT_EQ(ab.get_rank_repr(3), "a_01-b_01");
  EXPECT_EQ(ab.get_rank_repr(3, {"a"}), "b_01");
  ProcessTopology pd({"pipe", "data"}, {2, 2});
  EXPECT_EQ(pd.get_rank_repr(2), "");
  EXPECT_EQ(pd.get_rank_repr(1, {"pipe"}), "data_01");
  EXPECT_EQ(pd.get_rank_repr(2, {}), "pipe_01-data_00");
  const ProcessTopology pdm = pipe_model_data_parallel_topology(2, 2, 2);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(pdm.get_rank_repr(r), r % 2 ? "model_01" : "model_00");
}

TEST(Topology, RefusesBadInput) {
  EXPECT_THROW(ProcessTopology({"a", "a"}, {1, 2}), Error);
  EXPECT_THROW(ProcessTopology({"a"}, {0}), Error);
  EXPECT_THROW(ProcessTopology({"a", "b"}, {2}), Error);
  ProcessTopology t({"a", "b"}, {2, 2});
  EXPECT_THROW(t.get_rank({2, 0}), Error);
  EXPECT_THROW(t.get_rank({0}), Error);
  EXPECT_THROW(t.get_coord(4), Error);
  EXPECT_THROW(t.get_axis_list("c", 0), Error);
}

// The ranks that agree with `rank` on every axis but `axis` (all of them when axis is empty: a whole replica is
// "agree on data"), by scanning coordinates rather than through the topology's own lists.
std::vector<int> peers(const ProcessTopology& t, int rank, const std::vector<std::string>& free_axes) {
  std::vector<int> out;
  const auto me = t.get_coord(rank);
  for (int r = 0; r < t.world_size(); ++r) {
    const auto c = t.get_coord(r);
    bool same = true;
    for (size_t i = 0; i < c.size(); ++i)
      if (std::find(free_axes.begin(), free_axes.end(), t.axes()[i]) == free_axes.end() && c[i] != me[i]) same = false;
    if (same) out.push_back(r);
  }
  return out;
}

// Each rank adds 2^rank: the sum names exactly which ranks took part.
void expect_group_sums(ProcessGroup* g, const std::vector<int>& expected, int rank, const char* what) {
  if (expected.size() == 1) {
    EXPECT_EQ(g, nullptr) << what << ": a size-one axis has no group";
    return;
  }
  ASSERT_NE(g, nullptr) << what;
  EXPECT_EQ(g->size(), int(expected.size())) << what;
  Tensor t = make_tensor({double(1 << rank), 1.0}, DType::i32);
  g->all_reduce(t)->wait();
  int want = 0;
  for (int r : expected) want += 1 << r;
  EXPECT_EQ(load(t, 0), double(want)) << what << " on rank " << rank;
  EXPECT_EQ(load(t, 1), double(expected.size())) << what;
  for (int i = 0; i < g->size(); ++i) EXPECT_EQ(g->global_rank(i), expected[size_t(i)]) << what;
}

void check_groups(int pp, int tp, int dp) {
  const int world = pp * tp * dp;
  expect_all_pass(run_ranks(world, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, world, "127.0.0.1", port, std::chrono::seconds(30));
    const ProcessTopology topo = pipe_model_data_parallel_topology(pp, tp, dp);
    ParallelGroups g = make_parallel_groups(*pg, topo);
    const auto c = topo.get_coord(rank);
    EXPECT_EQ(g.stage, c[0]);
    EXPECT_EQ(g.data_rank, c[1]);
    EXPECT_EQ(g.model_rank, c[2]);
    EXPECT_EQ(g.is_first_stage(), c[0] == 0);
    EXPECT_EQ(g.is_last_stage(), c[0] == pp - 1);
    expect_group_sums(g.pipe, peers(topo, rank, {"pipe"}), rank, "pipe");
    expect_group_sums(g.data, peers(topo, rank, {"data"}), rank, "data");
    expect_group_sums(g.model, peers(topo, rank, {"model"}), rank, "model");
    expect_group_sums(g.model_parallel, peers(topo, rank, {"pipe", "model"}), rank, "model_parallel");
    // A group's rank is this rank's coordinate on its axis (Note [Topology layout]).
    if (g.pipe) {
      EXPECT_EQ(g.pipe->rank(), g.stage);
    }
    if (g.data) {
      EXPECT_EQ(g.data->rank(), g.data_rank);
    }
    if (g.model) {
      EXPECT_EQ(g.model->rank(), g.model_rank);
    }
    // The next stage's rank in the world, as a pipeline sends to it.
    if (pp > 1 && !g.is_last_stage()) {
      EXPECT_EQ(topo.rank_at(rank, "pipe", g.stage + 1), rank + dp * tp);
    }
  }));
}

TEST(TopologyGloo, PipeDataModelTwoEach) { check_groups(2, 2, 2); }
TEST(TopologyGloo, PipeThreeModelTwo) { check_groups(3, 2, 1); }
TEST(TopologyGloo, DataOnlyUsesTheWorld) {
  expect_all_pass(run_ranks(3, [&](int rank, int port) {
    auto pg = new_process_group("gloo", rank, 3, "127.0.0.1", port, std::chrono::seconds(30));
    ParallelGroups g = make_parallel_groups(*pg, pipe_model_data_parallel_topology(1, 1, 3));
    EXPECT_EQ(g.data, pg.get());  // Note [Size-one axes]: no second group over the same ranks
    EXPECT_EQ(g.pipe, nullptr);
    EXPECT_EQ(g.model, nullptr);
    EXPECT_EQ(g.model_parallel, nullptr);
    EXPECT_TRUE(g.owned.empty());
    EXPECT_THROW(make_parallel_groups(*pg, pipe_model_data_parallel_topology(1, 2, 1)), Error);
  }));
}
TEST(TopologyGloo, ModelAndDataTwoEach) { check_groups(1, 2, 2); }

}  // namespace
