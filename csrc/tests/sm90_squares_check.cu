// Host-side check of the square CTA's geometry (csrc/include/nattn/sm90/square_geometry.cuh,
// forward_squares.cuh; runs on the CPU, no GPU): for random 2-D problems within the square
// pair's limits (stride 1, windows up to 13 x 13; dilation, causal axes, even kernels, grids
// ending in partial boxes), every CTA, warp, lane, walk chunk and score (j, e):
//   - the warps' m16 rows cover the 8 x 8 query box once, and the output's staged rows are
//     the rows the lane's Q fragments and mask words are of;
//   - the square's walk stays inside the 20 x 20 key box, and the parts a chunk waits for
//     hold its rows (the parts' copies land where one copy of the whole box would); chunk 0's
//     parts are among those the dQ pass loads before the dO rows (kSquareEarlyParts); with
//     the ring (head dim 64) each walk row is read from its part's slot (square_ring_row);
//   - the K and V fragment addresses the kernels form (the square's first key, the tile's
//     first key, the lane's offset for the walk row's parity: square_fragment_offsets) are
//     the swizzled tile's offsets of the keys the scores are of (K transposed, as the dQ
//     pass reads it, alike);
//   - a score's mask bit is set exactly when its key is in the row's window (query_window),
//     and the row's set bits cover its whole window (each key once);
//   - its RPB index is (key - query + kernel - 1) per axis, row-major, where the bit is set,
//     and within the kernel's guards around the table where it is not.
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>

#include "nattn/sm90/smem_tile.cuh"
#include "nattn/sm90/square_geometry.cuh"
#include "nattn/sm90/tiles.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x9b05688c2b3e6c1full
#include "host_rng.h"
#include "sm90_problems.h"

constexpr int kGuard = 128;  // forward_squares.cuh, SquareCta::kRpbGuard
using QB = Box<8, 8, 1>;
using KB = Box<kSquareKeyBox, kSquareKeyBox, 1>;

static int fail(const char* what, const Params& p, long long box, int warp, int lane) {
  printf("FAIL %s: spatial %dx%d kernel %dx%d dilation %dx%d causal %d%d, box %lld warp %d lane %d\n", what,
         p.spatial[0], p.spatial[1], p.kernel[0], p.kernel[1], p.dilation[0], p.dilation[1], p.causal[0], p.causal[1],
         box, warp, lane);
  return 1;
}

// The kernels' fragment addresses (square_fragment_offsets: forward_squares.cuh with V's
// offsets from the V tile, backward_dq_squares.cuh with K's transposed from the K tile)
// against the tile's offsets.
template <int HD>
static int check_addresses(const SquareLane& s, int lane, long long& checks) {
  using C = TileSmem<HD, KB::kSize>;
  constexpr int RB = C::kRowBytes, KR = kSquareKeyBox * RB;
  int k_off[2][HD / 32], v_off[2][HD / 16], kt_off[2][HD / 16];
  square_fragment_offsets<C, HD>(s.sy, s.sx, lane, C::kBytes, k_off, v_off);
  square_fragment_offsets<C, HD>(s.sy, s.sx, lane, 0, k_off, kt_off);
  for (int odd = 0; odd < 2; ++odd) {
    for (int ch = 0; ch < s.chunks; ++ch)
      for (int j = 0; j < 2 * kStripChunkRows; ++j) {
        if ((j / 2) % 2 != odd) continue;
        const int key = square_tile_key(s.sy, s.sx, ch, j);
        const int base = (s.sy * kSquareKeyBox + s.sx) * RB + kStripChunkRows * ch * KR;
        for (int x = 0; x < HD / 32; ++x) {
          ++checks;
          if (base + (j / 2) * KR + 8 * (j % 2) * RB + k_off[odd][x] !=
              C::offset(key + lane % 8, 8 * (lane / 8) + 32 * x))
            return 1;
        }
        if (j % 2) continue;
        for (int x = 0; x < HD / 16; ++x) {  // P V and dS K: tiles j and j + 1, sixteen keys of walk row 4 ch + j / 2
          ++checks;
          const int row = lane % 8 + 8 * ((lane / 8) % 2), c = 8 * (lane / 16) + 16 * x;
          if (base + (j / 2) * KR + v_off[odd][x] != C::kBytes + C::offset(key + row, c)) return 1;
          if (base + (j / 2) * KR + kt_off[odd][x] != C::offset(key + row, c)) return 1;
        }
      }
  }
  return 0;
}

static int check_problems(int count, long long& checks) {
  constexpr int R = 0, Cx = 1;
  for (int it = 0; it < count; ++it) {
    Params p = square_problem();
    if (square_declines(p)) return fail("declined a problem within the limits", p, -1, 0, 0);
    set_query_boxes<QB>(p);
    const int table = p.rpb_size[0] * p.rpb_size[1];
    for (long long box = 0; box < num_cta_tiles<QB>(p); ++box) {
      CtaTile tile;
      if (!cta_tile<2, QB, KB>(p, unsigned(box), tile)) continue;
      if (tile.nk[0] != 1 || tile.nk[1] != 1) return fail("the union is larger than the key box", p, box, 0, 0);
      int rows_seen[64] = {0};
      for (int warp = 0; warp < 4; ++warp) {
        for (int m = 0; m < 16; ++m) rows_seen[square_query_row(warp, m)] += 1;
        for (int lane = 0; lane < 32; ++lane) {
          static int kept[2];
          if (lane % 4 == 0) kept[0] = kept[1] = 0;
          SquareLane s;
          square_lane<QB>(p, tile, warp, lane, s);
          if (s.sy < 0 || s.sy + kStripChunkRows * s.chunks > kSquareKeyBox || s.sx < 0 ||
              s.sx + kSquareWalk > kSquareKeyBox || s.chunks < 1)
            return fail("the square's walk leaves the key box", p, box, warp, lane);
          for (int ch = 0; ch < s.chunks; ++ch) {
            const int a = square_first_part(s.sy, ch), z = square_last_part(s.sy, ch);
            if (a < 0 || z >= kSquareParts || z - a > 1 || kSquarePartRows * a > s.sy + kStripChunkRows * ch ||
                kSquarePartRows * (z + 1) < s.sy + kStripChunkRows * (ch + 1))
              return fail("a chunk's parts", p, box, warp, lane);
            // the ring (head dim 64): each walk row at its part's slot, in the row's place there
            for (int i = 0; i < kStripChunkRows; ++i) {
              const int r = s.sy + kStripChunkRows * ch + i, at = square_ring_row(r);
              if (at < 0 || at >= kSquareRingRows || at / kSquarePartRows != (r / kSquarePartRows) % kSquareRingParts ||
                  at % kSquarePartRows != r % kSquarePartRows)
                return fail("a walk row's ring slot", p, box, warp, lane);
            }
          }
          if (square_last_part(s.sy, 0) >= kSquareEarlyParts) return fail("chunk 0 past the early parts", p, box, warp, lane);
          if (check_addresses<32>(s, lane, checks) || check_addresses<64>(s, lane, checks))
            return fail("fragment address", p, box, warp, lane);
          const int row0 = square_query_row(warp, lane / 4);
          if (square_query_row(warp, lane / 4 + 8) != row0 + kSquareLaneRowStep) return fail("staged rows", p, box, warp, lane);
          for (int r = 0; r < 2; ++r) {
            const int qr = square_query_row(warp, lane / 4 + 8 * r);
            int cq[2];
            bool ok = true;
            AxisRange w[2];
            for (int a = 0; a < 2; ++a) {
              const int q = tile.q0[a] + QB::offset(qr, a);
              ok = ok && q < tile.len[a];
              cq[a] = q < tile.len[a] ? q : tile.len[a] - 1;  // padding rows take the last query's window
              w[a] = query_window(cq[a], tile.len[a], p.kernel[a], 1, p.causal[a] != 0);
            }
            if (s.row_ok[r] != ok) return fail("row validity", p, box, warp, lane);
            for (int ch = 0; ch < s.chunks; ++ch) {
              const uint32_t word = square_chunk_word(s.word[r], ch);
              for (int j = 0; j < 2 * kStripChunkRows; ++j)
                for (int e = 2 * r; e < 2 * r + 2; ++e) {
                  ++checks;
                  const int key = square_tile_key(s.sy, s.sx, ch, j) + 2 * (lane % 4) + e % 2;
                  const int k[2] = {tile.lo[R] + key / kSquareKeyBox, tile.lo[Cx] + key % kSquareKeyBox};
                  if (k[0] != tile.lo[R] + s.sy + kStripChunkRows * ch + j / 2 ||
                      k[1] != tile.lo[Cx] + s.sx + 8 * (j % 2) + 2 * (lane % 4) + e % 2)
                    return fail("key coordinates", p, box, warp, lane);
                  bool in = true;
                  int want = 0;
                  for (int a = 0; a < 2; ++a) {
                    in = in && k[a] >= w[a].start && k[a] < w[a].start + w[a].count;
                    want = want * p.rpb_size[a] + (k[a] - cq[a] + p.kernel[a] - 1);
                  }
                  if (strip_kept(word, j, e) != in) return fail("mask bit", p, box, warp, lane);
                  kept[r] += in;
                  const int idx = s.bias_at[r] + strip_chunk_bias(s.row_mult, ch) + strip_bias_offset(s.row_mult, j, e);
                  if (in && idx != want) return fail("RPB index", p, box, warp, lane);
                  if (idx < -kGuard || idx >= table + kGuard) return fail("RPB index outside the guards", p, box, warp, lane);
                }
            }
            if (lane % 4 == 3 && kept[r] != w[0].count * w[1].count)
              return fail("the walk misses keys of the window", p, box, warp, lane);
          }
        }
      }
      for (int i = 0; i < 64; ++i)
        if (rows_seen[i] != 1) return fail("the squares do not cover the query box once", p, box, 0, 0);
    }
  }
  return 0;
}

// A part's copy lands at i x its bytes, where the whole box's copy puts its first key; its
// bytes are whole swizzle atoms (8 rows), so the copy engine swizzles it the same way.
template <int HD>
static int check_parts() {
  using C = TileSmem<HD, KB::kSize>;
  using P = TileSmem<HD, kSquarePartRows * kSquareKeyBox>;
  for (int i = 0; i < kSquareParts; ++i)
    if (i * P::kBytes != C::offset(i * kSquarePartRows * kSquareKeyBox, 0) || P::kBytes % (8 * P::kRowBytes) ||
        kSquareParts * P::kBytes != C::kBytes) {
      printf("FAIL part %d's place at head dim %d\n", i, HD);
      return 1;
    }
  return 0;
}

int main() {
  long long checks = 0;
  if (check_parts<32>() || check_parts<64>()) return 1;
  if (check_problems(2000, checks)) return 1;
  printf("ok %lld\n", checks);
  return 0;
}
