// Hopper (sm90) runs of problems whose head dims the family has no instance for: D != D_v,
// or a head dim between its instances (48, 72, 80, 96, ...). The tensors with fewer
// channels than the instance's head dim HD are copied into packed buffers with zero channels
// up to HD, the kernels run on those, and the outputs' first D / D_v channels are copied
// back. Zero channels change no result: Q K^T adds zero products, the extra columns of P V
// are dropped, and with a zero-padded output gradient every gradient's extra channels are
// zero (dQ = dS K, dK = dS^T Q, dV = P^T dO; delta = rowsum(dO * O) gains nothing).
#pragma once
#include <cuda_runtime.h>

#include "nattn/common/registry.h"

namespace nattn { namespace host {

// The instance head dim such a problem runs at (the smallest built sm90 head dim >= D and
// D_v, with a backward when `backward`), or 0: the family has the problem's own head dims,
// or none large enough.
int sm90_padded_head_dim(const nattn::Params& p, bool backward);

// Whether the padded run beats the other families' native one: 2-D and 3-D windows from
// kSm90PaddedMinWindow keys (the copies and the padded channels' work cost too much on
// smaller ones, where the tensor-core family runs these head dims itself; 1-D never: flex
// runs D != D_v at its own head dims and beat even the native 128 instance, below), or at
// any window the Hopper family takes when a head dim is above the tensor-core family's
// 128; and the padded problem's own rules (sm90_preferred).
// Measured on the H200 (bf16, ms, forward / forward + backward, GPU time; docs/dev/PERF.md
// twenty-seventh session): 2-D 128x128 B2 H8 33x33 D64 / D_v 128 padded 0.712 / 2.58 vs
// flex 1.56 / 4.06; D72 0.923 / 3.23 vs tc 1.33 / 5.42 (flex 2.06 / 7.30); 3-D 16x48x48 B1
// H8 9x15x15 D96 1.77 / 6.56 vs tc 3.28 / 13.7 (flex 5.55 / 17.4); 1-D 8192 B2 H8 w1024 D128
// / D_v 64: the sm90 forward at 128 alone 0.160 vs flex 0.150.
bool sm90_padded_preferred(const nattn::Params& p, int hd, bool backward);
constexpr int64_t kSm90PaddedMinWindow[3] = {0, 401, 401};  // 0: never (per NA dim)

// Runs the padded problem on the caller's stream; nullptr, or why the family declined it
// (nothing launched: the caller runs another family, or fails when the call required sm90).
const char* run_sm90_padded(const nattn::Params& p, int hd, bool backward, cudaStream_t stream);

}  }  // namespace nattn::host
