// When a problem runs the Hopper (sm90) family and with which tile pair: the measured
// window thresholds against the tensor-core family, the pairs' cost model, the call's /
// NATTN_SM90_TILE's pair, the backward's pair and split-KV by default (sm90_dispatch.cu has
// the measurements behind each constant).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "nattn/common/registry.h"

namespace nattn { namespace host {

// Attention dropout runs on the tensor-core and SIMT families (kernel_table.DROPOUT_FAMILIES):
// a problem with it never goes to the Hopper family.
constexpr const char* kSm90NoDropout = "dropout_p > 0 is not supported by the sm90 family (the tc and simt families run it)";
// The tensor-core family's largest head dim (above it the Hopper forward runs at any window).
constexpr int kTcMaxHeadDim = 128;
// Key slices per box of a split-KV forward that the call left to libnattn (split_by_default).
constexpr int kDefaultSplits = 2;

int64_t window_keys(const nattn::Params& p);  // keys in a query's window
int64_t sm90_min_window_backward(int na_dim, int64_t head_dim);
bool sm90_preferred(const nattn::Params& p, bool backward);  // from the window, head dims and box fit
bool split_by_default(const nattn::Params& p, int device);

double sm90_tile_cost(const nattn::Params& p, const nattn::KernelEntry& e);
void sm90_tile_name(const nattn::KernelEntry& e, int na_dim, char* buf, size_t n);
// The kernel table's Hopper entries in table order, collected once: the per-call choices
// compare integers only (a strcmp on each of the table's ~770 entries cost ~2 us a call).
struct Sm90Entries {
  const nattn::KernelEntry* const* e;
  int n;
};
Sm90Entries sm90_entries();
bool sm90_entry_for(const nattn::KernelEntry& e, const nattn::Params& p, int dim);  // dtype, NA dim, head dim
const nattn::KernelEntry* default_sm90(const nattn::Params& p, int dim);
bool tile_requested(const nattn::Params& p);
const nattn::KernelEntry* find_sm90(const nattn::Params& p, int dim, const char** why);
const nattn::KernelEntry* find_sm90_backward(const nattn::Params& p, int dim, const char** why);
const char* sm90_pair_declines(const nattn::Params& p, const nattn::KernelEntry& e);
bool strips_by_default();  // unless NATTN_SM90_STRIPS=0
const nattn::KernelEntry* strip_pair_for(const nattn::Params& p, int dim);

}  }  // namespace nattn::host
