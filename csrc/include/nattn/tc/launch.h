// Host launchers of the tensor-core (SM80+) family, declared for the kernel table; the
// explicit instantiations live in the generated files (one per dtype x NA dim x head dim).
#pragma once
#include "nattn/common/registry.h"

namespace nattn { namespace tc {

template <typename T, int NA, int HD> void launch_forward(const Params& p, cudaStream_t stream);
template <typename T, int NA, int HD> void launch_backward(const Params& p, cudaStream_t stream);

}  }  // namespace nattn::tc
