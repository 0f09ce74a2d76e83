// Host launchers of the SIMT family, declared for the kernel table; the explicit
// instantiations live in the generated files (one per dtype x NA dim x head-dim bucket).
#pragma once
#include "nattn/common/registry.h"

namespace nattn { namespace simt {

template <typename T, int NA, int HD> void launch_forward(const Params& p, cudaStream_t stream);
template <typename T, int NA, int HD> void launch_backward(const Params& p, cudaStream_t stream);

// Threads per block of every SIMT kernel.
constexpr int kThreads = 128;

}  }  // namespace nattn::simt
