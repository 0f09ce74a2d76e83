// Host time of the CUDA calls one libnattn call makes (issue 13's per-call budget): device
// selection, tensor-map encoding (and address replacement, what a cache of encoded maps
// would do instead: an encode measured ~60 ns on the H100 host, too little to cache), and
// kernel launches with a small and a Hopper-sized parameter block (Params plus five tensor
// maps). Prints ns per call, the best round's (five rounds of 20000 calls; launches: twenty
// rounds of 200).
//   nvcc -O2 -arch=sm_90 benchmarks/cuda_host_costs.cu -o cuda_host_costs -lcuda && ./cuda_host_costs
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include <chrono>

struct Small {
  int x[16];
};
struct Large {  // ~ sizeof(nattn::Params) + five CUtensorMaps
  long long x[96];
  CUtensorMap maps[5];
};
__global__ void small_kernel(Small) {}
__global__ void large_kernel(Large) {}

// The best round's ns per call of f(i). `drain`: the stream is synchronized before each
// round, outside the clock (launches: the queue never fills, so no launch waits for the GPU).
template <class F>
double best_ns(F f, int n = 20000, int rounds = 5, cudaStream_t drain = nullptr) {
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    if (drain) cudaStreamSynchronize(drain);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f(i);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
    if (ns < best) best = ns;
  }
  return best;
}

int main() {
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    printf("no CUDA device\n");
    return 1;
  }
  void* buf = nullptr;
  cudaMalloc(&buf, 1 << 24);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  CUtensorMap map;
  const cuuint64_t dim[5] = {64, 4, 16, 16, 2}, stride[4] = {128, 512, 8192, 131072};
  const cuuint32_t box[5] = {64, 1, 8, 8, 1}, es[5] = {1, 1, 1, 1, 1};
  auto encode = [&](int i) {
    return cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, static_cast<char*>(buf) + 256 * (i & 7), dim,
                                  stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  if (encode(0) != CUDA_SUCCESS) printf("encode failed\n");
  printf("cudaSetDevice (current device)   %8.1f ns\n", best_ns([](int) { cudaSetDevice(0); }));
  int dev;
  printf("cudaGetDevice                    %8.1f ns\n", best_ns([&](int) { cudaGetDevice(&dev); }));
  printf("cuTensorMapEncodeTiled (5-D)     %8.1f ns\n", best_ns([&](int i) { encode(i); }));
  printf("cuTensorMapReplaceAddress        %8.1f ns\n",
         best_ns([&](int i) { cuTensorMapReplaceAddress(&map, static_cast<char*>(buf) + 256 * (i & 7)); }));
  Small s{};
  Large l{};
  // launch host time alone: rounds of 200 launches on a drained stream
  auto launches = [&](auto launch) { return best_ns([&](int) { launch(); }, 200, 20, stream); };
  printf("launch, 64-byte parameters       %8.1f ns\n", launches([&] { small_kernel<<<1, 32, 0, stream>>>(s); }));
  printf("launch, %zu-byte parameters     %8.1f ns\n", sizeof(Large), launches([&] { large_kernel<<<1, 32, 0, stream>>>(l); }));
  printf("cudaMemsetAsync (4 KiB)          %8.1f ns\n", launches([&] { cudaMemsetAsync(buf, 0, 4096, stream); }));
  cudaStreamSynchronize(stream);
  return 0;
}
