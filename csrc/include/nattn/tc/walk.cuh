// A warp's rows and its walk over the union of their windows (or inverse windows): the
// chunk ring of staged tokens, each chunk's column tokens, masks and RPB parts, and the
// score-loop helpers (for_each_score, the RPB / bias instances).
#pragma once
#include "nattn/common/registry.h"
#include "nattn/common/tiling.cuh"
#include "nattn/common/window.cuh"
#include "nattn/tc/config.cuh"
#include "nattn/tc/dropout.cuh"
#include "nattn/tc/fragments.cuh"

namespace nattn { namespace tc {

// The two rows a lane holds in the accumulator fragments: their tokens (group
// coordinates), windows (or inverse windows) and whether they are real.
template <int NA, bool kInverse>
struct Rows {
  int ig[2][3];
  AxisRange win[2][3];
  bool ok[2];

  __device__ __forceinline__ Rows(const Params& p, const int* first, const int* L, int lane) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ok[r] = lane_token<NA>(p.box, lane / 4 + 8 * r, first, L, ig[r]);
#pragma unroll
      for (int a = 0; a < NA; ++a) win[r][a] = axis_range_selects<kInverse>(p, a, ig[r][a], L[a]);
    }
  }
  // Stages this lane's pieces of the rows' tokens of tensor X (at its (b, h) origin, token
  // strides xs, dilation group g) into the warp's own-rows tile `dst`.
  template <typename T, int HD>
  __device__ __forceinline__ void stage(typename Layout<T, HD>::S* dst, const Params& p, const T* X,
                                        const int64_t* xs, const int* g, int dim, int lane) const {
    stage_rows<T, HD>(dst, X + spatial_offset<NA>(p, xs, ig[0], g), X + spatial_offset<NA>(p, xs, ig[1], g), dim, lane);
  }
  // Row r's part of the RPB index (tiling::rpb_index adds a column's part).
  __device__ __forceinline__ int rpb_part(const Params& p, const int* rmult, int r) const {
    return rpb_row_part<NA, kInverse>(p, ig[r], rmult);
  }
};

// The columns a lane holds in the score fragments: chunk tokens 2tq, 2tq + 1, 8 + 2tq and
// 9 + 2tq (column q = 2 * n-tile + odd), whether each lies in the window of each of the
// lane's two rows, and their RPB column parts.
struct Cols {
  bool ok[2][4];
  int rpb[4];
};

__device__ __forceinline__ int col_token(int q, int tq) { return (q >> 1) * 8 + 2 * tq + (q & 1); }

// f(nt, e, r, q) for each of a lane's 8 score elements: n-tile nt, fragment element e, row r
// (0: lane / 4, 1: lane / 4 + 8) and column q (col_token's index).
template <typename F>
__device__ __forceinline__ void for_each_score(F&& f) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(nt, e, e >> 1, nt * 2 + (e & 1));
}

// A score's bias: entry idx of the head's table, or entry 0 where the score is masked (idx
// is then not an entry). The offset is 32-bit unsigned (idx >= 0 where the score is kept):
// no sign extension and no 64-bit select per score in the loops.
__device__ __forceinline__ float table_bias(const float* table, bool ok, int idx) { return table[ok ? unsigned(idx) : 0u]; }

// The forward and dQ pass: the head's bias table times log2(e), copied into the block's
// shared memory after its warps' tiles when Params::rpb_in_smem is 2 (the launchers set it
// where the table fits: kernels.cuh, query_bias_bytes). Every thread of the block calls it, before
// any warp returns (it synchronises). Null when the table is not staged.
__device__ __forceinline__ const float* stage_query_bias(const Params& p, float* dst, int h) {
  if (p.rpb == nullptr || p.rpb_in_smem != 2) return nullptr;
  const float* src = p.rpb + int64_t(h) * p.rpb_head_size;
  for (int i = threadIdx.x; i < int(p.rpb_head_size); i += blockDim.x) dst[i] = src[i] * kLog2e;
  __syncthreads();
  return dst;
}

// Where a score loop reads the bias table: none, global memory, or a copy in shared memory.
// The loops run in one instance each (std::integral_constant: a uniform branch per chunk), so
// that a call without RPB carries no bias loads or dRPB atomics.
enum BiasAt : int { kNoBias = 0, kBiasGlobal = 1, kBiasShared = 2 };
template <typename F>
__device__ __forceinline__ void bias_instanced(int at, F&& f) {
  if (at == kBiasShared) f(std::integral_constant<int, kBiasShared>{});
  else if (at == kBiasGlobal) f(std::integral_constant<int, kBiasGlobal>{});
  else f(std::integral_constant<int, kNoBias>{});
}

// One box's walk over its window union, packed (common/tiling.cuh): chunk ci's tokens of two
// tensors X and Y (K and V, or Q and dO for the inverse walk) are staged into slot
// tc_stage(ci) of the warp's buffer with cp.async, kTcStages - 1 chunks ahead of the one
// computed. Per chunk, lane l finds the coordinates of chunk token l % 16 (UnionIndex: two
// multiply-highs in 3-D, none in 1-D) and its address in X (lanes 0-15) or Y (lanes 16-31);
// the copying lanes fetch the addresses they need with shuffles (16-bit head dims <= 32 with
// token rows: the token's index, one 32-bit shuffle, and multiply it by each tensor's row
// stride themselves: copy_rows). Its fragment columns' coordinates
// come the same way. (Cursors stepping along the union with carries across line ends cost
// ~200 integer instructions a chunk, Nsight Compute, PERF.md thirteenth session.) With kSide,
// the inverse walk also stages each query's LSE and delta (a second address stream: the row of
// the [B, N, H] LSE (lanes 0-15) or delta (lanes 16-31), `rst` the per-axis row strides).
// Whole addresses travel, not offsets: each lane adds its one base pointer, so the loop does
// not rebuild X's, Y's and the LSE's head bases (64-bit products of Params' strides) per chunk.
template <typename T, int NA, int HD, bool kInverse, bool kSide = false>
struct Walk {
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  static constexpr int PPK = HD / Lt::VEC;  // 16-byte pieces per staged token
  static constexpr int TPI = 32 / PPK;      // tokens per copy instruction of the warp
  static constexpr int NS = kSide ? 2 : 1;
  // Rows mode at head dims <= 32 (16-bit) shuffles token indices (copy_rows: 2% off the
  // DiNAT-size passes); the others keep shuffling whole addresses (with both tensors' bases
  // held, the 3-D head-dim-64 forward ran 5% slower and TF32's dK/dV pass spilled at 128).
  static constexpr bool kTokens = !Lt::kF32 && HD <= 32;
  const Params& p;
  const Rows<NA, kInverse>& rw;
  S* buf;
  const T* src;            // this lane's tensor at (b, h): X for lanes 0-15, Y for 16-31
  const T* x_src;          // rows mode: X and Y at (b, h), for every lane
  const T* y_src;
  int x_rs, y_rs;          // rows mode: their row strides (below 2^31: has_token_rows)
  GroupStrides<NA> st[2];  // this lane's tensor, the LSE / delta row (kSide)
  int lane, size, chunks;
  bool xin, yin;           // this lane's channels lie within X's / Y's head dim
  // X and Y store their tokens as rows (Params::token_rows): a token's offset is its index
  // times this lane's row stride `rs` (the LSE / delta row: the index times H).
  bool rows;
  TokenIndex<NA> ti;
  int64_t rs;
  UnionIndex<NA> ui;
  // kSide: LSE/delta rows (b, token, h) of the staged queries, into side[stage][lse 16 | delta 16];
  // side_src: this lane's tensor (LSE for lanes 0-15, delta for 16-31) at row (b, 0, h)
  float* side;
  const float* side_src;
  const float* side_rows_src;  // rows mode: the LSE for a token's lane 0 (of PPK), delta for its lane 1

  __device__ __forceinline__ Walk(const Params& p_, const Rows<NA, kInverse>& rw_, const int* g, const AxisRange* u_,
                                  S* buf_, int lane_, const T* X_, const int64_t* xst, int xdim, const T* Y_,
                                  const int64_t* yst, int ydim, bool rows_, float* side_ = nullptr,
                                  int64_t row0_ = 0, int h_ = 0, const int64_t* rst = nullptr)
      : p(p_), rw(rw_), buf(buf_), src(held(lane_ >= CW ? Y_ : X_)), x_src(kTokens ? held(X_) : nullptr),
        y_src(kTokens ? held(Y_) : nullptr),
        x_rs(int(xst[NA])), y_rs(int(yst[NA])),
        st{GroupStrides<NA>(p_, xst, g, yst, lane_ >= CW), GroupStrides<NA>(p_, kSide ? rst : xst, g)},
        lane(lane_), xin((lane_ % PPK) * Lt::VEC < xdim), yin((lane_ % PPK) * Lt::VEC < ydim), rows(rows_),
        ti(p_, g), rs(lane_ >= CW ? yst[NA] : xst[NA]), ui(u_),
        side(side_), side_src(kSide ? held((lane_ >= CW ? p_.delta : p_.lse) + row0_ * p_.heads + h_) : nullptr),
        side_rows_src(kSide && kTokens ? held(((lane_ % PPK) & 1 ? p_.delta : p_.lse) + row0_ * p_.heads + h_) : nullptr) {
    size = union_size<NA>(u_);
    chunks = (size + CW - 1) / CW;
  }
  __device__ __forceinline__ const S* tile(int ci) const { return buf + tc_stage(ci) * 2 * Lt::TILE; }
  __device__ __forceinline__ const float* side_tile(int ci) const { return side + tc_stage(ci) * 2 * CW; }

  // The chunks staged before the first one is computed (after the rows' own copy group):
  // chunk 0, and with more stages the next ones, an empty group for each missing chunk so
  // that every later wait counts the same number of groups.
  __device__ __forceinline__ void prologue() {
    if constexpr (kTcStages == 2) {
      if (chunks > 0) issue(0);
    } else {
#pragma unroll 1
      for (int ci = 0; ci < kTcStages - 1; ++ci) {
        if (ci < chunks) issue(ci);
        else cp_async_commit();
      }
    }
  }
  // Waits for the rows' own copy group (issued before prologue()).
  __device__ __forceinline__ void wait_rows() const {
    if constexpr (kTcStages == 2) {
      if (chunks > 0) cp_async_wait<1>();
      else cp_async_wait<0>();
    } else {
      cp_async_wait<kTcStages - 1>();
    }
  }
  // TF32: waits for the rows' own copy group and rounds kTiles staged tiles of them (from
  // `tile`) in place, so that the products read them as A operands.
  template <int kTiles>
  __device__ __forceinline__ void round_own_rows_tf32(S* tile, int lane) const {
    wait_rows();
#pragma unroll
    for (int i = 0; i < kTiles; ++i) round_rows_tf32<HD>(tile + i * Lt::TILE, lane);
  }

  // Stages chunk ci (in walk order) into slot tc_stage(ci); channels past a tensor's dim and
  // tokens past the union are zero-filled.
  __device__ __forceinline__ void issue(int ci) {
    S* dst = buf + tc_stage(ci) * 2 * Lt::TILE;
    // Source addresses stay inside the tensors: the cursors never leave the union, and a
    // lane whose channels lie past a head dim reads channel 0 (its copy is zero-filled).
    const int e = (lane % PPK) * Lt::VEC, left = size - ci * CW;
    // This lane's token (past the union: its last token, so that copies predicated off still
    // get an address inside the tensor) and its addresses.
    int c[3];
    ui.coords(nattn_min(ci * CW + lane % CW, size - 1), c);
    if (kTokens && rows) {  // a 32-bit token index travels per copy; the copying lanes build the addresses
      const int t = ti.at(p, c);
#pragma unroll
      for (int i = 0; i < CW / TPI; ++i) copy_rows(dst, ci, i, e, left, t);
      cp_async_commit();
      return;
    }
    int64_t o[NS];
    if (rows) {
      const int t = ti.at(p, c);
      o[0] = int64_t(t) * rs;
      if constexpr (kSide) o[NS - 1] = int64_t(t) * p.heads;
    } else {
#pragma unroll
      for (int s = 0; s < NS; ++s) o[s] = st[s].at(c);
    }
    const T* mine = src + o[0];
    const float* mine_side = kSide ? side_src + o[NS - 1] : nullptr;
    if constexpr (Lt::kF32) {
      // TF32: kept rolled (16 copies a tensor at head dim 128); unrolled, their shuffled
      // addresses held at once made the dK/dV pass spill at head dim 128.
#pragma unroll 1
      for (int i = 0; i < CW / TPI; ++i) copy(dst, ci, i, e, left, mine, mine_side);
    } else {
#pragma unroll
      for (int i = 0; i < CW / TPI; ++i) copy(dst, ci, i, e, left, mine, mine_side);
    }
    cp_async_commit();
  }
  // Copy instruction i of issue: chunk token j's piece e of X and Y (and its LSE and delta).
  __device__ __forceinline__ void copy(S* dst, int ci, int i, int e, int left, const T* mine,
                                       const float* mine_side) {
    const int j = i * TPI + lane / PPK;
    const T* xs = shfl_ptr(mine, j);
    const T* ys = shfl_ptr(mine, CW + j);
    const bool in = j < left;
    cp_async16(dst + j * Lt::P + e, xs + (xin ? e : 0), in && xin);
    cp_async16(dst + Lt::TILE + j * Lt::P + e, ys + (yin ? e : 0), in && yin);
    if (kSide) {  // the token's first two lanes: its LSE (from lane j) and its delta (lane 16 + j)
      const float* row = shfl_ptr(mine_side, (lane % PPK & 1) * CW + j);
      if (lane % PPK < 2) cp_async4(side + tc_stage(ci) * 2 * CW + (lane % PPK) * CW + j, row, in);
    }
  }
  // Rows mode: copy instruction i of issue, with chunk token j's index from lane j.
  __device__ __forceinline__ void copy_rows(S* dst, int ci, int i, int e, int left, int t) {
    const int j = i * TPI + lane / PPK;
    const int tj = __shfl_sync(0xffffffffu, t, j);
    const bool in = j < left;
    cp_async16(dst + j * Lt::P + e, x_src + mul_wide(tj, x_rs) + (xin ? e : 0), in && xin);
    cp_async16(dst + Lt::TILE + j * Lt::P + e, y_src + mul_wide(tj, y_rs) + (yin ? e : 0), in && yin);
    if (kSide && lane % PPK < 2)  // the token's first two lanes: its LSE and its delta
      cp_async4(side + tc_stage(ci) * 2 * CW + (lane % PPK) * CW + j, side_rows_src + mul_wide(tj, p.heads), in);
  }
  // a * b of two ints as a 64-bit product (one IMAD.WIDE)
  __device__ __forceinline__ static int64_t mul_wide(int a, int b) {
    long long r;
    asm("mul.wide.s32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
    return r;
  }
  // A pointer the compiler keeps in registers: left to itself it rebuilt the head bases from
  // Params (b * s[0] + h * s[4] in 64 bits, per tensor) in every chunk.
  template <typename P>
  __device__ __forceinline__ static const P* held(const P* x) {
    unsigned long long r;
    asm volatile("mov.b64 %0, %1;" : "=l"(r) : "l"(reinterpret_cast<unsigned long long>(x)));
    return reinterpret_cast<const P*>(r);
  }
  template <typename P>
  __device__ __forceinline__ static const P* shfl_ptr(const P* x, int from) {
    return reinterpret_cast<const P*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(x), from));
  }
  // Chunk ci is in shared memory for the whole warp (the next kTcStages - 1 are on their way).
  // Its slot's previous chunk was released by every lane's __syncwarp at the end of that
  // chunk's products.
  __device__ __forceinline__ void arrive(int ci) {
    if constexpr (kTcStages == 2) {
      if (ci + 1 < chunks) {
        issue(ci + 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    } else {
      if (ci + kTcStages - 1 < chunks) issue(ci + kTcStages - 1);
      else cp_async_commit();  // an empty group: the wait below counts the same groups
      cp_async_wait<kTcStages - 1>();
    }
    __syncwarp();
  }
  // Chunk ci's columns (the lane's 4 fragment columns); with kTok also their token indices
  // mod 2^32 (dropout's mask words; g: the box's dilation group).
  template <bool kTok = false>
  __device__ __forceinline__ void take(int ci, Cols& cl, const int* rmult, bool rpb, uint32_t* tok = nullptr,
                                       const int* g = nullptr) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int f = ci * CW + col_token(q, lane % 4);
      const bool in = f < size;
      int c[3];
      ui.coords(f, c);
#pragma unroll
      for (int r = 0; r < 2; ++r) cl.ok[r][q] = in && in_window<NA>(rw.win[r], c);
      cl.rpb[q] = rpb ? rpb_dot<NA>(c, rmult) : 0;
      if constexpr (kTok) tok[q] = token_word<NA>(p, c, g);
    }
  }
};

// A warp's walk over the keys of its query rows' windows (forward and dQ pass), with what
// their scores need besides: the head's RPB table and the rows' part of its index and, with
// dropout, the head's key stream and the rows' query tokens.
template <typename T, int NA, int HD, bool kDrop>
struct RowWalk {
  Walk<T, NA, HD, false> walk;
  const float* rpb;
  int rrow[2];
  DropKeys drop;
  uint32_t qtok[2];

  __device__ __forceinline__ RowWalk(const Params& p, const Rows<NA, false>& rw, const int* g, const AxisRange* u,
                                     typename Layout<T, HD>::S* buf, int lane, int b, int h, int hkv,
                                     const int* rmult)
      : walk(p, rw, g, u, buf, lane, head_base<const T>(p.k, p.k_s, b, hkv), p.k_s, p.dim,
             head_base<const T>(p.v, p.v_s, b, hkv), p.v_s, p.dim_v,
             all_token_rows(p, kRowsK | kRowsV)),
        rpb(p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr),
        rrow{rw.rpb_part(p, rmult, 0), rw.rpb_part(p, rmult, 1)} {
    if constexpr (kDrop) {
      drop.init(p, b, h);
      qtok[0] = token_word<NA>(p, rw.ig[0], g);
      qtok[1] = token_word<NA>(p, rw.ig[1], g);
    }
  }
};

}  }  // namespace nattn::tc
