// Host entry points of the Hopper (sm90) family, declared for the kernel table; the
// explicit instantiations live in the generated files (one per dtype x NA dim x head dim).
#pragma once
#include "nattn/common/registry.h"
#include "nattn/sm90/tiles.cuh"

namespace nattn { namespace sm90 {

// Whether the family takes this forward problem: nullptr when it does (and the launch
// state is written to `workspace`, kPrepareBytes, kPrepareAlign-byte aligned), else the reason.
template <typename T, int NA, int HD, class Tile> const char* prepare_forward(const Params& p, void* workspace);
template <typename T, int NA, int HD, class Tile> void launch_forward(const Params& p, cudaStream_t stream);
// The backward of the pairs in SM90_BACKWARD_TILES (a 128-token and a 64-token box).
template <typename T, int NA, int HD, class Tile> const char* prepare_backward(const Params& p, void* workspace);
template <typename T, int NA, int HD, class Tile> void launch_backward(const Params& p, cudaStream_t stream);

}  }  // namespace nattn::sm90
